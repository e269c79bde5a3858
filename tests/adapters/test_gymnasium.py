"""The Gymnasium adapter on real Gymnasium envs: CartPole, HalfCheetah (MuJoCo), Blackjack and
a small Dict/Tuple env defined here (a real ``gymnasium.Env`` subclass)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

import marlkit
from marlkit.data import Binary, Bounded, Categorical, Composite, MultiCategorical, Unbounded
from marlkit.data.keys import NEXT
from marlkit.envs import (
    InvalidActionError,
    MissingActionError,
    StepCounter,
    TransformedEnv,
    accepted_kwargs,
)
from marlkit.envs.registry import UnknownEnvError
from marlkit.testing import check_adapter

gym = pytest.importorskip("gymnasium")
from marlkit.adapters.custom import SimulatorOutputError  # noqa: E402
from marlkit.adapters.gymnasium import GymnasiumEnv, list_scenarios  # noqa: E402

spaces = gym.spaces
AutoresetMode = gym.vector.AutoresetMode
COUNTDOWN_ID = "marlkit_test/Countdown-v0"
EPISODE_IDS = 1 << 30


class Countdown(gym.Env):
    """Counts the steps of an episode; terminates after a random length in ``[2, 5]``.

    Observation (Dict): ``t`` (steps so far, Box float64), ``episode`` (a random id drawn at
    reset, Discrete), ``flags`` (Tuple of MultiBinary(2) and MultiDiscrete([3, 4]), both
    derived from ``t``). Action (Dict): ``move`` in Discrete(3, start=-1), ``push`` Box(2).
    Reward: ``move``, so the test sees the start offset of the Discrete space.
    """

    metadata = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {
                "t": spaces.Box(0.0, 10.0, (1,), np.float64),
                "episode": spaces.Discrete(EPISODE_IDS),
                "flags": spaces.Tuple((spaces.MultiBinary(2), spaces.MultiDiscrete([3, 4]))),
            }
        )
        self.action_space = spaces.Dict(
            {"move": spaces.Discrete(3, start=-1), "push": spaces.Box(-1.0, 1.0, (2,), np.float32)}
        )
        self.episode, self.t, self.length = 0, 0, 0

    def _obs(self) -> dict[str, Any]:
        bits = np.array([self.t & 1, (self.t >> 1) & 1], dtype=np.int8)
        return {
            "t": np.array([self.t], dtype=np.float64),
            "episode": self.episode,
            "flags": (bits, np.array([self.t % 3, self.t % 4], dtype=np.int64)),
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.episode = int(self.np_random.integers(EPISODE_IDS))
        self.t, self.length = 0, int(self.np_random.integers(2, 6))
        return self._obs(), {}

    def step(self, action: dict) -> tuple:
        if not self.action_space.contains(action):
            raise ValueError(f"Countdown got an action outside its space: {action}")
        self.t += 1
        return self._obs(), float(action["move"]), self.t >= self.length, False, {"t": self.t}


if COUNTDOWN_ID not in gym.registry:
    gym.register(id=COUNTDOWN_ID, entry_point=Countdown)


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """MuJoCo writes its warnings to ./MUJOCO_LOG.TXT: keep them out of the repository."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def closing() -> Any:
    """Collects envs and closes them after the test (async workers, pygame windows)."""
    envs: list[Any] = []
    yield envs.append
    for env in envs:
        env.close()


def make(closing: Any, name: str, **kwargs: Any) -> Any:
    env = marlkit.make(name, **kwargs)
    closing(env)
    return env


# ---------------------------------------------------------------------- conformance
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"num_envs": 4}, {"plain_keys": True}, {"num_envs": 3, "plain_keys": True}],
    ids=["single", "vector", "plain", "plain-vector"],
)
def test_cartpole_passes_the_kit(closing: Any, kwargs: dict) -> None:
    env = make(closing, "gymnasium/CartPole-v1", **kwargs)
    check_adapter(env, steps=30)


