"""The conformance kit over the whole registry, a test that the registry and the files agree,
and the kit catching envs that break the contract."""

from __future__ import annotations

import inspect
import pathlib
from importlib.metadata import version
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import marlkit
from marlkit.adapters.custom import from_batched, from_parallel
from marlkit.data import Bounded, Composite, Unbounded
from marlkit.envs import EnvBase, make_done_spec, make_reward_spec, registered, registered_adapters
from marlkit.testing import AdapterCheckError, check_adapter
from marlkit.testing.conformance import _simulator_replays

gymnasium = pytest.importorskip("gymnasium")
spaces = gymnasium.spaces
from marlkit.adapters.gymnasium import GymnasiumEnv  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Small constructions of every native scenario; a new scenario must be added here.
SMALL = {
    "navigation": {"num_envs": 3, "n_agents": 3},
    "swarm": {"num_envs": 2, "n_agents": 16},
    "predator_prey": {"num_envs": 3, "n_predators": 2, "n_prey": 2},
}


def _native_families() -> dict[str, str]:
    """Families of names (``smax/<scenario>``) that a native scenario module registers."""
    return {
        name: entry.source.rsplit(".", 1)[-1]
        for name, entry in registered_adapters().items()
        if entry.source.startswith("marlkit.scenarios.")
    }


def test_registry_and_scenario_files_agree() -> None:
    files = {p.stem for p in (ROOT / "scenarios").glob("*.py") if not p.stem.startswith("_")}
    modules = {entry.source.rsplit(".", 1)[-1] for entry in registered().values()}
    modules |= set(_native_families().values())
    assert files == modules, "every scenarios/*.py registers an env, and nothing else does"
    assert set(SMALL) == set(registered()), "add the new scenario to SMALL"


def test_registry_and_adapter_files_agree() -> None:
    files = {p.stem for p in (ROOT / "adapters").glob("*.py") if not p.stem.startswith("_")} - {
        "custom"
    }  # custom holds the helpers for user simulators, not a family
    assert files == set(registered_adapters()) - set(_native_families())


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("continuous", [True, False])
def test_every_native_scenario_conforms(name: str, continuous: bool) -> None:
    env = marlkit.make(name, seed=0, continuous_actions=continuous, **SMALL[name])
    check_adapter(env)


class _Toy(EnvBase):
    """A tiny env whose faults can be switched on, to see the kit catch each."""

    render_modes = ("rgb_array",)

    def __init__(self, *, wrong_shape=False, nan=False, accept_anything=False, bad_frame=False):
        super().__init__(batch_size=(2,))
        self.faults = {"wrong_shape": wrong_shape, "nan": nan, "bad_frame": bad_frame}
        self.group_map = {"agents": ["a", "b"]}
        self.observation_spec = Composite(
            agents=Composite(observation=Unbounded((2, 2, 3)), shape=(2, 2)), shape=(2,)
        )
        self.action_spec = Composite(
            agents=Composite(action=Unbounded((2, 2, 1)), shape=(2, 2)), shape=(2,)
        )
        self.reward_spec = make_reward_spec((2,), {"agents": 2})
        self.done_spec = make_done_spec((2,), {"agents": 2})
        self.validate_actions = not accept_anything
        self._state = torch.zeros(2, 2, 3)
        self._gen = torch.Generator().manual_seed(0)

    def _obs(self) -> TensorDict:
        obs = self._state.clone()
        if self.faults["wrong_shape"]:
            obs = torch.zeros(2, 2, 4)
        if self.faults["nan"]:
            obs[1, 0, 2] = float("nan")
        return TensorDict({"agents": TensorDict({"observation": obs}, (2, 2))}, (2,))

    def _reset(self, tensordict, env_mask):  # type: ignore[no-untyped-def]
        fresh = torch.rand(2, 2, 3, generator=self._gen)
        self._state = (
            fresh if env_mask is None else torch.where(env_mask[:, None, None], fresh, self._state)
        )
        return self._obs()

    def _step(self, tensordict):  # type: ignore[no-untyped-def]
        self._state = self._state + tensordict["agents", "action"].nan_to_num()
        out = self._obs()
        zeros = torch.zeros(2, 2, 1, dtype=torch.bool)
        out["agents"].update(
            {"reward": torch.zeros(2, 2, 1), "terminated": zeros, "truncated": zeros}
        )
        return out

    def _set_seed(self, seed: int) -> None:
        self._gen.manual_seed(seed)

    def _render(self, env_index: int):  # type: ignore[no-untyped-def]
        if self.faults["bad_frame"]:
            return torch.zeros(4, 4)
        return torch.zeros(8, 8, 3, dtype=torch.uint8)


