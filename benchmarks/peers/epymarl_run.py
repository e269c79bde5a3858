"""The EPyMARL peer: runs EPyMARL's own ``src/main.py`` (its repository at a pinned commit, in
its own venv, not marlkit's) for one algorithm, env and seed, and prints its returns as one
JSON line.

    /tmp/epymarl-venv/bin/python benchmarks/peers/epymarl_run.py --epymarl /tmp/epymarl-src \
        --alg qmix --key lbforaging:Foraging-8x8-2p-2f-coop-v3 --time-limit 50 \
        --seed 0 --t-max 100000 --tests 10 --threads 1

EPyMARL runs with its defaults (``src/config/default.yaml``, ``algs/<alg>.yaml``,
``envs/gymma.yaml``: for QMIX a 64-unit GRU agent with the agent's id in its input, RMSprop
lr 5e-4, eps 1.0 -> 0.05 over 50k steps, double Q, a hard target update every 200 episodes, a
buffer of 5,000 episodes, batches of 32 episodes, gamma 0.99, standardised rewards, a 2-layer
hypernetwork mixer), changed only in ``t_max``, the time limit, CPU, and its test schedule:
``--tests`` evaluations of ``--test-episodes`` episodes (EPyMARL's protocol: 100; greedy for the
value-based algorithms, sampled for MAPPO and IPPO: their ``soft_policies`` action selector
samples whatever ``test_mode`` says, ``test_greedy`` reaching only the epsilon-greedy and
multinomial selectors; the JSON's ``does`` says which), every ``t_max / tests`` steps from the
start (EPyMARL tests once that many steps have passed since the last test, and its loop stops at
``t_max`` without a test: a run of 1M steps and 10 tests has them at 0, ~100k, ..., ~900k, so
compare it with another side at ~900k, or pass ``--final-test``: EPyMARL then runs up to 5,000
steps past ``--t-max`` and tests there).
The returns are EPyMARL's (sacred's ``info.json``): per episode, the agents' rewards summed
(``common_reward``, ``reward_scalarisation: sum``), as marlkit's ``agents/episode_reward`` on
``lbforaging/...`` with ``common_reward: true`` (every agent given that sum).

EPyMARL's ``main.py`` calls ``torch.set_num_threads(1)`` itself; ``--threads`` sets the
OpenMP/MKL threads of the process (and is reported). Its ``envs/__init__.py`` imports
``smaclite`` (SMAClite, not on PyPI) for SMAClite maps only: this driver puts an empty module
of that name in ``sys.modules`` before running ``main.py`` and changes nothing else.

Prints one JSON line: the final test return (``final``, the last test), the curve of the
tests ``[[t_env, return], ...]``, the training episodes' returns, the whole command's
wall-clock and the commit of the EPyMARL checkout (``git`` where it is a checkout, else
``--commit``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

BOOT = (
    "import runpy, sys, types; "
    "sys.modules['smaclite'] = types.ModuleType('smaclite'); "
    "sys.argv = sys.argv[1:]; sys.path.insert(0, {src!r}); "
    "runpy.run_path({main!r}, run_name='__main__')"
)


#: ``--final-test``: how far past ``--t-max`` EPyMARL runs so that its test there happens. Its
#: tests come once the interval has passed, at the end of a batch of episodes, each up to a
#: batch later than the last: 900k's test of a 1M LBF run came at 902,075.
FINAL_TEST_SLACK = 5000


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epymarl", required=True, help="EPyMARL's source tree (has src/main.py)")
    p.add_argument("--alg", default="qmix", help="src/config/algs/<alg>.yaml")
    p.add_argument("--key", default="lbforaging:Foraging-8x8-2p-2f-coop-v3")
    p.add_argument("--time-limit", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--t-max", type=int, default=100_000)
    p.add_argument("--tests", type=int, default=10, help="test evaluations over the run")
    p.add_argument("--test-episodes", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--commit", default="", help="the pinned commit, where no .git is there")
    p.add_argument(
        "--final-test",
        action="store_true",
        help=f"run EPyMARL up to {FINAL_TEST_SLACK} steps (half a test interval at most) past "
        "--t-max so that its test at --t-max happens (its loop stops at t_max without one)",
    )
    p.add_argument(
        "--from-sacred",
        default=None,
        help="print the JSON of this sacred run folder (results/sacred/<alg>/<env>/<n>) instead "
        "of running EPyMARL: a run whose driver stopped, or one stopped early",
    )
    p.add_argument("extra", nargs="*", help="more of EPyMARL's 'with' overrides, key=value")
    args = p.parse_args(argv)
    if args.t_max < 1 or args.tests < 1 or args.test_episodes < 1 or args.threads < 1:
        p.error("--t-max, --tests, --test-episodes and --threads must be >= 1")
    return args


def _commit(root: pathlib.Path, given: str) -> str:
    if given:
        return given
    out = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def _num(value: Any) -> float:
    """A number of sacred's info.json (numpy scalars are stored as jsonpickle objects)."""
    return float(value["value"] if isinstance(value, dict) else value)


