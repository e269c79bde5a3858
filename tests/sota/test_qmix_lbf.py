"""``configs/qmix_lbf.yaml``: QMIX on LBF with EPyMARL's QMIX hyperparameters (its
``src/config/algs/qmix.yaml`` and ``default.yaml``) in marlkit's keys, and a run of it (VDN:
``loss.mixer=vdn``, EPyMARL's ``algs/vdn.yaml`` differing only there)."""

from __future__ import annotations

import pytest

from marlkit.record import read_metrics

from ._scripts import run, summary
from .test_configs import _compose

pytest.importorskip("lbforaging")


def test_qmix_lbf_has_epymarls_qmix_hyperparameters():
    cfg = _compose("qmix_lbf")
    assert cfg.env.name == "lbforaging/Foraging-8x8-2p-2f-coop-v3"
    assert cfg.env.kwargs.time_limit == 50 and cfg.env.kwargs.common_reward
    # EPyMARL's RNNAgent with use_rnn: False (algs/qmix.yaml, vdn.yaml): fc1, fc, fc2 of 64
    assert (cfg.model.memory, cfg.model.kind) == ("none", "mlp")
    assert (cfg.policy.depth, cfg.policy.num_cells, cfg.policy.share_params) == (2, 64, True)
    assert cfg.policy.activation == "relu"  # F.relu after fc1 and fc
    assert list(cfg.env.transforms) == ["agent_id"]  # obs_agent_id: True
    # standardise_rewards: True
    assert cfg.loss.standardise_rewards
    # lr 5e-4, grad norm 10, gamma 0.99, double Q, mixing embedding 32
    assert (cfg.train.lr, cfg.train.max_grad_norm, cfg.loss.gamma) == (5e-4, 10.0, 0.99)
    assert cfg.loss.double_dqn and cfg.loss.mixer == "qmix" and cfg.loss.mixing_embed_dim == 32
    # the mixer's weight hypernetworks: hypernet_layers: 2, hypernet_embed: 64
    assert (cfg.loss.hypernet_layers, cfg.loss.hypernet_embed) == (2, 64)
    # eps 1.0 -> 0.05 over 50k steps
    annealed = cfg.exploration.annealing_fraction * cfg.collector.total_frames
    assert (cfg.exploration.eps_init, cfg.exploration.eps_end, annealed) == (1.0, 0.05, 50000)
    # a buffer of 5,000 episodes, batches of 32, one gradient step per episode's worth of steps
    episode = cfg.env.kwargs.time_limit
    assert cfg.buffer.capacity == 5000 * episode
    assert cfg.train.minibatch_size == 32 * episode
    steps = cfg.train.epochs * max(1, cfg.collector.frames_per_batch // cfg.train.minibatch_size)
    assert steps * episode == cfg.collector.frames_per_batch
    # target_update_interval_or_tau: 200: a copy every 200 gradient steps (one per episode)
    assert cfg.loss.hard_update_interval == 200
    # EPyMARL's evaluation protocol: 100 greedy episodes
    assert cfg.eval.num_envs == 100 and cfg.eval.exploration == "deterministic"


@pytest.mark.slow
def test_qmix_lbf_runs(tmp_path):
    run_dir = tmp_path / "run"
    budget = (
        "env.num_envs=2",
        "collector.frames_per_batch=100",  # 2 envs x 50 steps: one episode each
        "collector.total_frames=200",
        "train.epochs=2",
        "train.minibatch_size=100",
        "eval.num_envs=2",
        "eval.every=0",
    )
    out = run("qmix_vdn", run_dir, budget, config="qmix_lbf").stdout
    assert "iteration 2: frames 200" in out
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["replay/agents/size"] for r in rows] == [100, 200]  # steps
    assert all(r["train/agents/reward_std"] > 0 for r in rows)  # rewards standardised
    info = summary(run_dir)
    assert info["env"] == "lbforaging/Foraging-8x8-2p-2f-coop-v3" and info["frames"] == 200
    assert info["trained"]["episode_length"] == 50.0
