"""Collector on native navigation (3 agents) -> GAE -> PPO epochs, on a tiny budget."""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential

import marlkit
from marlkit.collectors import Collector
from marlkit.envs import InitTracker, TransformedEnv
from marlkit.modules import (
    MultiAgentGRU,
    MultiAgentMLP,
    NormalParamExtractor,
    ProbabilisticActor,
    StateValueCritic,
    TanhNormal,
    ValueNorm,
    set_recurrent_mode,
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


def test_recurrent_actor_trains_on_whole_sequences() -> None:
    torch.manual_seed(0)
    env = TransformedEnv(marlkit.make("navigation", num_envs=4, n_agents=3, seed=0), InitTracker())
    obs = env.observation_spec["agents", "observation"].shape[-1]
    gru = MultiAgentGRU(obs, 16, 3)
    head = TensorDictModule(
        torch.nn.Sequential(MultiAgentMLP(16, 4, 3, num_cells=16), NormalParamExtractor()),
        in_keys=[("agents", "rnn_output")],
        out_keys=[("agents", "loc"), ("agents", "scale")],
    )
    actor = ProbabilisticActor(TensorDictSequential(gru, head), distribution_class=TanhNormal)
    critic = StateValueCritic(3, obs, num_cells=16)
    loss = ClipPPOLoss(actor, critic)
    batch = next(iter(Collector(env, actor, frames_per_batch=4 * 15, max_frames_per_traj=6)))
    GAE(0.99, 0.95, critic)(batch)
    with set_recurrent_mode(True):
        out = loss(batch)  # [4, 15] sequences: the ratio is 1 at the collected parameters
    torch.testing.assert_close(out["kl_approx"], torch.tensor(0.0), atol=1e-4, rtol=0)
    (out["loss_objective"] + out["loss_critic"]).backward()
    assert gru.input_gates.weight.grad is not None
