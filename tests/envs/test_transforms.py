"""Transforms and ``TransformedEnv``: each transform's data, the specs it changes (checked with
``check_env_specs``), partial resets, composition order and bad arguments."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

import marlkit
from marlkit.data.composite import Composite
from marlkit.data.specs import Bounded, Categorical, Unbounded
from marlkit.envs import (
    CommonReward,
    Compose,
    DoubleToFloat,
    EnvBase,
    EnvSpecs,
    ExcludeKeys,
    InitTracker,
    InvalidActionError,
    MissingActionError,
    RenameKeys,
    RewardSum,
    StepCounter,
    Transform,
    TransformedEnv,
    TruncationAsTermination,
    check_env_specs,
)

ACT = ("agents", "action")
OBS = ("agents", "observation")
GROUPS = {"a": 1, "b": 2}


def _push(value: float = 1.0):
    """A policy writing ``value`` into every action of the env, in the spec's dtype."""

    def policy(td: TensorDictBase, env: EnvBase) -> TensorDictBase:
        for key in env.action_keys:
            spec = env.action_spec[key]
            td.set(key, torch.full(spec.shape, value, dtype=spec.dtype))
        return td

    return policy


def _rollout_push(env: EnvBase, steps: int, value: float = 1.0) -> TensorDictBase:
    push = _push(value)
    return env.rollout(steps, lambda td: push(td, env), break_when_any_done=False)


def _advance(env: EnvBase, steps: int) -> TensorDictBase:
    td = env.reset()
    for _ in range(steps):
        _, td = env.step_and_maybe_reset(env.rand_action(td))
    return td


def _done_levels(env: EnvBase) -> list[tuple[str, ...]]:
    return [()] + [(g,) for g in env.groups]


# --------------------------------------------------------------------------- StepCounter


def test_step_counter_specs_add_truncated_where_missing(point_mass_cls):
    base = point_mass_cls(num_envs=3, groups=GROUPS)
    assert "truncated" not in base.done_spec.keys(True)
    env = TransformedEnv(base, StepCounter(max_steps=4))
    # Not capped at max_steps: a manual loop that ignores done keeps counting.
    high = torch.iinfo(torch.int64).max
    assert env.observation_spec["step_count"] == Bounded(0, high, (3, 1), dtype=torch.int64)
    assert env.done_spec["truncated"] == Categorical(2, (3, 1), dtype=torch.bool)
    for g, n in GROUPS.items():
        assert env.done_spec[g, "truncated"] == Categorical(2, (3, n, 1), dtype=torch.bool)
    assert "truncated" not in base.done_spec.keys(True)  # the inner env's specs are untouched
    check_env_specs(env, steps=10)


def test_step_counter_truncates_at_every_done_level(nav):
    env = TransformedEnv(nav(num_envs=3, n_agents=3, group_map="per_agent"), StepCounter(4))
    r = env.rollout(20)
    assert r.batch_size == torch.Size([3, 4])
    assert torch.equal(r.get("step_count")[0, :, 0], torch.arange(4))
    assert torch.equal(r.get(("next", "step_count"))[0, :, 0], torch.arange(1, 5))
    for prefix in _done_levels(env):
        trunc = r.get(("next", *prefix, "truncated"))
        done = r.get(("next", *prefix, "done"))
        assert trunc[:, -1].all() and done[:, -1].all(), prefix
        assert not trunc[:, :-1].any() and not done[:, :-1].any(), prefix
        assert not r.get(("next", *prefix, "terminated")).any(), prefix
    check_env_specs(env, steps=10)


def test_step_counter_restarts_after_truncation(point_mass_cls):
    env = TransformedEnv(point_mass_cls(num_envs=2, bound=100.0), StepCounter(3))
    r = env.rollout(8, break_when_any_done=False)
    assert r.get("step_count")[:, :, 0].tolist() == [[0, 1, 2, 0, 1, 2, 0, 1]] * 2
    truncated = r.get(("next", "points", "truncated"))[..., 0, 0]
    assert truncated.tolist() == [[False, False, True] * 2 + [False, False]] * 2


def test_step_counter_keeps_counts_of_envs_not_reset(point_mass_cls):
    env = TransformedEnv(point_mass_cls(num_envs=4, bound=100.0), StepCounter())
    td = _advance(env, 3)
    assert td.get("step_count")[:, 0].tolist() == [3, 3, 3, 3]
    td.set("_reset", torch.tensor([[False], [True], [False], [False]]))
    assert env.reset(td).get("step_count")[:, 0].tolist() == [3, 0, 3, 3]


def test_step_counter_without_limit_only_counts(point_mass_cls):
    env = TransformedEnv(point_mass_cls(num_envs=2, bound=100.0), StepCounter())
    r = env.rollout(6)
    assert r.batch_size == torch.Size([2, 6])
    assert not r.get(("next", "done")).any()
    assert r.get(("next", "step_count"))[:, -1, 0].tolist() == [6, 6]
    assert env.observation_spec["step_count"].high.max() == torch.iinfo(torch.int64).max


def test_step_counter_custom_key(point_mass_cls):
    env = TransformedEnv(point_mass_cls(num_envs=2), StepCounter(5, step_count_key="t"))
    assert "t" in env.observation_spec and "step_count" not in env.observation_spec
    assert env.rollout(2).get(("next", "t"))[:, :, 0].tolist() == [[1, 2], [1, 2]]