def test_a_correct_toy_env_passes() -> None:
    check_adapter(_Toy())


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (
            "wrong_shape",
            r"\('agents', 'observation'\): shape \[2, 2, 4\] != spec shape \[2, 2, 3\]",
        ),
        ("nan", r"non-finite value nan at index \[1, 0, 2\] \(env 1, agent 'a'\)"),
        ("accept_anything", "validate_actions is off"),
        ("bad_frame", r"render\(\) raised ValueError"),
    ],
)
def test_the_kit_names_what_is_wrong(fault: str, message: str) -> None:
    with pytest.raises(AdapterCheckError, match=message):
        check_adapter(_Toy(**{fault: True}))


def test_nan_outputs_fail_the_spec_checks_only() -> None:
    # An env that emits NaN is reported where the NaN is, once per moment, and not again as a
    # seeding, partial-reset or bad-action failure (NaN compares equal to NaN there).
    with pytest.raises(AdapterCheckError) as caught:
        check_adapter(_Toy(nan=True))
    failures = [line for line in str(caught.value).splitlines() if line.startswith("  - ")]
    assert failures and all(line.startswith("  - specs: ") for line in failures), failures
    assert all("(env 1, agent 'a')" in line for line in failures)


class _Unseedable(_Toy):
    """A toy env whose seed is ignored: every reset draws from a fresh generator."""

    def _set_seed(self, seed: int) -> None:
        self._gen.manual_seed(int(torch.randint(1 << 30, ())))


def test_an_unseedable_env_fails_the_seeding_check_once() -> None:
    # A simulator that ignores its seed was also reported as one whose rejected bad actions
    # change its state: that check replays a seeded step, so it is skipped where seeding failed.
    with pytest.raises(AdapterCheckError) as caught:
        check_adapter(_Unseedable())
    failures = [line for line in str(caught.value).splitlines() if line.startswith("  - ")]
    assert len(failures) == 1 and failures[0].startswith("  - seeding: "), failures
    check_adapter(_Unseedable(), check_seeding=False)


#: How the seeding diagnosis names a class of this module (no installed package provides it)
#: and Gymnasium's SyncVectorEnv (its module, package and version).
HERE = __name__
SYNC_VECTOR = f"gymnasium.vector.sync_vector_env.SyncVectorEnv of gymnasium {gymnasium.__version__}"


def _seeding_failure(env: EnvBase, **switches: bool) -> str:
    with pytest.raises(AdapterCheckError) as caught:
        check_adapter(env, **switches)
    (line,) = [f for f in str(caught.value).splitlines() if f.startswith("  - seeding: ")]
    return line


def test_an_env_without_a_reachable_simulator_gets_the_plain_seeding_message() -> None:
    line = _seeding_failure(_Unseedable())
    assert line.endswith("; pass check_seeding=False for a simulator that cannot be seeded")
    assert "simulator itself" not in line


