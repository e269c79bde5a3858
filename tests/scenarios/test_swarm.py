"""The native swarm scenario: conformance, C++ vs torch agreement, observations, rewards,
truncation, resets, rendering, and 10,000 agents in one env."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

import marlkit
from marlkit.envs import InvalidActionError, check_env_specs
from marlkit.native import extension_available
from marlkit.native.lidar import lidar
from marlkit.scenarios import SwarmEnv
from marlkit.testing import check_adapter

needs_ext = pytest.mark.skipif(not extension_available(), reason="marlkit._C not built")


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"continuous_actions": False},
        {"group_map": "per_agent", "n_agents": 3},
        {"group_map": {"red": ["agent_0", "agent_2"], "blue": ["agent_1", "agent_3"]}},
        {"n_agents": 1},
        {"k_nearest": 0, "max_steps": None},
        {"backend": "torch", "max_steps": 3},
    ],
)
def test_conformance(kwargs: dict) -> None:
    env = marlkit.make("swarm", **{"num_envs": 3, "n_agents": 4, "seed": 0, **kwargs})
    check_env_specs(env)
    check_adapter(env, steps=6)


@needs_ext
@pytest.mark.parametrize("continuous", [True, False])
def test_native_and_torch_agree(continuous: bool, rollout_with: Callable) -> None:
    kwargs = dict(num_envs=8, n_agents=40, continuous_actions=continuous, seed=3, world_size=0.8)
    native = SwarmEnv(**kwargs, backend="native")  # crowded: contacts and speed limits
    twin = SwarmEnv(**kwargs, backend="torch")
    gen = torch.Generator().manual_seed(1)
    spec = native.action_spec["agents", "action"]
    actions = [spec.rand(generator=gen) for _ in range(40)]
    for a, b in zip(rollout_with(native, actions), rollout_with(twin, actions)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_same_seed_same_rollout_and_other_seeds_differ() -> None:
    runs = [
        SwarmEnv(num_envs=4, n_agents=12, seed=5).rollout(20, break_when_any_done=False)
        for _ in range(2)
    ]
    for key in (("next", "agents", "observation"), ("next", "agents", "reward")):
        assert torch.equal(runs[0][key], runs[1][key])
    other = SwarmEnv(num_envs=4, n_agents=12, seed=6).rollout(20, break_when_any_done=False)
    assert not torch.equal(other["next", "state"], runs[0]["next", "state"])


def test_observation_layout() -> None:
    env = SwarmEnv(num_envs=2, n_agents=30, k_nearest=3, sensing_radius=0.6, seed=0)
    td = env.reset()
    obs = td["agents", "observation"]
    assert obs.shape == (2, 30, 4 + 5 * 3)
    pos, vel = env.positions, env.velocities
    torch.testing.assert_close(obs[..., 0:2], vel)
    torch.testing.assert_close(obs[..., 2:4], pos / env.half_extent)
    rel, rel_vel, found = obs[..., 4:10], obs[..., 10:16], obs[..., 16:19]
    d = torch.cdist(pos, pos) + torch.eye(30) * 1e9  # [E, N, N]
    dist, order = d.sort(dim=-1)
    expect_found = (dist[..., :3] <= 0.6).float()
    assert torch.equal(found, expect_found)
    neighbour = torch.gather(pos, 1, order[..., :1].expand(-1, -1, 2))
    first = found[..., 0] > 0
    torch.testing.assert_close(rel[..., 0:2][first], ((neighbour - pos) / 0.6)[first])
    neighbour_vel = torch.gather(vel, 1, order[..., :1].expand(-1, -1, 2))
    torch.testing.assert_close(rel_vel[..., 0:2][first], (neighbour_vel - vel)[first])
    assert not rel[found.repeat_interleave(2, dim=-1) == 0].any()
    assert td["state"].shape == (2, 4 * 30)


def test_reward_terms() -> None:
    # Two agents side by side, both cruising along +x at the target speed: aligned, in sight,
    # not touching. The reward is the cohesion term only: distance to the centroid / radius.
    env = SwarmEnv(
        num_envs=1, n_agents=2, k_nearest=1, drag=0.0, contact_stiffness=1.0, backend="torch"
    )
    td = env.reset()
    env._pos = torch.tensor([[[0.0, 0.0], [0.0, 0.5]]])
    env._vel = torch.tensor([[[0.5, 0.0], [0.5, 0.0]]])
    td["agents", "action"] = torch.zeros(1, 2, 2)
    reward = env.step(td)["next", "agents", "reward"]
    torch.testing.assert_close(reward, torch.full((1, 2, 1), -0.5))
    # Far apart (out of sight) and standing still: the largest cohesion penalty plus the speed
    # term; alignment needs a neighbour, so it is 0.
    env._pos = torch.tensor([[[-0.8, 0.0], [0.8, 0.0]]])
    env._vel = torch.zeros(1, 2, 2)
    reward = env.step(td)["next", "agents", "reward"]
    torch.testing.assert_close(reward, torch.full((1, 2, 1), -(1.0 + 0.5 * 0.5)))
    # Overlapping (a weak spring keeps them so): the separation term counts the contact.
    env._pos = torch.tensor([[[0.0, 0.0], [0.05, 0.0]]])
    env._vel = torch.tensor([[[0.5, 0.0], [0.5, 0.0]]])
    reward = env.step(td)["next", "agents", "reward"]
    assert (reward < -1.0).all() and (reward > -1.1).all()  # -(1 contact + a small centroid)


@pytest.mark.parametrize("kwargs", [{}, {"backend": "torch", "n_lidar_rays": 3}])
def test_lidar_mode(kwargs: dict) -> None:
    env = SwarmEnv(num_envs=3, n_agents=40, world_size=1.0, seed=2, obs_mode="lidar", **kwargs)
    check_env_specs(env)
    check_adapter(env, steps=4)
    rays = kwargs.get("n_lidar_rays", 12)
    td = env.rollout(3, break_when_any_done=False)[..., -1]
    obs = td["next", "agents", "observation"]
    assert obs.shape == (3, 40, 4 + rays)
    torch.testing.assert_close(obs[..., 0:2], env.velocities, atol=0, rtol=0)
    torch.testing.assert_close(obs[..., 2:4], env.positions / env.half_extent, atol=0, rtol=0)
    readings = lidar(env.positions, rays, 0.35, env.physics["radius"])
    assert torch.equal(obs[..., 4:], 0.35 - readings)
    assert (obs[..., 4:] > 0).any()
    # The rewards still measure the k nearest neighbours: the same as in "knn" mode.
    knn_env = SwarmEnv(num_envs=3, n_agents=40, world_size=1.0, seed=2, **kwargs)
    env.set_seed(2)
    knn_env.set_seed(2)
    rewards = [
        e.rollout(3, break_when_any_done=False)["next", "agents", "reward"] for e in (env, knn_env)
    ]
    assert torch.equal(rewards[0], rewards[1])


@needs_ext
def test_lidar_mode_native_and_torch_agree(rollout_with: Callable) -> None:
    kwargs = dict(num_envs=4, n_agents=40, seed=3, world_size=0.8, obs_mode="lidar")
    native, twin = SwarmEnv(**kwargs, backend="native"), SwarmEnv(**kwargs, backend="torch")
    gen = torch.Generator().manual_seed(4)
    spec = native.action_spec["agents", "action"]
    actions = [spec.rand(generator=gen) for _ in range(30)]
    for a, b in zip(rollout_with(native, actions), rollout_with(twin, actions)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_truncation_after_max_steps_and_partial_reset() -> None:
    env = SwarmEnv(num_envs=4, n_agents=5, max_steps=3, seed=1)
    out = env.rollout(7, break_when_any_done=False)
    truncated = out["next", "truncated"][..., 0]  # [E, T]
    assert truncated[:, [2, 5]].all() and truncated.sum() == 8
    assert not out["next", "terminated"].any()
    assert torch.equal(out["next", "done"], out["next", "truncated"])
    # A partial reset touches only the masked envs and restarts their step count.
    root = env._step_mdp(env.rollout(2, break_when_any_done=False)[..., -1])
    pos = env.positions
    mask = torch.tensor([True, False, False, True])
    root["_reset"] = mask.unsqueeze(-1)
    after = env.reset(root)
    assert torch.equal(env.positions[~mask], pos[~mask])
    assert not torch.equal(env.positions[mask], pos[mask])
    assert torch.equal(after["agents", "observation"][~mask], root["agents", "observation"][~mask])
    assert env._steps.tolist() == [0, 2, 2, 0]


def test_world_grows_with_agents_and_bounds_hold() -> None:
    small, large = SwarmEnv(num_envs=1, n_agents=4), SwarmEnv(num_envs=1, n_agents=400)
    assert small.half_extent == 1.0 and large.half_extent == pytest.approx(5.0)
    env = SwarmEnv(num_envs=2, n_agents=6, seed=0)
    td = env.reset()
    for _ in range(40):
        td["agents", "action"] = torch.ones(2, 6, 2)
        td = env._step_mdp(env.step(td))
    limit = env.half_extent - env.physics["radius"]
    assert (env.positions.abs() <= limit + 1e-6).all()
    assert (env.velocities.norm(dim=-1) <= env.physics["max_speed"] * (1 + 1e-6)).all()


@needs_ext
def test_ten_thousand_agents_in_one_env() -> None:
    env = marlkit.make(
        "swarm", num_envs=1, n_agents=10_000, continuous_actions=True, k_nearest=6, seed=0
    )
    td = env.reset()
    assert env.half_extent == pytest.approx(25.0)
    for _ in range(3):
        td = env._step_mdp(env.step(env.rand_action(td)))
    obs = td["agents", "observation"]
    assert obs.shape == (1, 10_000, 34) and bool(torch.isfinite(obs).all())
    assert obs[..., -6:].mean() > 0.5  # most agents see most of their 6 neighbours
    frame = env.render()
    assert frame.shape == (256, 256, 3) and frame.dtype == np.uint8
    assert (frame != 255).any(axis=-1).sum() > 5_000  # thousands of one-pixel agents


def test_render_colours_agents_by_heading() -> None:
    env = SwarmEnv(num_envs=2, n_agents=3, agent_radius=0.2, seed=0, render_size=64)
    env.reset()
    env._pos[1] = torch.tensor([[-0.5, 0.0], [0.5, 0.0], [0.0, 0.5]])
    env._vel[1] = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0]])
    frame = env.render(1)
    px = [frame[32, 16], frame[32, 48], frame[16, 32]]  # agent centres (y up)
    assert not np.array_equal(px[0], px[1])  # opposite headings, different hues
    assert px[2][0] == px[2][1] == px[2][2]  # at rest: grey


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_agents": 0}, ValueError, "n_agents must be an int >= 1"),
        ({"num_envs": 1.5}, TypeError, "num_envs must be an int >= 1, got float: 1.5"),
        ({"k_nearest": -2}, ValueError, "k_nearest must be an int >= 0"),
        ({"sensing_radius": 0.0}, ValueError, r"sensing_radius must be a finite number > 0"),
        ({"max_speed": math.inf}, ValueError, r"max_speed must be a finite number > 0"),
        ({"target_speed": "fast"}, TypeError, r"target_speed must be a number, got str"),
        ({"max_steps": 0}, ValueError, r"max_steps must be an int >= 1 or None"),
        ({"world_size": 0.01}, ValueError, r"world_size 0.01 must exceed agent_radius"),
        ({"cohesion_weight": -1.0}, ValueError, r"cohesion_weight must be a finite number >= 0"),
        ({"backend": "cuda"}, ValueError, "backend must be"),
        ({"group_map": {"a": ["agent_0"]}}, ValueError, "in no group"),
        ({"obs_mode": "sonar"}, ValueError, r"obs_mode must be one of \['knn', 'lidar'\]"),
        ({"n_lidar_rays": -1}, ValueError, r"n_lidar_rays must be an int >= 1, got -1"),
        ({"mass": 0.0}, ValueError, r"mass must be a finite number > 0, got 0.0"),
        ({"dt": math.inf}, ValueError, r"dt must be a finite number > 0, got inf"),
        ({"render_size": -3}, ValueError, r"render_size must be an int >= 1, got -3"),
    ],
)
def test_bad_construction(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SwarmEnv(**{"num_envs": 2, "n_agents": 2, **kwargs})


def test_bad_actions_rejected_with_state_untouched() -> None:
    env = SwarmEnv(num_envs=2, n_agents=3, seed=0)
    td = env.reset()
    pos = env.positions
    for bad, match in [
        (torch.full((2, 3, 2), 2.0), r"outside \[-1.0, 1.0\]"),
        (torch.full((2, 3, 2), math.nan), r"non-finite value nan"),
        (torch.zeros(2, 3, 3), r"shape"),
    ]:
        td["agents", "action"] = bad
        with pytest.raises(InvalidActionError, match=match):
            env.step(td)
    assert torch.equal(env.positions, pos)