@pytest.mark.parametrize(
    ("max_steps", "error"), [(0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_step_counter_rejects_bad_max_steps(max_steps, error):
    with pytest.raises(error, match="max_steps must be an int >= 1 or None, got"):
        StepCounter(max_steps)
    with pytest.raises(TypeError, match="max_steps must be an int >= 1 or None, got str: '3'"):
        StepCounter("3")


def test_step_counter_missing_count_is_rejected_before_the_simulator_runs(nav):
    env = TransformedEnv(nav(), StepCounter(5))
    td = env.rand_action(env.reset()).exclude("step_count")
    inner = env.base_env
    pos, vel = inner._pos.clone(), inner._vel.clone()
    with pytest.raises(KeyError, match="StepCounter: the step input has no 'step_count'"):
        env.step(td)
    assert torch.equal(inner._pos, pos) and torch.equal(inner._vel, vel)


# --------------------------------------------------------------------------- RewardSum


def test_reward_sum_specs(point_mass_cls):
    env = TransformedEnv(point_mass_cls(num_envs=3, groups=GROUPS), RewardSum())
    for g, n in GROUPS.items():
        spec = env.observation_spec[g, "episode_reward"]
        assert spec == Unbounded((3, n, 1), dtype=torch.float64)
    assert env.transform[0].in_keys == [("a", "reward"), ("b", "reward")]
    check_env_specs(env, steps=10)


def test_reward_sum_matches_manual_sums_across_auto_resets(point_mass_cls):
    env = TransformedEnv(point_mass_cls(num_envs=4, groups=GROUPS, bound=0.6), RewardSum())
    r = _rollout_push(env, 30)
    done = r.get(("next", "done"))[..., 0]
    assert done.any() and not done.all(), "want episodes that end at different steps"
    for g in GROUPS:
        reward = r.get(("next", g, "reward"))
        acc = torch.zeros_like(reward[:, 0])
        for t in range(30):
            assert torch.equal(r.get((g, "episode_reward"))[:, t], acc), (g, t)
            acc = acc + reward[:, t]
            assert torch.equal(r.get(("next", g, "episode_reward"))[:, t], acc), (g, t)
            acc = torch.where(done[:, t].view(-1, 1, 1), torch.zeros_like(acc), acc)


def test_reward_sum_resets_to_zero_on_full_and_partial_reset(point_mass_cls):
    env = TransformedEnv(point_mass_cls(num_envs=4, bound=100.0), RewardSum())
    assert not env.reset().get(("points", "episode_reward")).any()
    td = _advance(env, 3)
    sums = td.get(("points", "episode_reward")).clone()
    assert (sums != 0).all()
    td.set("_reset", torch.tensor([[True], [False], [False], [True]]))
    out = env.reset(td).get(("points", "episode_reward"))
    assert not out[[0, 3]].any()
    assert torch.equal(out[[1, 2]], sums[[1, 2]])


def test_reward_sum_custom_keys(point_mass_cls):
    env = TransformedEnv(
        point_mass_cls(num_envs=2, groups=GROUPS),
        RewardSum(in_keys=[("b", "reward")], out_keys=[("b", "return")]),
    )
    assert ("b", "return") in env.observation_spec
    assert ("a", "episode_reward") not in env.observation_spec
    r = env.rollout(3)
    expected = r.get(("next", "b", "reward")).cumsum(1)
    assert torch.allclose(r.get(("next", "b", "return")), expected)
    check_env_specs(env)


def test_reward_sum_bad_arguments(point_mass_cls):
    with pytest.raises(ValueError, match="RewardSum: out_keys need in_keys"):
        RewardSum(out_keys=["x"])
    with pytest.raises(ValueError, match="RewardSum: 2 in_keys but 1 out_keys"):
        RewardSum(in_keys=[("a", "reward"), ("b", "reward")], out_keys=["x"])
    with pytest.raises(KeyError, match=re.escape("RewardSum: ('c', 'reward') is not a reward key")):
        TransformedEnv(point_mass_cls(groups=GROUPS), RewardSum(in_keys=[("c", "reward")]))


# --------------------------------------------------------------------------- CommonReward


@pytest.mark.parametrize("scalarisation", ["sum", "mean"])
def test_common_reward_gives_every_agent_its_groups_reward(point_mass_cls, scalarisation):
    inner = TransformedEnv(point_mass_cls(num_envs=3, groups=GROUPS, bound=100.0))
    env = TransformedEnv(
        point_mass_cls(num_envs=3, groups=GROUPS, bound=100.0),
        CommonReward(scalarisation=scalarisation),
    )
    assert env.transform[0].in_keys == [("a", "reward"), ("b", "reward")]
    for g, n in GROUPS.items():
        assert env.reward_spec[g, "reward"] == Unbounded((3, n, 1), dtype=torch.float64)
    plain, common = _rollout_push(inner, 6, 0.3), _rollout_push(env, 6, 0.3)
    for g, n in GROUPS.items():
        own = plain.get(("next", g, "reward"))
        team = own.sum(-2, keepdim=True) if scalarisation == "sum" else own.mean(-2, keepdim=True)
        got = common.get(("next", g, "reward"))
        assert got.shape == own.shape and torch.allclose(got, team.expand_as(own))
        assert n == 1 or not torch.equal(got, own)  # b's two agents had rewards of their own
    assert torch.equal(
        common.get(("next", "a", "observation")), plain.get(("next", "a", "observation"))
    )
    check_env_specs(env, steps=5)


def test_common_reward_on_chosen_groups_and_before_the_episode_sums(point_mass_cls):
    env = TransformedEnv(
        point_mass_cls(num_envs=2, groups=GROUPS, bound=100.0),
        Compose(CommonReward(in_keys=[("b", "reward")]), RewardSum()),
    )
    r = _rollout_push(env, 4, 0.5)
    b = r.get(("next", "b", "reward"))
    assert torch.equal(b[..., 0, :], b[..., 1, :])
    assert torch.allclose(r.get(("next", "b", "episode_reward"))[:, -1], b.sum(1))


def test_common_reward_bad_arguments(point_mass_cls):
    with pytest.raises(ValueError, match="in_keys is empty"):
        CommonReward(in_keys=[])
    with pytest.raises(
        ValueError, match=r"scalarisation must be one of \['sum', 'mean'\], got 'max'"
    ):
        CommonReward(scalarisation="max")
    with pytest.raises(KeyError, match=r"\('a', 'observation'\) is not a reward key"):
        TransformedEnv(point_mass_cls(groups=GROUPS), CommonReward(in_keys=[("a", "observation")]))
    b = torch.Size([4])
    team = EnvSpecs(
        Composite(shape=b),
        Composite(shape=b),
        Composite(shape=b),
        Composite({"reward": Unbounded((4, 1))}, shape=b),
        Composite(shape=b),
    )
    with pytest.raises(ValueError, match=r"no group reward .*'reward' \[4, 1\]"):
        CommonReward().transform_specs(team.clone())
    with pytest.raises(ValueError, match=re.escape("'reward' [4, 1] has no agents' dim")):
        CommonReward(in_keys=["reward"]).transform_specs(team.clone())


# --------------------------------------------------------------------------- DoubleToFloat


# ------------------------------------------------------------------ TruncationAsTermination


def test_truncation_as_termination_turns_every_levels_cut_into_a_termination(nav):
    env = TransformedEnv(
        nav(num_envs=3, n_agents=3, group_map="per_agent"),
        Compose(StepCounter(4), TruncationAsTermination()),
    )
    r = env.rollout(20)
    assert r.batch_size == torch.Size([3, 4])
    for prefix in _done_levels(env):
        term = r.get(("next", *prefix, "terminated"))
        done = r.get(("next", *prefix, "done"))
        assert term[:, -1].all() and done[:, -1].all(), prefix
        assert not term[:, :-1].any() and not done[:, :-1].any(), prefix
        assert not r.get(("next", *prefix, "truncated")).any(), prefix
    check_env_specs(env, steps=10)
    # auto-resets go on as before: a new episode every 4 steps
    td = _advance(env, 9)
    assert torch.equal(td["step_count"], torch.ones(3, 1, dtype=torch.int64))


@pytest.mark.parametrize("bound", [0.02, 100.0])  # terminated at the 2nd step; cut at the 3rd
def test_truncation_as_termination_keeps_the_simulators_terminations(point_mass_cls, bound):
    """An agent the simulator ended before the limit stays terminated (and its episode ends
    there); otherwise the cut is a termination. Every other flag is the plain env's."""
    plain = TransformedEnv(point_mass_cls(groups=GROUPS, bound=bound), StepCounter(3))
    ended = TransformedEnv(
        point_mass_cls(groups=GROUPS, bound=bound),
        Compose(StepCounter(3), TruncationAsTermination()),
    )
    a, b = _rollout_push(plain, 6), _rollout_push(ended, 6)
    cut = a.get(("next", "truncated"))
    assert cut.any() == (bound > 1), "the case the parameter names"
    assert a.get(("next", "terminated")).any() == (bound < 1)
    for prefix in _done_levels(ended):
        done = a.get(("next", *prefix, "done"))
        assert torch.equal(b.get(("next", *prefix, "done")), done), prefix
        either = a.get(("next", *prefix, "terminated")) | a.get(("next", *prefix, "truncated"))
        assert torch.equal(b.get(("next", *prefix, "terminated")), either), prefix
        assert not b.get(("next", *prefix, "truncated")).any(), prefix


def test_truncation_as_termination_refuses_an_env_that_never_truncates():
    specs = EnvSpecs(
        observation=Composite(),
        action=Composite(),
        reward=Composite(),
        done=Composite(
            {
                "done": Categorical(2, (1,), dtype=torch.bool),
                "terminated": Categorical(2, (1,), dtype=torch.bool),
            }
        ),
        state=Composite(),
    )
    with pytest.raises(ValueError, match="no 'truncated' flag at any level"):
        TruncationAsTermination().transform_specs(specs)


def test_double_to_float_specs_and_data(point_mass_cls):
    base = point_mass_cls(num_envs=3, groups=GROUPS)
    env = TransformedEnv(base, DoubleToFloat())
    for g, n in GROUPS.items():
        assert env.observation_spec[g, "observation"] == Unbounded((3, n, 2))
        assert env.reward_spec[g, "reward"] == Unbounded((3, n, 1))
        assert env.action_spec[g, "action"] == Bounded(-1.0, 1.0, (3, n, 1))
        assert base.action_spec[g, "action"].dtype == torch.float64  # inner specs untouched
    assert env.state_spec["state"] == Unbounded((3, 6))
    r = env.rollout(4)
    for key in r.keys(True, True):
        assert not r.get(key).is_floating_point() or r.get(key).dtype == torch.float32, key
    assert set(base.action_dtypes) == {torch.float64}  # the inner env gets float64 back
    assert r.get(("a", "action")).dtype == torch.float32  # the caller's actions stay float32
    check_env_specs(env)


def test_double_to_float_values_match_the_float64_env(point_mass_cls):
    cast = TransformedEnv(point_mass_cls(num_envs=3, groups=GROUPS, seed=4), DoubleToFloat())
    plain = point_mass_cls(num_envs=3, groups=GROUPS, seed=4)
    a, b = _rollout_push(cast, 6, 0.5), _rollout_push(plain, 6, 0.5)
    for key in b.keys(True, True):
        value = b.get(key)
        expected = value.float() if value.dtype == torch.float64 else value
        assert torch.equal(a.get(key), expected), key


def test_double_to_float_selected_keys(point_mass_cls):
    env = TransformedEnv(
        point_mass_cls(groups=GROUPS), DoubleToFloat(in_keys=[("a", "observation")])
    )
    assert env.observation_spec["a", "observation"].dtype == torch.float32
    assert env.observation_spec["b", "observation"].dtype == torch.float64
    assert env.state_spec["state"].dtype == torch.float64
    assert env.action_spec["a", "action"].dtype == torch.float64
    r = env.rollout(2)
    assert r.get(("next", "a", "observation")).dtype == torch.float32
    assert r.get(("next", "b", "observation")).dtype == torch.float64
    check_env_specs(env)


def test_double_to_float_rejects_keys_without_float64_spec(nav, point_mass_cls):
    with pytest.raises(KeyError, match=re.escape("DoubleToFloat: no float64 spec under")):
        TransformedEnv(nav(), DoubleToFloat(in_keys=[OBS]))
    with pytest.raises(KeyError, match=re.escape("no float64 spec under [('c', 'observation')]")):
        TransformedEnv(point_mass_cls(), DoubleToFloat(in_keys=[("c", "observation")]))


def test_double_to_float_is_a_no_op_on_float32_envs(nav):
    base = nav()
    env = TransformedEnv(base, DoubleToFloat())
    for name in ("observation", "state", "action", "reward", "done"):
        assert getattr(env, f"{name}_spec") == getattr(base, f"{name}_spec"), name
    check_env_specs(env)


def test_double_to_float_validates_against_the_float32_spec(point_mass_cls):
    base = point_mass_cls(num_envs=2)
    env = TransformedEnv(base, DoubleToFloat())
    td = env.reset()
    td.set(("points", "action"), torch.zeros(2, 2, 1, dtype=torch.float64))
    with pytest.raises(InvalidActionError, match="dtype float64 != spec dtype float32"):
        env.step(td)
    assert base.action_dtypes == []


# --------------------------------------------------------------------------- ExcludeKeys


def test_exclude_state(nav):
    env = TransformedEnv(nav(), ExcludeKeys("state"))
    assert env.state_spec.is_empty()
    assert env.observation_keys == [OBS]
    td = env.reset()
    assert "state" not in td
    r = env.rollout(3)
    assert "state" not in r and "state" not in r.get("next")
    check_env_specs(env)


def test_exclude_nested_observation(point_mass_cls):
    env = TransformedEnv(point_mass_cls(groups=GROUPS), ExcludeKeys(("a", "observation")))
    assert ("a", "observation") not in env.observation_spec
    r = env.rollout(3)
    assert ("a", "observation") not in r.keys(True)
    assert ("next", "a", "observation") not in r.keys(True)
    assert ("next", "b", "observation") in r.keys(True)
    assert ("next", "a", "reward") in r.keys(True)
    check_env_specs(env)


def test_exclude_keys_bad_arguments(nav):
    with pytest.raises(ValueError, match="ExcludeKeys needs at least one key"):
        ExcludeKeys()
    for key in (ACT, ("agents", "reward"), "done", ("agents", "terminated")):
        with pytest.raises(ValueError, match=re.escape(f"ExcludeKeys cannot drop {key!r}")):
            TransformedEnv(nav(), ExcludeKeys(key))
    with pytest.raises(KeyError, match="'nope' is neither an observation nor a state key"):
        TransformedEnv(nav(), ExcludeKeys("nope"))


def test_exclude_keys_refuses_a_whole_group(nav):
    # "agents" holds observations but also the group's actions, rewards and done flags
    with pytest.raises(ValueError, match="ExcludeKeys cannot drop 'agents'"):
        TransformedEnv(nav(), ExcludeKeys("agents"))


# --------------------------------------------------------------------------- RenameKeys


def test_rename_observation_and_reward(nav):
    env = TransformedEnv(
        nav(),
        RenameKeys([OBS, ("agents", "reward")], [("agents", "obs"), ("agents", "r")]),
    )
    assert env.observation_spec["agents", "obs"] == Unbounded((4, 3, 10))
    assert OBS not in env.observation_spec
    assert env.reward_keys == [("agents", "r")]
    r = env.rollout(3)
    keys = set(r.keys(True, True))
    assert {("agents", "obs"), ("next", "agents", "obs"), ("next", "agents", "r")} <= keys
    assert not {OBS, ("next", *OBS), ("next", "agents", "reward"), ("agents", "r")} & keys
    check_env_specs(env)


def test_rename_to_the_root_drops_the_emptied_group_spec(point_mass_cls):
    env = TransformedEnv(
        point_mass_cls(groups=GROUPS), RenameKeys([("a", "observation")], ["a_obs"])
    )
    assert "a" not in env.observation_spec and "a_obs" in env.observation_spec
    assert env.reset().get("a_obs").shape == (4, 1, 2)
    check_env_specs(env)


@pytest.mark.parametrize("old", [("a", "observation"), ("a", "action")])
def test_rename_into_a_group_of_another_size_names_both_keys(point_mass_cls, old):
    env = point_mass_cls(groups=GROUPS)  # "a" holds 1 agent, "b" 2
    message = f"RenameKeys cannot move {old!r} to ('b', 'moved'): the spec for ('b', 'moved')"
    with pytest.raises(ValueError, match=re.escape(message)):
        TransformedEnv(env, RenameKeys([old], [("b", "moved")]))


def test_rename_action_policy_writes_the_new_name(nav, td_equal):
    env = TransformedEnv(nav(seed=2), RenameKeys([ACT], [("agents", "force")]))
    assert env.action_keys == [("agents", "force")]
    assert env.action_spec["agents", "force"] == Bounded(-1.0, 1.0, (4, 3, 2))
    r = env.rollout(5, break_when_any_done=False)
    assert ACT not in r.keys(True)
    plain = nav(seed=2).rollout(5, break_when_any_done=False)
    plain.rename_key_(ACT, ("agents", "force"))
    td_equal(r, plain)  # same random actions, and the inner env read them
    check_env_specs(env)

    net = nn.Sequential(nn.Linear(10, 2), nn.Tanh())
    policy = TensorDictModule(net, in_keys=[OBS], out_keys=[("agents", "force")])
    r = env.rollout(3, policy)
    assert ACT not in r.keys(True)
    with torch.no_grad():
        assert torch.allclose(r.get(("agents", "force")).detach(), net(r.get(OBS)))


def test_rename_action_validates_the_new_name(nav):
    env = TransformedEnv(nav(), RenameKeys([ACT], [("agents", "force")]))
    td = env.reset()
    td.set(ACT, torch.zeros(4, 3, 2))  # the old name does not count
    with pytest.raises(MissingActionError, match=re.escape("('agents', 'force') is missing")):
        env.step(td)
    td = env.rand_action(env.reset())
    td.set(("agents", "force"), td.get(("agents", "force")) * 3)
    with pytest.raises(
        InvalidActionError, match=re.escape("invalid action at ('agents', 'force')")
    ):
        env.step(td)


def test_rename_keys_bad_arguments(nav):
    with pytest.raises(ValueError, match=r"as many out_keys as in_keys .* got 2 and 1"):
        RenameKeys([OBS, "state"], ["x"])
    with pytest.raises(ValueError, match="at least one"):
        RenameKeys([], [])
    with pytest.raises(KeyError, match=re.escape("RenameKeys: the env has no ('agents', 'nope')")):
        TransformedEnv(nav(), RenameKeys([("agents", "nope")], ["x"]))
    with pytest.raises(ValueError, match="RenameKeys cannot rename the done flag 'done'"):
        TransformedEnv(nav(), RenameKeys(["done"], ["finished"]))
    with pytest.raises(ValueError, match=re.escape("RenameKeys: 'state' already exists")):
        TransformedEnv(nav(), RenameKeys([OBS], ["state"]))


@pytest.mark.parametrize("new", [ACT, ("agents", "reward"), ("agents", "done")])
def test_rename_keys_refuses_a_name_taken_in_another_spec(nav, new):
    with pytest.raises(ValueError, match=re.escape(f"RenameKeys: {new!r} already exists")):
        TransformedEnv(nav(), RenameKeys([OBS], [new]))


def test_rename_keys_refuses_a_whole_group(nav):
    with pytest.raises(ValueError, match="RenameKeys cannot rename 'agents'"):
        TransformedEnv(nav(), RenameKeys(["agents"], ["robots"]))


@pytest.mark.parametrize("leaf", ["mask", "action_mask"])
@pytest.mark.parametrize("transform", ["rename", "exclude"])
def test_the_leaves_the_contract_reads_are_never_renamed_or_dropped(leaf, transform):
    # The done rule reads (group, "mask"), validation reads (group, "action_mask").
    with pytest.raises(ValueError, match=f"cannot touch \\('agents', '{leaf}'\\)"):
        if transform == "rename":
            RenameKeys([("agents", leaf)], [("agents", "other")])
        else:
            ExcludeKeys(("agents", leaf))


@pytest.mark.parametrize("scenario", ["native", "vmas"])
def test_renamed_observations_of_envs_not_reset_survive_a_partial_reset(scenario):
    # VMAS recomputes every observation at a reset (with fresh noise here) and keeps the envs
    # that were not reset at what they reported before: it must see that under its own key.
    if scenario == "vmas":
        pytest.importorskip("vmas")
        inner = marlkit.make("vmas/give_way", num_envs=3, obs_noise=0.1, seed=0)
    else:
        inner = marlkit.make("navigation", num_envs=3, n_agents=2, seed=0)
    env = TransformedEnv(inner, RenameKeys([("agents", "observation")], [("agents", "obs")]))
    td = env.reset()
    for _ in range(2):
        _, td = env.step_and_maybe_reset(env.rand_action(td))
    mask = torch.tensor([[True], [False], [False]])
    td["_reset"] = mask
    out = env.reset(td)
    assert torch.equal(out["agents", "obs"][1:], td["agents", "obs"][1:])
    assert not torch.equal(out["agents", "obs"][0], td["agents", "obs"][0])
    assert ("agents", "observation") not in out.keys(True)


# --------------------------------------------------------------------------- InitTracker


def test_init_tracker_specs_and_flags(point_mass_cls):
    env = TransformedEnv(point_mass_cls(num_envs=3, groups=GROUPS, bound=100.0), InitTracker())
    assert env.observation_spec["is_init"] == Categorical(2, (3, 1), dtype=torch.bool)
    for g, n in GROUPS.items():
        assert env.observation_spec[g, "is_init"] == Categorical(2, (3, n, 1), dtype=torch.bool)
    r = env.rollout(4)
    for prefix in _done_levels(env):
        flag = r.get((*prefix, "is_init"))
        assert flag[:, 0].all() and not flag[:, 1:].any(), prefix
        assert not r.get(("next", *prefix, "is_init")).any(), prefix
    check_env_specs(env)


def test_init_tracker_flags_only_envs_that_were_reset(point_mass_cls):
    env = TransformedEnv(point_mass_cls(num_envs=4, groups=GROUPS, bound=0.6), InitTracker())
    r = _rollout_push(env, 25)
    done = r.get(("next", "done"))[..., 0]
    assert done.any() and not done.all()
    for prefix in _done_levels(env):
        flag = r.get((*prefix, "is_init")).reshape(4, 25, -1)
        assert torch.equal(flag[:, 1:], done[:, :-1].unsqueeze(-1).expand_as(flag[:, 1:])), prefix
    td = _advance(env, 2)
    td.set("_reset", torch.tensor([[False], [True], [False], [False]]))
    assert env.reset(td).get("is_init")[:, 0].tolist() == [False, True, False, False]


def test_init_tracker_bad_key():
    with pytest.raises(TypeError, match="init_key must be a str"):
        InitTracker(("agents", "is_init"))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- composition


def test_transformed_env_without_transform_is_the_inner_env(nav, td_equal):
    base = nav(seed=9)
    env = TransformedEnv(base)
    for name in ("observation", "state", "action", "reward", "done"):
        assert getattr(env, f"{name}_spec") == getattr(base, f"{name}_spec"), name
    assert env.batch_size == base.batch_size and env.group_map == base.group_map
    td_equal(
        env.rollout(5, break_when_any_done=False), nav(seed=9).rollout(5, break_when_any_done=False)
    )


def test_transform_argument_forms(nav):
    counter, summer = StepCounter(3), RewardSum()
    env = TransformedEnv(nav(), [counter, summer])
    assert isinstance(env.transform, Compose) and list(env.transform) == [counter, summer]
    assert len(env.transform) == 2 and env.transform[1] is summer
    other = StepCounter(3)  # a transform belongs to one env
    single = TransformedEnv(nav(), other)
    assert isinstance(single.transform, Compose) and single.transform[0] is other
    compose = Compose(StepCounter(3))
    assert TransformedEnv(nav(), compose).transform is compose
    assert "StepCounter(max_steps=3)" in repr(env)


def test_append_transform_recomputes_specs(nav):
    env = TransformedEnv(nav(), StepCounter(3))
    assert ("agents", "episode_reward") not in env.observation_spec
    assert env.append_transform(RewardSum()) is env
    assert ("agents", "episode_reward") in env.observation_spec
    assert ("next", "agents", "episode_reward") in env.rollout(2).keys(True)
    check_env_specs(env)


def test_composition_bad_arguments(nav):
    with pytest.raises(TypeError, match="Compose takes Transforms, got str"):
        Compose(StepCounter(), "RewardSum")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Compose takes Transforms, got function"):
        Compose().append(lambda td: td)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Compose takes Transforms, got int"):
        TransformedEnv(nav(), [StepCounter(), 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="TransformedEnv wraps an EnvBase, got dict"):
        TransformedEnv({}, StepCounter())  # type: ignore[arg-type]


def test_inverse_transforms_run_in_reverse_order(point_mass_cls):
    # Specs: DoubleToFloat makes the action float32, then RenameKeys names it "force". On the
    # way in, RenameKeys must run first (force -> action), then DoubleToFloat casts "action".
    base = point_mass_cls(num_envs=2)
    env = TransformedEnv(
        base, [DoubleToFloat(), RenameKeys([("points", "action")], [("points", "force")])]
    )
    assert env.action_spec["points", "force"] == Bounded(-1.0, 1.0, (2, 2, 1))
    td = env.rand_action(env.reset())
    env.step(td)
    assert set(base.action_dtypes) == {torch.float64}
    assert ("points", "action") not in td.keys(True)  # the caller's TensorDict is not changed
    assert td.get(("points", "force")).dtype == torch.float32
    check_env_specs(env)


def test_nested_transformed_envs(nav):
    inner = TransformedEnv(nav(num_envs=2), StepCounter(3))
    env = TransformedEnv(inner, [RewardSum(), InitTracker()])
    r = env.rollout(10)
    assert r.batch_size == torch.Size([2, 3])
    assert r.get(("next", "truncated"))[:, -1].all()
    assert r.get("is_init")[:, 0].all()
    check_env_specs(env, steps=8)


def test_attributes_reach_the_inner_env(nav):
    base = nav(n_agents=3)
    env = TransformedEnv(base, StepCounter())
    assert env.n_agents == 3 and env.backend == base.backend
    assert torch.equal(env.positions, base.positions)
    with pytest.raises(AttributeError):
        env._pos  # noqa: B018  # private attributes are not forwarded


def test_transformed_env_rejects_bad_actions_and_keeps_inner_state(nav, td_equal):
    env = TransformedEnv(nav(seed=1), [StepCounter(10), RewardSum()])
    twin = TransformedEnv(nav(seed=1), [StepCounter(10), RewardSum()])
    td, td_twin = env.reset(), twin.reset()
    bad = env.rand_action(td.clone())
    twin.rand_action(td_twin.clone())
    bad.set(ACT, bad.get(ACT).index_put((torch.tensor(0),), torch.tensor(torch.nan)))
    with pytest.raises(InvalidActionError, match="non-finite value nan"):
        env.step(bad)
    td_equal(
        env.rollout(4, auto_reset=False, tensordict=td),
        twin.rollout(4, auto_reset=False, tensordict=td_twin),
    )


class _Scale(Transform):
    """Multiply rewards by ``factor`` (a user-written transform on the base class)."""

    def __init__(self, factor: float):
        self.factor = factor

    def step(self, tensordict, next_tensordict):
        for key in ("a", "b"):
            reward = next_tensordict.get((key, "reward"))
            next_tensordict.set((key, "reward"), reward * self.factor)
        return next_tensordict


def test_user_transform_and_order_within_compose(point_mass_cls):
    # RewardSum after _Scale sums the scaled rewards; before it, the raw ones
    after = TransformedEnv(point_mass_cls(groups=GROUPS, seed=3), [_Scale(2.0), RewardSum()])
    before = TransformedEnv(point_mass_cls(groups=GROUPS, seed=3), [RewardSum(), _Scale(2.0)])
    ra, rb = _rollout_push(after, 3), _rollout_push(before, 3)
    assert torch.equal(ra.get(("next", "a", "reward")), rb.get(("next", "a", "reward")))
    assert torch.equal(
        ra.get(("next", "a", "episode_reward")), 2 * rb.get(("next", "a", "episode_reward"))
    )
    assert repr(_Scale(1.0)) == "_Scale()"


@pytest.mark.parametrize(
    "transforms",
    [
        lambda: [StepCounter(4)],
        lambda: [RewardSum()],
        lambda: [DoubleToFloat()],
        lambda: [ExcludeKeys("state")],
        lambda: [RenameKeys([("b", "observation"), ("a", "action")], ["b_obs", ("a", "u")])],
        lambda: [InitTracker()],
        lambda: [
            DoubleToFloat(),
            StepCounter(3),
            RewardSum(),
            InitTracker(),
            RenameKeys([("a", "action"), ("b", "reward")], [("a", "u"), ("b", "r")]),
            ExcludeKeys("state"),
        ],
    ],
    ids=["step_counter", "reward_sum", "double_to_float", "exclude", "rename", "init", "all"],
)
def test_every_transform_keeps_the_specs_right(point_mass_cls, transforms):
    env = TransformedEnv(point_mass_cls(num_envs=3, groups=GROUPS, bound=0.6), transforms())
    check_env_specs(env, steps=12)
    r = env.rollout(12, break_when_any_done=False)
    next_spec = env.observation_spec.clone().update(env.state_spec)
    next_spec.update(env.reward_spec).update(env.done_spec)
    for t in range(12):
        assert not next_spec.explain(r.get("next")[:, t], strict=True), t


def test_wrapped_seeded_env_replays_the_same_rollout(nav, td_equal):
    # The seed given to the inner env also drives the wrapper's random actions.
    def run() -> TensorDictBase:
        env = TransformedEnv(nav(seed=5), [StepCounter(6), RewardSum()])
        return env.rollout(10, break_when_any_done=False)

    td_equal(run(), run())
    env = TransformedEnv(nav(seed=None), [StepCounter(6), InitTracker()])
    env.set_seed(2)
    first = env.rollout(8, break_when_any_done=False)
    env.set_seed(2)
    td_equal(first, env.rollout(8, break_when_any_done=False))


# --------------------------------------------------------------------------- carried entries

CARRIED = {
    "StepCounter": (lambda: StepCounter(10), "step_count"),
    "RewardSum": (RewardSum, ("agents", "episode_reward")),
    "InitTracker": (InitTracker, ("agents", "is_init")),
}


@pytest.mark.parametrize("name", list(CARRIED))
def test_a_partial_reset_without_the_carried_entries_is_refused(nav, name):
    # Guessing them (zeros, as before) silently restarted the episodes of the envs kept running.
    make, key = CARRIED[name]
    env = TransformedEnv(nav(num_envs=2), make())
    td = _advance(env, 3)
    mask = torch.tensor([[True], [False]])
    pattern = f"{name}: the input of a partial reset has no {re.escape(repr(key))}.*last step's"
    with pytest.raises(KeyError, match=pattern):
        env.reset(TensorDict({"_reset": mask}, batch_size=[2]))
    with pytest.raises(KeyError, match=pattern):  # rollout(tensordict=...) resets with it
        env.rollout(3, tensordict=TensorDict({"_reset": mask}, batch_size=[2]))
    td["_reset"] = mask  # the last step's TensorDict: the env kept running keeps its entry
    out = env.reset(td)
    assert torch.equal(out[key][1], td[key][1])


def test_a_rollout_continued_from_a_partial_reset_keeps_counting(nav):
    env = TransformedEnv(nav(num_envs=2), [StepCounter(5), RewardSum()])
    first = env.rollout(3)
    root = env._step_mdp(first[:, -1])
    root["_reset"] = torch.tensor([[True], [False]])
    out = env.rollout(5, tensordict=root, break_when_any_done=False)
    assert out["next", "step_count"][1, :2, 0].tolist() == [4, 5]  # truncated on time
    assert out["next", "truncated"][1, :, 0].tolist() == [False, True, False, False, False]
    assert out["next", "step_count"][0, :, 0].tolist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("step_count", torch.zeros(3, 1), r"dtype float32 != spec dtype int64"),
        ("step_count", torch.zeros(3, dtype=torch.long), r"shape \[3\] != spec shape \[3, 1\]"),
        (("agents", "episode_reward"), torch.zeros(3, 3), r"shape \[3, 3\] != spec shape"),
        (("agents", "episode_reward"), torch.zeros(3, 3, 2), r"shape \[3, 3, 2\] != spec shape"),
    ],
)
def test_carried_entries_that_do_not_fit_their_spec_are_refused(nav, key, value, reason):
    env = TransformedEnv(nav(num_envs=3), [StepCounter(5), RewardSum()])
    td = env.rand_action(env.reset())
    td[key] = value
    inner = env.base_env
    pos = inner._pos.clone()
    owner = "StepCounter" if key == "step_count" else "RewardSum"
    with pytest.raises(ValueError, match=f"{owner}: the input's {re.escape(repr(key))} .*{reason}"):
        env.step(td)
    assert torch.equal(inner._pos, pos)  # refused before the simulator ran
    td = _advance(env, 1)
    td[key] = value
    td["_reset"] = torch.tensor([[True], [False], [False]])
    with pytest.raises(ValueError, match=f"{owner}: the input's {re.escape(repr(key))}"):
        env.reset(td)


def test_reward_sum_without_its_sums_in_the_step_input_is_refused(nav):
    env = TransformedEnv(nav(num_envs=2), RewardSum())
    td = env.rand_action(env.reset()).exclude(("agents", "episode_reward"))
    with pytest.raises(KeyError, match=r"RewardSum: the step input has no \('agents', 'episode"):
        env.step(td)


def test_reward_sum_sums_what_a_later_transform_renamed(nav):
    # Each transform reads the input under its own names: the sums renamed after RewardSum are
    # mapped back for it (they restarted at every step before).
    env = TransformedEnv(
        nav(num_envs=2),
        [RewardSum(), RenameKeys([("agents", "episode_reward")], [("agents", "ret")])],
    )
    r = env.rollout(4, break_when_any_done=False)
    expected = r["next", "agents", "reward"].cumsum(1)
    assert torch.allclose(r["next", "agents", "ret"], expected)
    check_env_specs(env)


# --------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    "out_key", [("agents", "observation"), ("agents", "reward"), ("agents", "done"), "step_count"]
)
def test_reward_sum_refuses_out_keys_that_exist(nav, out_key):
    with pytest.raises(
        ValueError, match=rf"RewardSum: the out_key {re.escape(repr(out_key))} already exists"
    ):
        TransformedEnv(
            nav(),
            [StepCounter(5), RewardSum(in_keys=[("agents", "reward")], out_keys=[out_key])],
        )


def test_reward_sum_twice_on_one_reward_is_refused(nav):
    with pytest.raises(ValueError, match="episode_reward'\\) already exists"):
        TransformedEnv(nav(), [RewardSum(), RewardSum()])


def test_a_single_key_where_a_list_is_expected_is_named():
    with pytest.raises(TypeError, match=r"RewardSum: in_keys takes a list of keys, got the single"):
        RewardSum(in_keys=("agents", "reward"))
    with pytest.raises(TypeError, match=r"RenameKeys: in_keys takes a list of keys.*'obs'"):
        RenameKeys("obs", "ob")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"DoubleToFloat: in_keys takes a list of keys"):
        DoubleToFloat(("agents", "observation"))
    with pytest.raises(TypeError, match="step_count_key must be a str or a tuple of strs, got 3"):
        StepCounter(5, step_count_key=3)  # type: ignore[arg-type]


