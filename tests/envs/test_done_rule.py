"""The done rule, decided in one place (EnvBase) for every simulator: per agent done =
terminated | truncated; the root is done when every agent is (or the simulator ends the episode,
truncating whoever was not done); root truncated when an agent present at the end was
truncated without terminating; root terminated = done & ~truncated."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import marlkit
from marlkit.adapters.pettingzoo import PettingZooEnv
from marlkit.data import Composite, Unbounded
from marlkit.envs import EnvBase, StepCounter, TransformedEnv, make_done_spec, make_reward_spec
from marlkit.testing import AdapterCheckError, check_adapter

pettingzoo = pytest.importorskip("pettingzoo")
gymnasium = pytest.importorskip("gymnasium")


class _Scripted(pettingzoo.ParallelEnv):
    """A PettingZoo parallel env whose agents end as a script says: ``{agent: (t, how, leaves)}``
    ends ``agent`` at step ``t`` by ``how`` ("terminated" or "truncated"), removing it from
    ``agents`` when ``leaves``. Observations count the steps."""

    metadata = {"name": "scripted_v0"}

    def __init__(self, script: dict[str, tuple[int, str, bool]]):
        self.possible_agents = ["a", "b"]
        self.script = script
        self._spaces = gymnasium.spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def observation_space(self, agent: str) -> Any:
        return self._spaces

    def action_space(self, agent: str) -> Any:
        return gymnasium.spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: np.zeros(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        self.t += 1
        obs = {a: np.full(1, self.t, np.float32) for a in self.agents}
        rewards = dict.fromkeys(self.agents, 1.0)
        terms, truncs = dict.fromkeys(self.agents, False), dict.fromkeys(self.agents, False)
        for agent in list(self.agents):
            when, how, leaves = self.script.get(agent, (-1, "", False))
            if when == self.t:
                (terms if how == "terminated" else truncs)[agent] = True
                if leaves:
                    self.agents.remove(agent)
        return obs, rewards, terms, truncs, {a: {} for a in obs}


def _flags(script: dict[str, tuple[int, str, bool]], steps: int) -> dict[str, list[bool]]:
    env = PettingZooEnv(functools.partial(_Scripted, script))
    out = env.rollout(steps)
    return {k: out["next", k][0, :, 0].tolist() for k in ("done", "terminated", "truncated")}


def test_truncated_agents_that_stay_listed_truncate_the_episode() -> None:
    # The regression: a time limit at t = 3 that keeps the agents in `agents` was reported as a
    # termination, so a trainer would not have bootstrapped.
    script = {a: (3, "truncated", False) for a in ("a", "b")}
    flags = _flags(script, 3)
    assert flags["done"] == [False, False, True]
    assert flags["truncated"] == [False, False, True]
    assert flags["terminated"] == [False, False, False]
    env = PettingZooEnv(functools.partial(_Scripted, script))
    out = env.rollout(3)
    assert out["next", "agents", "truncated"][0, -1].all()
    assert not out["next", "agents", "terminated"].any()
    check_adapter(env, steps=7)  # the kit agrees: root and groups are consistent


@pytest.mark.parametrize("leaves", [True, False])
def test_terminated_agents_terminate_the_episode(leaves: bool) -> None:
    flags = _flags({a: (2, "terminated", leaves) for a in ("a", "b")}, 2)
    assert flags == {
        "done": [False, True],
        "terminated": [False, True],
        "truncated": [False, False],
    }


def test_an_agent_truncated_at_the_end_makes_the_episode_truncated() -> None:
    # a terminates and leaves at t = 2; b, still present, is truncated at t = 4
    flags = _flags({"a": (2, "terminated", True), "b": (4, "truncated", True)}, 4)
    assert flags["done"] == [False, False, False, True]
    assert flags["truncated"][-1] and not flags["terminated"][-1]


def test_an_agent_truncated_earlier_does_not_truncate_the_end() -> None:
    # a is truncated and leaves at t = 1 (its flag stays set while it is absent); b, the only one
    # present at the end, terminates at t = 3: the episode terminated.
    env = PettingZooEnv(
        functools.partial(_Scripted, {"a": (1, "truncated", True), "b": (3, "terminated", True)})
    )
    out = env.rollout(3)
    assert out["next", "agents", "truncated"][0, -1, 0, 0]  # a's flag, carried
    assert out["next", "terminated"][0, :, 0].tolist() == [False, False, True]
    assert not out["next", "truncated"].any()


def test_mpe_time_limit_is_a_truncation() -> None:
    env = marlkit.make("pettingzoo/mpe2.simple_spread_v3", N=2, max_cycles=3, num_envs=2, seed=0)
    out = env.rollout(3)
    assert out["next", "truncated"][:, :, 0].tolist() == [[False, False, True]] * 2
    assert not out["next", "terminated"].any()


def test_root_only_flags_are_expanded_to_every_agent() -> None:
    env = marlkit.make("vmas/navigation", num_envs=3, n_agents=2, max_steps=3, seed=0)
    out = env.rollout(3)
    assert out["next", "agents", "truncated"][:, -1].all()
    assert not out["next", "agents", "truncated"][:, :-1].any()
    assert out["next", "truncated"][:, -1].all() and not out["next", "terminated"].any()
    assert torch.equal(
        out["next", "agents", "done"],
        out["next", "agents", "terminated"] | out["next", "agents", "truncated"],
    )


@pytest.mark.parametrize("plain_keys", [False, True])
def test_gymnasium_time_limit_is_a_truncation(plain_keys: bool) -> None:
    env = marlkit.make("gymnasium/CartPole-v1", max_episode_steps=4, plain_keys=plain_keys)
    td = env.reset()
    for t in range(4):
        td = env.rand_action(td)
        td["action" if plain_keys else ("agents", "action")] = torch.zeros_like(
            td["action" if plain_keys else ("agents", "action")]
        )  # push left four times: the pole does not fall yet
        td = env.step(td)
        nxt = td["next"]
        assert bool(nxt["truncated"]) == (t == 3) == bool(nxt["done"])
        assert not nxt["terminated"].any()
        if not plain_keys:
            assert bool(nxt["agents", "truncated"]) == (t == 3)
        td = env._step_mdp(td)


def _group(**leaves: Unbounded) -> Composite:
    (spec,) = leaves.values()
    return Composite(leaves, shape=spec.shape[:2])


class _EndsEarly(EnvBase):
    """Two groups; the simulator ends the episode (root ``done``) at step 2 although only group
    ``a`` has terminated; or, with ``root_only``, reports nothing but root ``done``."""

    def __init__(self, root_only: bool = False):
        super().__init__(batch_size=(2,))
        self.root_only = root_only
        self.group_map = {"a": ["a_0"], "b": ["b_0", "b_1"]}
        sizes = {"a": 1, "b": 2}
        self.observation_spec = Composite(
            {
                g: Composite(observation=Unbounded((2, n, 1)), shape=(2, n))
                for g, n in sizes.items()
            },
            shape=(2,),
        )
        self.action_spec = Composite(
            {g: Composite(action=Unbounded((2, n, 1)), shape=(2, n)) for g, n in sizes.items()},
            shape=(2,),
        )
        self.reward_spec = make_reward_spec((2,), sizes)
        self.done_spec = make_done_spec((2,), sizes)
        self.t = 0

    def _obs(self) -> TensorDict:
        return TensorDict(
            {
                "a": TensorDict({"observation": torch.full((2, 1, 1), float(self.t))}, (2, 1)),
                "b": TensorDict({"observation": torch.full((2, 2, 1), float(self.t))}, (2, 2)),
            },
            (2,),
        )

    def _reset(self, tensordict, env_mask):  # type: ignore[no-untyped-def]
        self.t = 0
        return self._obs()

    def _step(self, tensordict):  # type: ignore[no-untyped-def]
        self.t += 1
        out = self._obs()
        over = torch.full((2, 1), self.t == 2)
        out["a", "reward"] = torch.zeros(2, 1, 1)
        out["b", "reward"] = torch.zeros(2, 2, 1)
        if self.root_only:
            out["done"] = over
        else:
            out["a", "terminated"] = over.reshape(2, 1, 1)
            out["b", "terminated"] = torch.zeros(2, 2, 1, dtype=torch.bool)
            out["done"] = over  # the simulator ends the episode for b too
        return out

    def _set_seed(self, seed: int) -> None:
        pass


def test_an_episode_ended_by_the_simulator_truncates_the_agents_not_done() -> None:
    out = _EndsEarly().rollout(2)["next"]
    assert out["a", "terminated"][:, -1].all() and not out["a", "truncated"].any()
    assert out["b", "truncated"][:, -1].all() and not out["b", "terminated"].any()
    assert out["b", "done"][:, -1].all()
    assert out["done"][:, -1].all() and out["truncated"][:, -1].all()
    assert not out["terminated"].any()


def test_a_root_done_alone_terminates_every_agent() -> None:
    out = _EndsEarly(root_only=True).rollout(2)["next"]
    for g in ("a", "b"):
        assert out[g, "terminated"][:, -1].all() and not out[g, "truncated"].any()
    assert out["terminated"][:, -1].all() and not out["truncated"].any()


def test_a_time_limit_on_a_terminating_step_is_a_truncation() -> None:
    # a: terminated and truncated at once (a termination); b, cut short by the simulator and the
    # limit, is truncated only: the episode counts as truncated, and value targets bootstrap
    # per agent through the agents' own flags.
    env = TransformedEnv(_EndsEarly(), StepCounter(max_steps=2))
    out = env.rollout(2)["next"]
    assert out["a", "terminated"][:, -1].all() and out["a", "truncated"][:, -1].all()
    assert out["truncated"][:, -1].all() and not out["terminated"].any()


class _EndsBoth(gymnasium.Env):
    """A Gymnasium env whose second step is terminated and truncated at once (a pole that falls
    on the time limit's step); with ``limit=False`` it only terminates, at step 3."""

    observation_space = gymnasium.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, limit: bool = True):
        self.limit = limit

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        end = self.t >= (2 if self.limit else 3)
        return np.zeros(1, np.float32), 1.0, end, end and self.limit, {}


