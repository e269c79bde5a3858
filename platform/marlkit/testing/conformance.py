"""``check_adapter``: the conformance kit third parties run on their own envs.

It checks an env against the contract every marlkit component relies on, collects every failure
(not only the first) and raises one :class:`AdapterCheckError` listing them:

* **specs**: reset and step data agree with every spec, no undeclared entries, no NaN;
* **shapes**: ``rollout`` gives batch ``[*B, T]``, groups ``[*B, T, n]``, rewards
  ``[*B, T, n, 1]``, root done flags ``[*B, T, 1]``;
* **done rules**: ``done == terminated | truncated`` at every level, the root agrees with the
  agents by the done rule of :mod:`marlkit.envs.common` (root ``done`` exactly when every agent
  is done, root ``truncated`` when one present at the end was truncated, ``terminated = done &
  ~truncated``), a reset env is not done;
* **seeding**: the same seed gives the same random rollout (skip for nondeterministic sims);
  where it does not, the raw simulator under the adapter is run twice by itself (reset with the
  same seed, then the same actions) and the message says whose fault it is: the simulator's
  (it does not replay either: the message names its class and the package it comes from) or
  the adapter's (it does, in every one of up to six runs: a simulator whose replays differ only
  now and then is not blamed on the adapter after two lucky ones). The kit reaches the simulator
  through
  the adapter's ``_replay_simulator(seed, steps)`` hook (VMAS, MuJoCo, ``from_batched``), or
  runs ``env.simulators[0]`` / ``env.simulator`` by its protocol (PettingZoo parallel and AEC,
  Gymnasium envs and vector envs). A simulator whose adapter knows why it cannot replay a seed
  says so in its ``upstream_nondeterminism`` attribute (a sentence): the kit then reports that,
  every time, instead of comparing rollouts that may agree by chance (MeltingPot);
* **distinct instances**: where the simulator is stochastic (two seeds give two traces), no two
  instances of the batch replay one another under the same actions (a seed collision);
* **partial resets**: resetting one env leaves the others' observations untouched and
  restarts that one (observations its steps changed do not stay as the steps left them);
* **bad actions**: a missing key, a wrong shape, a NaN or out-of-range action raise a
  ``ValueError`` and leave the env's state as it was;
* **rendering**, when ``"rgb_array"`` is declared: ``uint8 [H, W, 3]`` frames.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from marlkit.data.keys import (
    DONE,
    DONE_KEYS,
    MASK,
    NEXT,
    RESET,
    TERMINATED,
    TRUNCATED,
    NestedKey,
    join_key,
    key_path,
)
from marlkit.data.specs import Bounded, Categorical, MultiCategorical, OneHot, TensorSpec
from marlkit.envs.checks import spec_problems
from marlkit.envs.common import EnvBase

__all__ = ["AdapterCheckError", "check_adapter"]


class AdapterCheckError(AssertionError):
    """An env broke the marlkit env contract; the message lists every failed check."""


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Equal values, element for element, NaN equal to NaN (a simulator that emits NaN is
    reported by the spec checks, not again as a seeding or reset failure)."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if torch.equal(x, y):
        return True
    if not x.is_floating_point():
        return False
    return bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all())


def _outputs_equal(a: TensorDictBase, b: TensorDictBase, keys: list[NestedKey]) -> list[NestedKey]:
    """Keys whose values differ between ``a`` and ``b`` (bit for bit, NaN equal to NaN)."""
    differ = []
    for key in keys:
        x, y = a.get(key, None), b.get(key, None)
        if x is None or y is None or not _same(x, y):
            differ.append(key)
    return differ


def _check_shapes(env: EnvBase, steps: int, failures: list[str]) -> TensorDictBase | None:
    try:
        rollout = env.rollout(steps, break_when_any_done=False)
    except Exception as err:
        failures.append(f"rollout({steps}) raised {type(err).__name__}: {err}")
        return None
    b = tuple(env.batch_size)
    if tuple(rollout.batch_size) != (*b, steps):
        failures.append(f"rollout batch {list(rollout.batch_size)} != {[*b, steps]} ([*B, T])")
    for group, agents in env.group_map.items():
        sub = rollout.get(group, None)
        if not isinstance(sub, TensorDictBase):
            failures.append(f"rollout has no sub-TensorDict for group {group!r}")
            continue
        if tuple(sub.batch_size) != (*b, steps, len(agents)):
            failures.append(
                f"group {group!r} batch {list(sub.batch_size)} != {[*b, steps, len(agents)]}"
            )
    for key in env.reward_keys:
        reward = rollout.get((NEXT, *key_path(key)), None)
        if reward is not None and reward.shape[-1] != 1:
            failures.append(f"reward {key!r} has shape {list(reward.shape)}; it must end with 1")
    for key in DONE_KEYS:
        value = rollout.get((NEXT, key), None)
        if value is not None and tuple(value.shape) != (*b, steps, 1):
            failures.append(f"root {key!r} has shape {list(value.shape)} != {[*b, steps, 1]}")
    return rollout


def _check_done_rules(env: EnvBase, rollout: TensorDictBase, failures: list[str]) -> None:
    nxt = rollout.get(NEXT)
    for prefix, _ in _levels(env):
        done = nxt.get(join_key(prefix, DONE), None)
        parts = [nxt.get(join_key(prefix, k), None) for k in (TERMINATED, TRUNCATED)]
        parts = [p for p in parts if p is not None]
        if done is None or not parts:
            continue
        combined = parts[0] if len(parts) == 1 else parts[0] | parts[1]
        if not torch.equal(done, combined):
            where = prefix or "root"
            failures.append(f"done != terminated | truncated at {where!r}")
    _check_root_against_groups(env, rollout, failures)


def _check_root_against_groups(env: EnvBase, rollout: TensorDictBase, failures: list[str]) -> None:
    """The root flags of every transition follow from the agents' flags (the done rule)."""
    nxt, lead = rollout.get(NEXT), rollout.batch_size
    root = {k: nxt.get(k, None) for k in DONE_KEYS}
    if root[DONE] is None:
        return
    every = cut = None
    for prefix, _ in _levels(env):
        if not prefix:
            continue
        done = nxt.get(join_key(prefix, DONE), None)
        trunc = nxt.get(join_key(prefix, TRUNCATED), None)
        term = nxt.get(join_key(prefix, TERMINATED), None)
        if trunc is not None and term is not None:  # both at once: a termination
            trunc = trunc & ~term
        if done is not None:
            env_done = done.reshape(*lead, -1).all(-1, keepdim=True)
            every = env_done if every is None else every & env_done
        if trunc is not None:
            present = rollout.get(join_key(prefix, MASK), None)  # who acted in the transition
            if present is not None and present.numel() == trunc.numel():
                trunc = trunc & present.reshape(trunc.shape)
            env_cut = trunc.reshape(*lead, -1).any(-1, keepdim=True)
            cut = env_cut if cut is None else cut | env_cut
    if every is None:  # no groups: nothing to compare the root with
        return
    expected = {DONE: every}
    if cut is not None:
        expected[TRUNCATED] = every & cut
        expected[TERMINATED] = every & ~cut
    rules = {
        DONE: "the episode is over exactly when every agent is done",
        TRUNCATED: (
            "truncated when over and an agent present at the end was truncated without terminating"
        ),
        TERMINATED: "terminated = done & ~truncated",
    }
    for key, want in expected.items():
        got = root[key]
        if got is None or torch.equal(got, want):
            continue
        where = (got != want).nonzero()[0].tolist()
        failures.append(
            f"root {key!r} disagrees with the agents' flags at index {where} (env batch, time): "
            f"got {bool(got[tuple(where)])}, the done rule gives {bool(want[tuple(where)])} "
            f"({rules[key]})"
        )


