"""``EnvBase``: specs, reset (full and partial), step with action validation, rollouts, seeding,
random actions (masked too) and closing; on the native navigation scenario and small fixture
envs (see ``conftest.py``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from unittest import mock

import numpy as np
import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

import marlkit
from marlkit.data.composite import Composite
from marlkit.data.specs import Bounded, Categorical, Unbounded
from marlkit.envs import (
    EnvBase,
    InvalidActionError,
    MissingActionError,
    StepCounter,
    TransformedEnv,
    check_env_specs,
    make_done_spec,
    make_reward_spec,
)
from marlkit.native import extension_available

ACT = ("agents", "action")
OBS = ("agents", "observation")


def _advance(env: EnvBase, steps: int) -> TensorDictBase:
    """Reset, then take ``steps`` random steps (auto-resetting); returns the next root."""
    td = env.reset()
    for _ in range(steps):
        _, td = env.step_and_maybe_reset(env.rand_action(td))
    return td


def _snapshot(env: EnvBase) -> dict[str, torch.Tensor]:
    return {name: getattr(env, name).clone() for name in ("_pos", "_vel", "_goal")}


# --------------------------------------------------------------------------- specs


def test_specs_and_properties(nav):
    env = nav(num_envs=4, n_agents=3)
    b = torch.Size([4])
    assert env.batch_size == b
    assert env.device == torch.device("cpu")
    assert env.groups == ["agents"]
    for spec in (env.observation_spec, env.action_spec, env.reward_spec, env.done_spec):
        assert isinstance(spec, Composite) and spec.shape == b
    assert env.observation_spec[OBS] == Unbounded((4, 3, 10))
    assert env.action_spec[ACT] == Bounded(-1.0, 1.0, (4, 3, 2))
    assert env.reward_spec["agents", "reward"] == Unbounded((4, 3, 1))
    assert env.state_spec["state"] == Unbounded((4, 18))
    for name in ("done", "terminated", "truncated"):
        assert env.done_spec[name] == Categorical(2, (4, 1), dtype=torch.bool)
        assert env.done_spec["agents", name] == Categorical(2, (4, 3, 1), dtype=torch.bool)
    assert env.action_keys == [ACT]
    assert env.reward_keys == [("agents", "reward")]
    assert set(env.observation_keys) == {OBS, "state"}
    assert "batch_size=[4]" in repr(env) and "agents: 3" in repr(env)


def test_discrete_action_spec(nav):
    env = nav(continuous_actions=False)
    assert env.action_spec[ACT] == Categorical(5, (4, 3))


def test_spec_setter_rejects_wrong_type_and_shape(point_mass_cls):
    env = point_mass_cls(num_envs=4)
    with pytest.raises(TypeError, match="observation_spec must be a Composite, got Unbounded"):
        env.observation_spec = Unbounded((4, 2))
    with pytest.raises(
        ValueError, match=re.escape("action_spec must have shape == batch_size [4]")
    ):
        env.action_spec = Composite(shape=(3,))


def test_spec_setter_refreshes_cached_keys(point_mass_cls):
    env = point_mass_cls(num_envs=2)
    assert env.action_keys == [("points", "action")]
    env.action_spec = Composite(
        {"points": Composite(force=Bounded(-1.0, 1.0, (2, 2, 1)), shape=(2, 2))}, shape=(2,)
    )
    assert env.action_keys == [("points", "force")]


# --------------------------------------------------------------------------- reset and step


def test_reset_output_matches_specs(nav):
    env = nav(num_envs=4, n_agents=3)
    td = env.reset()
    assert td.batch_size == torch.Size([4])
    assert td.get(OBS).shape == (4, 3, 10)
    assert td.get("state").shape == (4, 18)
    for key in env.done_keys:
        value = td.get(key)
        assert value.dtype == torch.bool and not value.any(), key


def test_step_writes_next_and_returns_its_input(nav):
    env = nav()
    td = env.rand_action(env.reset())
    obs_before = td.get(OBS).clone()
    out = env.step(td)
    assert out is td
    assert torch.equal(td.get(OBS), obs_before)  # the root is not overwritten
    nxt = td.get("next")
    assert nxt.get(OBS).shape == (4, 3, 10)
    assert nxt.get(("agents", "reward")).shape == (4, 3, 1)
    assert env.done_spec.is_in(nxt.select(*env.done_keys))
    assert not torch.equal(nxt.get(OBS), obs_before)


def test_step_completes_group_and_root_done_flags(point_mass_cls):
    # The fixture's _step returns only (group, "terminated"): the base fills group done and
    # the root done/terminated (any over groups).
    env = point_mass_cls(num_envs=6, groups={"a": 1, "b": 2}, bound=0.45)
    td = env.reset()
    td.set(("a", "action"), torch.ones(6, 1, 1, dtype=torch.float64))
    td.set(("b", "action"), torch.ones(6, 2, 1, dtype=torch.float64))
    for _ in range(20):
        env.step(td)
        if td.get(("next", "done")).any():
            break
        td = env._step_mdp(td)
    nxt = td.get("next")
    done = nxt.get("done")
    assert done.any() and not done.all(), "want a partly done batch to check the aggregation"
    for g in ("a", "b"):
        assert torch.equal(nxt.get((g, "done")), nxt.get((g, "terminated")))
    groups = torch.cat([nxt.get((g, "terminated")).squeeze(-1) for g in ("a", "b")], dim=-1)
    assert torch.equal(nxt.get("terminated"), groups.any(-1, keepdim=True))
    assert torch.equal(done, nxt.get("terminated"))
    assert "truncated" not in nxt


def test_step_and_maybe_reset_resets_only_done_envs(point_mass_cls):
    env = point_mass_cls(num_envs=6, bound=0.5)
    td = env.reset()
    push = torch.ones(6, 2, 1, dtype=torch.float64)
    for _ in range(30):
        td.set(("points", "action"), push)
        transition, root = env.step_and_maybe_reset(td)
        done = transition.get(("next", "done")).squeeze(-1)
        if done.any() and not done.all():
            break
        td = root
    else:
        pytest.fail("no partly done batch")
    assert torch.equal(env.reset_masks[-1], done)
    next_obs = transition.get(("next", "points", "observation"))
    root_obs = root.get(("points", "observation"))
    assert torch.equal(root_obs[~done], next_obs[~done])  # carried over
    assert (root_obs[done][..., 1] == 0).all()  # reset: velocity 0
    assert not root.get("done").any() and not root.get(("points", "done")).any()
    assert "_reset" not in root
    assert "action" not in root.get("points")


def test_step_rejects_a_non_tensordict(nav):
    env = nav()
    with pytest.raises(TypeError, match="step\\(\\) takes a TensorDict, got dict"):
        env.step({"agents": {"action": torch.zeros(4, 3, 2)}})


# --------------------------------------------------------------------------- action validation

BAD_CONTINUOUS: dict[str, tuple[Callable[[TensorDictBase], TensorDictBase], str]] = {
    "missing": (lambda td: td.exclude(ACT), "is missing from the input TensorDict"),
    "shape": (
        lambda td: td.set(ACT, td.get(ACT)[..., :1]),
        "shape [4, 3, 1] != spec shape [4, 3, 2]",
    ),
    "dtype": (lambda td: td.set(ACT, td.get(ACT).double()), "dtype float64 != spec dtype float32"),
    "bounds": (
        lambda td: td.set(ACT, td.get(ACT).index_put((torch.tensor(2),), torch.tensor(1.5))),
        "value 1.5 at index [2, 0, 0] is outside [-1.0, 1.0]",
    ),
    "nan": (
        lambda td: td.set(ACT, td.get(ACT).index_put((torch.tensor(1),), torch.tensor(torch.nan))),
        "non-finite value nan at index [1, 0, 0]",
    ),
    "inf": (
        lambda td: td.set(ACT, td.get(ACT).index_put((torch.tensor(3),), torch.tensor(-torch.inf))),
        "non-finite value -inf at index [3, 0, 0]",
    ),
}

BAD_DISCRETE: dict[str, tuple[Callable[[TensorDictBase], TensorDictBase], str]] = {
    "missing": (lambda td: td.exclude(ACT), "is missing from the input TensorDict"),
    "shape": (lambda td: td.set(ACT, td.get(ACT).unsqueeze(-1)), "shape [4, 3, 1] != spec shape"),
    "dtype": (lambda td: td.set(ACT, td.get(ACT).float()), "dtype float32 != spec dtype int64"),
    "high": (
        lambda td: td.set(ACT, torch.full((4, 3), 5)),
        "class 5 at index [0, 0] is outside [0, 5)",
    ),
    "negative": (
        lambda td: td.set(ACT, torch.full((4, 3), -1)),
        "class -1 at index [0, 0] is outside [0, 5)",
    ),
}


def _check_rejected_and_untouched(nav, td_equal, continuous: bool, corrupt, reason: str):
    env = nav(seed=11, continuous_actions=continuous)
    twin = nav(seed=11, continuous_actions=continuous)
    td, td_twin = _advance(env, 3), _advance(twin, 3)
    env.rand_action(td)
    twin.rand_action(td_twin)
    before = _snapshot(env)
    bad = corrupt(td.clone())
    with pytest.raises(InvalidActionError) as info:
        env.step(bad)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert repr(ACT) in message, message
    assert reason in message, message
    assert repr(twin.action_spec[ACT]) in message, message  # the expected spec
    assert "next" not in bad
    # the simulator was not touched ...
    for name, value in _snapshot(env).items():
        assert torch.equal(value, before[name]), name
    # ... and what follows is bit for bit what the twin without the bad step does
    td_equal(
        env.rollout(6, break_when_any_done=False, auto_reset=False, tensordict=td),
        twin.rollout(6, break_when_any_done=False, auto_reset=False, tensordict=td_twin),
    )


@pytest.mark.parametrize("case", sorted(BAD_CONTINUOUS))
def test_bad_continuous_action_is_rejected_and_state_untouched(nav, td_equal, case):
    corrupt, reason = BAD_CONTINUOUS[case]
    _check_rejected_and_untouched(nav, td_equal, True, corrupt, reason)


@pytest.mark.parametrize("case", sorted(BAD_DISCRETE))
def test_bad_discrete_action_is_rejected_and_state_untouched(nav, td_equal, case):
    corrupt, reason = BAD_DISCRETE[case]
    _check_rejected_and_untouched(nav, td_equal, False, corrupt, reason)


def test_missing_action_is_also_a_key_error(nav):
    env = nav()
    td = env.reset()
    with pytest.raises(KeyError, match=re.escape("the action ('agents', 'action') is missing")):
        env.step(td)
    with pytest.raises(MissingActionError, match=r"keys present: .*'state'"):
        env.step(td)


def test_bad_action_in_second_group_leaves_first_untouched(point_mass_cls):
    env = point_mass_cls(num_envs=3, groups={"a": 1, "b": 2})
    td = env.rand_action(env.reset())
    td.set(("b", "action"), torch.full((3, 2, 1), 2.0, dtype=torch.float64))
    pos, vel = env.pos.clone(), env.vel.clone()
    with pytest.raises(InvalidActionError, match=re.escape("invalid action at ('b', 'action')")):
        env.step(td)
    assert torch.equal(env.pos, pos) and torch.equal(env.vel, vel)
    assert env.action_dtypes == []  # _step never ran


def test_validation_can_be_switched_off(nav, point_mass_cls):
    env = nav()
    td = env.reset()
    td.set(ACT, torch.full((4, 3, 2), 3.0))
    with pytest.raises(InvalidActionError):
        env.step(td)
    env.validate_actions = False
    env.step(td)  # out of bounds, accepted
    assert "next" in td
    quiet = point_mass_cls(validate_actions=False)
    assert not quiet.validate_actions
    td = quiet.reset()
    td.set(("points", "action"), torch.full((4, 2, 1), 9.0, dtype=torch.float64))
    quiet.step(td)
    assert torch.allclose(quiet.vel, torch.full((4, 2), 0.9, dtype=torch.float64))


# --------------------------------------------------------------------------- partial resets


def _partial_reset_check(env: EnvBase, td: TensorDictBase, expected: torch.Tensor) -> None:
    """Reset with the masks in ``td``; ``expected`` [B] bool are the envs that must reset."""
    before = _snapshot(env)
    with mock.patch.object(env, "_reset", wraps=env._reset) as spy:
        out = env.reset(td)
    assert spy.call_count == 1  # one vectorised call for the whole batch
    env_mask = spy.call_args.args[1]
    assert env_mask.shape == env.batch_size and torch.equal(env_mask, expected)
    keep = ~expected
    after = _snapshot(env)
    for name in ("_pos", "_goal"):
        assert torch.equal(after[name][keep], before[name][keep]), name
        assert not torch.equal(after[name][expected], before[name][expected]), name
    assert (after["_vel"][expected] == 0).all()
    for group in env.groups:
        key = (group, "observation")
        assert torch.equal(out.get(key)[keep], td.get(key)[keep])
        assert not torch.equal(out.get(key)[expected], td.get(key)[expected])
    assert torch.equal(out.get("state")[keep], td.get("state")[keep])


def test_partial_reset_root_mask(nav):
    env = nav(num_envs=5)
    td = _advance(env, 3)
    mask = torch.tensor([False, True, False, True, False])
    td.set("_reset", mask.unsqueeze(-1))
    _partial_reset_check(env, td, mask)


def test_partial_reset_group_mask_resets_the_whole_env(nav):
    env = nav(num_envs=5, n_agents=3)
    td = _advance(env, 3)
    group_mask = torch.zeros(5, 3, 1, dtype=torch.bool)
    group_mask[0, 2] = True  # one agent of env 0: the env resets (resets are per env)
    td.set(("agents", "_reset"), group_mask)
    _partial_reset_check(env, td, torch.tensor([True, False, False, False, False]))


def test_partial_reset_with_several_groups_and_root_is_the_union(nav):
    env = nav(num_envs=5, n_agents=3, group_map="per_agent")
    assert env.groups == ["agent_0", "agent_1", "agent_2"]
    td = _advance(env, 3)
    td.set(("agent_1", "_reset"), torch.tensor([False, False, True, False, False]).view(5, 1, 1))
    td.set("_reset", torch.tensor([[True], [False], [False], [False], [False]]))
    _partial_reset_check(env, td, torch.tensor([True, False, True, False, False]))


def test_partial_reset_keeps_done_flags_of_other_envs(nav):
    env = nav(num_envs=4)
    td = _advance(env, 2)
    for key in env.done_keys:
        td.set(key, torch.ones_like(td.get(key)))
    td.set("_reset", torch.tensor([[False], [True], [False], [False]]))
    out = env.reset(td)
    for key in env.done_keys:
        flat = out.get(key).reshape(4, -1)
        assert not flat[1].any() and flat[[0, 2, 3]].all(), key


def test_full_and_empty_masks(nav):
    env = nav(num_envs=4)
    td = _advance(env, 2)
    with mock.patch.object(env, "_reset", wraps=env._reset) as spy:
        env.reset(td.clone().set("_reset", torch.ones(4, 1, dtype=torch.bool)))
    assert spy.call_args.args[1] is None  # all set: a full reset
    td = _advance(env, 2)
    before = _snapshot(env)
    out = env.reset(td.clone().set("_reset", torch.zeros(4, 1, dtype=torch.bool)))
    for name, value in _snapshot(env).items():
        assert torch.equal(value, before[name]), name
    assert torch.equal(out.get(OBS), td.get(OBS))


@pytest.mark.parametrize(
    ("key", "value", "error", "match"),
    [
        (
            "_reset",
            torch.ones(4, dtype=torch.bool),
            ValueError,
            "reset mask '_reset' has shape [4], expected [4, 1]",
        ),
        (
            ("agents", "_reset"),
            torch.ones(4, 3, dtype=torch.bool),
            ValueError,
            "reset mask ('agents', '_reset') has shape [4, 3], expected [4, 3, 1]",
        ),
        ("_reset", torch.ones(4, 1, dtype=torch.int64), TypeError, "must be a bool tensor"),
        ("_reset", torch.ones(4, 1), TypeError, "reset mask '_reset' must be a bool tensor"),
    ],
)
def test_bad_reset_mask_is_rejected(nav, key, value, error, match):
    env = nav(num_envs=4)
    td = _advance(env, 2)
    before = _snapshot(env)
    td.set(key, value)
    with pytest.raises(error, match=re.escape(match)):
        env.reset(td)
    for name, tensor in _snapshot(env).items():
        assert torch.equal(tensor, before[name]), name


# --------------------------------------------------------------------------- rollout


def test_rollout_shape_and_keys(nav):
    env = nav(num_envs=4, n_agents=3)
    r = env.rollout(7, break_when_any_done=False)
    assert r.batch_size == torch.Size([4, 7])
    assert r.get(ACT).shape == (4, 7, 3, 2)
    assert r.get(("next", "agents", "reward")).shape == (4, 7, 3, 1)
    assert r.get(("next", "done")).shape == (4, 7, 1)
    for t in range(7):  # the random policy samples the action spec
        assert env.action_spec[ACT].is_in(r.get(ACT)[:, t])
    # consecutive steps chain: next observation of t is the observation of t + 1
    assert torch.equal(r.get(("next", *OBS))[:, :-1], r.get(OBS)[:, 1:])


def test_rollout_of_an_unbatched_env():
    class Coin(EnvBase):
        """One env (batch []) with a single agent flipping a coin; done after heads."""

        def __init__(self):
            super().__init__(batch_size=())
            self.group_map = {"agents": ["agent_0"]}
            self.observation_spec = Composite(
                agents=Composite(observation=Unbounded((1, 1)), shape=(1,))
            )
            self.action_spec = Composite(agents=Composite(action=Categorical(2, (1,)), shape=(1,)))
            self.reward_spec = make_reward_spec((), {"agents": 1})
            self.done_spec = make_done_spec((), {"agents": 1}, keys=("done", "terminated"))

        def _set_seed(self, seed):
            pass

        def _reset(self, tensordict, env_mask):
            obs = TensorDict({"observation": torch.zeros(1, 1)}, batch_size=(1,))
            return TensorDict({"agents": obs}, batch_size=())

        def _step(self, tensordict):
            heads = tensordict.get(ACT).bool().view(1, 1)
            group = TensorDict(
                {"observation": heads.float(), "reward": heads.float(), "terminated": heads},
                batch_size=(1,),
            )
            return TensorDict({"agents": group}, batch_size=())

    env = Coin()
    env.set_seed(0)
    r = env.rollout(50)
    assert r.batch_size[0] < 50 and r.ndim == 1
    assert r.get(("next", "done"))[-1].all() and not r.get(("next", "done"))[:-1].any()
    check_env_specs(env)
    heads = torch.ones(1, dtype=torch.bool)
    td = env.reset(TensorDict({"_reset": heads}))
    assert td.get(("agents", "observation")).shape == (1, 1)


def test_rollout_break_when_any_done_stops_at_the_first_done(point_mass_cls):
    env = point_mass_cls(num_envs=4, bound=0.6)

    def push(td: TensorDictBase) -> TensorDictBase:
        return td.set(("points", "action"), torch.ones(4, 2, 1, dtype=torch.float64))

    r = env.rollout(50, push)
    done = r.get(("next", "done")).squeeze(-1)
    assert 1 < r.batch_size[1] < 50
    assert done[:, -1].any() and not done[:, :-1].any()
    assert len(env.reset_masks) == 1  # only the initial reset


def test_rollout_without_break_auto_resets_and_runs_max_steps(point_mass_cls):
    env = point_mass_cls(num_envs=4, bound=0.6)

    def push(td: TensorDictBase) -> TensorDictBase:
        return td.set(("points", "action"), torch.ones(4, 2, 1, dtype=torch.float64))

    r = env.rollout(40, push, break_when_any_done=False)
    assert r.batch_size == torch.Size([4, 40])
    done = r.get(("next", "done")).squeeze(-1)
    assert done.sum() >= 4
    partial = [m for m in env.reset_masks[1:] if m is not None]
    assert partial and any(not m.all() for m in partial)
    obs, next_obs = r.get(("points", "observation")), r.get(("next", "points", "observation"))
    for t in range(39):
        keep = ~done[:, t]
        assert torch.equal(obs[keep, t + 1], next_obs[keep, t])  # carried over
        fresh = obs[done[:, t], t + 1]
        assert (fresh[..., 1] == 0).all() and (fresh[..., 0].abs() <= 0.5).all()  # reset
        assert not r.get("done")[:, t + 1].any()


def test_rollout_auto_reset_false_continues_from_the_given_tensordict(point_mass_cls):
    env = point_mass_cls(num_envs=3)
    td = _advance(env, 2)
    calls = len(env.reset_masks)
    r = env.rollout(4, auto_reset=False, tensordict=td, break_when_any_done=False)
    assert len(env.reset_masks) == calls  # no reset
    assert torch.equal(r.get(("points", "observation"))[:, 0], td.get(("points", "observation")))
    with pytest.raises(ValueError, match=re.escape("rollout(auto_reset=False) needs a starting")):
        env.rollout(4, auto_reset=False)


def test_rollout_auto_reset_applies_the_masks_of_the_given_tensordict(point_mass_cls):
    env = point_mass_cls(num_envs=3)
    td = _advance(env, 2)
    mask = torch.tensor([True, False, False])
    td.set("_reset", mask.unsqueeze(-1))
    r = env.rollout(2, tensordict=td)
    assert torch.equal(env.reset_masks[-1], mask)
    obs0 = r.get(("points", "observation"))[:, 0]
    assert torch.equal(obs0[1:], td.get(("points", "observation"))[1:])


@pytest.mark.parametrize("max_steps", [0, -3])
def test_rollout_validates_max_steps_value(nav, max_steps):
    env = nav()
    with pytest.raises(ValueError, match=f"max_steps must be an int >= 1, got {max_steps}"):
        env.rollout(max_steps)


@pytest.mark.parametrize("max_steps", [2.5, True, "4", None])
def test_rollout_validates_max_steps_type(nav, max_steps):
    env = nav()
    with pytest.raises(TypeError, match="max_steps must be an int >= 1, got"):
        env.rollout(max_steps)


def test_rollout_and_render_take_numpy_ints(nav):
    # refused as "got int64" where num_envs, seed and StepCounter(max_steps) took them
    env = nav()
    assert env.rollout(np.int64(3)).batch_size[-1] == 3
    with pytest.raises(TypeError, match="validate_actions must be a bool, got str: 'False'"):
        marlkit.make("navigation", num_envs=2, validate_actions="False")


BACKENDS = [
    pytest.param(
        "native",
        marks=pytest.mark.skipif(not extension_available(), reason="marlkit._C not built"),
    ),
    "torch",
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_rollout_with_a_tensordict_module_policy(nav, backend):
    torch.manual_seed(0)
    env = nav(num_envs=4, n_agents=3, backend=backend)
    net = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 2), nn.Tanh())
    policy = TensorDictModule(net, in_keys=[OBS], out_keys=[ACT])
    r = env.rollout(5, policy, break_when_any_done=False)
    assert r.batch_size == torch.Size([4, 5])
    with torch.no_grad():
        expected = net(r.get(OBS))
    assert torch.allclose(r.get(ACT).detach(), expected)
    assert env.action_spec[ACT].is_in(r.get(ACT)[:, 0].detach())


# --------------------------------------------------------------------------- seeding


@pytest.mark.parametrize("continuous", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_rollout(nav, td_equal, continuous, backend):
    def run(seed: int) -> TensorDictBase:
        env = nav(seed=seed, continuous_actions=continuous, backend=backend)
        return env.rollout(12, break_when_any_done=False)

    td_equal(run(5), run(5))
    a, b = run(5), run(6)
    assert not torch.equal(a.get(OBS), b.get(OBS))
    assert not torch.equal(a.get(ACT), b.get(ACT))


def test_set_seed_replays_the_same_rollout(nav, td_equal):
    env = nav(seed=None, continuous_actions=False)
    assert env.set_seed(3) == 4  # one generator for the batch: one seed used
    first = env.rollout(8, break_when_any_done=False)
    env.rollout(3)  # move every stream on
    env.set_seed(3)
    td_equal(first, env.rollout(8, break_when_any_done=False))


def test_random_actions_come_from_the_env_generator(nav):
    env = nav(continuous_actions=False)
    env.set_seed(1)
    a = env.rand_action().get(ACT)
    torch.manual_seed(123)  # the global generator plays no part
    env.set_seed(1)
    assert torch.equal(env.rand_action().get(ACT), a)
    assert env.action_spec[ACT].is_in(a)


@pytest.mark.parametrize("seed", ["1", 1.0, True, None])
def test_set_seed_rejects_non_ints(nav, seed):
    env = nav()
    with pytest.raises(TypeError, match="seed must be an int"):
        env.set_seed(seed)


# --------------------------------------------------------------------------- masked actions


@pytest.mark.parametrize("one_hot", [False, True])
def test_rand_action_honours_the_action_mask(masked_env_cls, one_hot):
    env = masked_env_cls(num_envs=64, n_agents=3, one_hot=one_hot)
    td = env.reset()
    chosen = []
    for _ in range(4):
        td = env.rand_action(td)
        action = td.get(ACT)
        index = action.long().argmax(-1) if one_hot else action
        mask = td.get(("agents", "action_mask"))
        assert mask.gather(-1, index.unsqueeze(-1)).all()
        chosen.append(index)
        _, td = env.step_and_maybe_reset(td)
    # both allowed actions of each step show up: sampled, not a fixed choice
    assert set(torch.stack(chosen).unique().tolist()) == {0, 1, 2, 3}
    r = env.rollout(5)
    assert (r.get(("next", "agents", "reward")) == 1).all()


@pytest.mark.parametrize("one_hot", [False, True])
def test_masked_out_action_is_rejected_naming_the_mask(masked_env_cls, one_hot):
    env = masked_env_cls(num_envs=2, n_agents=2, one_hot=one_hot)
    td = env.reset()  # t = 0: agent 0 may take 0 or 2, agent 1 may take 1 or 3
    index = torch.tensor([[0, 3], [2, 0]])  # env 1, agent 1 takes 0: masked out
    action = torch.nn.functional.one_hot(index, 4).bool() if one_hot else index
    td.set(ACT, action)
    with pytest.raises(InvalidActionError) as info:
        env.step(td)
    message = str(info.value)
    assert "action 0 at index [1, 1] is masked out by ('agents', 'action_mask')" in message
    assert repr(ACT) in message
    assert int(env.t.sum()) == 0  # not stepped
    env.validate_actions = False
    env.step(td)
    assert td.get(("next", "agents", "reward"))[1, 1].item() == -1.0


def test_masked_envs_pass_the_spec_check(masked_env_cls):
    check_env_specs(masked_env_cls())
    check_env_specs(masked_env_cls(one_hot=True))


# --------------------------------------------------------------------------- close


def test_closed_env_raises(point_mass_cls):
    env = point_mass_cls()
    td = env.rand_action(env.reset())
    assert not env.is_closed
    env.close()
    env.close()  # idempotent
    assert env.is_closed and env.close_calls == 1
    for call in (env.reset, lambda: env.step(td), lambda: env.rollout(2)):
        with pytest.raises(RuntimeError, match="PointMassEnv is closed; create a new env"):
            call()


def test_context_manager_closes(point_mass_cls):
    with point_mass_cls() as env:
        env.rollout(2)
        assert not env.is_closed
    assert env.is_closed and env.close_calls == 1
    with pytest.raises(RuntimeError, match="is closed"):
        env.reset()


def test_closing_a_transformed_env_closes_the_inner_one_and_vice_versa(point_mass_cls):
    inner = point_mass_cls()
    with TransformedEnv(inner, StepCounter()) as env:
        env.rollout(2)
    assert inner.is_closed and inner.close_calls == 1
    inner = point_mass_cls()
    env = TransformedEnv(inner, StepCounter())
    inner.close()
    with pytest.raises(RuntimeError, match="PointMassEnv is closed"):
        env.rollout(2)


def test_an_env_pickles_after_use_and_the_copy_steps_alike(nav, td_equal):
    import pickle

    env = nav()
    env.set_seed(0)
    _, root = env.step_and_maybe_reset(env.rand_action(env.reset()))  # caches step_mdp
    copy = pickle.loads(pickle.dumps(env))
    a, b = env.rollout(3, tensordict=root), copy.rollout(3, tensordict=root.clone())
    td_equal(a, b)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_an_unavailable_device_is_named(nav):
    with pytest.raises(ValueError, match="device 'cuda' is not available here"):
        nav(device="cuda")