class _Drift:
    """A real (tiny) simulator of the PettingZoo-parallel kind: two agents drift on a line,
    each pushed by its action. ``forget`` makes it ignore the seed the way some upstream
    simulators do: at its reset (``"reset"``, the start positions) or in its steps (``"step"``,
    a gust drawn each step), from a generator it never seeds."""

    possible_agents = ["a_0", "a_1"]

    def __init__(self, forget: str = "reset"):
        self.forget, self.agents, self.seeded_resets = forget, [], 0
        self.rng, self.unseeded = np.random.default_rng(0), np.random.default_rng()

    def observation_space(self, agent: str) -> Any:
        return spaces.Box(-100, 100, (1,), np.float32)

    def action_space(self, agent: str) -> Any:
        return spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, seed: int | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
            self.seeded_resets += 1
        start = self.unseeded if self.forget == "reset" else self.rng
        if self.forget == "now and then" and self.seeded_resets % 3 == 0:
            start = self.unseeded  # every third seeded reset forgets its seed
        self.x = {a: start.uniform(-1, 1, 1).astype(np.float32) for a in self.possible_agents}
        self.agents = list(self.possible_agents)
        return dict(self.x), {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        gust = self.unseeded if self.forget == "step" else self.rng
        for a, push in actions.items():
            self.x[a] = (self.x[a] + push + gust.normal(0, 0.1, 1)).astype(np.float32)
        no = dict.fromkeys(self.agents, False)
        return dict(self.x), dict.fromkeys(self.agents, 0.0), no, dict(no), {a: {} for a in no}


@pytest.mark.parametrize(
    ("forget", "moment"), [("reset", "after its reset"), ("step", "after step 1")]
)
def test_a_simulator_that_ignores_its_seed_is_named_not_the_adapter(forget, moment) -> None:
    # LBF and magent2's adversarial_pursuit ignore the seed upstream: the kit blamed the adapter.
    env = from_parallel(lambda: _Drift(forget), num_envs=2, seed=0)
    line = _seeding_failure(env)
    assert (
        "; the simulator itself does not replay under seed=0: two runs of its first instance "
        f"({HERE}._Drift), each reset(seed=0) then the same actions, differ {moment}. Not the "
        "adapter's fault; pass check_seeding=False for a simulator that cannot be seeded"
    ) in line, line
    check_adapter(env, check_seeding=False)  # everything else about the adapter is right


def test_a_simulator_that_replays_a_seed_only_now_and_then_is_not_blamed_on_the_adapter() -> None:
    # dm-meltingpot 2.4.1's builds with one env_seed fall into a few starts: two runs of the raw
    # simulator that happened to agree made the kit blame the adapter. It runs it up to 6 times.
    env = from_parallel(lambda: _Drift("now and then"), num_envs=1, seed=0)
    line = _seeding_failure(env, check_partial_reset=False)
    assert (
        "; the simulator itself does not replay under seed=0: 3 runs of its first instance "
        f"({HERE}._Drift), each reset(seed=0) then the same actions: the first 2 agree, run 3 "
        "differs after its reset. Not the adapter's fault"
    ) in line, line


class _DeclaredDrift(_Drift):
    """``_Drift`` whose adapter knows why it cannot replay a seed and says so."""

    upstream_nondeterminism = "every third seeded reset draws its start from an unseeded generator"


@pytest.mark.parametrize("forget", ["now and then", "nothing"])
def test_a_declared_cause_is_the_verdict_whatever_the_rollouts_show(forget) -> None:
    # MeltingPot replays a seed now and then: by comparing rollouts, the kit passed it, blamed
    # it or blamed the adapter, by chance. The cause an adapter declares is reported instead,
    # also on a run whose rollouts happen to agree ("nothing": this one replays).
    env = from_parallel(lambda: _DeclaredDrift(forget), num_envs=1, seed=0)
    line = _seeding_failure(env, check_partial_reset=False)
    assert line == (
        f"  - seeding: {HERE}._DeclaredDrift does not replay a seed, as its adapter declares: "
        "every third seeded reset draws its start from an unseeded generator. Not the adapter's "
        "fault; pass check_seeding=False for a simulator that cannot be seeded"
    ), line
    check_adapter(env, check_seeding=False, check_partial_reset=False)


class _Wheel:
    """A real (tiny) simulator of the Gymnasium kind that honours its seed."""

    def __init__(self) -> None:
        self.action_space = spaces.Box(-1, 1, (2, 2, 1), np.float32)
        self.rng = np.random.default_rng()

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.state = self.rng.uniform(size=(2, 2, 3)).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.state = self.state + action
        return self.state.copy(), 0.0, False, False, {}


class _LosesTheSeed(_Toy):
    """An adapter of one's own over ``_Wheel`` that never hands the seed on."""

    def __init__(self) -> None:
        super().__init__()
        self.simulator = _Wheel()

    def _reset(self, tensordict, env_mask):  # type: ignore[no-untyped-def]
        self._state = torch.as_tensor(self.simulator.reset()[0])  # the seed is lost here
        return self._obs()

    def _set_seed(self, seed: int) -> None:
        pass


def test_an_adapter_that_loses_the_seed_is_told_the_simulator_replays() -> None:
    line = _seeding_failure(_LosesTheSeed(), check_partial_reset=False)
    assert line.endswith(
        f", though the simulator itself replays under seed=0 (6 runs of {HERE}._Wheel, each "
        "reset(seed=0) then 8 steps of the same actions, agree): the adapter loses the seed on "
        "its way to the simulator (does _set_seed reach the next reset of every instance?)"
    ), line


class _Walk(gymnasium.Env):
    """A real (tiny) Gymnasium env: a point on a plane, pushed by its action, starting at a
    random place. ``seeded=False`` draws that place from NumPy's global generator, which
    ``reset(seed=...)`` never seeds (the way some upstream simulators ignore their seed);
    ``seeded=True`` from the env's own ``np_random``, as Gymnasium asks."""

    def __init__(self, seeded: bool = True) -> None:
        self.seeded = seeded
        self.observation_space = spaces.Box(-100, 100, (2,), np.float32)
        self.action_space = spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        draw = self.np_random if self.seeded else np.random  # np.random: the global generator
        self.x, self.t = draw.uniform(-1, 1, 2).astype(np.float32), 0
        return self.x.copy(), {}

    def step(self, action: np.ndarray) -> tuple:
        self.x, self.t = (self.x + action).astype(np.float32), self.t + 1
        return self.x.copy(), float(-np.abs(self.x).sum()), False, self.t >= 50, {}


WALK = "marlkit_test/Walk-v0"
if WALK not in gymnasium.registry:
    gymnasium.register(WALK, entry_point=_Walk)


def _walk(seeded: bool, vector: bool) -> Any:
    if vector:
        return gymnasium.make_vec(WALK, num_envs=2, seeded=seeded)
    return gymnasium.make(WALK, seeded=seeded)


@pytest.mark.parametrize(("vector", "name"), [(False, f"{HERE}._Walk"), (True, SYNC_VECTOR)])
def test_a_gymnasium_env_that_ignores_its_seed_is_named_not_the_adapter(vector, name) -> None:
    env = GymnasiumEnv(_walk(seeded=False, vector=vector))
    line = _seeding_failure(env)
    assert (
        "; the simulator itself does not replay under seed=0: two runs of its first instance "
        f"({name}), each reset(seed=0) then the same actions, differ after its reset. Not the "
        "adapter's fault; pass check_seeding=False for a simulator that cannot be seeded"
    ) in line, line
    check_adapter(env, check_seeding=False)  # everything else about the adapter is right


class _SeedLosingGymnasiumEnv(GymnasiumEnv):
    """The Gymnasium adapter with the fault the diagnosis must blame on it: the seed it hands
    on is not the one it was given."""

    def _set_seed(self, seed: int) -> int:
        return super()._set_seed(seed + int(np.random.default_rng().integers(1, 1 << 20)))


@pytest.mark.parametrize(("vector", "name"), [(False, f"{HERE}._Walk"), (True, SYNC_VECTOR)])
def test_a_well_behaved_gymnasium_env_replays_and_a_seed_losing_adapter_is_blamed(
    vector, name
) -> None:
    check_adapter(GymnasiumEnv(_walk(seeded=True, vector=vector)))
    line = _seeding_failure(_SeedLosingGymnasiumEnv(_walk(seeded=True, vector=vector)))
    assert line.endswith(
        f", though the simulator itself replays under seed=0 (6 runs of {name}, each "
        "reset(seed=0) then 8 steps of the same actions, agree): the adapter loses the seed on "
        "its way to the simulator (does _set_seed reach the next reset of every instance?)"
    ), line


class _Line:
    """A real (tiny) batched simulator (the ``from_batched`` protocol): ``E`` worlds of two
    points on a line. ``seeded=False`` starts them from a generator it never seeds."""

    def __init__(self, num_envs: int, seeded: bool = True) -> None:
        self.e, self.seeded = num_envs, seeded
        self.rng, self.x = np.random.default_rng(), np.zeros((num_envs, 2, 1), np.float32)

    def reset(self, seed: int | None = None, env_mask: np.ndarray | None = None) -> dict:
        if seed is not None and self.seeded:
            self.rng = np.random.default_rng(seed)
        mask = np.ones(self.e, bool) if env_mask is None else env_mask
        self.x[mask] = self.rng.uniform(-1, 1, (int(mask.sum()), 2, 1))
        return {"points": self.x.copy()}

    def step(self, actions: dict) -> tuple:
        self.x = (self.x + 0.1 * actions["points"]).astype(np.float32)
        no = np.zeros(self.e, bool)
        return {"points": self.x.copy()}, {"points": -np.abs(self.x[..., 0])}, no, no, {}


def _line(seeded: bool) -> EnvBase:
    return from_batched(
        _Line(2, seeded),
        num_envs=2,
        group_map={"points": 2},
        observation_spaces={"points": Unbounded((1,))},
        action_spaces={"points": Bounded(-1.0, 1.0, (1,))},
        seed=0,
    )


def test_a_batched_simulator_that_ignores_its_seed_is_named_not_the_adapter() -> None:
    line = _seeding_failure(_line(seeded=False))
    assert (
        "; the simulator itself does not replay under seed=0: two runs of the raw simulator "
        "under BatchedEnv, each reset(seed=0) then the same actions, differ after its reset. "
        "Not the adapter's fault"
    ) in line, line


def _every_kind() -> dict[str, tuple[Any, str]]:
    """A small real env of every adapter kind, and how the diagnosis names its simulator."""
    pytest.importorskip("vmas")
    pytest.importorskip("mujoco")
    pytest.importorskip("mpe2")
    return {
        "vmas": (
            lambda: marlkit.make("vmas/navigation", num_envs=2, n_agents=2),
            "the raw simulator under VmasEnv",
        ),
        "pettingzoo parallel": (
            lambda: marlkit.make("pettingzoo/mpe2.simple_spread_v3", N=2, max_cycles=25),
            f"mpe2.simple_spread.simple_spread.raw_env of mpe2 {version('mpe2')}",
        ),
        "pettingzoo aec": (
            lambda: marlkit.make("pettingzoo/tictactoe_v3"),
            f"pettingzoo.classic.tictactoe.tictactoe.raw_env of pettingzoo {version('pettingzoo')}",
        ),
        "gymnasium": (lambda: GymnasiumEnv(_walk(True, vector=False)), f"{HERE}._Walk"),
        "gymnasium vector": (lambda: GymnasiumEnv(_walk(True, vector=True)), SYNC_VECTOR),
        "mujoco": (
            lambda: marlkit.make("mujoco/ant_2x4", num_envs=2),
            "the raw simulator under MultiAgentMujocoEnv",
        ),
        "from_parallel": (lambda: from_parallel(lambda: _Drift(""), num_envs=2), f"{HERE}._Drift"),
        "from_batched": (lambda: _line(seeded=True), "the raw simulator under BatchedEnv"),
    }


@pytest.mark.parametrize(
    "kind",
    [
        "vmas",
        "pettingzoo parallel",
        "pettingzoo aec",
        "gymnasium",
        "gymnasium vector",
        "mujoco",
        "from_parallel",
        "from_batched",
    ],
)
def test_the_raw_simulator_of_every_adapter_kind_is_replayed(kind: str) -> None:
    # What a failed seeding check says comes from here: the raw simulator, reset twice with the
    # same seed and stepped with the same actions, agrees with itself (these all do).
    make, name = _every_kind()[kind]
    env = make()
    assert _simulator_replays(env, seed=0, steps=4) == (
        True,
        f"6 runs of {name}, each reset(seed=0) then 4 steps of the same actions, agree",
    )
    env.close()


def test_every_switch_of_check_adapter_is_documented() -> None:
    guide = (ROOT / "docs" / "adapters.md").read_text()
    for name in list(inspect.signature(check_adapter).parameters)[1:]:
        assert f"| `{name}` |" in guide, f"docs/adapters.md does not document {name}"