@pytest.mark.parametrize("plain_keys", [True, False])
def test_terminated_and_truncated_at_once_is_a_termination(plain_keys: bool) -> None:
    # Gymnasium lets both be true; the state is terminal, so nothing may bootstrap from it.
    from marlkit.adapters.gymnasium import GymnasiumEnv

    out = GymnasiumEnv(_EndsBoth(), plain_keys=plain_keys, seed=0).rollout(2)["next"]
    assert out["terminated"][-1].all() and out["done"][-1].all()
    assert not out["truncated"].any()
    if not plain_keys:  # the agent keeps both flags as the simulator gave them
        assert out["agents", "terminated"][-1].all() and out["agents", "truncated"][-1].all()
    # StepCounter's limit on the step the simulator terminates: a termination too
    env = TransformedEnv(
        GymnasiumEnv(_EndsBoth(limit=False), plain_keys=plain_keys, seed=0), StepCounter(3)
    )
    out = env.rollout(3)["next"]
    assert out["terminated"][-1].all() and not out["truncated"].any()


def test_a_step_without_any_done_flag_is_an_error() -> None:
    class _Silent(_EndsEarly):
        def _step(self, tensordict):  # type: ignore[no-untyped-def]
            out = self._obs()
            out["a", "reward"] = torch.zeros(2, 1, 1)
            out["b", "reward"] = torch.zeros(2, 2, 1)
            return out

    env = _Silent()
    with pytest.raises(KeyError, match="no terminated, truncated or done flag under 'a'"):
        env.step(env.rand_action(env.reset()))


