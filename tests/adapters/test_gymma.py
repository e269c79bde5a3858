"""The EPyMARL Gymnasium format (``gymma``, ``lbforaging``, ``rware``) against the real packages."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import marlkit
from marlkit.adapters._spaces import SimulatorOutputError
from marlkit.envs import InvalidActionError, accepted_kwargs, check_env_specs
from marlkit.envs.registry import UnknownEnvError
from marlkit.testing import check_adapter

pytest.importorskip("lbforaging")
pytest.importorskip("rware")

LBF = "lbforaging/Foraging-8x8-2p-2f-coop-v3"
LBF_SMALL = "lbforaging/Foraging-5x5-2p-1f-v3"  # random play eats its one food now and then
RWARE = "rware/rware-tiny-2ag-v2"


def lbf(**kwargs):
    return marlkit.make(LBF, **{"num_envs": 2, "seed": 0, **kwargs})


# ---------------------------------------------------------------------- specs and data
@pytest.mark.parametrize(
    ("name", "n", "obs", "actions", "bounded"),
    [
        (LBF, 2, 12, 6, True),
        ("lbforaging/Foraging-10x10-3p-3f-v3", 3, 18, 6, True),
        (RWARE, 2, 71, 5, False),
    ],
)
def test_one_group_of_agents_with_stacked_specs(name, n, obs, actions, bounded):
    env = marlkit.make(name, num_envs=3, seed=0)
    assert env.group_map == {"agents": [f"agent_{i}" for i in range(n)]}
    spec = env.observation_spec["agents", "observation"]
    assert spec.shape == (3, n, obs) and spec.dtype == torch.float32
    assert hasattr(spec, "low") == bounded  # LBF's Box is bounded, RWARE's is not
    action = env.action_spec["agents", "action"]
    assert action.shape == (3, n) and action.n == actions
    assert env.reward_spec["agents", "reward"].shape == (3, n, 1)
    check_env_specs(env)
    env.close()


@pytest.mark.parametrize(
    ("name", "gym_id"), [(LBF, "Foraging-8x8-2p-2f-coop-v3"), (RWARE, "rware-tiny-2ag-v2")]
)
def test_data_match_the_simulator_under_the_same_actions(name, gym_id):
    env = marlkit.make(name, num_envs=1, seed=5)
    raw = gym.make(gym_id, disable_env_checker=True)
    td = env.reset()
    raw_obs, _ = raw.reset(seed=5)
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        assert np.array_equal(td["agents", "observation"][0].numpy(), np.stack(raw_obs))
        action = torch.randint(0, env.action_spec["agents", "action"].n, (1, 2), generator=gen)
        td["agents", "action"] = action
        raw_obs, rewards, done, _, _ = raw.step(action[0].tolist())
        td = env.step(td)["next"]
        assert td["agents", "reward"][0, :, 0].tolist() == pytest.approx(list(rewards))
        assert td["done"].item() == done
        if done:
            break


def test_a_batched_rollout_resets_finished_envs():
    env = marlkit.make(LBF_SMALL, num_envs=4, seed=0, time_limit=10)
    out = env.rollout(25, break_when_any_done=False)
    assert out["agents", "observation"].shape == (4, 25, 2, 9)  # (row, col, level) x 3 things
    assert out["next", "agents", "reward"].shape == (4, 25, 2, 1)
    done = out["next", "done"][..., 0]
    assert (done.float().argmax(1) <= 9).all()  # every env ended by its 10th step
    assert (done.sum(1) >= 2).all()  # and again after its reset
    check_env_specs(env)


@pytest.mark.slow  # worker processes start: 5-12 s on 2 loaded cores
def test_inside_parallel_env_and_a_collector():
    from marlkit.collectors import Collector
    from marlkit.envs import ParallelEnv

    kwargs = {"name": RWARE, "num_envs": 2, "time_limit": 4}
    env = ParallelEnv(2, marlkit.make, kwargs, start_method="forkserver")
    try:
        assert env.batch_size == (2, 2)
        out = env.rollout(6, break_when_any_done=False)
        assert out["agents", "observation"].shape == (2, 2, 6, 2, 71)
        assert out["next", "truncated"].sum() == 2 * 2 and not out["next", "terminated"].any()
    finally:
        env.close()
    collector = Collector(lbf(time_limit=5), None, frames_per_batch=2 * 6, total_frames=24)
    batches = list(collector)
    collector.shutdown()
    assert [b.batch_size for b in batches] == [torch.Size([2, 6])] * 2
    assert batches[1]["next", "agents", "reward"].shape == (2, 6, 2, 1)


# ---------------------------------------------------------------------- bad input
def test_bad_actions_are_refused_naming_the_key():
    env = lbf()
    td = env.reset()
    sim = env.simulators[0].unwrapped
    before = [p.position for p in sim.players]
    with pytest.raises(InvalidActionError, match=r"\('agents', 'action'\) is missing"):
        env.step(td)
    td["agents", "action"] = torch.full((2, 2), 6)  # Discrete(6): classes 0..5
    with pytest.raises(InvalidActionError, match=r"\('agents', 'action'\).*class 6"):
        env.step(td)
    td["agents", "action"] = torch.zeros(2, 2, 1, dtype=torch.long)
    with pytest.raises(InvalidActionError, match=r"\('agents', 'action'\).*shape"):
        env.step(td)
    assert [p.position for p in sim.players] == before


def test_bad_names_and_options_are_refused_with_what_is_accepted():
    with pytest.raises(UnknownEnvError, match="Did you mean: Foraging-8x8-2p-2f-coop-v3"):
        marlkit.make("lbforaging/Foraging-8x8-2p-2f-cop-v3")
    with pytest.raises(UnknownEnvError, match="is not a rware env"):
        marlkit.make("rware/Foraging-8x8-2p-2f-coop-v3")
    with pytest.raises(TypeError, match=r"'max_episode_steps' is the simulator's step limit; pass"):
        lbf(max_episode_steps=20)  # LBF's own limit: time_limit sets it
    with pytest.raises(TypeError, match=r"'max_steps' .*time_limit=20"):
        marlkit.make(RWARE, max_steps=20)
    with pytest.raises(ValueError, match=r"reward_scalarisation must be one of \['sum', 'mean'\]"):
        lbf(reward_scalarisation="max")
    with pytest.raises(ValueError, match="time_limit must be an int >= 1"):
        lbf(time_limit=0)
    with pytest.raises(ValueError, match="render_mode must be None or 'rgb_array'"):
        lbf(render_mode="human")
    assert "sight" in accepted_kwargs(LBF) and "max_episode_steps" not in accepted_kwargs(LBF)
    assert "reward_type" in accepted_kwargs(RWARE) and "max_steps" not in accepted_kwargs(RWARE)


def test_the_gymnasium_adapter_points_to_the_multi_agent_families():
    for name in (LBF, "lbforaging:Foraging-8x8-2p-2f-coop-v3"):
        with pytest.raises(ValueError, match=r"EPyMARL's format.*marlkit.make\('lbforaging/Fo"):
            marlkit.make(f"gymnasium/{name.rpartition('/')[2]}")
    with pytest.raises(ValueError, match=r"marlkit.make\('rware/rware-tiny-2ag-v2'\)"):
        marlkit.make("gymnasium/rware-tiny-2ag-v2", num_envs=2)


def test_missing_packages_are_named_with_their_extra(monkeypatch):
    from marlkit.adapters.lbforaging import make_env
    from marlkit.envs import registry

    monkeypatch.setattr(registry, "has_module", lambda name: name != "rware")
    with pytest.raises(registry.AdapterUnavailableError, match=r"pip install 'marlkit\[rware\]'"):
        marlkit.make(RWARE)
    monkeypatch.setitem(sys.modules, "lbforaging", None)  # import lbforaging fails
    with pytest.raises(ImportError, match=r"pip install 'marlkit\[lbforaging\]'"):
        make_env("Foraging-8x8-2p-2f-coop-v3")


def test_the_registry_lists_the_ids():
    adapters = marlkit.envs.registered_adapters()
    lbf_ids = adapters["lbforaging"].list_scenarios()
    assert "Foraging-8x8-2p-2f-coop-v3" in lbf_ids and "Foraging-2s-10x10-3p-3f-v3" in lbf_ids
    assert "rware-tiny-2ag-v2" in adapters["rware"].list_scenarios()
    assert adapters["lbforaging"].extra == "lbforaging" and adapters["rware"].extra == "rware"


# ---------------------------------------------------------------------- seeding
def test_seeds_replay_and_instances_differ():
    env = lbf(num_envs=3, seed=7, time_limit=6)
    first = env.rollout(14, break_when_any_done=False)  # two resets on the way
    env.set_seed(7)
    second = env.rollout(14, break_when_any_done=False)
    assert (first == second).all()
    obs = first["agents", "observation"][:, 0]
    assert not torch.equal(obs[0], obs[1]) and not torch.equal(obs[1], obs[2])


def test_lbf_itself_does_not_replay_a_seeded_reset_after_an_episode():
    """Upstream (lbforaging 2.0.0): a reset places players and food away from where the last
    episode's players stood, so ``reset(seed=0)`` twice gives two starts; the adapter forgets
    the old positions before each reset (the test fails once LBF stops doing this: then the
    adapter's ``before_reset`` can go)."""
    raw = gym.make("Foraging-8x8-2p-2f-coop-v3", disable_env_checker=True)
    first = np.stack(raw.reset(seed=0)[0])
    assert not np.array_equal(first, np.stack(raw.reset(seed=0)[0]))
    env = lbf(num_envs=1)
    starts = []
    for _ in range(2):
        env.set_seed(0)
        starts.append(env.reset()["agents", "observation"][0].numpy())
    assert np.array_equal(starts[0], first) and np.array_equal(starts[1], first)


# ---------------------------------------------------------------------- rewards
def test_rewards_are_each_agents_or_common_by_option():
    runs = {}
    for key, options in {
        "own": {},
        "sum": {"common_reward": True},
        "mean": {"common_reward": True, "reward_scalarisation": "mean"},
    }.items():
        env = marlkit.make(LBF_SMALL, num_envs=4, seed=0, **options)
        runs[key] = env.rollout(100, break_when_any_done=False)
    own = runs["own"]["next", "agents", "reward"]
    assert (own[..., 0, 0] != own[..., 1, 0]).any()  # one agent loaded the food alone
    for key, reduce in (("sum", own.sum), ("mean", own.mean)):
        common = runs[key]["next", "agents", "reward"]
        assert torch.equal(common, reduce(-2, keepdim=True).expand_as(own))
    assert (runs["sum"]["agents", "observation"] == runs["own"]["agents", "observation"]).all()


# ---------------------------------------------------------------------- time limits
def _episodes(out):
    """``(env, step, length)`` of each episode's last step in a rollout ``[N, T]``."""
    done = out["next", "done"][..., 0]
    ends = []
    for i in range(done.shape[0]):
        start = 0
        for t in done[i].nonzero().flatten().tolist():
            ends.append((i, t, t + 1 - start))
            start = t + 1
    return ends


def test_lbf_food_eaten_terminates_and_the_time_limit_truncates():
    env = marlkit.make(LBF_SMALL, num_envs=4, seed=0)
    out = env.rollout(100, break_when_any_done=False)
    nxt = out["next"]
    kinds = set()
    for i, t, length in _episodes(out):
        if nxt["terminated"][i, t].item():  # the one food was loaded at that step
            kinds.add("terminated")
            assert nxt["agents", "reward"][i, t].sum() > 0 and length <= 50
            assert not nxt["truncated"][i, t].item()
        else:  # LBF's own limit (50, its registration's), food left
            kinds.add("truncated")
            assert nxt["truncated"][i, t].item() and length == 50
    assert kinds == {"terminated", "truncated"}
    assert torch.equal(nxt["agents", "truncated"][..., 0], nxt["truncated"].expand(-1, -1, 2))


def test_time_limit_sets_the_episode_length_of_the_simulator_too():
    env = lbf(time_limit=80, num_envs=1)  # beyond LBF's registered 50
    out = env.rollout(
        80,
        lambda td: td.set(("agents", "action"), torch.zeros(1, 2, dtype=torch.long)),
        break_when_any_done=False,
    )
    done = out["next", "done"][0, :, 0]
    assert done.nonzero().flatten().tolist() == [79]  # standing still: no food eaten
    assert (
        out["next", "truncated"][0, 79].item()
        and env.simulators[0].unwrapped._max_episode_steps == 80
    )


def test_rware_ends_episodes_only_by_truncation():
    env = marlkit.make(RWARE, num_envs=2, seed=0, time_limit=7)
    out = env.rollout(14, break_when_any_done=False)
    assert out["next", "truncated"][:, [6, 13]].all() and out["next", "done"].sum() == 4
    assert not out["next", "terminated"].any()
    env = marlkit.make(RWARE, num_envs=1, seed=0, max_inactivity_steps=3)  # RWARE's own limit
    out = env.rollout(6, break_when_any_done=False)
    assert out["next", "truncated"][0, [2, 5], 0].all() and not out["next", "terminated"].any()


# ---------------------------------------------------------------------- rendering, the kit
@pytest.mark.parametrize(("name", "shape"), [(LBF, (409, 409, 3)), (RWARE, (343, 311, 3))])
def test_frames_render_headless(name, shape, monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    env = marlkit.make(name, num_envs=2, seed=0, render_mode="rgb_array")
    assert env.render_modes == ("rgb_array",)
    env.reset()
    frame = env.render(1)
    assert frame.shape == shape and frame.dtype == np.uint8 and frame.std() > 0
    assert "rgb_array" not in marlkit.make(name).render_modes


@pytest.mark.parametrize("name", [LBF, RWARE])
def test_the_conformance_kit_passes(name):
    check_adapter(marlkit.make(name, num_envs=2, seed=0, render_mode="rgb_array"), steps=6)


# ---------------------------------------------------------------------- the gymma family
class _Relay(gym.Env):
    """A small env in EPyMARL's format: two agents whose observations differ in size (padded),
    MultiDiscrete actions, one scalar reward, a done flag per agent."""

    def __init__(self, nan_at: int = -1):
        box = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
        self.observation_space = gym.spaces.Tuple(
            (box, gym.spaces.Box(-10.0, 10.0, (2,), np.float32))
        )
        act = gym.spaces.MultiDiscrete([2, 3])
        self.action_space = gym.spaces.Tuple((act, act))
        self.n_agents, self.nan_at = 2, nan_at

    def _obs(self):
        a = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        if self.t == self.nan_at:
            a[1] = np.nan
        return (a, np.array([self.t, self.last], np.float32))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.last = 0, 0
        return self._obs(), {}

    def step(self, actions):
        self.t += 1
        self.last = int(actions[0][1] * 10 + actions[1][1])
        return self._obs(), float(self.last), [self.t >= 3, self.t >= 4], False, {}


gym.register("MarlkitRelay-v0", entry_point=_Relay)


def test_gymma_pads_observations_and_passes_multidiscrete_actions():
    env = marlkit.make("gymma/MarlkitRelay-v0", num_envs=2, seed=0)
    assert env.observation_spec["agents", "observation"].shape == (2, 2, 3)  # padded to 3
    assert env.action_spec["agents", "action"].shape == (2, 2, 2)
    td = env.reset()
    assert (td["agents", "observation"][:, 1, 2] == 0).all()  # the padding
    td["agents", "action"] = torch.tensor([[[0, 2], [1, 1]], [[1, 0], [0, 2]]])
    nxt = env.step(td)["next"]
    assert nxt["agents", "observation"][:, 1, 1].tolist() == [21.0, 2.0]  # what each got
    assert nxt["agents", "reward"][..., 0].tolist() == [[21.0, 21.0], [2.0, 2.0]]  # one for all
    out = env.rollout(5, break_when_any_done=False)
    assert out["next", "done"][0, :, 0].tolist() == [False, False, False, True, False]  # all done
    assert not out["next", "truncated"].any()  # no rule: the simulator's own flags
    check_adapter(marlkit.make("gymma/MarlkitRelay-v0", num_envs=2), steps=4)


def test_gymma_refuses_a_non_finite_observation_naming_the_key():
    env = marlkit.make("gymma/MarlkitRelay-v0", nan_at=2)
    env.rollout(1)
    with pytest.raises(
        SimulatorOutputError, match=r"\('agents', 'observation'\) that is not finite"
    ):
        env.rollout(3)


class _BadReward(_Relay):
    """Rewards each agent ``reward`` from step ``at`` on (NaN, or a list of the wrong size)."""

    def __init__(self, reward=np.nan, at: int = 2):
        super().__init__()
        self.reward, self.at = reward, at

    def step(self, actions):
        obs, reward, done, truncated, info = super().step(actions)
        bad = self.t >= self.at
        return obs, (self.reward if bad else [reward, reward]), done, truncated, info


gym.register("MarlkitBadReward-v0", entry_point=_BadReward)


@pytest.mark.parametrize(
    ("reward", "match"),
    [
        ([0.0, np.inf], r"\('agents', 'reward'\) that is not finite: inf at index \[1, 1\]"),
        (np.nan, r"\('agents', 'reward'\) that is not finite: nan at index \[1, 0\]"),
        ([1.0, 2.0, 3.0], r"env 1 returned a reward .*does not fit \('agents', 'reward'\)"),
    ],
)
def test_gymma_refuses_a_bad_reward_naming_the_key(reward, match):
    env = marlkit.make("gymma/MarlkitBadReward-v0", num_envs=2, reward=reward)
    td = env.reset()
    env.simulators[0].unwrapped.at = 9  # only env 1 goes wrong
    td["agents", "action"] = torch.zeros(2, 2, 2, dtype=torch.long)
    env.step(td)
    with pytest.raises(SimulatorOutputError, match=match):
        env.step(td)


def test_gymma_refuses_to_step_an_ended_env_until_it_is_reset():
    env = marlkit.make("gymma/MarlkitRelay-v0", num_envs=2, seed=0)
    td = env.reset()
    td["agents", "action"] = torch.zeros(2, 2, 2, dtype=torch.long)
    for _ in range(4):  # every agent done at the 4th step
        nxt = env.step(td)["next"]
    assert nxt["done"].all()
    with pytest.raises(RuntimeError, match=r"env\(s\) \[0, 1\] ended at the last step"):
        env.step(td)
    td = env.reset(td.set("_reset", torch.tensor([[True], [False]])))  # env 0 only
    with pytest.raises(RuntimeError, match=r"env\(s\) \[1\] ended at the last step"):
        env.step(td.set(("agents", "action"), torch.zeros(2, 2, 2, dtype=torch.long)))
    td = env.reset(td.set("_reset", torch.tensor([[False], [True]])))
    td["agents", "action"] = torch.zeros(2, 2, 2, dtype=torch.long)
    assert not env.step(td)["next", "done"].any()


def test_gymma_applies_the_lbf_rule_to_lbf_ids():
    env = marlkit.make("gymma/lbforaging:Foraging-8x8-2p-2f-coop-v3", num_envs=1, time_limit=3)
    assert env.rule is not None and env.rule.family == "lbforaging"
    out = env.rollout(3)
    assert out["next", "truncated"][0, 2].item()
    with pytest.raises(TypeError, match="not in EPyMARL's format"):
        marlkit.make("gymma/CartPole-v1")


class _ListReward(_Relay):
    """Declares one agent (``n_agents = 1``) but returns a reward per agent."""

    def __init__(self):
        super().__init__()
        self.n_agents = 1

    def step(self, actions):
        obs, reward, done, truncated, info = super().step(actions)
        return obs, [reward, reward], all(done), truncated, info


gym.register("MarlkitListReward-v0", entry_point=_ListReward)


def test_the_gymnasium_adapter_names_the_format_at_a_list_reward():
    env = marlkit.make("gymnasium/MarlkitListReward-v0", disable_env_checker=True)
    with pytest.raises(SimulatorOutputError, match=r"reward of shape \[2\].*marlkit.make\('gymma/"):
        env.rollout(2)
    assert marlkit.make("gymma/MarlkitListReward-v0").rollout(2).batch_size == (1, 2)


def test_marlkit_record_films_lbf_headless(tmp_path, monkeypatch, capsys):
    from marlkit.cli import main
    from marlkit.record import read_video

    monkeypatch.delenv("DISPLAY", raising=False)
    out = tmp_path / "lbf.mp4"
    argv = ["record", LBF, "--steps", "4", "--no-progress", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    frames, _ = read_video(out)
    assert frames.shape[0] == 5 and frames.shape[-1] == 3 and frames.std() > 0


class _Uneven(_Relay):
    """Agents with Discrete(3) and Discrete(5) actions (EPyMARL masks the longer space)."""

    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Discrete(5)))

    def step(self, actions):
        assert actions[0] < 3 and actions[1] < 5  # what the simulator would refuse
        self.last = actions[0] * 10 + actions[1]
        return self._obs(), [0.0, 1.0], self.t >= 6, False, {}


gym.register("MarlkitUneven-v0", entry_point=_Uneven)


class _Mixed(_Relay):
    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,))))


gym.register("MarlkitMixed-v0", entry_point=_Mixed)


def test_gymma_masks_the_actions_of_agents_with_fewer():
    env = marlkit.make("gymma/MarlkitUneven-v0", num_envs=2, seed=0)
    assert env.action_spec["agents", "action"].n == 5
    td = env.reset()
    assert td["agents", "action_mask"].tolist() == [[[True] * 3 + [False] * 2, [True] * 5]] * 2
    td["agents", "action"] = torch.tensor([[2, 4], [1, 0]])
    assert env.step(td)["next", "agents", "observation"][:, 1, 1].tolist() == [24.0, 10.0]
    td = env.reset()
    td["agents", "action"] = torch.tensor([[4, 4], [0, 0]])  # agent 0 has 3 actions
    with pytest.raises(InvalidActionError, match=r"\('agents', 'action'\)"):
        env.step(td)
    out = env.rollout(8, break_when_any_done=False)  # random actions follow the mask
    assert (out["agents", "action"][..., 0] < 3).all()
    check_adapter(env, steps=4)
    with pytest.raises(TypeError, match="one group takes one action space"):
        marlkit.make("gymma/MarlkitMixed-v0")  # Discrete and Box: no mask joins them