def test_cartpole_layouts(closing: Any) -> None:
    single = make(closing, "gymnasium/CartPole-v1")
    assert single.batch_size == () and single.group_map == {"agents": ["agent_0"]}
    td = single.rollout(5, break_when_any_done=False)
    assert td["agents", "observation"].shape == (5, 1, 4)
    assert td["agents", "action"].shape == (5, 1)
    assert td["next", "agents", "reward"].shape == (5, 1, 1)
    assert td["next", "agents", "reward"].dtype == torch.float32
    assert td["next", "agents", "terminated"].shape == (5, 1, 1)
    assert td["next", "done"].shape == (5, 1)
    assert isinstance(single.action_spec["agents", "action"], Categorical)

    vec = make(closing, "gymnasium/CartPole-v1", num_envs=3, group="cart")
    assert vec.batch_size == (3,) and vec.groups == ["cart"]
    assert vec.reset()["cart", "observation"].shape == (3, 1, 4)

    plain = make(closing, "gymnasium/CartPole-v1", num_envs=2, plain_keys=True)
    assert plain.group_map == {}
    td = plain.rollout(4, break_when_any_done=False)
    assert td["observation"].shape == (2, 4, 4) and td["action"].shape == (2, 4)
    assert td["next", "reward"].shape == (2, 4, 1) and td["next", "truncated"].shape == (2, 4, 1)
    assert set(td["next"].keys()) == {"observation", "reward", "done", "terminated", "truncated"}


def test_async_vector_env(closing: Any) -> None:
    env = make(closing, "gymnasium/CartPole-v1", num_envs=2, vectorization="async")
    check_adapter(env, steps=20)


def test_halfcheetah_continuous_float64(closing: Any) -> None:
    env = make(closing, "gymnasium/HalfCheetah-v5", num_envs=2, max_episode_steps=4)
    obs = env.observation_spec["agents", "observation"]
    act = env.action_spec["agents", "action"]
    assert isinstance(obs, Unbounded) and obs.dtype == torch.float64 and obs.shape == (2, 1, 17)
    assert isinstance(act, Bounded) and act.dtype == torch.float32 and act.shape == (2, 1, 6)
    check_adapter(env)
    td = env.rollout(9, break_when_any_done=False)
    assert td["agents", "observation"].dtype == torch.float64
    truncated = td["next", "truncated"][..., 0]
    assert truncated[:, [3, 7]].all() and truncated.sum() == 4  # TimeLimit -> truncated
    assert not td["next", "terminated"].any()


def test_halfcheetah_single_renders_through_mujoco(closing: Any) -> None:
    env = make(closing, "gymnasium/HalfCheetah-v5", render_mode="rgb_array", width=64, height=48)
    assert env.render_modes == ("rgb_array",)
    check_adapter(env)
    frame = env.render()
    assert frame.shape == (48, 64, 3) and frame.dtype == np.uint8 and frame.std() > 0


# ---------------------------------------------------------------------- spaces
def test_dict_tuple_multidiscrete_spaces(closing: Any) -> None:
    env = make(closing, f"gymnasium/{COUNTDOWN_ID}", num_envs=2)
    obs = env.observation_spec["agents", "observation"]
    assert isinstance(obs, Composite) and obs.shape == (2, 1)
    assert isinstance(obs["t"], Bounded) and obs["t"].dtype == torch.float64
    assert isinstance(obs["episode"], Categorical) and obs["episode"].shape == (2, 1)
    assert isinstance(obs["flags", "0"], Binary) and obs["flags", "0"].shape == (2, 1, 2)
    assert isinstance(obs["flags", "1"], MultiCategorical)
    act = env.action_spec["agents", "action"]
    assert isinstance(act["move"], Categorical) and isinstance(act["push"], Bounded)
    check_adapter(env, steps=12)

    td = env.reset()
    td["agents", "action"] = env.action_spec["agents", "action"].zero()
    td["agents", "action", "move"] = torch.tensor([[0], [2]])
    out = env.step(td)["next"]
    assert out["agents", "reward"].flatten().tolist() == [-1.0, 1.0]  # Discrete start=-1
    assert out["agents", "observation", "t"].flatten().tolist() == [1.0, 1.0]
    assert out["agents", "observation", "flags", "0"][:, 0].tolist() == [[1, 0], [1, 0]]


