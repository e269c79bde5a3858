"""Where MADDPG's trained actors sit against their tanh: greedy rollouts of runs' latest
checkpoints on VMAS balance, one JSON object keyed by run folder.

Per run: the share of actions within 1 % of the action bounds, the actor MLP's pre-tanh
outputs (median and 90th percentile of their magnitude, the share beyond 3), and the actions'
standard deviation over steps and envs (about 0: one constant action whatever the
observation). Used for docs/results.md's MADDPG paragraph::

    .venv/bin/python benchmarks/results.py maddpg-balance --seeds 0,1,2 --out /tmp/maddpg/base
    .venv/bin/python benchmarks/analysis/maddpg_saturation.py /tmp/maddpg/base/maddpg-balance/seed*
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

import torch
from omegaconf import OmegaConf

import marlkit
from marlkit.data.exploration import set_exploration
from marlkit.modules import MultiAgentMLP
from marlkit.train.checkpoint import Checkpointer

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sota-implementations" / "maddpg_iddpg"))
import maddpg_iddpg  # noqa: E402  # the script's own builders


def saturation(run: pathlib.Path, num_envs: int, steps: int, seed: int) -> dict[str, float]:
    """The run's greedy actor rolled out for ``steps`` steps of ``num_envs`` envs."""
    torch.manual_seed(seed)
    env = marlkit.make(
        "vmas/balance", num_envs=num_envs, seed=seed, max_steps=steps, continuous_actions=True
    )
    state = Checkpointer(run / "checkpoints").load()
    net = maddpg_iddpg.make_policy(env, OmegaConf.create(state["config"]))
    net.load_state_dict(state["policy"])
    policy = set_exploration("deterministic")(net)
    pre: list[torch.Tensor] = []
    for module in net.modules():
        if isinstance(module, MultiAgentMLP):
            module.register_forward_hook(lambda _m, _i, out: pre.append(out.detach()))
    actions = []
    td = env.reset()
    with torch.no_grad():
        for _ in range(steps):
            td = policy(td)
            actions.append(td["agents", "action"].clone())
            td = env.step_and_maybe_reset(td)[1]
    a = torch.stack(actions)  # [T, E, n, act]
    high = env.action_spec["agents", "action"].high
    u = torch.cat(pre).abs()
    return {
        "share_of_actions_within_1pct_of_bounds": float((a.abs() >= 0.99 * high).float().mean()),
        "pre_tanh_abs_median": float(u.median()),
        "pre_tanh_abs_p90": float(u.quantile(0.9)),
        "share_of_pre_tanh_beyond_3": float((u > 3).float().mean()),
        "action_std_over_steps_and_envs": float(a.flatten(0, 1).std(0).mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=pathlib.Path, help="run folders")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=123)
    args = parser.parse_args(argv)
    out: dict[str, Any] = {
        str(run): saturation(run, args.num_envs, args.steps, args.seed) for run in args.runs
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
