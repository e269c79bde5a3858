"""The native navigation scenario: C++ vs torch agreement, seeding, specs, physics, resets."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import pytest
import torch

import marlkit
from marlkit.envs import InvalidActionError, check_env_specs
from marlkit.native import extension_available
from marlkit.native.lidar import lidar
from marlkit.scenarios import NavigationEnv
from marlkit.testing import check_adapter

needs_ext = pytest.mark.skipif(not extension_available(), reason="marlkit._C not built")
#: VMAS navigation's observation: its LiDAR, with its agent radius.
LIDAR = dict(obs_mode="lidar", agent_radius=0.1)


def _actions(env: NavigationEnv, steps: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    spec = env.action_spec["agents", "action"]
    return [spec.rand(generator=gen) for _ in range(steps)]


@needs_ext
@pytest.mark.parametrize("continuous", [True, False])
@pytest.mark.parametrize("n_agents", [4, 16])
def test_native_and_torch_agree_over_100_steps(
    continuous: bool, n_agents: int, rollout_with: Callable
) -> None:
    kwargs = dict(num_envs=16, n_agents=n_agents, continuous_actions=continuous, seed=7)
    native = NavigationEnv(**kwargs, backend="native", world_size=0.6)  # crowded: contacts
    twin = NavigationEnv(**kwargs, backend="torch", world_size=0.6)
    actions = _actions(native, 100, seed=1)
    for a, b in zip(rollout_with(native, actions), rollout_with(twin, actions)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@needs_ext
def test_crowded_world_has_contacts() -> None:
    env = NavigationEnv(num_envs=8, n_agents=16, world_size=0.4, seed=0, collision_penalty=1.0)
    out = env.rollout(30, break_when_any_done=False)
    assert (out["next", "agents", "reward"] < -0.5).any(), "no collision penalty seen"


@pytest.mark.parametrize("backend", ["native", "torch"])
@pytest.mark.parametrize("continuous", [True, False])
def test_same_seed_same_rollout_bit_for_bit(backend: str, continuous: bool) -> None:
    if backend == "native" and not extension_available():
        pytest.skip("marlkit._C not built")
    runs = []
    for _ in range(2):
        env = NavigationEnv(num_envs=8, n_agents=4, continuous_actions=continuous, backend=backend)
        env.set_seed(123)
        runs.append(env.rollout(50, break_when_any_done=False))
    assert torch.equal(
        runs[0]["next", "agents", "observation"], runs[1]["next", "agents", "observation"]
    )
    assert torch.equal(runs[0]["next", "agents", "reward"], runs[1]["next", "agents", "reward"])
    other = NavigationEnv(
        num_envs=8, n_agents=4, continuous_actions=continuous, backend=backend, seed=124
    )
    diff = other.rollout(50, break_when_any_done=False)
    assert not torch.equal(
        diff["next", "agents", "observation"], runs[0]["next", "agents", "observation"]
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"continuous_actions": False},
        {"group_map": "per_agent"},
        {"n_agents": 1},
        {"group_map": {"red": ["agent_0", "agent_2"], "blue": ["agent_1", "agent_3"]}},
        {"backend": "torch", "k_nearest": 0},
    ],
)
def test_check_env_specs(kwargs: dict) -> None:
    env = marlkit.make("navigation", **{"num_envs": 4, "n_agents": 4, "seed": 0, **kwargs})
    check_env_specs(env)


def test_observation_layout() -> None:
    env = NavigationEnv(num_envs=3, n_agents=5, k_nearest=2, seed=0)
    td = env.reset()
    obs = td["agents", "observation"]
    assert obs.shape == (3, 5, 6 + 2 * 2)
    pos, goal = env.positions, env.goals
    torch.testing.assert_close(obs[..., 0:2], pos)
    torch.testing.assert_close(obs[..., 2:4], torch.zeros_like(pos))  # at rest after reset
    torch.testing.assert_close(obs[..., 4:6], goal - pos)
    # The first neighbour is the nearest other agent.
    d = torch.cdist(pos, pos) + torch.eye(5) * 1e9
    nearest = d.argmin(-1)
    expected = torch.gather(pos, 1, nearest.unsqueeze(-1).expand(-1, -1, 2)) - pos
    torch.testing.assert_close(obs[..., 6:8], expected)
    assert td["state"].shape == (3, 6 * 5)


def test_moving_towards_goal_is_rewarded_and_arrival_terminates() -> None:
    env = NavigationEnv(num_envs=2, n_agents=2, seed=0, collision_penalty=0.0, backend="torch")
    td = env.reset()
    direction = env.goals - env.positions
    td["agents", "action"] = (direction / direction.norm(dim=-1, keepdim=True)).clamp(-1, 1)
    td = env.step(td)
    assert (td["next", "agents", "reward"] > 0).all()
    assert not td["next", "done"].any()
    # Put every goal under its agent: the env terminates and everyone gets the final bonus.
    env._goal = env._pos.clone()
    td = env._step_mdp(td)
    td["agents", "action"] = torch.zeros(2, 2, 2)
    td = env.step(td)
    assert td["next", "terminated"].all() and td["next", "agents", "done"].all()
    assert (td["next", "agents", "reward"] >= env.final_reward - 1e-3).all()


def test_world_bounds_hold() -> None:
    env = NavigationEnv(num_envs=4, n_agents=3, world_size=1.0, seed=0)
    td = env.reset()
    for _ in range(60):  # push hard to +x, +y
        td["agents", "action"] = torch.ones(4, 3, 2)
        td = env._step_mdp(env.step(td))
    limit = env.half_extent - env.physics["radius"]
    assert (env.positions.abs() <= limit + 1e-6).all()
    assert torch.allclose(env.positions.max(), torch.tensor(limit), atol=1e-3)


def test_partial_reset_touches_only_masked_envs() -> None:
    env = NavigationEnv(num_envs=6, n_agents=3, seed=0)
    td = env.rollout(5, break_when_any_done=False)[..., -1]
    root = env._step_mdp(td)
    pos_before = env.positions
    mask = torch.tensor([False, True, False, False, True, False]).unsqueeze(-1)
    root["_reset"] = mask
    out = env.reset(root)
    keep = ~mask.squeeze(-1)
    assert torch.equal(env.positions[keep], pos_before[keep])
    assert torch.equal(out["agents", "observation"][keep], root["agents", "observation"][keep])
    assert not torch.equal(env.positions[~keep], pos_before[~keep])
    assert (out["agents", "observation"][~keep][..., 2:4] == 0).all()  # velocity zeroed


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_agents": 0}, "n_agents must be an int >= 1"),
        ({"num_envs": -1}, "num_envs must be an int >= 1"),
        ({"k_nearest": -1}, "k_nearest"),
        ({"world_size": 0.01}, "world_size"),
        ({"backend": "cuda"}, "backend must be"),
        ({"group_map": {"a": ["agent_0"]}}, "in no group"),
    ],
)
def test_bad_construction(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NavigationEnv(**{"num_envs": 2, "n_agents": 2, **kwargs})


@pytest.mark.parametrize("flag", ["continuous_actions", "shared_reward"])
def test_flags_must_be_bools(flag: str) -> None:
    # bool("false") is True: a string from a config file must not flip the meaning
    with pytest.raises(TypeError, match=rf"{flag} must be a bool, got str: 'false'"):
        NavigationEnv(num_envs=2, n_agents=2, **{flag: "false"})


def test_bad_actions_rejected_with_state_untouched() -> None:
    env = NavigationEnv(num_envs=2, n_agents=2, seed=0)
    td = env.reset()
    pos = env.positions
    td["agents", "action"] = torch.full((2, 2, 2), 2.0)
    with pytest.raises(InvalidActionError, match=r"outside \[-1.0, 1.0\]"):
        env.step(td)
    assert torch.equal(env.positions, pos)
    discrete = NavigationEnv(num_envs=2, n_agents=2, continuous_actions=False, seed=0)
    td = discrete.reset()
    td["agents", "action"] = torch.full((2, 2), 5)
    with pytest.raises(InvalidActionError, match=r"outside \[0, 5\)"):
        discrete.step(td)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("obs", [{}, LIDAR])
def test_cuda_matches_cpu_torch_twin(rollout_with: Callable, obs: dict) -> None:
    kwargs = dict(num_envs=8, n_agents=8, seed=3, backend="torch", **obs)
    cpu, gpu = NavigationEnv(**kwargs), NavigationEnv(**kwargs, device="cuda")
    actions = _actions(cpu, 50, seed=2)
    a = rollout_with(cpu, actions)
    b = rollout_with(gpu, [x.cuda() for x in actions])
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y.cpu(), atol=1e-4, rtol=1e-4)


# ---- obs_mode="lidar": VMAS navigation's observation -------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"backend": "torch"},
        {"continuous_actions": False, "n_lidar_rays": 1},
        {"group_map": "per_agent", "n_lidar_rays": 5, "lidar_range": 0.5},
        {"n_agents": 1},
    ],
)
def test_lidar_mode_passes_specs_and_the_kit(kwargs: dict) -> None:
    env = marlkit.make("navigation", **{"num_envs": 4, "n_agents": 4, "seed": 0, **LIDAR, **kwargs})
    check_env_specs(env)
    check_adapter(env, steps=6)
    group = next(iter(env.group_map))
    leaf = env.observation_spec[group, "observation"]
    assert leaf.shape[-1] == 6 + kwargs.get("n_lidar_rays", 12)


def test_lidar_observation_layout_and_readings() -> None:
    env = NavigationEnv(num_envs=6, n_agents=8, world_size=0.7, seed=0, **LIDAR)
    td = env.rollout(4, break_when_any_done=False)[..., -1]
    obs = td["next", "agents", "observation"]
    assert obs.shape == (6, 8, 6 + 12)
    pos, goal = env.positions, env.goals
    torch.testing.assert_close(obs[..., 0:2], pos, atol=0, rtol=0)
    torch.testing.assert_close(obs[..., 2:4], env._vel, atol=0, rtol=0)
    torch.testing.assert_close(obs[..., 4:6], pos - goal, atol=0, rtol=0)  # VMAS's sign
    readings = lidar(pos, 12, 0.35, 0.1)
    assert torch.equal(obs[..., 6:], 0.35 - readings)
    assert torch.equal(env.lidar_readings(), readings)
    sensed = obs[..., 6:]
    assert (sensed > 0).any() and (sensed == 0).any()  # crowded: some rays see someone


@needs_ext
@pytest.mark.parametrize("continuous", [True, False])
def test_lidar_mode_native_and_torch_agree(continuous: bool, rollout_with: Callable) -> None:
    kwargs = dict(
        num_envs=16, n_agents=12, continuous_actions=continuous, seed=5, world_size=0.8, **LIDAR
    )
    native = NavigationEnv(**kwargs, backend="native")
    twin = NavigationEnv(**kwargs, backend="torch")
    actions = _actions(native, 100, seed=2)
    out_native, out_twin = rollout_with(native, actions), rollout_with(twin, actions)
    for a, b in zip(out_native, out_twin):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (out_native[0][..., 6:] > 0).float().mean() > 0.05  # the rays saw agents


def test_lidar_observation_equals_vmas() -> None:
    """Same positions and goals, at rest: the observation VMAS navigation writes, to rounding."""
    vmas = pytest.importorskip("vmas")
    e, n = 8, 5
    env = NavigationEnv(num_envs=e, n_agents=n, world_size=0.6, seed=3, **LIDAR)
    obs = env.reset()["agents", "observation"]
    with warnings.catch_warnings():  # VMAS imports the retired gym, which warns
        warnings.simplefilter("ignore")
        raw = vmas.make_env("navigation", num_envs=e, device="cpu", n_agents=n, seed=0)
        raw.reset()
    pos, goal = env.positions, env.goals
    for i, agent in enumerate(raw.world.agents):
        agent.set_pos(pos[:, i], batch_index=None)
        agent.goal.set_pos(goal[:, i], batch_index=None)
    expected = torch.stack([raw.scenario.observation(a) for a in raw.world.agents], dim=1)
    assert expected.shape == obs.shape == (e, n, 18)
    torch.testing.assert_close(obs, expected, atol=1e-5, rtol=0)
    assert (expected[..., 6:] > 0).any()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"obs_mode": "rays"},
            ValueError,
            r"obs_mode must be one of \['knn', 'lidar'\], got 'rays'",
        ),
        ({"n_lidar_rays": 0}, ValueError, r"n_lidar_rays must be an int >= 1, got 0"),
        ({"lidar_range": -1.0}, ValueError, r"lidar_range must be a finite number > 0, got -1.0"),
        ({"lidar_range": "far"}, TypeError, r"lidar_range must be a number, got str"),
        # physics, rewards and rendering: refused when built, named as the argument
        ({"mass": 0.0}, ValueError, r"mass must be a finite number > 0, got 0.0"),
        ({"drag": 1.5}, ValueError, r"drag must be a finite number in \[0, 1\), got 1.5"),
        ({"dt": math.inf}, ValueError, r"dt must be a finite number > 0, got inf"),
        ({"substeps": 0}, ValueError, r"substeps must be an int >= 1, got 0"),
        ({"contact_stiffness": -1}, ValueError, r"contact_stiffness must be a finite number >= 0"),
        ({"agent_radius": -0.1}, ValueError, r"agent_radius must be a finite number > 0"),
        ({"world_size": math.nan}, ValueError, r"world_size must be a finite number > 0, got nan"),
        ({"max_force": math.nan}, ValueError, r"max_force must be a finite number >= 0, got nan"),
        ({"max_force": -1.0}, ValueError, r"max_force must be a finite number >= 0, got -1.0"),
        ({"goal_radius": -1.0}, ValueError, r"goal_radius must be a finite number > 0"),
        ({"collision_penalty": math.nan}, ValueError, r"collision_penalty must be a finite"),
        ({"shaping_factor": "x"}, TypeError, r"shaping_factor must be a number, got str: 'x'"),
        ({"render_size": 0}, ValueError, r"render_size must be an int >= 1, got 0"),
    ],
)
def test_bad_lidar_physics_and_reward_arguments(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        NavigationEnv(num_envs=2, n_agents=2, **kwargs)


@pytest.mark.parametrize("color_by", ["agent", "group"])
def test_render_colours_each_agent_and_its_goal(color_by):
    from marlkit.native.render import group_color, lighten

    env = marlkit.make("navigation", num_envs=1, n_agents=3, seed=0, color_by=color_by)
    env.reset()
    pixels = {tuple(c) for c in env.render().reshape(-1, 3).tolist()}
    agents = {group_color(i) for i in range(3)}
    if color_by == "agent":  # discs and rings of three colours
        assert agents <= pixels
    else:  # one colour for the group, its goals lighter
        assert group_color(0) in pixels and lighten(group_color(0)) in pixels
        assert not ({group_color(1), group_color(2)} & pixels)


def test_render_colour_mode_is_checked():
    with pytest.raises(
        ValueError, match=r"navigation: color_by must be one of \['agent', 'group'\], got 'team'"
    ):
        marlkit.make("navigation", num_envs=1, color_by="team")


def test_shared_reward_gives_everyone_the_team_progress():
    kwargs = dict(num_envs=3, n_agents=3, seed=0, collision_penalty=0.0, final_reward=0.0)
    own, shared = (
        marlkit.make("navigation", shared_reward=flag, **kwargs) for flag in (False, True)
    )
    torch.manual_seed(0)
    a, b = own.rollout(5), shared.rollout(5)  # the same seeds: the same random actions
    mine = a["next", "agents", "reward"]
    team = b["next", "agents", "reward"]
    torch.testing.assert_close(team, mine.sum(-2, keepdim=True).expand_as(mine))