def test_the_kit_reports_root_flags_that_disagree_with_the_agents() -> None:
    class _Inconsistent(type(marlkit.make("navigation"))):  # type: ignore[misc]
        def step(self, tensordict):  # type: ignore[no-untyped-def]
            out = super().step(tensordict)
            out["next", "done"] = torch.ones_like(out["next", "done"])  # bypasses the rule
            return out

    env = _Inconsistent(num_envs=2, n_agents=2, seed=0)
    with pytest.raises(AdapterCheckError, match=r"root 'done' disagrees with the agents' flags"):
        check_adapter(env, steps=3)


def _reference_rule(
    flags: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], ended: torch.Tensor | None
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], tuple[bool, ...]]:
    """The rule as a plain loop over envs and agents: ``flags[g] = (term, trunc, present)``."""
    envs = next(iter(flags.values()))[0].shape[0]
    groups = {g: [t.clone(), u.clone()] for g, (t, u, _) in flags.items()}
    roots = []
    for e in range(envs):
        every = all(
            bool(t[e, i, 0] or u[e, i, 0]) for t, u in groups.values() for i in range(len(t[e]))
        )
        over = every or (ended is not None and bool(ended[e, 0]))
        if over and not every:  # cut short by the simulator: the agents not done are truncated
            for t, u in groups.values():
                for i in range(len(t[e])):
                    u[e, i, 0] = u[e, i, 0] or not t[e, i, 0]
        cut = any(  # present, truncated and not terminated (both at once: terminated)
            bool(groups[g][1][e, i, 0] and not groups[g][0][e, i, 0] and flags[g][2][e, i])
            for g in groups
            for i in range(len(groups[g][1][e]))
        )
        roots.append((over, over and cut, over and not cut))
    return {g: (t, u) for g, (t, u) in groups.items()}, tuple(roots)