class WideUints(gym.Env):
    """A counter in a uint16/32/64 Box, moved by an action in a Box of the same dtype."""

    def __init__(self, dtype: Any = np.uint16, high: int = 60_000) -> None:
        self.observation_space = spaces.Box(0, high, (2,), dtype)
        self.action_space = spaces.Box(0, 3, (1,), dtype)
        self.seen: list[Any] = []
        self.x = np.zeros(2, dtype)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.x = np.array([high_value(self.observation_space), 0], self.observation_space.dtype)
        return self.x.copy(), {}

    def step(self, action: Any) -> tuple:
        self.seen.append(action)
        if not self.action_space.contains(action):
            raise ValueError(f"an action outside the space: {action!r}")
        self.x[1] += action[0]
        return self.x.copy(), 0.0, False, False, {}


def high_value(space: Any) -> int:
    return int(space.high[0])


@pytest.mark.parametrize(
    ("dtype", "held"),
    [(np.uint16, torch.int32), (np.uint32, torch.int64), (np.uint64, torch.int64)],
)
def test_unsigned_boxes_wider_than_8_bits_are_held_in_a_signed_int(
    closing: Any, dtype: Any, held: torch.dtype
) -> None:
    # torch cannot compare uint16/32/64: a Box of them failed at construction ("lt_cpu" not
    # implemented for 'UInt16'); its values are now held in the next signed int
    sim = WideUints(dtype)
    env = GymnasiumEnv(sim, seed=0)
    closing(env)
    assert env.observation_spec["agents", "observation"].dtype == held
    assert env.action_spec["agents", "action"].dtype == held
    rollout = env.rollout(4)
    assert rollout["agents", "observation"][0, 0].tolist() == [60_000, 0]
    assert all(np.asarray(a).dtype == dtype for a in sim.seen)  # in the simulator's own dtype
    check_adapter(env, steps=6)


def test_a_uint64_box_past_int64_is_refused(closing: Any) -> None:
    with pytest.raises(TypeError, match=r"uint64.*bounds pass int64's 9223372036854775807"):
        GymnasiumEnv(WideUints(np.uint64, high=2**64 - 1))


def test_dict_spaces_plain_keys_single(closing: Any) -> None:
    env = make(closing, f"gymnasium/{COUNTDOWN_ID}", plain_keys=True)
    assert env.observation_spec["observation", "flags", "1"].shape == (2,)
    check_adapter(env, steps=12)


def test_blackjack_tuple_of_discrete(closing: Any) -> None:
    env = make(closing, "gymnasium/Blackjack-v1", num_envs=3)
    assert env.observation_spec["agents", "observation", "0"].n == 32
    check_adapter(env, steps=12)


class _TextObs(gym.Env):
    observation_space = spaces.Text(5)
    action_space = spaces.Discrete(2)


def test_unmapped_space_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot map a Text space"):
        GymnasiumEnv(_TextObs())


# ---------------------------------------------------------------------- autoreset
def _assert_no_mixed_transitions(td: Any, key: tuple) -> int:
    """Every transition stays in one episode and the step after a done starts a new one."""
    obs = td[(*key, "t")][..., 0]  # [N, T]
    nxt = td[("next", *key, "t")][..., 0]
    ep, next_ep = td[(*key, "episode")], td[("next", *key, "episode")]
    done = td["next", "done"][..., 0]
    assert torch.equal(nxt, obs + 1), "a transition mixes two episodes"
    assert torch.equal(ep, next_ep), "a transition mixes two episodes"
    after = done[:, :-1]
    assert (obs[:, 1:][after] == 0).all(), "the step after a done does not start at reset"
    assert (ep[:, 1:][after] != ep[:, :-1][after]).all()
    assert torch.equal(obs[:, 1:][~after], nxt[:, :-1][~after])
    return int(done.sum())


