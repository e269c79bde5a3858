"""Adapter overhead: each adapter against a raw loop over its simulator, side by side.

Prints one JSON object with a section per adapter; compare the ratios (adapter / raw).

    python benchmarks/adapters.py                  # every section
    python benchmarks/adapters.py --only vmas      # one section
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def timed(step: Callable[[], Any], min_seconds: float, min_steps: int, warmup: int) -> dict:
    """Call ``step`` until both ``min_seconds`` and ``min_steps`` are reached; steps per second."""
    for _ in range(warmup):
        step()
    steps, start = 0, time.perf_counter()
    while steps < min_steps or time.perf_counter() - start < min_seconds:
        step()
        steps += 1
    seconds = time.perf_counter() - start
    return {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds}


# --- section: vmas ---------------------------------------------------------------------------
# --- end section: vmas -----------------------------------------------------------------------

# --- section: pettingzoo ---------------------------------------------------------------------
# --- end section: pettingzoo -----------------------------------------------------------------

# --- section: mujoco -------------------------------------------------------------------------
# --- end section: mujoco ---------------------------------------------------------------------

SECTIONS: dict[str, Callable[[argparse.Namespace], dict]] = {}
for _name in ("vmas", "pettingzoo", "mujoco"):
    _fn = globals().get(f"bench_{_name}")
    if _fn is not None:
        SECTIONS[_name] = _fn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(SECTIONS), default=None)
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--min-steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "benchmark": "adapters",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    for name in args.only or sorted(SECTIONS):
        report[name] = SECTIONS[name](args)
        print(f"{name}: done", file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