@pytest.mark.parametrize("host", [True, False])
@pytest.mark.parametrize("seed", range(40))  # some draw both flags for a present agent
def test_the_rule_matches_a_plain_loop_on_random_flags(host: bool, seed: int) -> None:
    # The NumPy path (CPU envs) and the torch path (other devices) against a plain loop.
    from marlkit.envs._done_rule import apply_done_rule, make_done_plan

    gen = torch.Generator().manual_seed(seed)
    env = _EndsEarly()
    device = torch.device("cpu" if host else "meta")  # "meta" only picks the torch path
    observed = env.observation_spec.clone()
    for g, n in (("a", 1), ("b", 2)):  # groups that say who is present
        observed[g, "mask"] = Unbounded((2, n), dtype=torch.bool)
    plan = make_done_plan(env.done_spec, observed, env.batch_size, device)
    assert plan.ops.host is host

    def bits(*shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=gen) < 0.3

    flags = {
        g: (bits(2, n, 1), bits(2, n, 1), bits(2, n) | (seed % 2 == 0))
        for g, n in (("a", 1), ("b", 2))
    }
    ended = bits(2, 1) if seed >= 3 else None
    out = TensorDict(
        {
            g: TensorDict({"terminated": t, "truncated": u}, (2, t.shape[1]))
            for g, (t, u, _) in flags.items()
        },
        (2,),
    )
    if ended is not None:
        out["done"] = ended
    step_input = TensorDict(
        {g: TensorDict({"mask": p}, (2, p.shape[1])) for g, (_, _, p) in flags.items()}, (2,)
    )
    apply_done_rule(plan, out, step_input)
    groups, roots = _reference_rule(flags, ended)
    for g, (t, u) in groups.items():
        assert torch.equal(out[g, "terminated"], t) and torch.equal(out[g, "truncated"], u), g
        assert torch.equal(out[g, "done"], t | u), g
    for e, (done, truncated, terminated) in enumerate(roots):
        assert (bool(out["done"][e]), bool(out["truncated"][e]), bool(out["terminated"][e])) == (
            done,
            truncated,
            terminated,
        )


@pytest.mark.parametrize("seed", range(6))
def test_the_root_only_shortcut_is_the_general_rule(seed: int) -> None:
    # Simulators that decide whole envs (terminated and truncated at the root only, no group
    # "mask") take a shortcut on the CPU: the same flags as the general path, both at once too.
    import dataclasses

    from marlkit.envs._done_rule import apply_done_rule, make_done_plan

    env = _EndsEarly()
    plan = make_done_plan(env.done_spec, env.observation_spec, env.batch_size, env.device)
    assert plan.root_shortcut
    general = dataclasses.replace(plan, root_shortcut=False)
    gen = torch.Generator().manual_seed(seed)
    term, trunc = (torch.rand(2, 1, generator=gen) < 0.5 for _ in range(2))
    outs = []
    for used in (plan, general):
        out = TensorDict({"terminated": term.clone(), "truncated": trunc.clone()}, (2,))
        out["a"] = TensorDict({"reward": torch.zeros(2, 1, 1)}, (2, 1))  # a group without flags
        apply_done_rule(used, out, None)
        outs.append(out)
    assert set(outs[0].keys(True, True)) == set(outs[1].keys(True, True))
    for key in outs[1].keys(True, True):
        assert torch.equal(outs[0][key], outs[1][key]), key
    assert torch.equal(outs[0]["b", "truncated"], trunc[:, None].expand(2, 2, 1))
    assert torch.equal(outs[0]["truncated"], trunc & ~term)


