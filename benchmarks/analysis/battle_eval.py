"""A MAgent2 battle run's trained team against fixed opponents: one JSON object.

The run's policy of one team (``--team``, ``red`` by default; its latest checkpoint, loaded by
``trained_policy`` of ``sota-implementations/mappo_ippo``), greedy and sampled, plays the other
team driven by uniformly random actions and by standing still; a random and a still team play
the same two opponents as baselines. The env is the run's own (its config's ``env`` section:
map size, ``max_cycles``, rewards, transforms), so the trained policy sees what it trained on::

    .venv/bin/python benchmarks/analysis/battle_eval.py RUN_DIR
    .venv/bin/python benchmarks/analysis/battle_eval.py RUN_DIR --episodes 100 --num-envs 10 \
        --team blue --opponents random,still,trained --env-kwarg attack_penalty=-0.1

Per pairing, over ``--episodes`` first episodes (``--num-envs`` envs at a time, rollouts seeded
from ``--seed``): the team's mean return (per agent, the sum of its rewards over the episode, as
the training logs ``<group>/episode_reward``; and its team's sum), each team's survivors at the
episode's end, the kills and losses they make, and the win, draw and loss rates (the team with
more survivors at the end wins: a wiped-out team, or fewer left at ``max_cycles``).
``--env-kwarg attack_penalty=-0.1`` plays with MAgent2's own rewards a run trained with others
(``configs/mappo_battle.yaml`` trains without the attack penalty); survivors, kills and wins do
not depend on the rewards, the returns do.

The sides:

* ``greedy``/``sampled``: the run's policy of that team, its most likely action or sampled (as
  while collecting).
* ``random``: one of MAgent2's 21 battle actions drawn uniformly for each agent at each step
  (battle has no action mask: every action is legal everywhere; attacking an empty cell costs
  ``attack_penalty``).
* ``still``: MAgent2's no-op, action 6 (:data:`STILL`): battle's 13 move actions are the cells
  of the radius-2 move circle in row order, 6 its centre, the move by ``(0, 0)``; 13-20 attack.
  Checked on MAgent2 0.3.4 by stepping every action: 6 is the one action that neither moves an
  agent nor costs the attack penalty.
* ``trained`` (opponent only): the run's own policy of the other team, greedy.

Survivors are read from the observations of the episode's last step: when a team has no agent
left MAgent2 ends the episode with every agent of both teams ``terminated``, so the flags cannot
tell who survived; an agent alive after the step sees itself (its team's presence channel, 1, at the
centre of its own view), a killed one does not.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import OmegaConf
from tensordict import TensorDictBase

from marlkit.bench.environment import describe_environment
from marlkit.train.checkpoint import Checkpointer
from marlkit.train.scripts import env_factory

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sota-implementations" / "mappo_ippo"))
import mappo_ippo  # noqa: E402  # the script's own policy builder (trained_policy)

#: MAgent2 battle's no-op: the centre of the 13 move actions (see the module's docstring).
STILL = 6
#: the channel of an agent's own team in MAgent2's views (walls, own team, its hit points, ...)
OWN_TEAM = 1
SIDES = ("greedy", "sampled", "random", "still")
OPPONENTS = ("random", "still", "trained")

Policy = Callable[[TensorDictBase], TensorDictBase]


def run_env(
    run_dir: pathlib.Path, num_envs: int, seed: int, env_kwargs: dict[str, Any] | None = None
) -> tuple[Any, Any]:
    """The env of the run's config (``num_envs`` envs, seeded ``seed``; ``env_kwargs`` in
    place of the config's ``env.kwargs`` of those names) and that config."""
    state = Checkpointer(run_dir / "checkpoints").load(map_location="cpu")
    cfg = OmegaConf.create(state["config"])
    if not str(cfg.env.name).startswith("magent2/battle"):
        raise ValueError(f"{run_dir} trained on {cfg.env.name}, not magent2/battle_v4")
    for key, value in (env_kwargs or {}).items():
        if key not in ("attack_penalty", "attack_opponent_reward", "step_reward", "dead_penalty"):
            raise ValueError(f"--env-kwarg {key}: only the rewards may differ from the run's")
        cfg.env.kwargs[key] = value
    return env_factory(cfg, num_envs, seed)(), cfg