def _levels(env: EnvBase) -> list[tuple[tuple[str, ...], torch.Size]]:
    return env._done_levels()


def _check_reset_not_done(env: EnvBase, failures: list[str]) -> TensorDictBase:
    td = env.reset()
    for key in env.done_keys:
        value = td.get(key, None)
        if value is not None and bool(value.any()):
            failures.append(f"after reset(), {key!r} is already true")
    return td


def _check_seeding(env: EnvBase, steps: int, seed: int, failures: list[str]) -> bool:
    """Two seeded rollouts equal; whether they were (the bad-action check relies on it)."""
    declared = _declared_nondeterminism(env)
    if declared is not None:
        failures.append(
            f"seeding: {declared[0]} does not replay a seed, as its adapter declares: "
            f"{declared[1]}. Not the adapter's fault; pass check_seeding=False for a simulator "
            "that cannot be seeded"
        )
        return False
    runs = []
    for _ in range(2):
        env.set_seed(seed)
        runs.append(env.rollout(steps, break_when_any_done=False))
    keys = [k for k in runs[0].keys(True, True) if k in runs[1].keys(True, True)]
    differ = _outputs_equal(runs[0], runs[1], keys)
    if not differ:
        return True
    message = f"seeding: two rollouts after set_seed({seed}) differ at {differ[:5]}"
    verdict = _simulator_replays(env, seed, steps)
    if verdict is None:  # no raw simulator to ask
        message += "; pass check_seeding=False for a simulator that cannot be seeded"
    elif not verdict[0]:
        message += (
            f"; the simulator itself does not replay under seed={seed}: {verdict[1]}. Not the "
            "adapter's fault; pass check_seeding=False for a simulator that cannot be seeded"
        )
    else:
        message += (
            f", though the simulator itself replays under seed={seed} ({verdict[1]}): the "
            "adapter loses the seed on its way to the simulator (does _set_seed reach the next "
            "reset of every instance?)"
        )
    failures.append(message)
    return False


