"""``configs/mappo_lbf.yaml``: MAPPO on LBF with EPyMARL's MAPPO hyperparameters (its
``src/config/algs/mappo.yaml`` over ``default.yaml`` and ``envs/gymma.yaml``) in marlkit's keys,
and a run of it (IPPO: ``critic.centralised=false``, EPyMARL's ``algs/ippo.yaml``)."""

from __future__ import annotations

import pytest

from marlkit.record import read_metrics
from marlkit.train import Checkpointer

from ._scripts import run, summary
from .test_configs import _compose

pytest.importorskip("lbforaging")


def test_mappo_lbf_has_epymarls_mappo_hyperparameters():
    cfg = _compose("mappo_lbf")
    assert cfg.env.name == "lbforaging/Foraging-8x8-2p-2f-coop-v3"
    assert cfg.env.kwargs.time_limit == 50 and cfg.env.kwargs.common_reward
    # obs_agent_id: True
    assert list(cfg.env.transforms) == ["agent_id"]
    # runner: parallel, batch_size_run 10, batch_size 10 (episodes of 50 steps)
    assert cfg.env.num_envs == 10
    assert cfg.collector.frames_per_batch == 10 * cfg.env.kwargs.time_limit
    # the agent: RNNAgent, hidden_dim 128, use_rnn True, shared (fc1 -> GRU -> fc2)
    assert (cfg.policy.depth, cfg.policy.share_params) == (0, True)
    assert (cfg.model.memory, cfg.model.memory_hidden, cfg.model.kind) == ("gru", 128, "mlp")
    assert cfg.model.seq_len == cfg.env.kwargs.time_limit  # whole episodes
    # the critic: cv_critic, feed-forward 128 -> 128 -> 1 on the state (every observation)
    assert cfg.critic.centralised and not cfg.model.critic_memory
    assert (cfg.critic.depth, cfg.critic.num_cells) == (2, 128)
    # epochs 4 over the whole batch, lr 3e-4, grad norm 10, gamma 0.99, clip 0.2, ent 0.001
    assert cfg.train.epochs == 4 and cfg.train.minibatch_size == cfg.collector.frames_per_batch
    assert (cfg.train.lr, cfg.train.max_grad_norm, cfg.train.anneal_lr) == (3e-4, 10.0, False)
    assert (cfg.loss.gamma, cfg.loss.clip_epsilon, cfg.loss.entropy_coef) == (0.99, 0.2, 1e-3)
    assert cfg.loss.loss_critic_type == "l2" and not cfg.loss.normalize_advantage
    # standardise_rewards: True
    assert cfg.loss.standardise_rewards
    # ppo_learner's advantage: q_nstep 5 returns of a target critic (target_update_interval_or_tau
    # 0.01) minus the critic's value at each epoch
    assert (cfg.loss.estimator, cfg.loss.nstep, cfg.loss.target_critic_tau) == ("nstep", 5, 0.01)
    assert cfg.loss.refresh_advantage
    # EPyMARL's tests: test_nepisode 100, sampled (its soft_policies selector samples in test
    # mode); the greedy evaluation logged beside it
    assert cfg.eval.num_envs == 100 and cfg.eval.exploration == "both"


@pytest.mark.slow  # ~15 s
def test_mappo_lbf_runs_with_agent_ids_and_standardised_rewards(tmp_path):
    run_dir = tmp_path / "run"
    budget = (
        "env.num_envs=2",
        "collector.frames_per_batch=100",  # 2 envs x 50 steps
        "collector.total_frames=200",
        "train.minibatch_size=100",
        "eval.num_envs=2",
        "eval.every=0",
    )
    out = run("mappo_ippo", run_dir, budget, config="mappo_lbf").stdout
    assert "iteration 2: frames 200" in out
    state = Checkpointer(run_dir / "checkpoints").load()
    # the shared agent: fc1 reads LBF's 12 features and the 2 agents' one-hot ids into the
    # GRU's 128 (no hidden layer before it: EPyMARL's RNNAgent); the critic the 2 agents' 14
    weights = {k: v.shape for k, v in state["losses"].items() if k.endswith("weight")}
    actor = [s for k, s in weights.items() if k.startswith("agents.actor_network")]
    assert [tuple(s) for s in actor] == [(1, 14, 128), (1, 128, 384), (1, 128, 384), (1, 128, 6)]
    assert weights["agents.critic_network.module.layers.0.weight"][1] == 2 * 14
    count = state["reward_standardisers"]["agents.stats.count"]
    assert float(count) == pytest.approx(2 * 100 * 2 + 1e-4)  # 2 batches x 100 steps x 2 agents
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["frames"] for r in rows] == [100, 200]
    info = summary(run_dir)
    assert info["env"] == "lbforaging/Foraging-8x8-2p-2f-coop-v3" and info["variant"] == "MAPPO"
    # the trained policy reads the agent ids: an env without them is refused naming the
    # transform (the message named only env.kwargs, which this env has)
    import marlkit

    from .test_trained_policy import _module

    bare = marlkit.make(info["env"], num_envs=2, time_limit=50, common_reward=True)
    with pytest.raises(ValueError, match=r"and the observation transforms \['agent_id'\]"):
        _module("mappo_ippo").trained_policy(bare, run_dir)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["loss.estimator=td"], r"^loss.estimator must be one of \['gae', 'nstep'\]"),
        (["loss.estimator=nstep", "loss.nstep=0"], r"^loss.nstep must be an int >= 1, got 0"),
        (
            ["loss.target_critic_tau=0"],
            r"^loss.target_critic_tau must be a finite number in \(0, 1\]",
        ),
        (
            ["loss.target_critic_tau=0.01", "loss.clip_value=0.2"],
            r"^loss.clip_value clips the critic around the values of the batch",
        ),
        (
            ["loss.target_critic_tau=0.01", "model.critic_memory=true"],
            r"^loss.target_critic_tau needs a feed-forward critic",
        ),
    ],
)
def test_epymarls_estimator_options_refuse_what_they_cannot_do(overrides, message):
    """Each message names its key in full, once (a section's check that names keys of other
    sections is not prefixed with its section again: it read "loss.loss.clip_value")."""
    from marlkit.train.config import ConfigError, check_config

    with pytest.raises(ConfigError, match=message):
        check_config(_compose("mappo_lbf", overrides))


