"""``check_env_specs``: a real short rollout checked against the specs, every problem listed."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from marlkit.data.composite import Composite
from marlkit.data.specs import Bounded, Unbounded
from marlkit.envs import (
    EnvBase,
    SpecCheckError,
    StepCounter,
    TransformedEnv,
    check_env_specs,
    make_done_spec,
    make_reward_spec,
    spec_problems,
)

B, N = 3, 2
DEFECTS = ("obs_shape", "reward_dtype", "extra_key", "missing_state", "out_of_bounds", "reset")


class BrokenEnv(EnvBase):
    """A small batched env with switchable defects (all off: a correct env).

    ``obs_shape``: ``(agents, observation)`` is ``[3, 2, 5]``, declared ``[3, 2, 4]``.
    ``reward_dtype``: rewards come as float64, declared float32.
    ``extra_key``: steps also write an undeclared ``(agents, "debug")``.
    ``missing_state``: the declared ``"state"`` never comes.
    ``out_of_bounds``: ``(agents, "energy")``, declared in ``[0, 1]``, reaches 1.5 at step 2.
    ``reset``: partial resets (not full ones) return the observation as float64.
    """

    def __init__(self, *defects: str):
        super().__init__(batch_size=(B,))
        unknown = set(defects) - set(DEFECTS)
        assert not unknown, unknown
        self.defects = set(defects)
        self.group_map = {"agents": [f"agent_{i}" for i in range(N)]}
        self.observation_spec = Composite(
            agents=Composite(
                observation=Unbounded((B, N, 4)),
                energy=Bounded(0.0, 1.0, (B, N, 1)),
                shape=(B, N),
            ),
            shape=(B,),
        )
        self.state_spec = Composite(state=Unbounded((B, 8)), shape=(B,))
        self.action_spec = Composite(
            agents=Composite(action=Bounded(-1.0, 1.0, (B, N, 1)), shape=(B, N)), shape=(B,)
        )
        self.reward_spec = make_reward_spec((B,), {"agents": N})
        self.done_spec = make_done_spec((B,), {"agents": N})
        self.t = torch.zeros(B, dtype=torch.long)

    def _set_seed(self, seed: int) -> None:
        pass

    def _output(self, partial: bool = False) -> TensorDict:
        dim = 5 if "obs_shape" in self.defects else 4
        obs = self.t.view(B, 1, 1).expand(B, N, dim).float()
        if partial and "reset" in self.defects:
            obs = obs.double()
        high = 1.5 if "out_of_bounds" in self.defects else 1.0
        energy = torch.where(self.t == 2, high, 0.5).view(B, 1, 1).expand(B, N, 1).clone()
        group = TensorDict({"observation": obs, "energy": energy}, batch_size=(B, N))
        out = TensorDict({"agents": group}, batch_size=(B,))
        if "missing_state" not in self.defects:
            out.set("state", torch.zeros(B, 8))
        return out

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        self.t = torch.where(env_mask, 0, self.t) if env_mask is not None else self.t * 0
        return self._output(partial=env_mask is not None)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.t = self.t + 1
        out = self._output()
        dtype = torch.float64 if "reward_dtype" in self.defects else torch.float32
        out.set(("agents", "reward"), torch.ones(B, N, 1, dtype=dtype))
        # env i ends its episode every i + 2 steps: partial resets
        end = (self.t % torch.arange(2, 2 + B) == 0).view(B, 1, 1).expand(B, N, 1).clone()
        out.set(("agents", "terminated"), end)
        out.set(("agents", "truncated"), torch.zeros(B, N, 1, dtype=torch.bool))
        if "extra_key" in self.defects:
            out.set(("agents", "debug"), torch.zeros(B, N))
        return out


def test_a_correct_env_passes():
    env = BrokenEnv()
    assert spec_problems(env, steps=6) == []
    check_env_specs(env, steps=6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"continuous_actions": True},
        {"continuous_actions": False},
        {"group_map": "per_agent"},
        {"num_envs": 1, "n_agents": 1},
    ],
)
def test_navigation_passes(nav, kwargs):
    check_env_specs(nav(**kwargs), steps=4)


def test_fixture_envs_pass(point_mass_cls, masked_env_cls):
    check_env_specs(point_mass_cls(groups={"a": 1, "b": 3}, bound=0.6), steps=12)
    check_env_specs(masked_env_cls(one_hot=True))


def test_every_broken_key_is_listed():
    env = BrokenEnv("obs_shape", "reward_dtype", "extra_key")
    with pytest.raises(SpecCheckError) as info:
        check_env_specs(env, steps=3)
    message = str(info.value)
    assert message.startswith("BrokenEnv: ")
    assert re.search(r"\d+ disagreement\(s\) between data and specs", message)
    for line in (
        "reset: ('agents', 'observation'): shape [3, 2, 5] != spec shape [3, 2, 4]",
        "step 0: ('next', 'agents', 'observation'): shape [3, 2, 5] != spec shape [3, 2, 4]",
        "step 0: ('next', 'agents', 'reward'): dtype float64 != spec dtype float32",
        "step 0: ('next', 'agents', 'debug'): present in the data but absent from every spec",
        "step 2: ('next', 'agents', 'debug'): present in the data but absent from every spec",
    ):
        assert line in message, line
    assert "step 3:" not in message  # steps=3: steps 0, 1, 2
    assert isinstance(info.value, AssertionError)


@pytest.mark.parametrize(
    ("defect", "key", "expected"),
    [
        (
            "obs_shape",
            "'observation'",
            "reset: ('agents', 'observation'): shape [3, 2, 5] != spec shape [3, 2, 4]",
        ),
        ("reward_dtype", "'reward'", "step 0: ('next', 'agents', 'reward'): dtype float64 != spec"),
        ("extra_key", "'debug'", "step 0: ('next', 'agents', 'debug'): present in the data but"),
        ("missing_state", "'state'", "reset: 'state': missing (expected Unbounded(shape=[3, 8]"),
        (
            "out_of_bounds",
            "'energy'",
            "step 1: ('next', 'agents', 'energy'): value 1.5 at index [0, 0, 0] is outside "
            "[0.0, 1.0]",
        ),
        (
            "reset",
            "'observation'",
            "step 1 reset: ('agents', 'observation'): dtype float64 != spec dtype float32",
        ),
    ],
)
def test_each_defect_is_reported_alone(defect, key, expected):
    problems = spec_problems(BrokenEnv(defect), steps=4)
    assert any(p.startswith(expected) for p in problems), problems
    assert all(key in p for p in problems), problems  # nothing else is blamed


def test_partial_reset_outputs_are_checked():
    # Env 0 ends every 2 steps: after step 1 it is reset alone (a partial reset).
    problems = spec_problems(BrokenEnv("reset"), steps=2)
    assert problems == [
        "step 1 reset: ('agents', 'observation'): dtype float64 != spec dtype float32"
    ]


def test_undeclared_key_at_reset_is_listed(point_mass_cls):
    class Chatty(point_mass_cls):
        def _reset(self, tensordict, env_mask):
            return super()._reset(tensordict, env_mask).set("info", torch.zeros(4))

    problems = spec_problems(Chatty(), steps=1)
    assert problems == ["reset: 'info': present in the data but absent from every spec"]


def test_transformed_env_is_checked_against_its_own_specs(point_mass_cls):
    class BadCounter(StepCounter):
        """Writes the step count as int32 while declaring int64."""

        def inv(self, tensordict):  # reads its own int32 back (the input check wants int64)
            count = tensordict.get(self.step_count_key).long()
            return super().inv(tensordict.clone(False).set(self.step_count_key, count))

        def step(self, tensordict, next_tensordict):
            next_tensordict = super().step(tensordict, next_tensordict)
            count = next_tensordict.get(self.step_count_key)
            return next_tensordict.set(self.step_count_key, count.int())

    with pytest.raises(SpecCheckError, match=re.escape("('next', 'step_count'): dtype int32")):
        check_env_specs(TransformedEnv(point_mass_cls(), BadCounter(5)))


def test_check_is_seeded_and_reproducible(nav):
    env = nav(seed=None)
    check_env_specs(env, seed=4)
    first = env.rollout(3, break_when_any_done=False)
    check_env_specs(env, seed=4)
    second = env.rollout(3, break_when_any_done=False)
    assert torch.equal(first.get(("agents", "action")), second.get(("agents", "action")))
