"""Adapter overhead: each adapter against a raw loop over its simulator, side by side.

Prints one JSON object with a section per adapter; compare the ratios (adapter / raw). VMAS and
PettingZoo time pairs of calls (one raw, one adapter, back to back in alternating order) until
each side has had about ``--round-seconds`` and ``--min-steps`` pairs; MuJoCo alternates its
two physics loops over ``--rounds`` rounds of ``--round-seconds`` each.

    python benchmarks/adapters.py                  # every section
    python benchmarks/adapters.py --only vmas      # one section

LBF and RWARE (EPyMARL's Gymnasium format) time pairs of batch steps as PettingZoo does; OpenSpiel
(shimmy) and MeltingPot alternate the raw loop and the adapter over `--rounds` rounds, as MuJoCo.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from marlkit.bench import Stopwatch, alternate, make_parser, paired, run_sections, time_steps
from marlkit.bench.environment import load_average
from marlkit.bench.overhead import collector_loop, measure_overhead, random_actions


# --- section: vmas ---------------------------------------------------------------------------
def bench_vmas(args: argparse.Namespace) -> dict:
    """``vmas/navigation``, 1024 envs x 4 agents, validation off, against a raw VMAS loop.

    Raw: ``vmas.make_env`` stepped with a list of per-agent action tensors (random, drawn like a
    policy would), done envs reset with ``reset_at``. Adapter: ``step_and_maybe_reset`` on
    random actions (section ``"step"``) and ``rollout`` in chunks of 8 steps (section
    ``"rollout"``, paired with 8 raw steps). Each timed call runs the raw loop and the adapter
    back to back (alternating which goes first) and records both, so that load from other
    processes hits them alike; figures are medians over the pairs and ``ratio`` is raw time /
    adapter time (target >= 0.9). ``time_in_vmas_fraction`` is the share of the adapter's time
    spent inside VMAS's ``step`` (timed around that call): the ratio the adapter reaches against
    a loop that costs nothing beyond VMAS, insensitive to load. Torch's thread count is left as
    it is (``OMP_NUM_THREADS`` sets it) unless ``--threads`` sets it.
    """
    import vmas

    import marlkit
    from marlkit.data import step_mdp

    num_envs, n_agents, chunk = 1024, 4, 8
    env = marlkit.make(
        "vmas/navigation", num_envs=num_envs, n_agents=n_agents, seed=0, validate_actions=False
    )
    raw = vmas.make_env(
        "navigation", num_envs=num_envs, n_agents=n_agents, seed=0, terminated_truncated=True
    )
    raw.reset()
    gen = torch.Generator().manual_seed(0)

    def raw_step() -> None:
        actions = list((torch.rand(n_agents, num_envs, 2, generator=gen) * 2 - 1).unbind(0))
        _, _, terminated, truncated, _ = raw.step(actions)
        done = terminated | truncated
        if bool(done.any()):
            for i in done.nonzero().flatten().tolist():
                raw.reset_at(i)

    def raw_chunk() -> None:
        for _ in range(chunk):
            raw_step()

    state = {"step": env.reset(), "rollout": env.reset()}
    in_vmas = Stopwatch()  # seconds the adapter spent inside VMAS's own step, timed around it
    vmas_step = env.vmas_env.step
    vmas_step_timed = in_vmas.wrap(vmas_step)

    def adapter_step() -> None:
        env.vmas_env.step = vmas_step_timed
        _, state["step"] = env.step_and_maybe_reset(env.rand_action(state["step"]))
        env.vmas_env.step = vmas_step

    def adapter_rollout() -> None:
        env.vmas_env.step = vmas_step_timed
        out = env.rollout(
            chunk, break_when_any_done=False, auto_reset=False, tensordict=state["rollout"]
        )
        env.vmas_env.step = vmas_step
        state["rollout"] = step_mdp(
            out[:, -1],
            action_keys=env.action_keys,
            reward_keys=env.reward_keys,
            done_keys=env.done_keys,
        )

    report: dict[str, Any] = {
        "scenario": "navigation",
        "num_envs": num_envs,
        "n_agents": n_agents,
        "device": "cpu",
        "rollout_chunk": chunk,
        "target": 0.9,
    }
    for name, adapter, raw_fn, per_call in (
        ("step", adapter_step, raw_step, 1),
        ("rollout", adapter_rollout, raw_chunk, chunk),
    ):
        warmup = -(-args.warmup // per_call)  # ceil: calls whose pairs are dropped
        calls = warmup + max(8, -(-args.min_steps // per_call))
        in_vmas.seconds = 0.0
        # Each side timed for about --round-seconds: the pairs run for twice that.
        pairs = paired(raw_fn, adapter, min_pairs=calls, min_seconds=2 * args.round_seconds)
        adapter_total = sum(p[1] for p in pairs)
        seconds = adapter_total + sum(p[0] for p in pairs)
        del pairs[:warmup]
        raw_s = statistics.median(p[0] for p in pairs) / per_call
        adapter_s = statistics.median(p[1] for p in pairs) / per_call
        report[name] = {
            "pairs": len(pairs),
            "seconds": seconds,
            "raw_steps_per_s": 1.0 / raw_s,
            "adapter_steps_per_s": 1.0 / adapter_s,
            "adapter_agent_steps_per_s": num_envs * n_agents / adapter_s,
            "ratio": raw_s / adapter_s,
            # Insensitive to load: the share of the adapter's time spent inside VMAS's step.
            "time_in_vmas_fraction": in_vmas.seconds / adapter_total,
        }
    return report


# --- end section: vmas -----------------------------------------------------------------------


# --- section: pettingzoo ---------------------------------------------------------------------
def bench_pettingzoo(args: argparse.Namespace) -> dict:
    """``pettingzoo/mpe2.simple_spread_v3`` (validation off) against a raw ``parallel_env`` loop.

    Both loops draw actions with the same torch call, step one env (``num_envs=1``) and reset
    when the episode ends (``max_cycles=25``); the adapter loop is a collector's
    (``step_and_maybe_reset``). ``adapter`` does the raw loop's work; ``adapter_with_state`` also
    returns ``env.state()`` (the default, for centralised critics; MPE computes it by observing
    every agent again). Each timed call runs one raw step and one adapter step back to back
    (alternating which goes first), so that load from other processes hits both alike; figures
    are medians over the pairs and ``ratio`` is raw time / adapter time (target >= 0.7).
    ``time_in_simulator_fraction`` is the share of the adapter's time spent inside PettingZoo's
    ``step`` (timed around that call): the ratio against a loop that costs nothing beyond it.
    """
    from mpe2 import simple_spread_v3

    import marlkit

    out: dict[str, Any] = {"scenario": "mpe2.simple_spread_v3", "max_cycles": 25}
    for n in (3, 10):
        raw = simple_spread_v3.parallel_env(N=n, max_cycles=25)
        raw.reset(seed=0)
        gen = torch.Generator().manual_seed(0)

        def raw_step(raw: Any = raw, gen: torch.Generator = gen, n: int = n) -> None:
            actions = torch.randint(0, 5, (n,), generator=gen).tolist()
            raw.step(dict(zip(raw.agents, actions)))
            if not raw.agents:
                raw.reset()

        entry: dict[str, Any] = {}
        for name, with_state in (("adapter", False), ("adapter_with_state", True)):
            env = marlkit.make(
                "pettingzoo/mpe2.simple_spread_v3",
                N=n,
                max_cycles=25,
                seed=0,
                state=with_state,
                validate_actions=False,
            )
            sim = env.simulators[0]
            in_sim = Stopwatch()
            sim.step = in_sim.wrap(sim.step)  # an instance attribute shadows the method
            pairs = paired(
                raw_step,
                collector_loop(env, random_actions(env, gen)),
                min_pairs=args.warmup + args.min_steps,
                min_seconds=2 * args.round_seconds,  # each side about --round-seconds
            )
            timed_pairs = pairs[args.warmup :]
            raw_times, env_times = zip(*timed_pairs)
            entry[f"{name}_raw_steps_per_s"] = 1.0 / statistics.median(raw_times)
            entry[f"{name}_steps_per_s"] = 1.0 / statistics.median(env_times)
            entry[f"{name}_ratio"] = statistics.median(r / a for r, a in timed_pairs)
            entry[f"{name}_time_in_simulator_fraction"] = in_sim.seconds / sum(a for _, a in pairs)
            entry[f"{name}_pairs"] = len(timed_pairs)
            env.close()
        out[f"N={n}"] = entry
        raw.close()
    return out


# --- end section: pettingzoo -----------------------------------------------------------------

# --- section: mujoco -------------------------------------------------------------------------


def bench_mujoco(args: argparse.Namespace) -> dict:
    """Multi-agent MuJoCo ``ant_2x4``, 64 envs: batched native stepping (a thread per core, each
    running GIL-free ``mj_step`` over a slice of the batch) against a single-threaded Python
    loop of ``mj_step`` over the same 64 ``MjData``, and the full marlkit ``env.step``.

    The two physics measurements alternate over ``--rounds`` rounds of ``--round-seconds`` each
    (load on a shared machine hits both alike); ``speedup`` is the median over rounds of loop
    time / batched time.
    """
    import numpy as np

    import marlkit

    num_envs = 64
    env = marlkit.make("mujoco/ant_2x4", num_envs=num_envs, seed=0)
    sim, model = env._sim, env.model
    mujoco = sim.mujoco  # the module the adapter imported (with MUJOCO_GL set)
    frame_skip = env.options["frame_skip"]
    ctrl = np.random.default_rng(0).uniform(-1.0, 1.0, (num_envs, model.nu))

    def python_loop() -> None:  # what a one-env-at-a-time adapter does, same physics
        for i, data in enumerate(sim.datas):
            data.ctrl[:] = ctrl[i]
            mujoco.mj_step(model, data, nstep=frame_skip)
            mujoco.mj_rnePostConstraint(model, data)

    def batched() -> None:
        sim.step(ctrl)

    td = env.rand_action(env.reset())

    def env_step() -> None:
        env.step(td)

    def cpu_timed(step: Any) -> dict:  # CPU seconds per wall second: the cores it really got
        for _ in range(args.warmup):
            step()
        cpu = time.process_time()
        run = time_steps(step, min_seconds=args.round_seconds, min_steps=args.min_steps)
        run["cores_used"] = (time.process_time() - cpu) / run["seconds"]
        return run

    runs = alternate(
        {"loop": lambda: cpu_timed(python_loop), "batched": lambda: cpu_timed(batched)},
        args.rounds,
    )
    loop_runs, batched_runs = runs["loop"], runs["batched"]
    ratios = [b["steps_per_s"] / a["steps_per_s"] for a, b in zip(loop_runs, batched_runs)]
    full = time_steps(
        env_step, min_seconds=args.round_seconds, min_steps=args.min_steps, warmup=args.warmup
    )

    def env_steps_per_s(runs: list[dict]) -> float:
        return float(np.median([r["steps_per_s"] for r in runs])) * num_envs

    env.close()
    return {
        "scenario": "mujoco/ant_2x4",
        "num_envs": num_envs,
        "frame_skip": frame_skip,
        "threads": sim.num_threads,
        "python_loop_env_steps_per_s": env_steps_per_s(loop_runs),
        "batched_env_steps_per_s": env_steps_per_s(batched_runs),
        "marlkit_env_steps_per_s": env_steps_per_s([full]),
        "python_loop_cores_used": float(np.median([r["cores_used"] for r in loop_runs])),
        "batched_cores_used": float(np.median([r["cores_used"] for r in batched_runs])),
        "speedup_rounds": [round(r, 3) for r in ratios],
        "speedup": float(np.median(ratios)),
        "target_speedup": 1.5,
        "load_average_1min": load_average(),
    }


# --- end section: mujoco ---------------------------------------------------------------------

# --- section: lbforaging, rware (EPyMARL's Gymnasium format) ----------------------------------
#: The EPyMARL tasks timed, and the batch sizes of each.
GYMMA_TASKS = {
    "lbforaging": ("Foraging-8x8-2p-2f-coop-v3", (1, 16)),
    "rware": ("rware-tiny-2ag-v2", (1, 16)),
}


def _bench_gymma(family: str, args: argparse.Namespace) -> dict:
    """``<family>/<id>`` (validation off) against a raw loop over the same Gymnasium envs.

    Raw: ``num_envs`` envs of ``gymnasium.make(id, disable_env_checker=True)`` (instance ``i``
    reset with seed ``i``), each stepped with a list of per-agent ints drawn by one
    ``torch.randint`` call for the batch and reset when ``done``. Adapter: the same ``torch``
    call writes ``("agents", "action")``, then ``step_and_maybe_reset`` (the simulator steps,
    observations and rewards stacked into ``[num_envs, n_agents, ...]`` tensors, the done rule,
    ``step_mdp``, partial resets). Both sides step the same simulators the same number of times.
    Each timed call runs one raw step and one adapter step of the whole batch back to back
    (alternating which goes first); figures are medians over the pairs and ``ratio`` is raw time
    / adapter time (target >= 0.85). ``cpu_ratio`` is the same quotient of the CPU time each
    side took over all its calls (``time.process_time``): on a loaded machine, where a batch
    step of a few milliseconds is often descheduled, the wall-clock ratio drifts and this one
    does not. ``time_in_simulator_fraction`` is the share of each side's wall time spent inside
    the simulators' ``step`` (timed around those calls).
    """
    import gymnasium as gym

    import marlkit

    gym_id, sizes = GYMMA_TASKS[family]
    out: dict[str, Any] = {
        "task": f"{family}/{gym_id}",
        "target": 0.85,
        "work": {
            "raw": "num_envs gymnasium.make(id, disable_env_checker=True) envs, each stepped with "
            "a list of per-agent ints from one torch.randint call for the batch, reset when done; "
            "their tuples and lists kept as they come",
            "adapter": "the same torch.randint call written into ('agents', 'action'), "
            "step_and_maybe_reset (validation off): the same simulator steps, observations and "
            "rewards stacked into [num_envs, n_agents, ...] tensors and checked finite (work "
            "the raw loop does not do), done flags by the task's rule, the done rule, step_mdp, "
            "partial resets of the done envs",
        },
    }
    for num_envs in sizes:
        out[f"num_envs={num_envs}"] = _gymma_pairs(
            gym, marlkit.make, f"{family}/{gym_id}", gym_id, num_envs, args
        )
    out["load_average_1min"] = load_average()
    return out


def _gymma_pairs(
    gym: Any, make: Any, name: str, gym_id: str, num_envs: int, args: argparse.Namespace
) -> dict:
    """One batch size of :func:`_bench_gymma`."""
    env = make(name, num_envs=num_envs, seed=0, validate_actions=False)
    raws = [gym.make(gym_id, disable_env_checker=True) for _ in range(num_envs)]
    for i, raw in enumerate(raws):
        raw.reset(seed=i)
    spec = env.action_spec["agents", "action"]
    in_raw, in_adapter = Stopwatch(), Stopwatch()
    raw_steps = [in_raw.wrap(raw.step) for raw in raws]
    for sim in env.simulators:
        sim.step = in_adapter.wrap(sim.step)  # an instance attribute shadows the method
    gen_raw, gen_adapter = (torch.Generator().manual_seed(0) for _ in range(2))
    cpu = {"raw": 0.0, "adapter": 0.0}

    def raw_step() -> None:
        start = time.process_time()
        actions = torch.randint(0, spec.n, spec.shape, generator=gen_raw).tolist()
        for raw, step, action in zip(raws, raw_steps, actions):
            _, _, done, truncated, _ = step(action)
            if done or truncated:
                raw.reset()
        cpu["raw"] += time.process_time() - start

    state = {"td": env.reset()}

    def adapter_step() -> None:
        start = time.process_time()
        td = state["td"]
        td.set(("agents", "action"), torch.randint(0, spec.n, spec.shape, generator=gen_adapter))
        _, state["td"] = env.step_and_maybe_reset(td)
        cpu["adapter"] += time.process_time() - start

    pairs = paired(
        raw_step,
        adapter_step,
        min_pairs=args.warmup + args.min_steps,
        min_seconds=2 * args.round_seconds,  # each side about --round-seconds
    )
    raw_total, adapter_total = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    timed = pairs[args.warmup :]
    result = {
        "n_agents": env.n_agents,
        "pairs": len(timed),
        "raw_env_steps_per_s": num_envs / statistics.median(p[0] for p in timed),
        "adapter_env_steps_per_s": num_envs / statistics.median(p[1] for p in timed),
        "ratio": statistics.median(r / a for r, a in timed),
        "cpu_ratio": cpu["raw"] / cpu["adapter"] if cpu["adapter"] > 0 else None,
        "raw_time_in_simulator_fraction": in_raw.seconds / raw_total,
        "adapter_time_in_simulator_fraction": in_adapter.seconds / adapter_total,
    }
    env.close()
    for raw in raws:
        raw.close()
    return result


def bench_lbforaging(args: argparse.Namespace) -> dict:
    """Level-Based Foraging ``Foraging-8x8-2p-2f-coop-v3``, 1 and 16 envs (see
    :func:`_bench_gymma`)."""
    return _bench_gymma("lbforaging", args)


def bench_rware(args: argparse.Namespace) -> dict:
    """RWARE ``rware-tiny-2ag-v2``, 1 and 16 envs (see :func:`_bench_gymma`)."""
    return _bench_gymma("rware", args)


# --- end section: lbforaging, rware ----------------------------------------------------------


# --- section: openspiel, meltingpot (alternating rounds) --------------------------------------
def _rounds_cell(
    raw: Callable[[], None],
    adapter: Callable[[], None],
    sims: list[Any],
    num_envs: int,
    args: argparse.Namespace,
) -> dict:
    """One cell of the sections timed in alternating rounds (``--rounds`` of
    ``--round-seconds``, at least ``--min-steps`` calls, ``--warmup`` untimed calls each)."""
    result = measure_overhead(
        raw,
        adapter,
        rounds=args.rounds,
        seconds=args.round_seconds,
        min_calls=args.min_steps,
        warmup=args.warmup,
        inside=[(sim, "step") for sim in sims],
    )
    raw_rate, rate = result.rates(num_envs)
    return {
        "raw_env_steps_per_s": raw_rate,
        "adapter_env_steps_per_s": rate,
        "ratio": result.ratio,
        "ratio_rounds": result.ratio_rounds,
        "adapter_time_in_simulator_fraction": result.inside_fraction,
    }


#: OpenSpiel games timed (tic_tac_toe: turns; goofspiel: simultaneous moves, one player a
#: step), and the batch sizes of each.
OPENSPIEL_GAMES = {"tic_tac_toe": {}, "goofspiel": {"num_cards": 4}}
OPENSPIEL_SIZES = (1, 16)


def bench_openspiel(args: argparse.Namespace) -> dict:
    """``openspiel/<game>`` (validation off) against PettingZoo's AEC loop over the same games.

    Both sides step ``num_envs`` instances of the adapter's game class (shimmy's
    ``OpenSpielCompatibilityV0`` with marlkit's mends, the same simulator), one move of the
    acting player per env and step, drawn uniformly over its legal moves with
    ``torch.multinomial`` (a generator each side). Raw: the loop PettingZoo documents, per env:
    ``last()`` (the acting player's observation and action mask), ``step(action)``, done players
    stepped with ``None``, ``reset()`` when none is left. Adapter: the legal moves of the acting
    players read from ``(group, "action_mask")`` and ``(group, "acting")``, the moves written
    into ``(group, "action")``, ``step_and_maybe_reset``, which also observes every player (not
    only the acting one) and returns ``[num_envs, n, ...]`` tensors, the done rule and
    ``step_mdp``.
    """
    import marlkit
    from marlkit.adapters.openspiel import game_class

    out: dict[str, Any] = {
        "target": 0.85,
        "work": {
            "raw": "num_envs instances of the adapter's game class (shimmy + marlkit's mends); "
            "per env: last(), one torch.multinomial over the acting player's action mask, "
            "step(action), done players stepped with None, reset() when none is left",
            "adapter": "the same instances inside openspiel/<game> (validation off): one "
            "torch.multinomial over the acting players' (group, 'action_mask') rows, written "
            "into (group, 'action'), step_and_maybe_reset: the same moves, checked against "
            "the env's own action masks (validation off or not: work the raw loop does not "
            "do), every player observed each step, [num_envs, n, ...] tensors checked finite, "
            "the done rule, step_mdp, resets",
        },
    }
    for game, params in OPENSPIEL_GAMES.items():
        entry: dict[str, Any] = {"params": params}
        for num_envs in OPENSPIEL_SIZES:
            env = marlkit.make(
                f"openspiel/{game}", num_envs=num_envs, seed=0, validate_actions=False, **params
            )
            raws = [game_class()(game, params) for _ in range(num_envs)]
            for i, raw in enumerate(raws):
                raw.reset(seed=i)
            gen_raw, gen_adapter = (torch.Generator().manual_seed(0) for _ in range(2))
            entry[f"num_envs={num_envs}"] = _rounds_cell(
                _aec_loop(raws, gen_raw),
                collector_loop(env, functools.partial(_legal_moves, gen=gen_adapter)),
                list(env.simulators),
                num_envs,
                args,
            )
            env.close()
            for raw in raws:
                raw.close()
        out[game] = entry
    out["load_average_1min"] = load_average()
    return out


def _aec_loop(raws: list[Any], gen: torch.Generator) -> Callable[[], None]:
    """PettingZoo's AEC loop over each of ``raws``: one move of the acting player a call."""

    def step() -> None:
        for raw in raws:
            _, _, terminated, truncated, info = raw.last()
            if terminated or truncated:
                raw.step(None)
            else:
                mask = torch.as_tensor(info["action_mask"], dtype=torch.float32)
                raw.step(int(torch.multinomial(mask, 1, generator=gen)))
            if not raw.agents:
                raw.reset()

    return step


def _legal_moves(td: Any, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A legal move of each acting player (uniform over its action mask); 0 for the others:
    one ``torch.multinomial`` over the acting players' mask rows, as the raw loop draws."""
    group = td.get("agents")
    acting, mask = group.get("acting"), group.get("action_mask")  # [E, n], [E, n, A]
    moves = torch.multinomial(mask[acting].float(), 1, generator=gen)  # [acting players, 1]
    if moves.shape[0] == acting.shape[0]:  # one acting player per env (AEC): spread over n
        return {"agents": acting.long() * moves}
    action = torch.zeros(acting.shape, dtype=torch.int64)
    action[acting] = moves.squeeze(-1)
    return {"agents": action}


#: MeltingPot substrates timed (players: 2 and 7), one env each (a Python loop: a batch
#: repeats the same work per env).
MELTINGPOT_SUBSTRATES = ("coins", "commons_harvest__open")


def bench_meltingpot(args: argparse.Namespace) -> dict:
    """``meltingpot/<substrate>`` (validation off, one env) against MeltingPot's own loop.

    Raw: ``meltingpot.substrate.build(name, roles=default_player_roles)``, stepped with a list
    of per-player ints from one ``torch.randint`` call, its ``TimeStep`` kept as it comes (per
    player dicts of NumPy arrays, ``WORLD.RGB`` included), ``reset()`` when it is the last.
    Adapter: the same call written into ``(group, "action")``, ``step_and_maybe_reset``: the
    same substrate step (the same wrappers, built as ``build`` builds them), the players'
    observations (``RGB`` and vectors) as ``[1, n, ...]`` tensors, ``WORLD.RGB`` as ``"state"``,
    the step limit as truncation, the done rule, ``step_mdp``.
    """
    import marlkit
    from marlkit.adapters.meltingpot import _meltingpot

    substrate = _meltingpot("substrate")
    out: dict[str, Any] = {
        "num_envs": 1,
        "target": 0.85,
        "work": {
            "raw": "meltingpot.substrate.build(name, roles=default_player_roles).step(list of "
            "per-player ints from one torch.randint call), its TimeStep kept as it comes "
            "(WORLD.RGB included), reset() after the last step",
            "adapter": "the same torch.randint call into (group, 'action'), "
            "step_and_maybe_reset (validation off): the same substrate step, every player's "
            "observations as [1, n, ...] tensors, WORLD.RGB as 'state', the step limit as "
            "truncation, the done rule, step_mdp, the reset of an ended episode",
        },
    }
    for name in MELTINGPOT_SUBSTRATES:
        env = marlkit.make(f"meltingpot/{name}", num_envs=1, seed=0, validate_actions=False)
        raw = substrate.build(name, roles=env.roles)
        raw.reset()
        n_actions = int(raw.action_spec()[0].num_values)
        gen_raw, gen_adapter = (torch.Generator().manual_seed(0) for _ in range(2))
        shape = (len(env.roles),)

        cell = _rounds_cell(
            _substrate_loop(raw, n_actions, shape, gen_raw),
            collector_loop(env, random_actions(env, gen_adapter)),
            list(env.simulators),
            1,
            args,
        )
        out[name] = {"players": len(env.roles), **cell}
        env.close()
        raw.close()
    out["load_average_1min"] = load_average()
    return out


def _substrate_loop(
    raw: Any, n_actions: int, shape: tuple[int, ...], gen: torch.Generator
) -> Callable[[], None]:
    """MeltingPot's own loop: one ``torch.randint`` call's actions, ``step``, reset at the end."""

    def step() -> None:
        if raw.step(torch.randint(0, n_actions, shape, generator=gen).tolist()).last():
            raw.reset()

    return step


# --- end section: openspiel, meltingpot --------------------------------------------------------

SECTIONS: dict[str, Callable[[argparse.Namespace], dict]] = {
    "vmas": bench_vmas,
    "pettingzoo": bench_pettingzoo,
    "mujoco": bench_mujoco,
    "lbforaging": bench_lbforaging,
    "rware": bench_rware,
    "openspiel": bench_openspiel,
    "meltingpot": bench_meltingpot,
}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, sections=SECTIONS, rounds=15, round_seconds=1.0)
    parser.add_argument("--min-steps", type=int, default=20, help="timed steps (pairs) at least")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    return run_sections("adapters", SECTIONS, parser.parse_args(argv), sorted(SECTIONS))


if __name__ == "__main__":
    sys.exit(main())