@pytest.mark.parametrize(
    ("vectorization", "mode"),
    [("sync", None), ("async", None), ("sync", AutoresetMode.SAME_STEP)],
    ids=["sync", "async", "sync-same-step"],
)
def test_autoreset_made_here_is_exact(closing: Any, vectorization: str, mode: Any) -> None:
    env = make(
        closing,
        f"gymnasium/{COUNTDOWN_ID}",
        num_envs=3,
        vectorization=vectorization,
        vector_kwargs=None if mode is None else {"autoreset_mode": mode},
    )
    td = env.rollout(16, break_when_any_done=False)
    assert _assert_no_mixed_transitions(td, ("agents", "observation")) >= 6


def _user_vector(mode: Any, n: int = 3, cls: Any = None) -> Any:
    cls = cls or gym.vector.SyncVectorEnv
    return cls([Countdown for _ in range(n)], autoreset_mode=mode)


@pytest.mark.parametrize("plain_keys", [True, False], ids=["plain", "group"])
def test_user_vector_env_same_step_is_exact(closing: Any, plain_keys: bool) -> None:
    env = GymnasiumEnv(_user_vector(AutoresetMode.SAME_STEP), plain_keys=plain_keys, seed=0)
    closing(env)
    td = env.rollout(16, break_when_any_done=False)
    key = ("observation",) if plain_keys else ("agents", "observation")
    assert _assert_no_mixed_transitions(td, key) >= 6
    check_adapter(env, steps=12)


def test_user_vector_env_disabled_async(closing: Any) -> None:
    vec = _user_vector(AutoresetMode.DISABLED, 2, gym.vector.AsyncVectorEnv)
    env = GymnasiumEnv(vec, seed=1)
    closing(env)
    td = env.rollout(12, break_when_any_done=False)
    assert _assert_no_mixed_transitions(td, ("agents", "observation")) >= 4


@pytest.mark.parametrize(
    "cls", [gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv], ids=["sync", "async"]
)
def test_user_vector_env_next_step_is_exact(closing: Any, cls: Any) -> None:
    # NEXT_STEP (make_vec's default): the "_reset" of a done env goes through reset_mask, which
    # cancels its pending autoreset, so the next step is a real step of a fresh episode.
    env = GymnasiumEnv(_user_vector(AutoresetMode.NEXT_STEP, 3, cls), seed=2)
    closing(env)
    td = env.rollout(16, break_when_any_done=False)
    assert _assert_no_mixed_transitions(td, ("agents", "observation")) >= 6
    if cls is gym.vector.SyncVectorEnv:
        check_adapter(env, steps=12)


def test_next_step_matches_disabled_transition_for_transition(closing: Any) -> None:
    # Same seeds and actions: NEXT_STEP and DISABLED give the same rollout, bit for bit.
    rollouts = []
    for mode in (AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED):
        env = GymnasiumEnv(_user_vector(mode), seed=5)
        closing(env)
        torch.manual_seed(0)
        rollouts.append(env.rollout(20, break_when_any_done=False))
    assert (rollouts[0] == rollouts[1]).all()


def test_next_step_vector_envs_that_cannot_reset_exactly_are_refused() -> None:
    no_shared = gym.vector.AsyncVectorEnv(
        [Countdown, Countdown], autoreset_mode=AutoresetMode.NEXT_STEP, shared_memory=False
    )
    wrapped = gym.wrappers.vector.RecordEpisodeStatistics(_user_vector(AutoresetMode.NEXT_STEP))
    own = gym.make_vec("CartPole-v1", num_envs=2)  # its own vector entry point: NEXT_STEP only
    for vec, name in (
        (no_shared, "AsyncVectorEnv"),
        (wrapped, "RecordEpisodeStatistics"),
        (own, "CartPoleVectorEnv"),
    ):
        with pytest.raises(ValueError, match=f"NEXT_STEP are supported only .* got {name}"):
            GymnasiumEnv(vec)
        vec.close()