def _series(info: dict[str, Any], key: str) -> list[list[float]]:
    """``[[t_env, value], ...]`` of one of EPyMARL's logged stats (empty where it is absent)."""
    return [[int(t), _num(v)] for t, v in zip(info.get(f"{key}_T", []), info.get(key, []))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = pathlib.Path(args.epymarl).resolve()
    src, main = root / "src", root / "src" / "main.py"
    if not main.is_file():
        raise SystemExit(f"--epymarl {root}: no src/main.py there (EPyMARL's source tree)")
    interval = max(1, args.t_max // args.tests)
    # EPyMARL's own t_max: with --final-test, far enough past --t-max for a test there, and
    # short of the next interval
    t_max = args.t_max + (min(FINAL_TEST_SLACK, interval // 2) if args.final_test else 0)
    overrides = [
        f"env_args.key={args.key}",
        f"env_args.time_limit={args.time_limit}",
        f"seed={args.seed}",
        f"t_max={t_max}",
        f"test_interval={interval}",
        f"test_nepisode={args.test_episodes}",
        f"log_interval={interval}",
        f"runner_log_interval={interval}",
        f"learner_log_interval={interval}",
        "use_cuda=False",
        "save_model=False",
        *args.extra,
    ]
    sacred = root / "results" / "sacred"
    before = {p.parent for p in sacred.glob("**/run.json")}
    env = {
        **os.environ,
        **{k: str(args.threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
    }
    cmd = [
        sys.executable,
        "-c",
        BOOT.format(src=str(src), main=str(main)),
        "main.py",
        f"--config={args.alg}",
        "--env-config=gymma",
        "with",
        *overrides,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"EPyMARL failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    new = sorted({p.parent for p in sacred.glob("**/run.json")} - before)
    # other runs (of this driver, beside this one) may have started meanwhile: this run's is
    # the new one with this run's algorithm, env, seed and t_max
    mine = [d for d in new if _is_run(d, args, t_max)]
    if len(mine) != 1:
        raise SystemExit(
            f"expected one new sacred run of {args.alg} seed {args.seed} t_max {t_max} on "
            f"{args.key} under {sacred}, found {[str(d) for d in mine] or 'none'} among "
            f"{len(new)} new runs"
        )
    return {**_result(args, root, mine[0], overrides, seconds), "epymarl_t_max": t_max}


def _is_run(folder: pathlib.Path, args: argparse.Namespace, t_max: int) -> bool:
    """Whether the sacred run ``folder`` is of ``args``' algorithm, env and seed and of
    ``t_max``."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        config.get("name") == args.alg
        and config.get("seed") == args.seed
        and config.get("t_max") == t_max
        and (config.get("env_args") or {}).get("key") == args.key
    )


def from_sacred(args: argparse.Namespace) -> dict[str, Any]:
    """``--from-sacred``: the JSON of a sacred run folder already there (a run whose driver
    stopped, or one stopped early on purpose: its tests up to then), read as :func:`run` reads
    its own; ``seconds`` is null (time the command instead)."""
    folder = pathlib.Path(args.from_sacred).resolve()
    config = json.loads((folder / "config.json").read_text())
    args.alg, args.seed, args.t_max = config["name"], config["seed"], config["t_max"]
    args.key, args.time_limit = config["env_args"]["key"], config["env_args"]["time_limit"]
    root = pathlib.Path(args.epymarl).resolve()
    run_json = json.loads((folder / "run.json").read_text())
    overrides = [str(o) for o in run_json.get("meta", {}).get("config_updates", {}).items()]
    return _result(args, root, folder, overrides, None)


def _result(
    args: argparse.Namespace,
    root: pathlib.Path,
    folder: pathlib.Path,
    overrides: list[str],
    seconds: float | None,
) -> dict[str, Any]:
    info = json.loads((folder / "info.json").read_text())
    tests = _series(info, "test_return_mean")
    return {
        "peer": "epymarl",
        "commit": _commit(root, args.commit),
        "alg": args.alg,
        "env": args.key,
        "time_limit": args.time_limit,
        "seed": args.seed,
        "t_max": args.t_max,
        "threads": args.threads,
        "final": tests[-1][1],
        "final_t_env": tests[-1][0],
        "test_episodes": args.test_episodes,
        "curve": tests,
        "train_curve": _series(info, "return_mean"),
        # q_learner: the mixed Q of the taken actions and its targets; ppo_learner: the
        # critic's values and their n-step targets
        "q_taken_mean": _series(info, "q_taken_mean"),
        "target_mean": _series(info, "target_mean"),
        "seconds": seconds,
        "sacred_run": str(folder),
        "command": " ".join(
            [
                "python",
                "src/main.py",
                f"--config={args.alg}",
                "--env-config=gymma",
                "with",
                *overrides,
            ]
        ),
        "does": _does(root / "src", args.alg),
    }


def _test_actions(cfg: dict[str, Any]) -> str:
    """How EPyMARL's test episodes act under ``cfg`` (its action selectors at the pinned
    commit, ``components/action_selectors.py``): ``soft_policies`` (MAPPO, IPPO, MAA2C, COMA)
    samples in test mode too; ``epsilon_greedy`` (QMIX, VDN, IQL) takes ``evaluation_epsilon``
    (0: greedy); ``multinomial`` is greedy when ``test_greedy``."""
    selector = cfg.get("action_selector", "epsilon_greedy")
    if selector == "soft_policies":
        return "sampled (soft_policies: its test episodes sample the policy, test_greedy unused)"
    if selector == "epsilon_greedy":
        eps = float(cfg.get("evaluation_epsilon", 0.0))
        return "greedy" if eps == 0 else f"epsilon-greedy (evaluation_epsilon {eps})"
    return "greedy" if cfg.get("test_greedy", True) else f"{selector} (test_greedy False)"


def _does(src: pathlib.Path, alg: str) -> str:
    """What the run computes, from EPyMARL's own config of ``alg`` (over ``default.yaml``)."""
    import yaml  # EPyMARL's dependency, in its venv

    cfg: dict[str, Any] = {}
    for name in ("default.yaml", f"algs/{alg}.yaml"):
        cfg.update(yaml.safe_load((src / "config" / name).read_text()) or {})
    envs = int(cfg.get("batch_size_run", 1))
    if cfg.get("learner") == "ppo_learner":
        training = (
            f"{envs} envs stepped together ({cfg.get('runner')} runner), a training batch of "
            f"their {cfg.get('batch_size')} episodes, {cfg.get('epochs')} epochs over it"
        )
    else:
        training = (
            f"episodes of {envs} env(s), a training step per episode once "
            f"{cfg.get('batch_size')} are stored ({cfg.get('learner')})"
        )
    return (
        "EPyMARL's own src/main.py at the pinned commit with its defaults for the algorithm and "
        f"gymma (overrides in 'command'); {training}; {_test_actions(cfg)} tests of "
        "test_episodes episodes; "
        "returns: the agents' rewards summed per episode (common_reward, sum); wall-clock: the "
        "whole command, imports and tests included"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    print(json.dumps(from_sacred(args) if args.from_sacred else run(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