#: The hook an adapter defines when its simulator speaks none of the protocols ``_raw_run``
#: knows: ``env._replay_simulator(seed, steps)`` runs the raw simulator once (``reset`` with
#: ``seed``, bypassing the adapter's ``set_seed``, then ``steps`` steps of actions that depend on
#: ``seed`` alone) and returns what it showed after the reset and after each step.
_REPLAY_HOOK = "_replay_simulator"


def _replay_of(env: Any) -> tuple[Callable[[int, int], list[Any]], str, str] | None:
    """How to run the raw simulator under ``env`` (or under its transforms' ``base_env``) once,
    and its names in a message (when it differs, when it agrees): ``env._replay_simulator``
    where the adapter defines it (VMAS, MuJoCo, ``from_batched``), else the first of
    ``env.simulators`` (PettingZoo, ``from_parallel``, Gymnasium) or ``env.simulator``, run by
    its protocol (see :func:`_raw_run`); ``None`` when the env shows none."""
    for _ in range(64):  # through nested transforms (bounded: never a hang)
        hook = getattr(env, _REPLAY_HOOK, None)
        if callable(hook):
            name = f"the raw simulator under {type(env).__name__}"
            return _guarded(hook), name, name
        sims = getattr(env, "simulators", None)
        if isinstance(sims, (list, tuple)) and sims:
            name = _class_name(sims[0])
            return _generic(sims[0]), f"its first instance ({name})", name
        sim = getattr(env, "simulator", None)
        if sim is not None and callable(getattr(sim, "reset", None)):
            return _generic(sim), _class_name(sim), _class_name(sim)
        env = getattr(env, "base_env", None)
        if env is None:
            return None
    return None


