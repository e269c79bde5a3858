"""Collector on native navigation (discrete, 3 agents) -> ReplayBuffer -> QMIX / IQL steps."""

from __future__ import annotations

import torch
from torch import nn

import marlkit
from marlkit.collectors import Collector
from marlkit.data.exploration import set_exploration
from marlkit.modules import EGreedy, QMixer, QValueActor
from marlkit.objectives import DQNLoss, QMixerLoss, SoftUpdate
from marlkit.replay import PrioritizedSampler, ReplayBuffer, TensorStorage


def _actor(env: marlkit.envs.EnvBase) -> QValueActor:
    obs_dim = env.observation_spec["agents", "observation"].shape[-1]
    spec = env.action_spec["agents", "action"]
    net = nn.Sequential(nn.Linear(obs_dim, 32), nn.ReLU(), nn.Linear(32, spec.n))
    return QValueActor(net, spec=spec)


def test_collector_buffer_qmix_steps_change_parameters() -> None:
    torch.manual_seed(0)
    env = marlkit.make("navigation", num_envs=8, n_agents=3, continuous_actions=False, seed=0)
    actor = _actor(env)
    policy = EGreedy(actor, eps_init=1.0, eps_end=0.05, annealing_num_steps=200)
    state_dim = env.state_spec["state"].shape[-1]
    loss = QMixerLoss(actor, QMixer([state_dim], 16, n_agents=3), gamma=0.9)
    updater = SoftUpdate(loss, tau=0.1)
    optim = torch.optim.Adam(loss.online_parameters(), lr=1e-3)
    rb = ReplayBuffer(TensorStorage(1000), PrioritizedSampler(1000), batch_size=32)
    before = [p.detach().clone() for p in loss.online_parameters()]
    target_before = [p.clone() for p in loss.target_mixer_network.parameters()]
    collector = Collector(env, policy, frames_per_batch=64, total_frames=192)
    for batch in collector:
        rb.extend(batch.reshape(-1))
        policy.step(batch.numel())
        for _ in range(2):
            sample = rb.sample()
            out = loss(sample)
            optim.zero_grad()
            out["loss"].backward()
            optim.step()
            updater.step()
            rb.update_priority(sample["index"], out["td_error"])
            assert torch.isfinite(out["loss"])
    assert float(policy.eps) < 1.0
    changed = [not torch.equal(a, b) for a, b in zip(before, loss.online_parameters())]
    assert all(changed)
    assert any(
        not torch.equal(a, b) for a, b in zip(target_before, loss.target_mixer_network.parameters())
    )
    with set_exploration("deterministic"):  # the trained actor still acts greedily in the env
        td = actor(env.reset())
        assert env.action_spec.is_in(td.select(*env.action_spec.keys(True, True)))


def test_collector_buffer_iql_step() -> None:
    torch.manual_seed(0)
    env = marlkit.make("navigation", num_envs=4, n_agents=3, continuous_actions=False, seed=1)
    actor = _actor(env)
    loss = DQNLoss(actor, gamma=0.9)
    optim = torch.optim.Adam(loss.online_parameters(), lr=1e-3)
    rb = ReplayBuffer(TensorStorage(256), batch_size=16)
    for batch in Collector(env, EGreedy(actor), frames_per_batch=32, total_frames=64):
        rb.extend(batch.reshape(-1))
    before = [p.detach().clone() for p in actor.parameters()]
    out = loss(rb.sample())
    optim.zero_grad()
    out["loss"].backward()
    optim.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, actor.parameters()))