def test_a_transform_belongs_to_one_env(nav):
    counter = StepCounter(5)
    first = TransformedEnv(nav(num_envs=4), counter)
    with pytest.raises(
        RuntimeError, match=r"StepCounter\(max_steps=5\) is already attached.*clone"
    ):
        TransformedEnv(nav(num_envs=2), counter)
    with pytest.raises(RuntimeError, match="already attached to another env"):
        TransformedEnv(nav(num_envs=2), StepCounter(3)).append_transform(counter)
    with pytest.raises(ValueError, match="appears twice"):
        TransformedEnv(nav(num_envs=2), [RewardSum(in_keys=[("agents", "reward")])] * 2)
    assert first.reset()["step_count"].shape == (4, 1)  # the first env is intact
    assert first.rollout(6)["next", "truncated"][:, -1].all()
    copy = counter.clone()
    assert copy.parent is None and copy.max_steps == 5
    second = TransformedEnv(nav(num_envs=2), copy)
    assert second.reset()["step_count"].shape == (2, 1)
    composed = TransformedEnv(nav(num_envs=2), first.transform.clone())
    assert composed.rollout(6)["next", "truncated"][:, -1].all()


# --------------------------------------------------------------------------- masked actions


def _tictactoe() -> EnvBase:
    pytest.importorskip("pettingzoo")
    return marlkit.make("pettingzoo/pettingzoo.classic.tictactoe_v3", seed=0)