def test_the_shortcut_keeps_the_steps_own_root_flags_only_where_they_are_the_rules() -> None:
    # Root terminated and truncated that no env has both are the rule's own: the step's fresh
    # tensors stay; views (of a simulator's buffer, say) and flags set both at once do not.
    from marlkit.envs._done_rule import apply_done_rule, make_done_plan

    env = _EndsEarly()
    plan = make_done_plan(env.done_spec, env.observation_spec, env.batch_size, env.device)
    cases = [
        (torch.tensor([[True], [False]]), torch.tensor([[False], [True]]), True),
        (torch.tensor([True, False])[:, None], torch.tensor([[False], [True]]), False),  # view
        (torch.tensor([[True], [False]]), torch.tensor([[True], [True]]), False),  # both at once
    ]
    for term, trunc, kept in cases:
        out = TensorDict({"terminated": term, "truncated": trunc}, (2,))
        apply_done_rule(plan, out, None)
        assert (out["terminated"] is term and out["truncated"] is trunc) == kept
        assert torch.equal(out["terminated"], term) and torch.equal(out["truncated"], trunc & ~term)
        assert torch.equal(out["done"], term | trunc)


class _DoneOnly(EnvBase):
    """One group of two agents that declares only "done" (its terminations, by the done rule):
    agent i ends when its position passes 2 (actions add to it); with ``truncated``, the group
    also declares and reports "truncated" (always false)."""

    def __init__(self, truncated: bool = False):
        super().__init__(batch_size=(2,))
        self.group_map = {"agents": ["a0", "a1"]}
        b = (2,)
        self.observation_spec = Composite(agents=_group(observation=Unbounded((*b, 2, 1))), shape=b)
        self.action_spec = Composite(agents=_group(action=Unbounded((*b, 2, 1))), shape=b)
        self.reward_spec = make_reward_spec(b, {"agents": 2})
        keys = ("done", "truncated") if truncated else ("done",)
        self.done_spec = make_done_spec(b, {"agents": 2}, keys=keys)
        self.truncated = truncated
        self.x = torch.zeros(2, 2, 1)

    def _reset(self, tensordict, env_mask):  # type: ignore[no-untyped-def]
        if env_mask is None:
            self.x.zero_()
        else:
            self.x[env_mask] = 0
        return TensorDict({"agents": {"observation": self.x.clone()}}, (2,))

    def _step(self, tensordict):  # type: ignore[no-untyped-def]
        self.x = self.x + tensordict["agents", "action"]
        agents = {"observation": self.x.clone(), "reward": torch.zeros(2, 2, 1)}
        agents["done"] = self.x > 2
        if self.truncated:  # never a truncation here
            agents["truncated"] = torch.zeros(2, 2, 1, dtype=torch.bool)
        return TensorDict({"agents": agents}, (2,))

    def _set_seed(self, seed: int) -> None:
        pass


def _moves(*per_agent: float):  # type: ignore[no-untyped-def]
    step = torch.tensor(per_agent).reshape(1, 2, 1).expand(2, 2, 1)
    return lambda td: td.set(("agents", "action"), step.clone())


@pytest.mark.parametrize("limit", [None, 10, 3])
def test_a_done_only_group_keeps_its_terminations_under_a_step_counter(limit) -> None:
    # The regression: StepCounter added "truncated" beside "done", and the rule then read the
    # missing "terminated" as false: the simulator's done flags vanished, or came out as
    # truncations. limit=3 ends both agents on the limit's step: a termination.
    env = TransformedEnv(_DoneOnly(), StepCounter(limit))
    out = env.rollout(4, _moves(1.0, 0.0), break_when_any_done=False)["next"]
    done = out["agents", "done"][0, :3, :, 0].tolist()
    assert done[:2] == [[False, False], [False, False]] and done[2][0]  # agent 0 at step 3
    assert not out["agents", "truncated"][:, :3, 0].any()  # a termination, not a truncation
    if limit == 3:  # the limit truncates agent 1 at step 3: the episode is cut short
        assert out["agents", "truncated"][:, 2, 1].all() and out["truncated"][:, 2].all()
    else:
        assert not out["done"][:, :3].any() and not done[2][1]  # agent 1 still playing
    out = env.rollout(3, _moves(1.0, 1.0), break_when_any_done=False)["next"]
    assert out["done"][:, 2].all() and not out["truncated"].any()  # every agent terminated
    assert not out["agents", "truncated"].any()


def test_done_without_terminated_is_a_termination_where_it_is_not_a_truncation() -> None:
    env = _DoneOnly(truncated=True)  # done and truncated, no terminated: done is terminations
    out = env.rollout(3, _moves(1.0, 1.0))["next"]
    assert out["agents", "done"][:, 2].all() and not out["agents", "truncated"].any()
    assert out["done"][:, 2].all() and not out["truncated"].any()