def test_next_step_through_make_is_exact(closing: Any) -> None:
    env = make(
        closing,
        f"gymnasium/{COUNTDOWN_ID}",
        num_envs=3,
        vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP},
    )
    td = env.rollout(16, break_when_any_done=False)
    assert _assert_no_mixed_transitions(td, ("agents", "observation")) >= 6


def test_cartpole_final_observation_is_not_a_reset_one(closing: Any) -> None:
    env = make(closing, "gymnasium/CartPole-v1", num_envs=4, plain_keys=True, seed=3)
    td = env.rollout(120, break_when_any_done=False)
    term = td["next", "terminated"][..., 0]
    assert term.sum() >= 4
    final = td["next", "observation"][term]
    outside = (final[:, 0].abs() > 2.4) | (final[:, 2].abs() > 12 * 2 * np.pi / 360)
    assert outside.all()  # the true last observation, not the reset one
    first = td["observation"][:, 1:][term[:, :-1]]
    assert (first.abs() <= 0.05).all()  # the next step starts from the reset observation


def test_partial_reset_keeps_the_others(closing: Any) -> None:
    env = make(closing, f"gymnasium/{COUNTDOWN_ID}", num_envs=3)
    td = env.reset()
    td = env.step(env.rand_action(td))
    root = env._step_mdp(td)
    root["_reset"] = torch.tensor([[False], [True], [False]])
    out = env.reset(root)
    t = out["agents", "observation", "t"][:, 0, 0].tolist()
    assert t == [1.0, 0.0, 1.0]
    nothing = env._step_mdp(env.step(env.rand_action(out)))
    nothing["_reset"] = torch.zeros(3, 1, dtype=torch.bool)
    same = env.reset(nothing)
    assert torch.equal(same["agents", "observation", "t"], nothing["agents", "observation", "t"])


def test_step_counter_truncation_resets_the_gym_env(closing: Any) -> None:
    env = TransformedEnv(
        make(closing, "gymnasium/CartPole-v1", num_envs=2, plain_keys=True),
        StepCounter(max_steps=3),
    )
    td = env.rollout(7, break_when_any_done=False)
    assert td["next", "truncated"][0, :, 0].tolist() == [False, False, True] * 2 + [False]
    assert (td["observation"][:, 3].abs() <= 0.05).all()


# ---------------------------------------------------------------------- bad input
def test_bad_actions_are_refused(closing: Any) -> None:
    cart = make(closing, "gymnasium/CartPole-v1")
    td = cart.reset()
    with pytest.raises(MissingActionError, match=r"the action \('agents', 'action'\) is missing"):
        cart.step(td.clone())
    td["agents", "action"] = torch.tensor([2])
    with pytest.raises(InvalidActionError, match=r"class 2 at index \[0\] is outside \[0, 2\)"):
        cart.step(td)
    td["agents", "action"] = torch.tensor([1.0])
    with pytest.raises(InvalidActionError, match="dtype float32 != spec dtype int64"):
        cart.step(td)

    cheetah = make(closing, "gymnasium/HalfCheetah-v5", num_envs=2)
    twin = make(closing, "gymnasium/HalfCheetah-v5", num_envs=2)
    td = cheetah.rand_action(cheetah.reset())
    twin.reset()
    expected = twin.step(td.clone())["next", "agents", "observation"]
    bad = td.clone()
    bad["agents", "action"] = torch.full((2, 1, 6), float("nan"))
    with pytest.raises(InvalidActionError, match="non-finite value nan"):
        cheetah.step(bad)
    bad["agents", "action"] = torch.zeros(2, 1, 7)
    with pytest.raises(InvalidActionError, match=r"shape \[2, 1, 7\] != spec shape \[2, 1, 6\]"):
        cheetah.step(bad)
    bad["agents", "action"] = torch.full((2, 1, 6), 1.5)
    with pytest.raises(InvalidActionError, match=r"outside \[-1.0, 1.0\]"):
        cheetah.step(bad)
    # The rejected actions left the simulator where it was: the good one steps like the twin's.
    assert torch.equal(cheetah.step(td)["next", "agents", "observation"], expected)