def fixed_side(env: Any, group: str, side: str, generator: torch.Generator) -> Policy:
    """``random`` or ``still`` actions for ``group``: ``[*B, n]`` int64 under
    ``(group, "action")``."""
    spec = env.action_spec[group, "action"]
    shape, n = spec.shape, int(spec.n)
    if (group, "action_mask") in env.observation_spec.keys(True, True):
        raise ValueError(f"{group} has an action mask: 'random' here draws from every action")
    if side == "still" and n != 21:
        raise ValueError(f"MAgent2 battle has 21 actions, this env {n}: the no-op is not {STILL}")

    def act(td: TensorDictBase) -> TensorDictBase:
        if side == "random":
            action = torch.randint(n, tuple(shape), generator=generator)
        else:
            action = torch.full(tuple(shape), STILL, dtype=torch.int64)
        td.set((group, "action"), action)
        return td

    return act


def both_sides(env: Any, policies: dict[str, Policy]) -> Policy:
    """One policy for the env: each group's actions from its own side's policy (a trained
    policy writes every group's actions: only its own group's are kept)."""

    def act(td: TensorDictBase) -> TensorDictBase:
        actions = {}
        for group, policy in policies.items():
            actions[group] = policy(td.copy())[group, "action"]
        for group, action in actions.items():
            td.set((group, "action"), action)
        return td

    return act


