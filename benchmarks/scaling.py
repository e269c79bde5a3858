"""Scaling: agent-steps/s as agents per env grow, native ``navigation`` vs raw VMAS ``navigation``.

The issue's sweep: agents per env in {4, 16, 64, 256, 1024, 4096} with envs x agents ~= 65,536,
or a fixed number of envs (``--envs``). A thin front of ``marlkit bench scaling`` (every option
of it works here, ``--threads`` included); prints one JSON object on stdout (its header
``benchmark``, ``environment``, ``settings``, as every script of ``benchmarks/``), the table and
a progress bar on stderr, and writes ``scaling.json`` and ``scaling.png`` under ``--out``
(default runs/scaling).

    python benchmarks/scaling.py > benchmarks/results/scaling-$(date +%F).json
    python benchmarks/scaling.py --envs 16 --out runs/scaling-16-envs
    python benchmarks/scaling.py --backends native,torch,vmas --agents 4,64 --cell-budget 30

Any registered env, swept over the keyword that sizes it (agents counted from the built env,
each cell's memory too; several ``--env``/``--param`` pairs on one plot):

    python benchmarks/scaling.py --threads 1 --env magent2/battle_v4 \
        --param map_size=16,32,64,128,200,256 --env-arg magent2/battle_v4:state=False \
        --env swarm --param n_agents=16,64,256,1024,4096,16384 \
        > benchmarks/results/scaling-env-$(date +%F).json
"""

from __future__ import annotations

import pathlib
import sys

from marlkit.cli import main as marlkit_main

DEFAULT_OUT = pathlib.Path(__file__).resolve().parents[1] / "runs" / "scaling"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # Defaults first: a later --out on the command line wins.
    return marlkit_main(["bench", "scaling", "--json", "--out", str(DEFAULT_OUT), *args])


if __name__ == "__main__":
    sys.exit(main())