def test_protocol_errors(closing: Any) -> None:
    env = make(closing, f"gymnasium/{COUNTDOWN_ID}", num_envs=2)
    with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
        env.step(env.rand_action())
    td = env.reset()
    for _ in range(5):  # every episode ends within 5 steps
        td = env.step(env.rand_action(td))
        if td["next", "done"].any():
            break
        td = env._step_mdp(td)
    assert td["next", "done"].any()
    with pytest.raises(RuntimeError, match="finished their episode at the last step; reset them"):
        env.step(env.rand_action(env._step_mdp(td)))
    bad = env._step_mdp(td)
    bad["_reset"] = torch.ones(2, dtype=torch.bool)
    with pytest.raises(ValueError, match="reset mask '_reset' has shape"):
        env.reset(bad)


def test_bad_arguments(closing: Any) -> None:
    with pytest.raises(UnknownEnvError, match="Did you mean: CartPole-v1"):
        marlkit.make("gymnasium/CartPol-v1")
    with pytest.raises(ValueError, match="num_envs must be an int >= 1 or None, got 0"):
        marlkit.make("gymnasium/CartPole-v1", num_envs=0)
    with pytest.raises(TypeError, match=r"num_envs must be an int >= 1 or None, got float: 2\.0"):
        marlkit.make("gymnasium/CartPole-v1", num_envs=2.0)
    with pytest.raises(ValueError, match="vectorization must be 'sync', 'async' or None"):
        marlkit.make("gymnasium/CartPole-v1", num_envs=2, vectorization="ray")
    with pytest.raises(ValueError, match="'next' cannot name a group"):
        marlkit.make("gymnasium/CartPole-v1", group="next")
    with pytest.raises(TypeError, match=r"wraps a gymnasium\.Env or gymnasium\.vector\.VectorEnv"):
        GymnasiumEnv(object())
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_agents'"):
        marlkit.make("gymnasium/CartPole-v1", n_agents=4)


@pytest.mark.parametrize("num_envs", [None, 2])
def test_unknown_env_arguments_are_refused_with_close_matches(
    closing: Any, num_envs: int | None
) -> None:
    # Checked against CartPoleEnv's signature before gymnasium builds anything.
    expected = (
        r"env 'gymnasium/CartPole-v1' got an unexpected keyword argument 'sutton_barto' "
        r"\(did you mean 'sutton_barto_reward'\?\); it accepts: sutton_barto_reward, "
        r"render_mode, max_episode_steps, disable_env_checker"
    )
    with pytest.raises(TypeError, match=expected):
        marlkit.make("gymnasium/CartPole-v1", num_envs=num_envs, sutton_barto=True)
    with pytest.raises(TypeError, match=r"'num_env' \(did you mean 'num_envs'\?\)"):
        marlkit.make("gymnasium/CartPole-v1", num_env=2)
    # The constructor's own arguments and gymnasium.make's options still pass.
    env = make(
        closing,
        "gymnasium/CartPole-v1",
        num_envs=num_envs,
        sutton_barto_reward=True,
        max_episode_steps=3,
        disable_env_checker=True,
    )
    td = env.rollout(10)
    assert td.batch_size[-1] == 3 and td["next", "truncated"][..., -1, :].all()  # gymnasium's
    assert accepted_kwargs("gymnasium/CartPole-v1")[:2] == ["sutton_barto_reward", "render_mode"]


def test_env_arguments_of_an_open_constructor_go_to_gymnasium(closing: Any) -> None:
    # Ant-v5 takes **kwargs (handed to MujocoEnv): gymnasium's own error, not marlkit's.
    assert accepted_kwargs("gymnasium/Ant-v5") is None
    with pytest.raises(TypeError, match=r"MujocoEnv\.__init__\(\) got an unexpected keyword"):
        marlkit.make("gymnasium/Ant-v5", bogus=1)
    env = make(closing, "gymnasium/Ant-v5", ctrl_cost_weight=0.1, max_episode_steps=2)
    assert env.gym_env.unwrapped._ctrl_cost_weight == 0.1