def own_presence(observation: torch.Tensor, base_shape: torch.Size) -> torch.Tensor:
    """Whether each agent sees itself at the centre of its view ``[*B, n]``, from its
    observation in any of the layouts the transforms give: MAgent2's ``[H, W, C]``, channels
    first ``[C, H, W]`` (``pixels``) or flattened ``[H * W * C]`` (``flatten_observation``);
    ``base_shape``: MAgent2's ``[H, W, C]``."""
    h, w, c = base_shape
    if tuple(observation.shape[-3:]) == (c, h, w):
        cell = observation[..., OWN_TEAM, h // 2, w // 2]
    elif tuple(observation.shape[-3:]) == (h, w, c):
        cell = observation[..., h // 2, w // 2, OWN_TEAM]
    elif observation.shape[-1] == h * w * c:
        cell = observation.reshape(*observation.shape[:-1], h, w, c)[..., h // 2, w // 2, OWN_TEAM]
    else:
        raise ValueError(
            f"observations {tuple(observation.shape)} are not MAgent2's [H, W, C] = "
            f"{tuple(base_shape)} in any layout (HWC, CHW, flattened)"
        )
    return cell > 0.5


def first_episodes(rollout: TensorDictBase, groups: list[str], base_shapes: dict) -> dict:
    """Each env's first episode of ``rollout`` ``[E, T]``: per group its per-agent returns
    ``[E, n]`` and survivors ``[E]`` at the episode's last step."""
    done = rollout["next", "done"].squeeze(-1)  # [E, T]
    if not bool(done.any(-1).all()):
        raise ValueError("an env's first episode did not end within the rollout")
    last = done.int().argmax(-1)  # [E]: the first done step
    steps = torch.arange(done.shape[1])
    within = steps.unsqueeze(0) <= last.unsqueeze(1)  # [E, T]
    rows = torch.arange(done.shape[0])
    out = {}
    for g in groups:
        reward = rollout["next", g, "reward"].squeeze(-1)  # [E, T, n]
        returns = (reward * within.unsqueeze(-1)).sum(1)  # [E, n]
        seen = own_presence(rollout["next", g, "observation"][rows, last], base_shapes[g])
        out[g] = {"returns": returns, "survivors": seen.sum(-1), "agents": reward.shape[-1]}
    return out


def play(env: Any, policy: Policy, episodes: int, steps: int, groups: list[str]) -> dict:
    """``episodes`` first episodes (rounds of ``env``'s batch) under ``policy``."""
    base = env.base_env if hasattr(env, "base_env") else env
    shapes = {g: base.observation_spec[g, "observation"].shape[-3:] for g in groups}
    parts: dict[str, dict[str, list[torch.Tensor]]] = {g: {"r": [], "s": []} for g in groups}
    played = 0
    with torch.no_grad():
        while played < episodes:
            rollout = env.rollout(steps, policy, break_when_any_done=False)
            for g, res in first_episodes(rollout, groups, shapes).items():
                parts[g]["r"].append(res["returns"])
                parts[g]["s"].append(res["survivors"])
            played += rollout.shape[0]
    return {
        g: {
            "returns": torch.cat(p["r"])[:episodes],
            "survivors": torch.cat(p["s"])[:episodes],
            "agents": len(env.group_map[g]),
        }
        for g, p in parts.items()
    }


def summarise(res: dict, team: str, other: str) -> dict[str, Any]:
    """The figures of one pairing."""
    ours, theirs = res[team], res[other]
    mine, rival = ours["survivors"].float(), theirs["survivors"].float()
    per_episode = ours["returns"].mean(-1)  # [episodes]: the team's mean per-agent return
    n = per_episode.numel()
    return {
        "episodes": n,
        "return_per_agent": round(float(per_episode.mean()), 4),
        "return_per_agent_sem": round(float(per_episode.std() / n**0.5), 4) if n > 1 else None,
        "team_return": round(float(ours["returns"].sum(-1).mean()), 4),
        "opponent_return_per_agent": round(float(theirs["returns"].mean()), 4),
        "survivors": round(float(mine.mean()), 3),
        "opponent_survivors": round(float(rival.mean()), 3),
        "agents_per_team": [ours["agents"], theirs["agents"]],
        "kills": round(float(theirs["agents"] - rival.mean()), 3),
        "losses": round(float(ours["agents"] - mine.mean()), 3),
        "win_rate": round(float((mine > rival).float().mean()), 3),
        "draw_rate": round(float((mine == rival).float().mean()), 3),
        "loss_rate": round(float((mine < rival).float().mean()), 3),
    }


def training(run_dir: pathlib.Path, cfg: Any) -> dict[str, Any]:
    """How the run trained: its config's name, command-line overrides and env keywords (Hydra's
    record in ``.hydra/``), and its frames and iterations (its ``summary.json``, once it has
    ended)."""
    out: dict[str, Any] = {"algorithm": str(cfg.get("algorithm"))}
    hydra = run_dir / ".hydra"
    if (hydra / "hydra.yaml").exists():
        out["config_name"] = OmegaConf.load(hydra / "hydra.yaml").hydra.job.config_name
    if (hydra / "overrides.yaml").exists():
        out["overrides"] = OmegaConf.to_container(OmegaConf.load(hydra / "overrides.yaml"))
    if (hydra / "config.yaml").exists():  # the env it trained on (the evaluation's may differ)
        trained = OmegaConf.load(hydra / "config.yaml").env
        out["env_kwargs"] = OmegaConf.to_container(trained.get("kwargs", {}))
    if (run_dir / "summary.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text())
        out.update({k: summary[k] for k in ("frames", "iterations") if k in summary})
    return out


def evaluate_run(
    run_dir: pathlib.Path,
    *,
    team: str = "red",
    episodes: int = 100,
    num_envs: int = 10,
    seed: int = 0,
    sides: tuple[str, ...] = SIDES,
    opponents: tuple[str, ...] = ("random", "still"),
    env_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every ``side`` of ``team`` against every ``opponent``: ``{"<side>_vs_<opponent>":
    figures}`` (:func:`summarise`), with what the env and the sides are; ``env_kwargs``: rewards
    in place of the run's (MAgent2's own, for a run trained with others)."""
    env, cfg = run_env(run_dir, num_envs, seed, env_kwargs)
    groups = list(env.group_map)
    if team not in groups or len(groups) != 2:
        raise ValueError(f"team {team!r}: the env's groups are {groups}")
    other = next(g for g in groups if g != team)
    generator = torch.Generator().manual_seed(seed)
    trained = {
        mode: mappo_ippo.trained_policy(env, str(run_dir), exploration)
        for mode, exploration in (("greedy", "deterministic"), ("sampled", "random"))
    }

    def side_policy(group: str, side: str) -> Policy:
        if side in trained:
            return trained[side]
        if side == "trained":
            return trained["greedy"]
        return fixed_side(env, group, side, generator)

    steps = int(cfg.env.max_steps)
    pairings = {}
    for side in sides:
        for opponent in opponents:
            torch.manual_seed(seed)  # the sampled policy's draws
            generator.manual_seed(seed)  # the random sides' draws
            env.set_seed(seed)  # each pairing plays episodes seeded alike
            policy = both_sides(
                env, {team: side_policy(team, side), other: side_policy(other, opponent)}
            )
            res = play(env, policy, episodes, steps, groups)
            pairings[f"{side}_vs_{opponent}"] = summarise(res, team, other)
    env.close()
    return {
        "run": str(run_dir),
        "training": training(run_dir, cfg),
        "env": str(cfg.env.name),
        "env_kwargs": OmegaConf.to_container(cfg.env.kwargs),
        "max_steps": steps,
        "transforms": OmegaConf.to_container(cfg.env.transforms),
        "team": team,
        "opponent": other,
        "seed": seed,
        "num_envs": num_envs,
        "still_action": STILL,
        "pairings": pairings,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=pathlib.Path)
    parser.add_argument("--team", default="red", help="the run's team that plays (default red)")
    parser.add_argument("--episodes", type=int, default=100, help="per pairing (default 100)")
    parser.add_argument("--num-envs", type=int, default=10, help="envs at a time (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sides", default=",".join(SIDES), help=f"of {SIDES}")
    parser.add_argument("--opponents", default="random,still", help=f"of {OPPONENTS}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--env-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a reward in place of the run's env.kwargs (e.g. attack_penalty=-0.1, MAgent2's)",
    )
    args = parser.parse_args(argv)
    env_kwargs = {}
    for item in args.env_kwarg:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--env-kwarg takes KEY=VALUE, got {item!r}")
        env_kwargs[key] = float(value)
    sides, opponents = tuple(args.sides.split(",")), tuple(args.opponents.split(","))
    for name, given, allowed in (("--sides", sides, SIDES), ("--opponents", opponents, OPPONENTS)):
        if not set(given) <= set(allowed):
            parser.error(f"{name} takes {','.join(allowed)}, got {','.join(given)}")
    torch.set_num_threads(args.threads)
    out = {
        "benchmark": "results",
        "experiment": "battle-cnn",
        "environment": describe_environment(),
        "command": " ".join(["benchmarks/analysis/battle_eval.py", *(argv or sys.argv[1:])]),
        "sides": {
            "greedy": "the run's policy of the team, its most likely action",
            "sampled": "the run's policy of the team, sampled (as while collecting)",
            "random": "each agent one of the 21 actions uniformly at each step (no action mask)",
            "still": f"each agent MAgent2's no-op, action {STILL} (move by (0, 0)), every step",
            "trained": "the run's policy of the other team, greedy",
        },
        "win": "more survivors than the other team at the episode's end (wiped out or at "
        "max_cycles); survivors: agents that see themselves in their last observation",
        **evaluate_run(
            args.run_dir,
            team=args.team,
            episodes=args.episodes,
            num_envs=args.num_envs,
            seed=args.seed,
            sides=sides,
            opponents=opponents,
            env_kwargs=env_kwargs,
        ),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