@pytest.mark.slow  # ~20 s
def test_mappo_lbf_with_epymarls_estimator_keeps_a_target_critic_and_resumes_it(tmp_path):
    """``loss.estimator=nstep loss.target_critic_tau=0.01 loss.refresh_advantage=true``:
    EPyMARL's 5-step TD of a soft-updated target critic, recomputed at each epoch. The target
    is saved with the run, moved tau of the way after each batch, and a resumed run goes on
    from it."""
    import torch

    run_dir = tmp_path / "run"
    budget = (
        "env.num_envs=2",
        "collector.frames_per_batch=100",
        "train.minibatch_size=100",
        "eval.num_envs=2",
        "eval.every=0",
        "checkpoint.every=1",
        "loss.estimator=nstep",
        "loss.target_critic_tau=0.01",
        "loss.refresh_advantage=true",
    )
    run("mappo_ippo", run_dir, (*budget, "collector.total_frames=200"), config="mappo_lbf")
    state = Checkpointer(run_dir / "checkpoints").load()
    target = state["target_critics"]
    critic = {
        k.removeprefix("agents.critic_network."): v
        for k, v in state["losses"].items()
        if k.startswith("agents.critic_network.")
    }
    assert {k.removeprefix("agents.") for k in target} == set(critic)
    moved = [float((critic[k] - target["agents." + k]).abs().max()) for k in critic]
    assert max(moved) > 0  # two soft updates of 0.01: the target trails the critic
    # resumed for a third batch from that checkpoint: its target goes on from the saved one
    run("mappo_ippo", run_dir, (*budget, "collector.total_frames=300", f"resume={run_dir}"),
        config="mappo_lbf")  # fmt: skip
    resumed = Checkpointer(run_dir / "checkpoints").load()
    online = {"agents." + k: v for k, v in critic.items()}
    new_online = {
        k.removeprefix("agents.critic_network."): v
        for k, v in resumed["losses"].items()
        if k.startswith("agents.critic_network.")
    }
    for key, value in resumed["target_critics"].items():
        # one more step: 0.99 * the saved target + 0.01 * the critic after the third batch
        expected = 0.99 * target[key] + 0.01 * new_online[key.removeprefix("agents.")]
        torch.testing.assert_close(value, expected)
        assert not torch.equal(value, online[key])
    assert [r["frames"] for r in read_metrics(run_dir / "metrics.csv")] == [100, 200, 300]


@pytest.mark.slow  # two runs, one with two env worker processes (~25 s)
def test_env_workers_step_the_same_envs_as_one_process(tmp_path):
    """``env.workers=2``: the LBF envs stepped in two worker processes of two envs each, seeded
    in a chain, give the run of the one process with four envs (the same episodes, the same
    actions drawn, so the same losses), batch after batch; the evaluation stays in process."""
    budget = (
        "env.num_envs=4",
        "collector.frames_per_batch=200",  # 4 envs x 50 steps
        "collector.total_frames=400",
        "train.minibatch_size=200",
        "eval.num_envs=2",
        "eval.every=0",
        "eval.exploration=random",
        "seed=3",
    )
    rows = {}
    for workers in (1, 2):
        run_dir = tmp_path / f"workers-{workers}"
        run("mappo_ippo", run_dir, (*budget, f"env.workers={workers}"), config="mappo_lbf")
        rows[workers] = read_metrics(run_dir / "metrics.csv")
    keys = ["train/agents/loss_objective", "train/agents/loss_critic", "agents/episode_reward"]
    assert [r["frames"] for r in rows[2]] == [200, 400]
    for one, two in zip(rows[1], rows[2], strict=True):
        assert [two[k] for k in keys] == pytest.approx([one[k] for k in keys], rel=1e-5)
    assert rows[2][-1]["eval/agents/episode_reward"] == pytest.approx(
        rows[1][-1]["eval/agents/episode_reward"]
    )