# ---------------------------------------------------------------------- seeding
def test_seeding_reproduces_rollouts(closing: Any) -> None:
    a = make(closing, "gymnasium/CartPole-v1", num_envs=2, seed=7)
    b = make(closing, "gymnasium/CartPole-v1", num_envs=2, seed=7)
    c = make(closing, "gymnasium/CartPole-v1", num_envs=2, seed=8)
    ra, rb, rc = (e.rollout(40, break_when_any_done=False) for e in (a, b, c))
    assert torch.equal(ra["next", "agents", "observation"], rb["next", "agents", "observation"])
    assert torch.equal(ra["agents", "action"], rb["agents", "action"])
    assert not torch.equal(ra["agents", "observation"], rc["agents", "observation"])
    # Envs of one batch get different seeds (seed + i, as gymnasium's reset(seed=s)).
    assert not torch.equal(ra["agents", "observation"][0, 0], ra["agents", "observation"][1, 0])
    a.set_seed(7)
    assert torch.equal(a.reset()["agents", "observation"], ra["agents", "observation"][:, 0])
    assert a.gym_env.action_space.sample().tolist() == b.gym_env.action_space.sample().tolist()


def test_a_refused_seed_changes_nothing(closing: Any) -> None:
    env = make(closing, "gymnasium/CartPole-v1", num_envs=2, seed=7)
    first = env.reset()["agents", "observation"]
    with pytest.raises(ValueError, match=r"Gymnasium takes seeds >= 0 .*, got -1"):
        env.set_seed(-1)
    env.set_seed(7)  # the env still resets, and seed 7 still replays
    assert torch.equal(env.reset()["agents", "observation"], first)


class _Camera(gym.Env):
    """A uint8 observation space whose simulator returns floats: ``values`` at each reset."""

    observation_space = spaces.Box(0, 255, (2,), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self, values: list[float]):
        self.values = np.array(values)

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        return self.values, {}


@pytest.mark.parametrize("values", [[300.0, 1.0], [-1.0, 1.0], [0.7, 1.0], [np.nan, 1.0]])
def test_values_an_integer_space_cannot_hold_are_refused_not_wrapped(values: list) -> None:
    with pytest.raises(SimulatorOutputError, match=r"that uint8 cannot hold exactly .*: \["):
        GymnasiumEnv(_Camera(values)).reset()
    fits = GymnasiumEnv(_Camera([255.0, 0.0])).reset()["agents", "observation"]  # exact: kept
    assert fits.dtype == torch.uint8 and fits.tolist() == [[255, 0]]


