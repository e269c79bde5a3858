"""Small real envs shared by the env-API tests, handed out as fixtures.

With ``--import-mode=importlib`` test modules cannot import each other nor this file, so the
fixture envs are exposed through fixtures that return their classes or a factory.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

import marlkit
from marlkit.data.composite import Composite
from marlkit.data.keys import ACTION, ACTION_MASK, OBSERVATION, REWARD, STATE, TERMINATED
from marlkit.data.specs import Bounded, Categorical, OneHot, Unbounded
from marlkit.envs import EnvBase, make_done_spec, make_reward_spec


class PointMassEnv(EnvBase):
    """1-D point masses in float64, batched over envs, in one or more groups.

    Each agent has a position and a velocity (``(group, "observation")`` ``[E, n, 2]`` float64)
    and pushes itself with a force in ``[-1, 1]`` (``(group, "action")`` ``[E, n, 1]``
    float64). Reward: ``-|position|``. An env terminates when any agent leaves ``[-bound,
    bound]``. Done specs declare only ``done`` and ``terminated`` (no ``truncated``), and
    ``_step`` returns only the groups' ``terminated``: the base class fills the rest.

    It records every ``_reset`` mask, the dtype of the actions it received and ``_close`` calls.
    """

    def __init__(
        self,
        num_envs: int = 4,
        groups: Mapping[str, int] | None = None,
        *,
        bound: float = 1.0,
        dt: float = 0.1,
        seed: int = 0,
        validate_actions: bool = True,
    ):
        super().__init__(batch_size=(num_envs,), validate_actions=validate_actions)
        self.sizes = dict(groups) if groups is not None else {"points": 2}
        self.group_map = {g: [f"{g}_{i}" for i in range(n)] for g, n in self.sizes.items()}
        self.bound, self.dt = bound, dt
        self.n_total = sum(self.sizes.values())
        b, f64 = self.batch_size, torch.float64
        obs, act = Composite(shape=b), Composite(shape=b)
        for g, n in self.sizes.items():
            obs[g] = Composite({OBSERVATION: Unbounded((*b, n, 2), dtype=f64)}, shape=(*b, n))
            act[g] = Composite({ACTION: Bounded(-1.0, 1.0, (*b, n, 1), dtype=f64)}, shape=(*b, n))
        self.observation_spec = obs
        self.action_spec = act
        self.state_spec = Composite({STATE: Unbounded((*b, 2 * self.n_total), dtype=f64)}, shape=b)
        self.reward_spec = make_reward_spec(b, self.sizes, dtype=f64)
        self.done_spec = make_done_spec(b, self.sizes, keys=("done", "terminated"))
        self.pos = torch.zeros(num_envs, self.n_total, dtype=f64)
        self.vel = torch.zeros(num_envs, self.n_total, dtype=f64)
        self.reset_masks: list[torch.Tensor | None] = []
        self.action_dtypes: list[torch.dtype] = []
        self.close_calls = 0
        self._gen = torch.Generator()
        self.set_seed(seed)

    def _set_seed(self, seed: int) -> None:
        self._gen.manual_seed(seed + 7)

    def _slices(self) -> dict[str, slice]:
        out, start = {}, 0
        for g, n in self.sizes.items():
            out[g] = slice(start, start + n)
            start += n
        return out

    def _output(self) -> dict[str, TensorDictBase | torch.Tensor]:
        e = self.batch_size[0]
        groups: dict[str, TensorDictBase | torch.Tensor] = {}
        for g, s in self._slices().items():
            obs = torch.stack([self.pos[:, s], self.vel[:, s]], dim=-1)
            groups[g] = TensorDict({OBSERVATION: obs}, batch_size=(e, self.sizes[g]))
        groups[STATE] = torch.cat([self.pos, self.vel], dim=-1)
        return groups

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        self.reset_masks.append(None if env_mask is None else env_mask.clone())
        fresh = torch.rand(self.pos.shape, generator=self._gen, dtype=torch.float64) - 0.5
        reset = torch.ones(self.batch_size, dtype=torch.bool) if env_mask is None else env_mask
        self.pos = torch.where(reset.unsqueeze(-1), fresh, self.pos)
        self.vel = torch.where(reset.unsqueeze(-1), torch.zeros_like(self.vel), self.vel)
        return TensorDict(self._output(), batch_size=self.batch_size)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        actions = [tensordict.get((g, ACTION)) for g in self.sizes]
        self.action_dtypes.extend(a.dtype for a in actions)
        force = torch.cat([a.squeeze(-1).to(torch.float64) for a in actions], dim=-1)
        self.vel = self.vel + force * self.dt
        self.pos = self.pos + self.vel * self.dt
        out = self._output()
        env_done = (self.pos.abs() > self.bound).any(-1)
        e = self.batch_size[0]
        for g, s in self._slices().items():
            n = self.sizes[g]
            group = out[g]
            assert isinstance(group, TensorDictBase)
            group.set(REWARD, -self.pos[:, s].abs().unsqueeze(-1))
            group.set(TERMINATED, env_done.view(e, 1, 1).expand(e, n, 1).clone())
        return TensorDict(out, batch_size=self.batch_size)

    def _close(self) -> None:
        self.close_calls += 1


class MaskedChoiceEnv(EnvBase):
    """Agents pick one of 4 actions among those allowed by ``(agents, "action_mask")``.

    The mask changes every step (two of the four actions allowed, a pattern that rotates
    with the step and the agent). Observation: the last action taken (float32 ``[E, n, 1]``);
    reward 1 for an allowed action, -1 for a masked-out one (reachable with validation off).
    """

    n_actions = 4

    def __init__(
        self,
        num_envs: int = 8,
        n_agents: int = 3,
        *,
        one_hot: bool = False,
        seed: int = 0,
        validate_actions: bool = True,
    ):
        super().__init__(batch_size=(num_envs,), validate_actions=validate_actions)
        self.n_agents, self.one_hot = n_agents, one_hot
        self.group_map = {"agents": [f"agent_{i}" for i in range(n_agents)]}
        b, n, k = self.batch_size, n_agents, self.n_actions
        self.observation_spec = Composite(
            agents=Composite(
                {
                    OBSERVATION: Unbounded((*b, n, 1)),
                    ACTION_MASK: Categorical(2, (*b, n, k), dtype=torch.bool),
                },
                shape=(*b, n),
            ),
            shape=b,
        )
        leaf = OneHot(k, (*b, n, k)) if one_hot else Categorical(k, (*b, n))
        self.action_spec = Composite(agents=Composite({ACTION: leaf}, shape=(*b, n)), shape=b)
        self.reward_spec = make_reward_spec(b, {"agents": n})
        self.done_spec = make_done_spec(b, {"agents": n})
        self.t = torch.zeros(num_envs, dtype=torch.long)
        self.last = torch.zeros(num_envs, n, 1)
        self.set_seed(seed)

    def _set_seed(self, seed: int) -> None:
        pass

    def mask(self) -> torch.Tensor:
        """``[E, n, 4]`` bool: action ``a`` allowed iff ``a + t + agent`` is even."""
        a = torch.arange(self.n_actions)
        agent = torch.arange(self.n_agents).unsqueeze(-1)
        return (a + agent + self.t.view(-1, 1, 1)) % 2 == 0

    def _output(self) -> TensorDict:
        e, n = self.batch_size[0], self.n_agents
        group = TensorDict(
            {OBSERVATION: self.last.clone(), ACTION_MASK: self.mask()}, batch_size=(e, n)
        )
        return TensorDict({"agents": group}, batch_size=self.batch_size)

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        reset = torch.ones(self.batch_size, dtype=torch.bool) if env_mask is None else env_mask
        self.t = torch.where(reset, torch.zeros_like(self.t), self.t)
        self.last = torch.where(reset.view(-1, 1, 1), torch.zeros_like(self.last), self.last)
        return self._output()

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get(("agents", ACTION))
        index = action.long().argmax(-1) if self.one_hot else action.long()
        allowed = self.mask().gather(-1, index.unsqueeze(-1))
        self.last = index.unsqueeze(-1).float()
        self.t = self.t + 1
        out = self._output()
        e, n = self.batch_size[0], self.n_agents
        out.set(("agents", REWARD), torch.where(allowed, 1.0, -1.0))
        out.set(("agents", TERMINATED), torch.zeros(e, n, 1, dtype=torch.bool))
        out.set(("agents", "truncated"), torch.zeros(e, n, 1, dtype=torch.bool))
        return out


@pytest.fixture
def point_mass_cls() -> type[PointMassEnv]:
    """The float64 point-mass fixture env class (see :class:`PointMassEnv`)."""
    return PointMassEnv


@pytest.fixture
def masked_env_cls() -> type[MaskedChoiceEnv]:
    """The masked-categorical fixture env class (see :class:`MaskedChoiceEnv`)."""
    return MaskedChoiceEnv


@pytest.fixture
def nav():
    """``nav(**kwargs)``: a small seeded navigation env (cpu, default backend)."""
    made: list[EnvBase] = []

    def build(**kwargs: object) -> EnvBase:
        options: dict[str, object] = {"num_envs": 4, "n_agents": 3, "seed": 0}
        options.update(kwargs)
        env = marlkit.make("navigation", **options)
        made.append(env)
        return env

    yield build
    for env in made:
        env.close()


def assert_td_equal(a: TensorDictBase, b: TensorDictBase) -> None:
    """Same keys, and every leaf equal bit for bit (same dtype, shape, values)."""
    keys_a = set(a.keys(True, True))
    keys_b = set(b.keys(True, True))
    assert keys_a == keys_b, f"keys differ: {keys_a ^ keys_b}"
    for key in keys_a:
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x, y), f"{key!r} differs"


@pytest.fixture
def td_equal():
    """The bit-for-bit TensorDict comparison :func:`assert_td_equal`."""
    return assert_td_equal