#: The attribute in which a simulator (or marlkit's shim around one) says why it does not replay
#: a seed: a sentence naming the cause. Where a simulator replays only by chance (MeltingPot: one
#: seed, a few starts), comparing rollouts gives a verdict that changes from run to run; the kit
#: reports the declared cause instead, every time, and its adapter's tests pin the cause.
_NONDETERMINISM = "upstream_nondeterminism"


def _declared_nondeterminism(env: Any) -> tuple[str, str] | None:
    """``(the simulator's name, why it does not replay a seed)`` where the first of
    ``env.simulators`` or ``env.simulator`` (under transforms too) declares it; else ``None``."""
    for _ in range(64):  # through nested transforms (bounded: never a hang)
        sims = getattr(env, "simulators", None)
        sim = (
            sims[0] if isinstance(sims, (list, tuple)) and sims else getattr(env, "simulator", None)
        )
        reason = getattr(sim, _NONDETERMINISM, None) if sim is not None else None
        if isinstance(reason, str) and reason:
            return _class_name(sim), reason
        env = getattr(env, "base_env", None)
        if env is None:
            return None
    return None


def _class_name(sim: Any) -> str:
    """The simulator's class under its wrappers (Gymnasium's ``TimeLimit``, ...), and where
    it comes from: ``"lbforaging.foraging.environment.ForagingEnv of lbforaging 2.0.0"``. A
    class of marlkit's own that subclasses an upstream one names both (``"OpenSpielGame:
    shimmy.openspiel_compatibility.OpenSpielCompatibilityV0 of Shimmy 2.0.1 with marlkit's
    changes"``); one that holds the upstream simulator (its ``upstream_simulator`` attribute)
    names that one inside it (``"_Substrate, marlkit's shim around
    meltingpot.utils.substrates.substrate.Substrate of dm-meltingpot 2.4.1"``)."""
    inner = getattr(sim, "unwrapped", sim)
    cls = type(inner)
    upstream = getattr(inner, "upstream_simulator", None)
    if upstream is not None and _is_marlkit(cls):
        return f"{cls.__name__}, marlkit's shim around {_class_name(upstream)}"
    base = next((c for c in cls.__mro__ if not _is_marlkit(c) and c.__module__ != "builtins"), cls)
    named = f"{base.__module__}.{base.__qualname__}{_origin(base)}"
    if base is cls:
        return named
    return f"{cls.__name__}: {named} with marlkit's changes"


