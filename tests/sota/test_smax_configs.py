"""``configs/mappo_smax.yaml`` (issue 38): JaxMARL's SMAX MAPPO recipe in marlkit's keys, and a
run on native SMAX that logs its win rates (training, greedy and sampled evaluations)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from marlkit.record import read_metrics
from marlkit.train.config import check_config

from ._scripts import command, run, summary
from ._scripts import env as script_env
from .test_configs import _compose

#: JaxMARL's baselines/MAPPO/config/mappo_homogenous_rnn_smax.yaml (commit c793d09)
JAXMARL = {
    "NUM_ENVS": 128,
    "NUM_STEPS": 128,
    "GRU_HIDDEN_DIM": 128,
    "FC_DIM_SIZE": 128,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "LR": 0.002,
    "ANNEAL_LR": True,
    "MAX_GRAD_NORM": 0.25,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.0,
    "VF_COEF": 0.5,
}


def test_mappo_smax_is_jaxmarls_recipe_in_marlkits_keys():
    cfg = _compose("mappo_smax")
    check_config(cfg)
    j = JAXMARL
    assert cfg.env.name == "smax/3m" and cfg.env.num_envs == j["NUM_ENVS"]
    assert cfg.collector.frames_per_batch == j["NUM_ENVS"] * j["NUM_STEPS"]
    assert cfg.collector.total_frames % cfg.collector.frames_per_batch == 0
    assert cfg.model.memory == "gru" and cfg.model.memory_hidden == j["GRU_HIDDEN_DIM"]
    assert cfg.model.seq_len == j["NUM_STEPS"]  # whole rows, as JaxMARL replays them
    assert cfg.policy.num_cells == cfg.critic.num_cells == j["FC_DIM_SIZE"]
    assert cfg.critic.centralised
    assert cfg.train.epochs == j["UPDATE_EPOCHS"]
    assert cfg.train.minibatch_size * j["NUM_MINIBATCHES"] == cfg.collector.frames_per_batch
    assert (cfg.train.lr, cfg.train.max_grad_norm) == (j["LR"], j["MAX_GRAD_NORM"])
    assert cfg.train.anneal_lr == j["ANNEAL_LR"]
    assert (cfg.loss.gamma, cfg.loss.lmbda) == (j["GAMMA"], j["GAE_LAMBDA"])
    assert (cfg.loss.clip_epsilon, cfg.loss.entropy_coef) == (j["CLIP_EPS"], j["ENT_COEF"])
    assert cfg.loss.critic_coef == j["VF_COEF"] and cfg.loss.loss_critic_type == "l2"
    assert cfg.loss.normalize_advantage  # JaxMARL normalises each minibatch's advantages
    assert cfg.loss.team_episodes  # JaxMARL's GAE reads the episode's done for every agent
    for env in ("smax/2s3z", "smax/5m_vs_6m"):
        check_config(_compose("mappo_smax", [f"env={env}"]))


#: JaxMARL's baselines/IPPO/config/ippo_rnn_smax.yaml (commit c793d09): what differs from MAPPO's
JAXMARL_IPPO = {"LR": 0.004, "CLIP_EPS": 0.05, "ENT_COEF": 0.01}


def test_ippo_smax_is_jaxmarls_ippo_recipe_in_marlkits_keys():
    mappo, ippo = _compose("mappo_smax"), _compose("ippo_smax")
    check_config(ippo)
    j = JAXMARL_IPPO
    assert not ippo.critic.centralised  # the critic reads the agent's own observation
    assert ippo.train.lr == j["LR"]
    assert (ippo.loss.clip_epsilon, ippo.loss.entropy_coef) == (j["CLIP_EPS"], j["ENT_COEF"])
    assert ippo.algorithm == "ippo_smax"
    # everything else is mappo_smax's (JaxMARL's two SMAX configs share it)
    for section in ("env", "collector", "policy", "model", "eval"):
        assert ippo[section] == mappo[section], section
    for key in ("epochs", "minibatch_size", "max_grad_norm", "anneal_lr"):
        assert ippo.train[key] == mappo.train[key], key
    for key in ("gamma", "lmbda", "critic_coef", "loss_critic_type", "team_episodes"):
        assert ippo.loss[key] == mappo.loss[key], key


@pytest.mark.slow  # one small batch of a recurrent MAPPO and three evaluations: ~20 s
def test_mappo_smax_logs_training_greedy_and_sampled_win_rates(tmp_path):
    budget = [
        "env.num_envs=4",
        "collector.frames_per_batch=256",  # 4 envs x 64 steps
        "collector.total_frames=512",
        "model.seq_len=32",
        "train.minibatch_size=128",
        "train.epochs=1",
        "eval.exploration=both",
        "eval.num_envs=4",
    ]
    out = run("mappo_ippo", tmp_path, budget, config="mappo_smax").stdout
    assert "iteration 2: frames 512" in out
    info = summary(tmp_path)
    for section in ("trained", "trained_random", "random"):
        assert 0.0 <= info[section]["won"] <= 1.0
    last = read_metrics(tmp_path / "metrics.csv")[-1]
    assert last["eval/won"] == info["trained"]["won"]
    assert last["eval_random/won"] == info["trained_random"]["won"]
    assert 0.0 <= last["won"] <= 1.0  # episodes of 64 steps ended in the batch (at most 100)


def test_team_episodes_give_a_dead_units_steps_the_teams_later_rewards():
    """loss.team_episodes: GAE over the episode's done, as JaxMARL's. Agent 1 of 2 dies at step
    0; the team wins at step 2 (reward 1). Per agent (the default), agent 1's advantage at step
    0 stops at its death; over the team's episode it earns the win, discounted."""
    from tensordict import TensorDict

    from marlkit.objectives import GAE
    from marlkit.train.scripts import env_factory

    from .test_configs import _script_module

    module = _script_module("mappo_ippo")
    gamma, lmbda, T = 0.9, 0.8, 3
    dead = torch.tensor([[False, True], [False, True], [False, True]])  # agent 1 from step 0
    episode_over = torch.tensor([False, False, True])[:, None]
    reward = torch.tensor([0.0, 0.0, 1.0])[:, None, None].expand(T, 2, 1)

    def batch() -> TensorDict:
        present = torch.cat([torch.ones(1, 2, dtype=torch.bool), ~dead[:-1]])  # then absent
        zeros = torch.zeros(1, T, 2, 1)
        nxt = {
            "done": episode_over[None],
            "terminated": episode_over[None],
            "ally": {
                "reward": reward[None].clone(),
                "done": (dead | episode_over)[None, ..., None],
                "terminated": (dead | episode_over)[None, ..., None],
                "state_value": zeros.clone(),
            },
        }
        ally = {"mask": present[None], "state_value": zeros.clone()}
        return TensorDict({"ally": ally, "next": nxt}, batch_size=[1, T])

    per_agent = GAE(gamma, lmbda, group="ally")(batch())
    assert per_agent["ally", "advantage"][0, 0, 1, 0] == 0.0  # its death's reward only
    data, team = batch(), GAE(gamma, lmbda, group="ally")
    cfg = _compose("mappo_smax")
    env = env_factory(cfg, 2, seed=0)()
    actor = module.make_policy(env, cfg).module[0]
    loss = module.make_loss(
        actor, module.make_critic(env, "ally", cfg.critic, cfg.model), "ally", cfg
    )
    module.use_team_episodes({"ally": team}, {"ally": loss})
    module.team_flags(data, {"ally": 2})
    assert data["next", "ally", "team_done"].shape == (1, T, 2, 1)
    advantage = team(data)["ally", "advantage"][0, :, :, 0]
    # both agents' steps earn the win: (gamma lmbda)^2 at step 0, gamma lmbda at 1, 1 at 2
    expected = torch.tensor([(gamma * lmbda) ** 2, gamma * lmbda, 1.0])[:, None].expand(T, 2)
    torch.testing.assert_close(advantage, expected)
    assert loss.tensor_keys.mask == ("ally", module.NO_MASK)  # no agent left out of the loss


