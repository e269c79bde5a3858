"""``MultiAgentMLP`` against a Python loop over per-agent MLPs; prints one JSON object.

Workload: one forward + backward (sum of the outputs) of independent per-agent MLPs, input 16
features per agent, 2 hidden layers of 256 Tanh, 4 outputs, a batch of 1024, for n_agents in
{4, 32, 256}.

* ``batched``: :class:`marlkit.modules.MultiAgentMLP` (``share_params=False``): one batched
  matmul per layer for every agent.
* ``loop``: ``n_agents`` ``nn.Sequential`` MLPs of the same sizes, called one after the other on
  each agent's slice, outputs stacked: the plain-PyTorch way.

Target: ``loop / batched >= 3`` at 32 agents. ``--cells`` changes the hidden width (the
loop's per-agent overhead only dominates for narrow networks; at width 256 and batch 1024 both
sides are bound by the same matmul FLOPs). Sides alternate round by round; times are
medians, the ratio the median of the per-round ratios.

    python benchmarks/modules.py
    python benchmarks/modules.py --agents 32 --rounds 7 --threads 1
    python benchmarks/modules.py --retain-freed-memory   # glibc keeps large freed blocks

``--retain-freed-memory`` raises glibc's mmap and trim thresholds (``mallopt``) before anything
is allocated, for both sides alike. By default glibc serves every block above 32 MB (the batched
activations at 32 agents x 1024 x 256 floats) with a fresh ``mmap`` and unmaps it when freed,
so each such tensor pays its page faults again; the loop's per-agent activations (1 MB) are
reused from the heap.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json

import torch

from _timing import alternate, summary
from marlkit.bench import describe_environment, set_threads
from marlkit.modules import MultiAgentMLP

BATCH, IN, OUT, CELLS = 1024, 16, 4, 256


def bench(n_agents: int, cells: int, batch: int, rounds: int, seconds: float) -> dict[str, object]:
    torch.manual_seed(0)
    mlp = MultiAgentMLP(IN, OUT, n_agents, num_cells=cells)
    nets = [mlp.agent_network(i) for i in range(n_agents)]  # the same weights
    x = torch.randn(batch, n_agents, IN)

    def batched() -> None:
        mlp.zero_grad(set_to_none=True)
        mlp(x).sum().backward()

    def loop() -> None:
        for net in nets:
            net.zero_grad(set_to_none=True)
        torch.stack([net(x[:, i]) for i, net in enumerate(nets)], 1).sum().backward()

    torch.testing.assert_close(
        mlp(x), torch.stack([n(x[:, i]) for i, n in enumerate(nets)], 1), rtol=1e-4, atol=1e-5
    )
    times = alternate({"loop": loop, "batched": batched}, rounds, seconds)
    return {
        "n_agents": n_agents,
        "num_cells": cells,
        "batch": batch,
        **summary(times, "loop", "batched"),
    }


def retain_freed_memory() -> dict[str, int]:
    """Make glibc keep freed blocks of up to 1 GiB in the heap (no ``mmap``/``munmap`` per large
    tensor); returns the settings. Raises OSError where the C library has no ``mallopt``."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "mallopt"):
        raise OSError("this C library has no mallopt (glibc only)")
    settings = {"M_MMAP_THRESHOLD": 1 << 30, "M_TRIM_THRESHOLD": 1 << 30}
    for option, value in zip((-3, -1), settings.values()):  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
        if libc.mallopt(option, value) != 1:
            raise OSError(f"mallopt({option}, {value}) failed")
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, action="append", default=None)
    parser.add_argument(
        "--cells", type=int, action="append", default=None, help="hidden width (default 256)"
    )
    parser.add_argument("--batch", type=int, default=BATCH, help="rows per call (default 1024)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-seconds", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--retain-freed-memory",
        action="store_true",
        help="raise glibc's mmap and trim thresholds first (both sides)",
    )
    args = parser.parse_args()
    allocator = retain_freed_memory() if args.retain_freed_memory else "glibc defaults"
    set_threads(args.threads)
    out: dict[str, object] = {
        "benchmark": "modules",
        "computes": {
            "batched": "MultiAgentMLP(16, 4, n_agents, num_cells=cells, depth=2, Tanh) forward "
            "+ backward on [batch, n_agents, 16], independent params",
            "loop": "the same maths as n_agents nn.Sequential MLPs called in a Python loop",
        },
        "target": "loop / batched >= 3 at 32 agents",
        "allocator": allocator,
        **describe_environment(),
    }
    out["results"] = [
        bench(n, cells, args.batch, args.rounds, args.round_seconds)
        for cells in args.cells or [CELLS]
        for n in args.agents or [4, 32, 256]
    ]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