def _is_marlkit(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "marlkit"


def _origin(cls: type) -> str:
    """``" of <distribution> <version>"``: the installed package that provides ``cls``'s
    module; ``""`` for a module no package provides (a script's, a test's)."""
    try:
        for dist in metadata.packages_distributions().get(cls.__module__.split(".")[0], []):
            return f" of {dist} {metadata.version(dist)}"
    except Exception:  # metadata unreadable: the module's path names it well enough
        pass
    return ""


def _generic(sim: Any) -> Callable[[int, int], list[Any]]:
    return lambda seed, steps: _raw_run(sim, seed, steps)


def _guarded(hook: Callable[[int, int], list[Any]]) -> Callable[[int, int], list[Any]]:
    """``hook``, with an exception it raises shown as the end of its run."""

    def run(seed: int, steps: int) -> list[Any]:
        try:
            return list(hook(seed, steps))
        except Exception as err:  # the simulator's own failure: compared like an output
            return [f"raised {type(err).__name__}: {err}"]

    return run


def _simulator_replays(env: EnvBase, seed: int, steps: int) -> tuple[bool, str] | None:
    """Whether the raw simulator under ``env`` replays by itself: two runs of it, each reset with
    ``seed`` then up to ``steps`` steps of the same actions, and ``(replays, what was
    compared)``. ``None`` when there is no simulator to reach, or when only its resets could be
    compared and they agree (its steps may still draw unseeded)."""
    found = _replay_of(env)
    if found is None:
        return None
    replay, differs, agrees = found
    first = replay(seed, steps)
    for run in range(2, _REPLAY_RUNS + 1):
        moment = _first_difference(first, replay(seed, steps))
        if moment is not None:
            if run == 2:
                return False, (
                    f"two runs of {differs}, each reset(seed={seed}) then the same actions, "
                    f"differ {moment}"
                )
            return False, (
                f"{run} runs of {differs}, each reset(seed={seed}) then the same actions: the "
                f"first {run - 1} agree, run {run} differs {moment}"
            )
        if len(first) <= 1:  # only the resets were compared
            return None
    return True, (
        f"{_REPLAY_RUNS} runs of {agrees}, each reset(seed={seed}) then {len(first) - 1} steps "
        "of the same actions, agree"
    )


#: Runs of the raw simulator before the adapter is blamed: some simulators replay a seed only
#: now and then (dm-meltingpot 2.4.1: builds with one env_seed fall into a few starts, which it
#: declares: see _NONDETERMINISM), so two that agree prove little.
_REPLAY_RUNS = 6


def _first_difference(a: list[Any], b: list[Any]) -> str | None:
    """Where two runs of a raw simulator first differ (``"after step 2"``), ``None`` if not."""
    for t in range(max(len(a), len(b))):
        if t >= min(len(a), len(b)) or not _plain_equal(a[t], b[t]):
            return "after its reset" if t == 0 else f"after step {t}"
    return None


def _raw_run(sim: Any, seed: int, steps: int) -> list[Any]:
    """What one run of a raw simulator shows: its reset's observations, then each step's
    outputs (infos left out). Actions come from its own action spaces, each seeded with
    ``seed`` just before its draw, so that two runs act alike. Protocols: PettingZoo parallel
    (``action_space(agent)``, dicts), PettingZoo AEC (``observe``, ``agent_selection``) and
    Gymnasium (an ``action_space`` to sample); any other is compared by its resets alone. An
    exception ends the run and is part of what it shows."""
    trace: list[Any] = []
    try:
        out = sim.reset(seed=seed)
        aec = out is None and callable(getattr(sim, "observe", None))
        if aec:
            trace.append({a: sim.observe(a) for a in sim.agents})
        else:
            trace.append(out[0] if isinstance(out, tuple) and len(out) == 2 else out)
        for _ in range(steps):
            step = _raw_step(sim, seed, aec, trace[-1])
            if step is None:
                break
            trace.append(step[0])
            if step[1]:
                break
    except Exception as err:  # the simulator's own failure: compared like an output
        trace.append(f"raised {type(err).__name__}: {err}")
    return trace


def _drawn(space: Any, seed: int, observation: Any = None) -> Any:
    """A draw from a Gymnasium space seeded now, so the same in every run; a legal one where
    the observation is a dict with an ``"action_mask"`` (PettingZoo's convention)."""
    mask = observation.get("action_mask") if isinstance(observation, Mapping) else None
    if mask is not None:
        try:
            space.seed(seed)
            return space.sample(mask=np.asarray(mask, dtype=np.int8))
        except Exception:  # a space that takes no mask: any action, as below
            pass
    space.seed(seed)
    return space.sample()


def _raw_step(sim: Any, seed: int, aec: bool, shown: Any) -> tuple[Any, bool] | None:
    """One step of the raw simulator with seeded draws from its action spaces (``shown``: what
    it showed last): what it shows now and whether its episode is over, or ``None`` when it
    cannot step (no action spaces, no agent left)."""
    space_of = getattr(sim, "action_space", None)
    if aec:
        agent = getattr(sim, "agent_selection", None)
        if not sim.agents or agent is None or not callable(space_of):
            return None
        over = sim.terminations.get(agent) or sim.truncations.get(agent)
        sim.step(None if over else _drawn(space_of(agent), seed, sim.observe(agent)))
        return ({a: sim.observe(a) for a in sim.agents}, dict(sim.rewards)), not sim.agents
    if callable(space_of):  # PettingZoo parallel: one action per agent in the game
        agents = list(getattr(sim, "agents", None) or [])
        if not agents:
            return None
        last = shown[0] if isinstance(shown, tuple) else shown  # a step's or the reset's
        seen = last if isinstance(last, Mapping) else {}
        out = sim.step({a: _drawn(space_of(a), seed, seen.get(a)) for a in agents})
        return _without_infos(out), not getattr(sim, "agents", agents)
    if callable(getattr(space_of, "sample", None)):  # Gymnasium (a vector env resets itself)
        out = sim.step(_drawn(space_of, seed))
        ended = isinstance(out, tuple) and len(out) == 5 and bool(np.all(out[2] | out[3]))
        return _without_infos(out), ended
    return None


def _without_infos(out: Any) -> Any:
    return out[:4] if isinstance(out, tuple) and len(out) == 5 else out


def _plain_equal(a: Any, b: Any) -> bool:
    """Equal simulator outputs: dicts, sequences, arrays and numbers, NaN equal to NaN."""
    if isinstance(a, Mapping):
        return (
            isinstance(b, Mapping)
            and a.keys() == b.keys()
            and all(_plain_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_plain_equal(x, y) for x, y in zip(a, b))
        )
    if isinstance(a, (np.ndarray, np.generic, numbers.Number, torch.Tensor)):
        if isinstance(b, torch.Tensor):
            b = b.detach().cpu().numpy()
        x = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        y = np.asarray(b)
        if x.shape != y.shape or x.dtype.kind != y.dtype.kind:
            return False
        return bool(np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"))
    try:
        return bool(a == b)
    except Exception:  # an object without a usable ==: not evidence either way
        return True


def _check_partial_reset(env: EnvBase, failures: list[str]) -> None:
    n = env.batch_size.numel()
    if n < 2 or not env.batch_size:
        return
    first = root = env.reset()
    ended = False  # env 0 finished (and was reset) during the steps
    for _ in range(3):  # the root after step_and_maybe_reset is the env's current state
        td, root = env.step_and_maybe_reset(env.rand_action(root))
        done = _env0(env, td.get(("next", "done"), None))
        ended = ended or (done is not None and bool(done.any()))
    mask = torch.zeros(*env.batch_size, 1, dtype=torch.bool, device=env.device)
    mask.view(-1)[0] = True
    root.set(RESET, mask)
    out = env.reset(root)
    keep = ~mask.squeeze(-1)
    for key in env.observation_keys:
        before, after = root.get(key, None), out.get(key, None)
        if before is None or after is None:
            continue
        if not _same(before[keep], after[keep]):
            failures.append(f"partial reset of env 0 changed {key!r} in envs that were not reset")
    for key in env.done_keys:
        value = out.get(key, None)
        if value is not None and bool(value[~keep].any()):
            failures.append(f"partial reset: {key!r} still true in the env that was reset")
    if not ended:
        _check_env0_restarted(env, first, root, out, failures)


def _env0(env: EnvBase, value: torch.Tensor | None) -> torch.Tensor | None:
    """The first env's part of ``value`` (the env's batch dims flattened)."""
    if value is None:
        return None
    return value.reshape(env.batch_size.numel(), *value.shape[len(env.batch_size) :])[0]


def _check_env0_restarted(
    env: EnvBase,
    first: TensorDictBase,
    before: TensorDictBase,
    after: TensorDictBase,
    failures: list[str],
) -> None:
    """A simulator that ignores the reset mask: env 0's observations that the steps changed are,
    after its partial reset, still what the steps made them."""
    moved = []
    for key in env.observation_keys:
        start, now, reset = (_env0(env, td.get(key, None)) for td in (first, before, after))
        if start is not None and now is not None and reset is not None and not _same(start, now):
            moved.append(_same(now, reset))
    if moved and all(moved):
        failures.append(
            "partial reset of env 0 left its observations as its steps had made them: the "
            "simulator seems to ignore the reset mask (env_mask / _reset)"
        )


def _bad_values(spec: TensorSpec) -> list[tuple[str, torch.Tensor]]:
    good = spec.zero()
    # A wrong trailing shape: the batch dims must stay, or the TensorDict itself refuses it.
    bad = [("a wrong shape", good.unsqueeze(-1))]
    if good.is_floating_point():
        bad.append(("NaN", torch.full_like(good, float("nan"))))
    if isinstance(spec, Bounded):
        bad.append(("an out-of-bounds value", spec.high + (spec.high - spec.low).abs() + 1))
    if isinstance(spec, Categorical) and spec.dtype != torch.bool:
        bad.append(("an out-of-range class", torch.full_like(good, spec.n)))
    if isinstance(spec, MultiCategorical):
        bad.append(("an out-of-range class", spec.nvec.expand(good.shape).to(good.dtype)))
    if isinstance(spec, OneHot):
        bad.append(("a vector with two ones", torch.ones_like(good)))
    wrong = torch.float64 if good.dtype != torch.float64 else torch.int64
    bad.append(("a wrong dtype", good.to(wrong)))
    return bad


def _check_bad_actions(env: EnvBase, seed: int, seeded: bool, failures: list[str]) -> None:
    if not env.validate_actions:
        failures.append("validate_actions is off: bad actions would reach the simulator")
        return
    env.set_seed(seed)
    td = env.rand_action(env.reset())
    good = td.clone()
    reference = env.step(good.clone()).get(NEXT) if seeded else None
    env.set_seed(seed)
    td = env.rand_action(env.reset())
    for key, spec, _ in env._action_items():
        for what, value in [("a missing key", None), *_bad_values(spec)]:
            bad = td.clone().exclude(key)
            if value is not None:
                bad.set(key, value)
            try:
                env.step(bad)
            except ValueError:
                continue
            except Exception as err:
                failures.append(
                    f"bad action ({what}) at {key!r} raised {type(err).__name__}, not "
                    f"ValueError: {err}"
                )
                continue
            failures.append(f"bad action ({what}) at {key!r} was accepted")
            return  # the env state moved on: later comparisons would mislead
    if reference is not None:
        after = env.step(good).get(NEXT)
        differ = _outputs_equal(reference, after, env.observation_keys + env.reward_keys)
        if differ:
            failures.append(f"a rejected bad action changed the env's state: {differ[:5]} differ")


def _same_actions(env: EnvBase, td: TensorDictBase) -> TensorDictBase:
    """The same action for every instance: the spec's zero, or the first legal class where the
    env masks actions (so no instance diverges because of its action)."""
    for key, spec, mask_key in env._action_items():
        value = spec.zero()
        mask = td.get(mask_key, None) if mask_key is not None else None
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            first = mask.to(torch.int8).argmax(-1)
            if isinstance(spec, OneHot):
                value = torch.nn.functional.one_hot(first, spec.n).to(spec.dtype)
            else:
                value = first.to(spec.dtype)
        td.set(key, value)
    return td


def _instance_trace(env: EnvBase, steps: int) -> torch.Tensor:
    """``[N, F]``: each instance's observations after a reset and ``steps`` steps of the same
    actions for all (stopping at the first done or at an error), flattened."""
    n = env.batch_size.numel()
    keys = env.observation_keys
    td = env.reset()
    rows = []

    def record(source: TensorDictBase) -> None:
        for key in keys:
            value = source.get(key, None)
            if isinstance(value, torch.Tensor):
                rows.append(value.detach().reshape(n, -1).to(torch.float64).nan_to_num())

    record(td)
    for _ in range(steps):
        try:
            td = env.step(_same_actions(env, td))
        except Exception:  # the env refuses a zero action: the reset is the trace
            break
        record(td.get(NEXT))
        if bool(td.get((NEXT, DONE)).any()):
            break
        td = env._step_mdp(td)
    return torch.cat(rows, -1) if rows else torch.zeros(n, 0, dtype=torch.float64)


def _check_distinct_instances(env: EnvBase, steps: int, seed: int, failures: list[str]) -> None:
    """Where two seeds give two traces (a stochastic simulator), the instances of one batch
    must not repeat one another (what colliding per-instance seeds produce)."""
    n = env.batch_size.numel()
    if n < 2:
        return
    traces = []
    for s in (seed, seed + 7919):
        env.set_seed(s)
        traces.append(_instance_trace(env, steps))
    if traces[0].shape == traces[1].shape and torch.equal(traces[0], traces[1]):
        return  # the trace does not depend on the seed: identical instances are legitimate
    _, inverse, counts = torch.unique(traces[0], dim=0, return_inverse=True, return_counts=True)
    if bool((counts == 1).all()):
        return
    twin = int((counts > 1).nonzero()[0])
    same = (inverse == twin).nonzero().reshape(-1)[:2].tolist()
    where = [[int(i) for i in torch.unravel_index(torch.tensor(k), env.batch_size)] for k in same]
    failures.append(
        f"instances {where[0]} and {where[1]} of the batch replay one another after "
        f"set_seed({seed}): the same observations under the same actions, though the simulator "
        "depends on its seed; give every instance its own seed (seed + i) and return the next "
        "unused seed from _set_seed"
    )


def _check_render(env: EnvBase, failures: list[str]) -> None:
    if "rgb_array" not in env.render_modes:
        return
    try:
        env.reset()
        frame = env.render(0)
    except Exception as err:
        failures.append(f"render() raised {type(err).__name__}: {err}")
        return
    if frame.dtype.name != "uint8" or frame.ndim != 3 or frame.shape[-1] != 3:
        failures.append(f"render() gave {frame.dtype} {list(frame.shape)}, not uint8 [H, W, 3]")


def check_adapter(
    env: EnvBase,
    *,
    steps: int = 8,
    seed: int = 0,
    check_seeding: bool = True,
    check_instances: bool = True,
    check_partial_reset: bool = True,
    check_render: bool = True,
    extra_checks: list[Callable[[EnvBase], list[str]]] | None = None,
) -> None:
    """Check ``env`` against the marlkit env contract (see the module docstring).

    Args:
        env: the env to check (it is reset and stepped; its state afterwards is arbitrary).
        steps: rollout length of each check.
        seed: the seed used by the seeded checks.
        check_seeding: compare two seeded rollouts bit for bit (where the simulator declares
            why it cannot replay a seed, ``upstream_nondeterminism``: report that instead).
        check_instances: check that the instances of a batch do not replay one another.
        check_partial_reset: reset env 0 alone, compare the others and check it restarted.
        check_render: render a frame when ``"rgb_array"`` is declared.
        extra_checks: callables returning failure messages, run last.

    Raises:
        AdapterCheckError: listing every failed check.
    """
    failures: list[str] = []
    failures += [f"specs: {p}" for p in spec_problems(env, steps=steps, seed=seed)]
    _check_reset_not_done(env, failures)
    rollout = _check_shapes(env, steps, failures)
    if rollout is not None:
        _check_done_rules(env, rollout, failures)
    seeded = check_seeding and _check_seeding(env, steps, seed, failures)
    if check_instances:
        _check_distinct_instances(env, steps, seed, failures)
    if check_partial_reset:
        _check_partial_reset(env, failures)
    # Whether a rejected action left the state alone is told by replaying a seeded step: not
    # where seeding failed (that failure is reported already, and would be reported twice).
    _check_bad_actions(env, seed, seeded, failures)
    if check_render:
        _check_render(env, failures)
    for extra in extra_checks or []:
        failures += extra(env)
    if failures:
        listing = "\n  - ".join(failures)
        raise AdapterCheckError(f"{env!r} failed {len(failures)} check(s):\n  - {listing}")