def test_qmix_smax_mixes_on_the_world_state_and_picks_only_allowed_actions():
    from marlkit.data.exploration import set_exploration
    from marlkit.train.scripts import env_factory

    from .test_configs import _script_module

    cfg = _compose("qmix_smax")
    check_config(cfg)
    assert cfg.env.name == "smax/3m" and cfg.loss.mixer_state == "state"
    assert cfg.model.memory == "gru" and cfg.model.seq_len * cfg.env.num_envs == 800
    assert cfg.collector.frames_per_batch == 800 and cfg.train.minibatch_size == 32 * 100
    module = _script_module("qmix_vdn")
    env = env_factory(cfg, 4, seed=0)()
    policy = module.make_policy(env, cfg)
    mixer = module.make_mixer(env, "ally", cfg.loss)
    assert "state" in mixer.in_keys
    td = env.reset()
    for mode in ("random", "deterministic") * 10:  # exploring (eps = 1 at first) and greedy
        with set_exploration(mode):
            td = policy(td)
        allowed = td["ally", "action_mask"].gather(-1, td["ally", "action"][..., None])
        assert allowed.all(), mode
        td = env.step(td)["next"]


@pytest.mark.slow  # one batch of 64 envs x 128 steps: ~10 s
def test_recurrent_mappo_buffers_hold_one_batch_of_windows_not_of_steps(tmp_path):
    # The buffers were sized in frames while holding windows of seq_len steps: seq_len times the
    # batch's memory (15.5 GB for mappo_smax.yaml; 1.4 GB here, 0.48 GB once fixed).
    cmd = command(
        "mappo_ippo",
        tmp_path,
        [
            "env=navigation",
            "env.num_envs=64",
            "env.max_steps=128",
            "collector.frames_per_batch=8192",
            "collector.total_frames=8192",
            "model.memory=gru",
            "model.memory_hidden=16",
            "model.seq_len=128",
            "train.minibatch_size=2048",
            "train.epochs=1",
            "eval.video=false",
        ],
    )
    # a parent of its own, so that RUSAGE_CHILDREN is the script's peak alone
    peak = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
        "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", peak, *cmd],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) < 900_000, out.stdout  # kB
