"""``marlkit.adapters.custom``: a user's own simulator as an env, through ``from_parallel``
(per-agent dicts, the PettingZoo adapter's machinery) and ``from_batched`` (arrays per group).

The toy simulators are real (small) simulators written here, not mocks: their agents move,
leave the game, are masked; one can be told to misbehave (a wrong shape, a missing agent, NaN).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from marlkit.adapters.custom import (
    BatchedEnv,
    SimulatorOutputError,
    from_batched,
    from_parallel,
    space_from_spec,
)
from marlkit.data import Binary, Bounded, Categorical, Composite, MultiCategorical, Unbounded
from marlkit.data.specs import OneHot, TensorSpec
from marlkit.envs import InvalidActionError, check_env_specs
from marlkit.testing import check_adapter

NAMES = ["walker_0", "walker_1", "walker_2"]


class Corridor:
    """Walkers on a line of cells 0..L; action 0/1/2 moves left/stays/right. A walker that
    reaches cell 0 scores 1 and leaves the game; the episode ends when all have left or after
    ``horizon`` steps (truncation). ``info["action_mask"]`` forbids walking into the right wall.

    ``bad`` makes one output wrong on the second step: ``"shape"``, ``"missing"``, ``"nan"``,
    ``"nan_reward"``, ``"no_reward"``, ``"unknown"``, ``"stray"``, ``"not_dicts"``.
    """

    possible_agents = NAMES

    def __init__(self, length: int = 4, horizon: int = 12, bad: str | None = None):
        self.length, self.horizon, self.bad = length, horizon, bad
        self.rng = np.random.default_rng()
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> Any:
        return spaces.Box(0, 100, (2,), np.float32)  # cell, clock

    def action_space(self, agent: str) -> Any:
        return spaces.Discrete(3)

    def reset(self, seed: int | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.pos = {a: int(self.rng.integers(1, self.length + 1)) for a in self.possible_agents}
        self.agents, self.t = list(self.possible_agents), 0
        return self._obs(self.agents), self._infos(self.agents)

    def _obs(self, agents: list[str]) -> dict[str, np.ndarray]:
        return {a: np.array([self.pos[a], self.t], np.float32) for a in agents}

    def _infos(self, agents: list[str]) -> dict[str, dict]:
        return {a: {"action_mask": self._mask(a)} for a in agents}

    def _mask(self, agent: str) -> np.ndarray:
        return np.array([1, 1, self.pos.get(agent, 0) < self.length])

    def step(self, actions: dict[str, int]) -> Any:
        assert set(actions) == set(self.agents), (actions, self.agents)  # the adapter's contract
        for a, act in actions.items():
            assert act != 2 or self.pos[a] < self.length, "illegal move reached the simulator"
            self.pos[a] += int(act) - 1
        self.t += 1
        before = self.agents
        arrived = {a: self.pos[a] == 0 for a in before}
        truncated = dict.fromkeys(before, self.t >= self.horizon)
        rewards = {a: float(arrived[a]) for a in before}
        obs = self._obs(before)
        self.agents = [a for a in before if not (arrived[a] or truncated[a])]
        if self.t == 2 and self.bad:
            obs, rewards = self._break(obs, rewards)
            if self.bad == "not_dicts":
                return [obs, rewards]
        return obs, rewards, arrived, truncated, self._infos(list(obs))

    def _break(self, obs: dict, rewards: dict) -> tuple[dict, dict]:
        victim = NAMES[1]
        if self.bad == "shape":
            obs[victim] = np.zeros(3, np.float32)
        elif self.bad == "missing":
            self.agents = list(NAMES)  # everybody still in the game, but one observation lacks
            obs.pop(victim)
        elif self.bad == "nan":
            obs[victim] = np.array([np.nan, 1.0], np.float32)
        elif self.bad == "nan_reward":
            rewards[victim] = float("nan")
        elif self.bad == "no_reward":
            rewards.pop(victim)
        elif self.bad == "unknown":
            self.agents = [*self.agents, "ghost"]
        elif self.bad == "stray":  # an observation for an agent nobody declared
            obs["ghost"] = np.zeros(2, np.float32)
        return obs, rewards


def test_from_parallel_passes_the_conformance_kit():
    env = from_parallel(Corridor, num_envs=3, seed=0)
    assert env.batch_size == (3,)
    assert env.group_map == {"agents": NAMES}
    assert env.observation_spec["agents", "observation"] == Bounded(0.0, 100.0, (3, 3, 2))
    assert env.observation_spec["agents", "action_mask"] == Binary(3, (3, 3, 3), dtype=torch.bool)
    assert env.action_spec["agents", "action"] == Categorical(3, (3, 3))
    check_adapter(env, steps=16)
    check_env_specs(env, steps=16)


def test_agents_that_leave_get_mask_false_zero_reward_and_done():
    env = from_parallel(Corridor, num_envs=4, seed=1)
    rollout = env.rollout(12, break_when_any_done=False)
    nxt = rollout["next", "agents"]
    mask, done, reward = nxt["mask"], nxt["done"][..., 0], nxt["reward"][..., 0]
    obs = nxt["observation"]
    left_early = False
    for e in range(4):
        for t in range(1, 12):
            gone = ~rollout["agents", "mask"][e, t]  # absent before this step
            if rollout["next", "done"][e, t - 1]:
                continue  # the env was reset in between
            assert done[e, t][gone].all() and (reward[e, t][gone] == 0).all()
            assert (obs[e, t][gone] == 0).all() and not mask[e, t][gone].any()
            root_over = bool(rollout["next", "done"][e, t])
            left_early |= bool(gone.any()) and not root_over
            assert root_over == bool((~mask[e, t]).all())  # over exactly when nobody is left
    assert left_early, "no walker left before its episode ended; pick another seed"
    # A walker's last transition carries its reward (1 on arrival) and its final observation.
    arrivals = (reward == 1) & done
    assert arrivals.any()
    assert (obs[..., 0][arrivals] == 0).all()  # it stood on cell 0
    terminated = nxt["terminated"][..., 0]
    assert terminated[arrivals].all()


def test_episode_end_by_truncation_sets_root_truncated():
    env = from_parallel(lambda: Corridor(length=40, horizon=3), num_envs=2, seed=0)
    rollout = env.rollout(3)
    assert rollout["next", "truncated"][:, -1].all() and rollout["next", "done"][:, -1].all()
    assert not rollout["next", "terminated"][:, -1].any()
    assert not rollout["next", "done"][:, :-1].any()


def test_info_action_masks_are_honoured_and_illegal_moves_refused():
    env = from_parallel(lambda: Corridor(length=1), num_envs=2, seed=0)  # all start at the wall
    td = env.reset()
    assert not td["agents", "action_mask"][..., 2].any()
    for _ in range(30):  # the random policy never walks into the wall (the simulator asserts)
        _, td = env.step_and_maybe_reset(env.rand_action(td))
    td = env.reset()
    td["agents", "action"] = torch.full((2, 3), 2)
    with pytest.raises(InvalidActionError, match="masked out"):
        env.step(td)
    env.validate_actions = False  # the adapter's own check still refuses it
    with pytest.raises(InvalidActionError, match=r"action 2 of agent 'walker_0' \(env 0\)"):
        env.step(td)
    masked = from_parallel(lambda: Corridor(length=1), seed=0, illegal_actions="mask")
    td = masked.reset()
    td["agents", "action"] = torch.full((1, 3), 2)
    out = masked.step(td)  # replaced by the first legal action: 0, walk left to the goal
    assert (out["next", "agents", "reward"] == 1).all()


def test_a_mask_that_only_steps_carry_is_refused_not_ignored():
    class LateMasks(Corridor):  # masks in step infos only: the env could not declare one
        def reset(self, seed: int | None = None) -> tuple[dict, dict]:
            obs, _ = super().reset(seed)
            return obs, {a: {} for a in self.agents}

    env = from_parallel(lambda: LateMasks(length=40), seed=0)  # no wall within reach
    assert ("agents", "action_mask") not in env.observation_spec.keys(True, True)
    message = r"infos of agent 'walker_0' carry an 'action_mask', but the first reset's infos"
    with pytest.raises(SimulatorOutputError, match=message):
        env.rollout(3)


def test_partial_reset_resets_only_the_selected_instances():
    env = from_parallel(Corridor, num_envs=3, seed=0)
    td = env.reset()
    for _ in range(2):
        _, td = env.step_and_maybe_reset(env.rand_action(td))
    td["_reset"] = torch.tensor([[False], [True], [False]])
    out = env.reset(td)
    assert (out["agents", "observation"][1, :, 1] == 0).all()  # its clock restarted
    for e in (0, 2):
        assert torch.equal(out["agents", "observation"][e], td["agents", "observation"][e])


def test_seeding_repeats_and_distinguishes():
    def run(seed: int) -> torch.Tensor:
        env = from_parallel(Corridor, num_envs=2, seed=seed)
        return env.rollout(10, break_when_any_done=False)["next", "agents", "observation"]

    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))


def test_a_refused_seed_changes_nothing():
    env = from_parallel(Corridor, num_envs=2, seed=3)
    first = env.rollout(6, break_when_any_done=False)["next", "agents", "observation"]
    with pytest.raises(ValueError, match=r"the simulator takes seeds >= 0 .*, got -1"):
        env.set_seed(-1)
    env.set_seed(3)
    again = env.rollout(6, break_when_any_done=False)["next", "agents", "observation"]
    assert torch.equal(again, first)


class Camera(Corridor):
    """Corridor with ``uint8`` observations; its simulator returns ``value`` (any dtype) for
    walker_1 on the second step."""

    def __init__(self, value: np.ndarray):
        super().__init__(length=40)
        self.value = value

    def observation_space(self, agent: str) -> Any:
        return spaces.Box(0, 255, (2,), np.uint8)

    def _obs(self, agents: list[str]) -> dict[str, np.ndarray]:
        obs = {a: np.array([self.pos[a], self.t], np.uint8) for a in agents}
        if self.t == 2 and NAMES[1] in obs:
            obs[NAMES[1]] = self.value
        return obs


@pytest.mark.parametrize(
    "value",
    [np.array([300.0, 1.0]), np.array([-1, 1]), np.array([0.7, 1.0]), np.array([np.nan, 1.0])],
    ids=["wraps", "negative", "fraction", "nan"],
)
def test_values_an_integer_space_cannot_hold_are_refused_not_wrapped(value: np.ndarray):
    env = from_parallel(lambda: Camera(value), seed=0)
    td = env.step(env.rand_action(env.reset()))["next"]
    message = r"agent 'walker_1' at key \('observation',\) holds values uint8 cannot hold exactly"
    with pytest.raises(SimulatorOutputError, match=message):
        env.step(env.rand_action(td))


def test_integer_values_that_fit_are_stored_exactly():
    env = from_parallel(lambda: Camera(np.array([255, 7], np.int64)), seed=0)
    td = env.step(env.rand_action(env.reset()))["next"]
    obs = env.step(env.rand_action(td))["next", "agents", "observation"]
    assert obs.dtype == torch.uint8 and obs[0, 1].tolist() == [255, 7]


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("shape", r"observation of agent 'walker_1' at key \('observation',\) has shape \[3\]"),
        ("missing", r"no observation for agent 'walker_1', which is in the game"),
        (
            "nan",
            r"step\(\) of env 0: the observation of agent 'walker_1' at key \('agents', "
            r"'observation'\) is not finite: \[nan 1\.\]",
        ),
        ("nan_reward", r"reward of agent 'walker_1' at key \('agents', 'reward'\) is not finite"),
        ("no_reward", r"no rewards entry for agent 'walker_1'"),
        ("unknown", r"unknown agents \['ghost'\]"),
        ("stray", r"step\(\) of env 0: observations of unknown agents \['ghost'\]"),
        ("not_dicts", r"must return 5 dicts"),
    ],
)
def test_bad_simulator_outputs_name_agent_key_and_value(bad: str, match: str):
    env = from_parallel(lambda: Corridor(length=40, bad=bad), seed=0)
    td = env.reset()
    td = env.step(env.rand_action(td))["next"]
    with pytest.raises(SimulatorOutputError, match=match):
        env.step(env.rand_action(td))
    assert issubclass(SimulatorOutputError, ValueError)


def test_specs_instead_of_spaces_and_an_object_instead_of_a_factory():
    class Bare(Corridor):  # no observation_space/action_space methods, no possible_agents
        observation_space = None  # type: ignore[assignment]
        action_space = None  # type: ignore[assignment]

    sim = Bare()
    env = from_parallel(
        sim,
        agents=NAMES,
        observation_spaces=Bounded(0.0, 100.0, (2,)),
        action_spaces={a: Categorical(3) for a in NAMES},
        group_map="per_agent",
        seed=0,
    )
    assert env.groups == NAMES and env.simulators == [sim]
    assert env.observation_spec["walker_2", "observation"].shape == (1, 1, 2)
    check_adapter(env)
    with pytest.raises(ValueError, match="num_envs=2"):
        from_parallel(Corridor(), num_envs=2)


def test_construction_errors_name_what_is_wrong():
    with pytest.raises(
        KeyError, match=r"observation_spaces has no entry for agents \['walker_2'\]"
    ):
        from_parallel(Corridor, observation_spaces={a: Unbounded((2,)) for a in NAMES[:2]})
    # the specs as the user wrote them, not the Gymnasium boxes the adapter made of them
    different = r"different observation spaces \(spec Unbounded\(shape=\[1\].* vs spec Unbounded"
    with pytest.raises(ValueError, match=different):
        from_parallel(
            Corridor,
            observation_spaces={a: Unbounded((i + 1,)) for i, a in enumerate(NAMES)},
            group_map="agents",
        )
    with pytest.raises(ValueError, match="illegal_actions must be 'raise' or 'mask'"):
        from_parallel(Corridor, illegal_actions="ignore")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="OneHot"):
        from_parallel(Corridor, action_spaces=OneHot(3))
    with pytest.raises(TypeError, match="must be a Gymnasium space or a marlkit spec"):
        from_parallel(Corridor, observation_spaces="box")


def test_heterogeneous_agents_default_to_groups_by_type():
    class Mixed(Corridor):
        possible_agents = ["scout_0", "scout_1", "tank_0"]

        def action_space(self, agent: str) -> Any:
            return spaces.Discrete(3 if agent.startswith("scout") else 2)

        def _mask(self, agent: str) -> np.ndarray:
            return super()._mask(agent)[: self.action_space(agent).n]

    env = from_parallel(Mixed, seed=0)
    assert env.group_map == {"scout": ["scout_0", "scout_1"], "tank": ["tank_0"]}
    assert env.action_spec["tank", "action"] == Categorical(2, (1, 1))


class Rich:
    """Dict observations (a Box and a Discrete with ``start=1``) and MultiDiscrete actions."""

    possible_agents = ["a_0", "a_1"]

    def __init__(self):
        self.agents: list[str] = []
        self.received: list[dict] = []

    def observation_space(self, agent: str) -> Any:
        return spaces.Dict(
            {"pos": spaces.Box(-1, 1, (2,), np.float32), "kind": spaces.Discrete(3, start=1)}
        )

    def action_space(self, agent: str) -> Any:
        return spaces.MultiDiscrete([2, 3])

    def reset(self, seed: int | None = None) -> tuple[dict, dict]:
        self.agents = list(self.possible_agents)
        return self._obs(0), {}

    def _obs(self, t: int) -> dict:
        return {
            a: {"pos": np.full(2, 0.1 * t, np.float32), "kind": 1 + (i + t) % 3}
            for i, a in enumerate(self.agents)
        }

    def step(self, actions: dict) -> tuple:
        self.received.append(actions)
        flags = dict.fromkeys(self.agents, False)
        return self._obs(1), dict.fromkeys(self.agents, 0.0), flags, flags, {}


def test_dict_observations_and_multidiscrete_actions():
    env = from_parallel(Rich, seed=0)
    spec = env.observation_spec["agents", "observation"]
    assert isinstance(spec, Composite) and set(spec.keys()) == {"pos", "kind"}
    assert spec["kind"] == Categorical(3, (1, 2))
    td = env.reset()
    assert td["agents", "observation", "kind"].tolist() == [[0, 1]]  # start=1 removed
    td["agents", "action"] = torch.tensor([[[1, 2], [0, 0]]])
    out = env.step(td)["next"]
    assert out["agents", "observation", "kind"].tolist() == [[1, 2]]
    sent = env.simulators[0].received[-1]
    assert sent["a_0"].tolist() == [1, 2] and sent["a_1"].tolist() == [0, 0]
    check_adapter(env)


def test_space_from_spec_round_trips_the_leaf_specs():
    box = space_from_spec(Bounded(-1.0, 2.0, (3,)))
    assert isinstance(box, spaces.Box) and box.shape == (3,) and box.high[0] == 2.0
    assert space_from_spec(Unbounded((2,), dtype=torch.int32)).dtype == np.int32
    assert space_from_spec(Categorical(4)) == spaces.Discrete(4)
    assert space_from_spec(MultiCategorical([2, 3], (2,))) == spaces.MultiDiscrete([2, 3])
    assert space_from_spec(Binary(5)) == spaces.MultiBinary(5)
    nested = space_from_spec(Composite(pos=Unbounded((2,)), kind=Categorical(3)))
    assert isinstance(nested, spaces.Dict) and set(nested.spaces) == {"pos", "kind"}


# ---------------------------------------------------------------------- from_batched
class Particles:
    """``E`` worlds of ``n`` particles on a line, stepped together (NumPy). Actions in [-1, 1]
    move them; reward ``-|x|``; a world terminates when all are within 0.1 of 0 and is
    truncated after ``horizon`` steps. ``bad``: ``"shape"``, ``"nan"`` or ``"half_done"`` (0.5
    as a truncation flag) on every step."""

    def __init__(self, num_envs: int, n: int = 2, horizon: int = 5, bad: str | None = None):
        self.e, self.n, self.horizon, self.bad = num_envs, n, horizon, bad
        self.rng = np.random.default_rng()
        self.x = np.zeros((num_envs, n, 1), np.float32)
        self.t = np.zeros(num_envs, np.int64)

    def reset(self, seed: int | None = None, env_mask: np.ndarray | None = None) -> dict:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        mask = np.ones(self.e, bool) if env_mask is None else env_mask
        self.x[mask] = self.rng.uniform(-1, 1, (int(mask.sum()), self.n, 1))
        self.t[mask] = 0
        return {"particles": self.x.copy()}

    def step(self, actions: dict) -> tuple:
        self.x = self.x + 0.1 * actions["particles"]
        self.t += 1
        obs: Any = self.x.copy()
        if self.bad == "shape":
            obs = obs[:, :1]
        elif self.bad == "nan":
            obs[0, 1, 0] = np.nan
        reward = -np.abs(self.x[..., 0])
        terminated = {"particles": np.abs(self.x[..., 0]) < 0.1}
        truncated: Any = self.t >= self.horizon
        if self.bad == "half_done":  # a probability, not a flag
            truncated = np.full(self.e, 0.5, np.float32)
        return {"particles": obs}, {"particles": reward}, terminated, truncated, {}

    def state(self) -> np.ndarray:
        return self.x.reshape(self.e, -1)


def _batched(bad: str | None = None, sim: Particles | None = None, **kwargs: Any) -> BatchedEnv:
    return from_batched(
        Particles(3, bad=bad) if sim is None else sim,
        num_envs=3,
        group_map={"particles": 2},
        observation_spaces={"particles": Unbounded((1,))},
        action_spaces={"particles": Bounded(-1.0, 1.0, (1,))},
        state_space=Unbounded((2,)),
        **kwargs,
    )


def test_from_batched_passes_the_conformance_kit():
    env = _batched(seed=0)
    assert env.group_map == {"particles": ["particles_0", "particles_1"]}
    assert env.state_spec["state"].shape == (3, 2)
    check_adapter(env, steps=12)
    rollout = env.rollout(5)
    assert rollout["next", "truncated"][:, -1].all()  # the horizon, per env as one array
    assert torch.equal(
        rollout["next", "state"], rollout["next", "particles", "observation"].reshape(3, 5, 2)
    )


@pytest.mark.parametrize(
    ("space", "why"),
    [
        (spaces.Discrete(3, start=1), r"its values start at 1, the spec's at 0"),
        (spaces.MultiDiscrete([2, 3], start=[1, 0]), r"its values start at \[1 0\]"),
        (spaces.MultiDiscrete([[2, 3], [2, 2]]), r"shape \(2, 2\), the spec flattens them"),
        (spaces.MultiBinary([2, 2]), r"shape \(2, 2\), the spec flattens them"),
        (spaces.Tuple([spaces.Discrete(2)]), "a tuple"),
        (spaces.Dict({"a": spaces.Discrete(4, start=-1)}), "start at -1"),
    ],
)
def test_from_batched_refuses_spaces_whose_values_are_not_their_spec_s(space, why) -> None:  # type: ignore[no-untyped-def]
    # from_batched passes arrays through: a Discrete(3, start=1) observation was stored
    # unshifted, outside the declared Categorical(3), and actions 0..2 went to a simulator
    # that takes 1..3. Refused, naming the space and what to give instead.
    def make(observation_space: Any) -> BatchedEnv:
        return from_batched(
            Particles(3),
            num_envs=3,
            group_map={"particles": 2},
            observation_spaces={"particles": observation_space},
            action_spaces={"particles": Bounded(-1.0, 1.0, (1,))},
        )

    with pytest.raises(TypeError, match=why) as err:
        make(space)
    assert "observation of particles: from_batched passes" in str(err.value)
    assert "use from_parallel" in str(err.value)
    for fine in (spaces.Discrete(3), spaces.MultiDiscrete([2, 3]), spaces.MultiBinary(4)):
        make(fine)


def test_the_kit_catches_a_simulator_that_ignores_the_reset_mask():
    class Stubborn(Particles):  # a partial reset resets nothing
        def reset(self, seed: int | None = None, env_mask: np.ndarray | None = None) -> dict:
            if env_mask is not None:
                return {"particles": self.x.copy()}
            return super().reset(seed)

    with pytest.raises(AssertionError, match="the simulator seems to ignore the reset mask"):
        check_adapter(_batched(sim=Stubborn(3, horizon=50), seed=0), steps=6)


def test_from_batched_torch_actions_and_gymnasium_spaces():
    received = []

    class Recording(Particles):
        def step(self, actions: dict) -> tuple:
            received.append(actions["particles"])
            return super().step({"particles": actions["particles"].numpy()})

    env = from_batched(
        Recording(2),
        num_envs=2,
        group_map={"particles": ["p", "q"]},
        observation_spaces={"particles": spaces.Box(-np.inf, np.inf, (1,), np.float32)},
        action_spaces={"particles": spaces.Box(-1, 1, (1,), np.float32)},
        array_type="torch",
        seed=0,
    )
    env.rollout(2)
    assert isinstance(received[0], torch.Tensor) and received[0].shape == (2, 2, 1)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (
            "shape",
            r"\('particles', 'observation'\): the simulator returned shape \[3, 1, 1\], "
            r"expected \[3, 2, 1\]",
        ),
        ("nan", r"non-finite value nan for agent 'particles_1' \(env 0\)"),
        ("half_done", r"'truncated': flags are bool \(or 0 and 1\), got 0.5 \(torch.float32\)"),
    ],
)
def test_from_batched_bad_outputs(bad: str, match: str):
    env = _batched(bad=bad, seed=0)
    with pytest.raises(SimulatorOutputError, match=match):
        env.rollout(2)


def test_from_batched_values_an_integer_spec_cannot_hold_are_refused():
    class Counts(Particles):  # whole counts at reset (they fit), 300 after a step
        def reset(self, seed: int | None = None, env_mask: np.ndarray | None = None) -> dict:
            super().reset(seed, env_mask)
            return {"particles": np.full((self.e, self.n, 1), 3.0)}

        def step(self, actions: dict) -> tuple:
            out = super().step(actions)
            return ({"particles": np.full((self.e, self.n, 1), 300.0)}, *out[1:])

    env = from_batched(
        Counts(3),
        num_envs=3,
        group_map={"particles": 2},
        observation_spaces={"particles": Bounded(0, 255, (1,), dtype=torch.uint8)},
        action_spaces={"particles": Bounded(-1.0, 1.0, (1,))},
        seed=0,
    )
    assert env.reset()["particles", "observation"].unique().tolist() == [3]
    message = r"value 300\.0 for agent 'particles_0' \(env 0\) does not fit torch\.uint8 exactly"
    with pytest.raises(SimulatorOutputError, match=message):
        env.rollout(2)


def test_from_batched_argument_errors():
    with pytest.raises(KeyError, match=r"action_spaces has no entry for groups \['particles'\]"):
        from_batched(
            Particles(1),
            num_envs=1,
            group_map={"particles": 2},
            observation_spaces={"particles": Unbounded((1,))},
            action_spaces={},
        )
    with pytest.raises(ValueError, match="num_envs must be an int >= 1"):
        _batched_with(num_envs=0)
    with pytest.raises(ValueError, match="array_type must be 'numpy' or 'torch'"):
        _batched(array_type="jax")  # type: ignore[arg-type]


def _batched_with(num_envs: int) -> BatchedEnv:
    return from_batched(
        Particles(1),
        num_envs=num_envs,
        group_map={"particles": 2},
        observation_spaces={"particles": Unbounded((1,))},
        action_spaces={"particles": Unbounded((1,))},
    )


class DrawnParticles(Particles):
    """Particles with a frame per world: a 3-pixel-high strip, each particle lit at its place
    (``dtype``: the frame's dtype, to test a bad one)."""

    dtype = np.uint8

    def render(self, env_index: int) -> np.ndarray:
        frame = np.zeros((3 * self.n, 21, 3), self.dtype)
        for i, x in enumerate(self.x[env_index, :, 0]):
            frame[3 * i : 3 * i + 3, int(np.clip((x + 1) * 10, 0, 20))] = 255
        return frame


def test_from_batched_renders_each_world_and_films_it(tmp_path: Path) -> None:
    from marlkit.record import read_video
    from marlkit.train import evaluate

    with pytest.raises(NotImplementedError, match=r"does not render \(render_modes=\(\)\)"):
        _batched(sim=DrawnParticles(3), seed=0).render()  # rendering is declared, not guessed
    env = _batched(sim=DrawnParticles(3), seed=0, render=True)
    assert env.render_modes == ("rgb_array",)
    env.reset()
    frames = [env.render(i) for i in range(3)]
    assert all(f.shape == (6, 21, 3) and f.dtype == np.uint8 for f in frames)
    assert not np.array_equal(frames[0], frames[1])  # each world's own frame
    evaluate(env, None, steps=4, video=tmp_path / "p.mp4", env_indices="all", tile=True)
    assert read_video(tmp_path / "p.mp4")[0].shape[0] == 5  # the reset and 4 steps
    bad = DrawnParticles(3)
    bad.dtype = np.float32
    with pytest.raises(
        ValueError,
        match=r"the simulator's frame is float32 \[6, 21, 3\], expected an RGB frame, uint8",
    ):
        _batched(sim=bad, seed=0, render=True).render()


class Typed:
    """Two agents observing bool flags, an int32 cell index, an int64 count and a float
    position; each acts with two ternary choices (a ``Categorical(3)`` of shape ``(2,)``)."""

    possible_agents = ["a", "b"]

    def __init__(self) -> None:
        self.t = 0
        self.received: list[dict] = []

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        self.agents, self.t = list(self.possible_agents), 0
        return {a: self._obs() for a in self.agents}, {a: {} for a in self.agents}

    def _obs(self) -> dict:
        flags = np.array([True, False, self.t % 2 == 1])
        return {"flags": flags, "cell": 3, "count": self.t, "pos": np.zeros(2, np.float32)}

    def step(self, actions: dict) -> tuple:
        self.received.append(actions)
        self.t += 1
        obs = {a: self._obs() for a in self.agents}
        ones = dict.fromkeys(self.agents, 1.0)
        return (
            obs,
            ones,
            dict.fromkeys(self.agents, False),
            dict.fromkeys(self.agents, self.t >= 5),
            {},
        )


TYPED_OBS = Composite(
    flags=Binary(3, dtype=torch.bool),
    cell=Categorical(5, dtype=torch.int32),
    count=Unbounded((), dtype=torch.int64),
    pos=Unbounded((2,)),
)


def test_specs_given_are_the_specs_declared() -> None:
    # Specs went through Gymnasium spaces and came back as the spaces' own: a bool Binary as
    # int8, an int32 Categorical as int64, an integer Unbounded as a Bounded box, a Categorical
    # of shape (2,) as a MultiCategorical. Now the env declares what it was given.
    env = from_parallel(
        Typed, num_envs=2, observation_spaces=TYPED_OBS, action_spaces=Categorical(3, (2,))
    )
    assert env.observation_spec["agents", "observation"] == TYPED_OBS.expand(2, 2).to("cpu")
    assert env.action_spec["agents", "action"] == Categorical(3, (2, 2, 2))
    td = env.reset()
    td["agents", "action"] = torch.tensor([[[0, 2], [1, 1]], [[2, 2], [0, 1]]])
    obs = env.step(td)["next", "agents", "observation"]
    assert {k: v.dtype for k, v in obs.items()} == {
        "flags": torch.bool,
        "cell": torch.int32,
        "count": torch.int64,
        "pos": torch.float32,
    }
    assert obs["flags"][0, 0].tolist() == [True, False, True]
    assert env.simulators[1].received[-1]["a"].tolist() == [2, 2]
    check_adapter(env)


def test_agents_of_one_group_with_specs_of_other_dtypes_are_refused() -> None:
    obs = {"a": Binary(3, dtype=torch.bool), "b": Binary(3)}  # one space, two dtypes
    with pytest.raises(ValueError, match="agents 'a' and 'b' of group 'agents' have different"):
        from_parallel(
            Typed, observation_spaces=obs, action_spaces=Categorical(3, (2,)), group_map="agents"
        )


def test_render_without_a_render_method_is_refused_when_the_env_is_built() -> None:
    # It used to pass, and a training script then failed at its first evaluation video.
    with pytest.raises(TypeError, match=r"render=True, but Corridor \(instances \[0, 1\]\) has no"):
        from_parallel(Corridor, num_envs=2, render=True)
    with pytest.raises(TypeError, match=r"render=True, but Particles \(instances \[0\]\) has no"):
        _batched(render=True)


@pytest.mark.parametrize("num_envs", [1, 3])
def test_step_before_any_reset_is_refused_for_every_env(num_envs: int) -> None:
    # The adapter's own probe reset of instance 0 counted as the user's: one env stepped
    # without a reset, and several named every env but 0.
    env = from_parallel(Corridor, num_envs=num_envs, seed=0)
    idle = "env 0 was" if num_envs == 1 else r"envs \[0, 1, 2\] were"
    with pytest.raises(RuntimeError, match=rf"{idle} never reset: call reset\(\) before step"):
        env.step(env.action_spec.zero())  # walk left: legal everywhere
    env.step(env.rand_action(env.reset()))


@pytest.mark.parametrize(
    ("action_spec", "action", "dtype"),
    [
        (Binary(2, dtype=torch.bool), [True, False], np.bool_),
        (Binary(2), [1, 0], np.int8),  # MultiBinary's own dtype
        (Categorical(3, (2,), dtype=torch.int32), [2, 1], np.int32),
        (Categorical(3, (2,)), [2, 1], np.int64),
    ],
)
def test_actions_reach_the_simulator_in_the_dtype_of_the_given_spec(
    action_spec: TensorSpec, action: list, dtype: type
) -> None:
    # A bool Binary action went through MultiBinary's int8, an int32 Categorical of a shape
    # through MultiDiscrete's int64: the simulator got another dtype than the spec declared.
    env = from_parallel(Typed, observation_spaces=TYPED_OBS, action_spaces=action_spec)
    td = env.reset()
    td["agents", "action"] = torch.tensor([[action, action]], dtype=action_spec.dtype)
    env.step(td)
    received = env.simulators[0].received[-1]["a"]
    assert received.dtype == dtype
    assert received.tolist() == action


def test_a_value_that_does_not_fit_names_the_spec_given() -> None:
    # The message named Box(-inf, inf, (3,), float32), a space the user never wrote.
    with pytest.raises(SimulatorOutputError, match=r"expected \[3\] from its spec Unbounded\("):
        from_parallel(Typed, observation_spaces=Unbounded((3,)), action_spaces=Categorical(3, (2,)))
    box = spaces.Box(-1.0, 1.0, (3,))  # a space given: named as the space
    with pytest.raises(SimulatorOutputError, match=r"from its space Box\(-1.0, 1.0, \(3,\)"):
        from_parallel(Typed, observation_spaces=box, action_spaces=Categorical(3, (2,)))


def test_from_parallel_holds_wide_unsigned_boxes_in_signed_ints() -> None:
    # a uint16/uint32 Box (torch cannot compare them) observed and acted in, per agent
    class Counters(Typed):
        def observation_space(self, agent: str) -> Any:
            return spaces.Box(0, 60_000, (2,), np.uint16)

        def action_space(self, agent: str) -> Any:
            return spaces.Box(0, 5, (1,), np.uint32)

        def _obs(self) -> Any:
            return np.array([60_000, self.t], np.uint16)

    env = from_parallel(Counters, num_envs=2, seed=0)
    assert env.observation_spec["agents", "observation"].dtype == torch.int32
    assert env.action_spec["agents", "action"].dtype == torch.int64
    rollout = env.rollout(3)
    assert rollout["next", "agents", "observation"][0, -1, 0].tolist() == [60_000, 3]
    assert env.simulators[0].received[-1]["a"].dtype == np.uint32
    check_adapter(env)


@pytest.mark.parametrize(
    "action_spec",
    [
        Categorical(3, (2, 3)),
        Binary(3, (2, 3), dtype=torch.bool),
        Binary(3, (2, 3)),
        MultiCategorical([2, 3], (4, 2)),
    ],
)
def test_given_specs_of_several_dims_reach_the_simulator_in_their_shape(action_spec) -> None:  # type: ignore[no-untyped-def]
    # a per-agent spec with more than one dim: its actions were reshaped as one flat dim
    # ("cannot reshape array of size 6 into shape (2,2,3)"), and a MultiCategorical's nvec
    # could not spread over its leading dims at construction
    obs_spec = MultiCategorical([2, 3], (4, 2))

    class Grid(Typed):
        def _obs(self) -> Any:
            return np.tile(np.array([1, 2]), (4, 1)) * (self.t % 2)

    env = from_parallel(
        Grid, num_envs=2, observation_spaces=obs_spec, action_spaces=action_spec, seed=0
    )
    assert env.action_spec["agents", "action"] == action_spec.expand(2, 2, *action_spec.shape)
    td = env.reset()
    td = env.rand_action(td)
    out = env.step(td)["next", "agents", "observation"]
    assert out.shape == (2, 2, 4, 2) and out[0, 0].tolist() == [[1, 2]] * 4
    sent = env.simulators[1].received[-1]["b"]
    assert sent.shape == tuple(action_spec.shape)
    assert sent.dtype == torch.zeros((), dtype=action_spec.dtype).numpy().dtype
    assert np.array_equal(sent, td["agents", "action"][1, 1].numpy())
    check_adapter(env)
