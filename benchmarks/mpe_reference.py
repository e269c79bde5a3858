"""Reference levels on PettingZoo MPE ``simple_spread_v3``: what a trained policy should beat.

    python benchmarks/mpe_reference.py --episodes 50

Runs PettingZoo's own parallel env (no marlkit in the loop) under three fixed policies and
prints one JSON object with each one's mean episode return (the mean over the agents of each
agent's return, as ``docs/results.md`` reports the training scripts' rewards): uniformly random
actions, standing still (action 0), and a hand-written rule where agent ``i`` steps towards
landmark ``i`` along its larger coordinate (no coordination beyond the fixed assignment).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
from mpe2 import simple_spread_v3

from marlkit.bench import finish, make_parser, start

# simple_spread's actions: 0 stay, 1 left, 2 right, 3 down, 4 up; its observation: own velocity
# (2), own position (2), the landmarks' positions relative to the agent (2 N), the others' (2
# (N - 1)), communication.
Policy = Callable[[str, np.ndarray], int]


def episode_returns(policy: Policy, n: int, max_cycles: int, episodes: int) -> list[float]:
    env = simple_spread_v3.parallel_env(N=n, max_cycles=max_cycles)
    out = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        total = dict.fromkeys(env.agents, 0.0)
        while env.agents:
            obs, rewards, _, _, _ = env.step({a: policy(a, obs[a]) for a in env.agents})
            for agent, r in rewards.items():
                total[agent] += float(r)
        out.append(float(np.mean(list(total.values()))))
    env.close()
    return out


def own_landmark(n: int) -> Policy:
    def policy(agent: str, obs: np.ndarray) -> int:
        dx, dy = obs[4 : 4 + 2 * n].reshape(n, 2)[int(agent.rsplit("_", 1)[1])]
        if abs(dx) > abs(dy):
            return 2 if dx > 0 else 1
        return 4 if dy > 0 else 3

    return policy


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, threads_flag=False)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--max-cycles", type=int, default=25)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    policies: dict[str, Policy] = {
        "random": lambda agent, obs: int(rng.integers(5)),
        "stand_still": lambda agent, obs: 0,
        "own_landmark_rule": own_landmark(args.n),
    }
    result = {
        **start("mpe_reference", args),
        "env": f"mpe2.simple_spread_v3(N={args.n}, max_cycles={args.max_cycles})",
        "episodes": args.episodes,
        "measure": "mean over episodes of the mean over agents of each agent's episode return",
    }
    for name, policy in policies.items():
        returns = episode_returns(policy, args.n, args.max_cycles, args.episodes)
        result[name] = {"mean": float(np.mean(returns)), "std": float(np.std(returns))}
    return finish(result)


if __name__ == "__main__":
    sys.exit(main())
