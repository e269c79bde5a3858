"""Collector on native navigation (3 agents) -> GAE -> PPO epochs, on a tiny budget."""

from __future__ import annotations

import torch

import marlkit
from marlkit.collectors import Collector
from marlkit.modules import (
    MultiAgentMLP,
    NormalParamExtractor,
    ProbabilisticActor,
    StateValueCritic,
    TanhNormal,
    ValueNorm,
)
from marlkit.objectives import GAE, ClipPPOLoss


def test_collect_gae_ppo_epochs_move_parameters() -> None:
    torch.manual_seed(0)
    env = marlkit.make("navigation", num_envs=4, n_agents=3, seed=0)
    obs = env.observation_spec["agents", "observation"].shape[-1]
    act = env.action_spec["agents", "action"].shape[-1]
    net = torch.nn.Sequential(MultiAgentMLP(obs, 2 * act, 3, num_cells=32), NormalParamExtractor())
    actor = ProbabilisticActor(net, group="agents", distribution_class=TanhNormal)
    critic = StateValueCritic(3, obs, centralised=True, num_cells=32)
    norm = ValueNorm()
    estimator = GAE(0.99, 0.95, critic, value_norm=norm)
    loss = ClipPPOLoss(actor, critic, value_norm=norm)
    optim = torch.optim.Adam(loss.parameters(), lr=3e-3)
    start = [p.detach().clone() for p in loss.parameters()]
    collector = Collector(
        env, actor, frames_per_batch=4 * 25, total_frames=4 * 25 * 2, max_frames_per_traj=10
    )
    n_batches = 0
    for batch in collector:
        n_batches += 1
        assert batch["agents", "action_log_prob"].shape == (4, 25, 3)
        assert bool(batch["next", "truncated"].any())  # episodes cut at 10 steps
        estimator(batch)
        norm.update(batch["agents", "value_target"])
        data = batch.reshape(-1)
        for _ in range(3):
            for idx in torch.randperm(data.shape[0]).split(50):
                out = loss(data[idx])
                l_total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
                assert torch.isfinite(l_total)
                optim.zero_grad()
                l_total.backward()
                torch.nn.utils.clip_grad_norm_(loss.parameters(), 1.0)
                optim.step()
        collector.update_policy_weights_()
    assert n_batches == 2
    moved = [not torch.equal(a, b.detach()) for a, b in zip(start, loss.parameters())]
    assert all(moved)
    assert 0.0 <= float(out["clip_fraction"]) <= 1.0
