"""Subprocess entry of an isolated cell: ``python -m marlkit.bench._worker '<json>'``.

The argument holds ``{"spec": CellSpec fields, "settings": TimingSettings fields, "threads":
int | None}``, or with ``"kind": "env"`` an :class:`~marlkit.bench.env_scaling.EnvCellSpec`'s
fields as ``"spec"`` (a cell of the sweep of any env). The worker prints one JSON object per
line on stdout as it goes: ``{"phase": name, ...figures}`` then ``{"result": CellResult}``, or
``{"error": message}`` with exit status 1.
The supervisor (:func:`marlkit.bench.scaling.run_cell`) kills it past its timeout and reads the
last phase to say where it was.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from marlkit.bench.cells import CellResult, CellSpec, TimingSettings, measure_cell
from marlkit.bench.env_scaling import EnvCellResult, EnvCellSpec, measure_env_cell
from marlkit.native import set_threads

__all__ = ["main"]


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the cell described by the JSON argument; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        _emit({"error": f"expected one JSON argument, got {len(args)} arguments"})
        return 1
    try:
        payload = json.loads(args[0])
        set_threads(payload.get("threads"))
        settings = TimingSettings(**payload["settings"])
        report = lambda phase, **figs: _emit({"phase": phase, **figs})  # noqa: E731
        result: CellResult | EnvCellResult
        if payload.get("kind") == "env":  # a cell of the any-env sweep
            result = measure_env_cell(EnvCellSpec(**payload["spec"]), settings, report)
        else:
            result = measure_cell(CellSpec(**payload["spec"]), settings, report)
    except Exception as err:  # reported to the supervisor, which records the cell as failed
        _emit({"error": f"{type(err).__name__}: {err}"})
        return 1
    _emit({"result": result.to_dict()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