def test_rename_keys_keeps_a_masked_action_next_to_its_mask():
    with pytest.raises(
        ValueError,
        match=r"cannot move the action \('agents', 'action'\) to 'act': its action mask",
    ):
        TransformedEnv(_tictactoe(), RenameKeys([("agents", "action")], ["act"]))
    # Within the group the mask still guards it: random actions stay legal, illegal ones refused.
    env = TransformedEnv(_tictactoe(), RenameKeys([("agents", "action")], [("agents", "act")]))
    for _ in range(5):
        env.rollout(9)
    td = env.reset()
    td["agents", "act"] = torch.zeros(1, 2, dtype=torch.int64)
    td = env._step_mdp(env.step(td))
    td["agents", "act"] = torch.zeros(1, 2, dtype=torch.int64)  # square 0 again
    with pytest.raises(InvalidActionError, match=r"\('agents', 'act'\).*masked out by"):
        env.step(td)


def test_rename_keys_refuses_to_name_something_a_mask(nav):
    with pytest.raises(ValueError, match=r"cannot touch \('agents', 'action_mask'\)"):
        RenameKeys([("agents", "observation")], [("agents", "action_mask")])


@pytest.mark.parametrize(
    ("transform", "message"),
    [
        # the count overwrote navigation's [E, 12] global state, or the root done (every
        # rollout stopped after one step)
        (lambda: StepCounter(step_count_key="state"), "the step_count_key 'state' already exists"),
        (lambda: StepCounter(step_count_key="done"), "the step_count_key 'done' already exists"),
        # the reset flag replaced the observations, or a group's done and mask
        (lambda: InitTracker(init_key="observation"), r"\('agents', 'observation'\) already"),
        (lambda: InitTracker(init_key="done"), r"init_key \('agents', 'done'\) already exists"),
        (lambda: InitTracker(init_key="mask"), r"the init_key \('agents', 'mask'\) ends in 'mask'"),
        (lambda: StepCounter(step_count_key="_reset"), r"'_reset' is '_reset', a name the env"),
        (lambda: RenameKeys(["state"], ["next"]), r"'next' is 'next', a name the env API reads"),
        (lambda: RenameKeys(["state"], ["_reset"]), r"'_reset' is '_reset'"),
    ],
)
def test_a_transform_may_not_write_over_an_entry_or_an_api_name(nav, transform, message):
    with pytest.raises(ValueError, match=message):
        TransformedEnv(nav(), transform())
