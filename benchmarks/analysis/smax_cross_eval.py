"""A trained SMAX policy of marlkit on both simulators: marlkit's native ``smax/<map>`` and
JaxMARL's own ``HeuristicEnemySMAX`` (through marlkit's ``jaxmarl`` adapter), the same
episodes count, greedy or sampled, one JSON line.

    .venv/bin/python benchmarks/analysis/smax_cross_eval.py --run /tmp/smax/all-s0 \
        --episodes 100 --seed 10000

Where marlkit's greedy win rate trails JaxMARL's at equal training curves (docs/results.md,
"MAPPO on SMAX 3m"), this says whether the simulator the episodes are played on accounts for
it: the run's actor (its latest checkpoint, the run's own config and observation transforms)
plays ``--episodes`` episodes, one per env, on each simulator. A win is counted the same way on
both (JaxMARL's env has no ``won`` flag): the episode's first ``done`` is a termination (a team
wiped out, not the 100-step limit) whose ally reward holds SMAX's win bonus (``>= 1``: the
enemy's lost health of one step is below 1 unless that step wins); on the native env that rule
is checked against its own ``won`` flag (``native_won_flag`` in the JSON).
JaxMARL's env is built with the options of the native one (``see_enemy_actions``,
``walls_cause_death``, the heuristic enemy attacking the closest unit: marlkit's defaults and
JaxMARL's peer run's).
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import sys
from typing import Any

import torch
from omegaconf import OmegaConf

from marlkit.bench.environment import describe_environment
from marlkit.train import Checkpointer
from marlkit.train.scripts import env_factory

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sota-implementations" / "mappo_ippo"))
import mappo_ippo  # noqa: E402  # the script's own policy builder (trained_policy)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from epymarl_side_by_side import emit_results  # noqa: E402  # this folder's script

GROUP = "ally"


def _wins(rollout: Any) -> dict[str, Any]:
    """Per env, whether its first episode was won by the rule of the module's notes, and the
    native ``won`` flag's verdict where the env has one."""
    shape = rollout.shape  # [E, T]
    done = rollout.get(("next", "done")).reshape(shape).bool()
    terminated = rollout.get(("next", "terminated")).reshape(shape).bool()
    reward = rollout.get(("next", GROUP, "reward")).reshape(*shape, -1).max(-1).values
    first = (done.long().cumsum(-1) - done.long() == 0) & done  # each env's first done step
    finished = first.any(-1)
    by_rule = (first & terminated & (reward >= 1.0)).any(-1)
    out: dict[str, Any] = {
        "episodes": int(shape[0]),
        "finished": int(finished.sum()),
        "won": float(by_rule.float().mean()),
        "episode_length": float(
            torch.where(finished, first.float().argmax(-1) + 1, torch.tensor(shape[1]))
            .float()
            .mean()
        ),
    }
    if ("next", "won") in rollout.keys(True, True):
        flag = (rollout.get(("next", "won")).reshape(shape).bool() & first).any(-1)
        out["native_won_flag"] = float(flag.float().mean())
        out["rule_agrees_with_flag"] = bool(torch.equal(flag, by_rule))
    return out


def cross_eval(run: pathlib.Path, episodes: int, seed: int, exploration: str) -> dict[str, Any]:
    """``run``'s actor on the native SMAX and on JaxMARL's, ``episodes`` a side.

    Raises:
        SystemExit: ``run`` has no checkpoint, or did not train on a ``smax/<map>`` env.
    """
    try:
        cfg = OmegaConf.create(Checkpointer(run / "checkpoints").load()["config"])
    except (FileNotFoundError, KeyError, TypeError) as err:
        raise SystemExit(f"{run}: no checkpoint with its config ({err!r})") from None
    name = str(cfg.env.name)
    if not name.startswith("smax/") or dict(cfg.env.get("kwargs") or {}):
        raise SystemExit(f"{run} trained on {name} with {cfg.env.get('kwargs')}: not smax/<map>")
    map_name = name.removeprefix("smax/")
    steps = int(cfg.env.max_steps) + 1
    out: dict[str, Any] = {"run": str(run), "map": map_name, "exploration": exploration}
    kwargs: dict[str, Any] = {}  # the native env's; JaxMARL's take its allies' names from it
    for side, env_name in (("native", name), ("jaxmarl", "jaxmarl/HeuristicEnemySMAX")):
        side_cfg = copy.deepcopy(cfg)
        side_cfg.env.name, side_cfg.env.kwargs = env_name, kwargs
        env = env_factory(side_cfg, episodes, seed, evaluation=True)()
        policy = mappo_ippo.trained_policy(env, str(run), exploration)  # its mode fixed
        with torch.no_grad():
            rollout = env.rollout(steps, policy, break_when_any_done=False)
        out[side] = _wins(rollout)
        allies = list(env.group_map[GROUP])
        env.close()
        kwargs = {"map_name": map_name, "attack_mode": "closest", "group_map": {GROUP: allies}}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=pathlib.Path, nargs="+", required=True)
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--seed", type=int, default=10000)
    p.add_argument("--exploration", choices=["deterministic", "random"], default="deterministic")
    p.add_argument("--out", type=pathlib.Path, default=None)
    args = p.parse_args(argv)
    results = [cross_eval(r, args.episodes, args.seed, args.exploration) for r in args.run]
    # "results": docs/results.md's JSON (benchmarks/results/results-<experiment>-<date>.json)
    emit_results(
        {
            "benchmark": "results",
            "experiment": "smax-cross-eval",
            "environment": describe_environment(),
            "runs": results,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