class _Sensor(gym.Env):
    """A Box(4) observation space whose simulator returns ``value`` at reset and each step."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, value: np.ndarray):
        self.value = value

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        return self.value, {}

    def step(self, action: int) -> tuple:
        return self.value, 0.0, False, False, {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (np.zeros(5, np.float32), r"observation',\) of shape \[5\], expected \[4\] \(from"),
        (np.array([0, np.nan, 0, 0], np.float32), r"not finite: nan at index \[1\]"),
        (np.array([0, 0, np.inf, 0], np.float32), r"not finite: inf at index \[2\]"),
    ],
)
def test_observations_of_another_shape_or_not_finite_are_refused(
    closing: Any, value: np.ndarray, message: str
) -> None:
    # as from_parallel and the PettingZoo adapter: a simulator's bad output is named at the
    # step it happens, not passed on (a [1, 5] tensor under a [1, 4] spec, or NaN, went through)
    with pytest.raises(SimulatorOutputError, match=message):
        GymnasiumEnv(_Sensor(value)).reset()
    if value.shape == (4,):  # a vector env of them: the env named by its index in the batch
        env = GymnasiumEnv(gym.vector.SyncVectorEnv([lambda: _Sensor(value)] * 2))
        closing(env)
        with pytest.raises(SimulatorOutputError, match=message.replace("[", "[0, ")):
            env.reset()


def test_single_env_seed_matches_gymnasium(closing: Any) -> None:
    env = make(closing, "gymnasium/CartPole-v1", seed=5)
    reference = gym.make("CartPole-v1")
    expected, _ = reference.reset(seed=5)
    reference.close()
    assert env.reset()["agents", "observation"][0].numpy().tolist() == expected.tolist()


# ---------------------------------------------------------------------- rendering
def test_cartpole_frames(closing: Any) -> None:
    single = make(closing, "gymnasium/CartPole-v1", render_mode="rgb_array")
    check_adapter(single)
    frame = single.render()
    assert frame.shape == (400, 600, 3) and frame.dtype == np.uint8

    vec = make(closing, "gymnasium/CartPole-v1", num_envs=2, render_mode="rgb_array", seed=1)
    td = vec.reset()
    for _ in range(8):
        td = vec._step_mdp(vec.step(vec.rand_action(td)))
    first, second = vec.render(0), vec.render(1)
    assert first.shape == second.shape == (400, 600, 3)
    assert not np.array_equal(first, second)

    plain = make(closing, "gymnasium/CartPole-v1")
    assert plain.render_modes == ()
    with pytest.raises(NotImplementedError, match="does not render"):
        plain.render()


def test_render_before_reset(closing: Any) -> None:
    env = make(closing, "gymnasium/CartPole-v1", render_mode="rgb_array")
    with pytest.raises(RuntimeError, match=r"call reset\(\) before render\(\)"):
        env.render()


# ---------------------------------------------------------------------- registry
def test_list_scenarios_and_registry() -> None:
    ids = list_scenarios()
    assert {"CartPole-v1", "HalfCheetah-v5", COUNTDOWN_ID} <= set(ids)
    assert "HalfCheetah-v2" not in ids  # a mujoco-py placeholder that only raises
    assert "Pusher-v5" in ids and "Pusher-v4" not in ids  # v4 refuses mujoco >= 3
    assert ids == sorted(set(ids))
    entry = marlkit.envs.registered_adapters()["gymnasium"]
    assert entry.available and "CartPole-v1" in entry.list_scenarios()
    env = marlkit.make("gymnasium/CartPole-v1", num_envs=2)
    assert isinstance(env, GymnasiumEnv) and env.is_vector
    env.close()
    assert env.is_closed
    with pytest.raises(RuntimeError, match="is closed"):
        env.reset()


def test_every_listed_mujoco_id_builds() -> None:
    # What `marlkit list` shows must make: no id that only raises on the installed mujoco.
    spec_of = gym.registry
    mujoco_ids = [i for i in list_scenarios() if "mujoco" in str(spec_of[i].entry_point)]
    assert len(mujoco_ids) > 10
    for env_id in mujoco_ids:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the v4 ids' "out of date"
            gym.make(env_id).close()


def test_step_output_is_fresh(closing: Any) -> None:
    env = make(closing, "gymnasium/CartPole-v1", num_envs=2)
    td = env.rollout(6, break_when_any_done=False)
    obs = td["next", "agents", "observation"]
    # Consecutive steps are different tensors: later steps did not overwrite earlier ones.
    assert not torch.equal(obs[:, 0], obs[:, 1])
    assert torch.equal(td["agents", "observation"][:, 1:], obs[:, :-1])
    assert td[NEXT].batch_size == (2, 6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device(closing: Any) -> None:
    env = make(closing, "gymnasium/CartPole-v1", num_envs=3, device="cuda", max_episode_steps=5)
    check_adapter(env, steps=12)
    td = env.rollout(12, break_when_any_done=False)
    assert td["agents", "observation"].device.type == "cuda"
    assert td["next", "agents", "reward"].device.type == "cuda"
