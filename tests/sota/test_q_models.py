"""The Q-learning scripts' ``model.kind`` (issue 37: an encoder per observation kind, as
MAPPO's, through ``marlkit.train.builders.encoder_network``) and ``loss.standardise_rewards``
(EPyMARL's running reward statistics, carried by the checkpoints)."""

from __future__ import annotations

import pytest
import torch

from marlkit.record import read_metrics
from marlkit.train.checkpoint import Checkpointer
from marlkit.train.config import ConfigError, check_config

from ._scripts import ALGORITHMS, activation_types, run
from .test_configs import _compose, _script_module

SMAX_SETS = ("model.kind=deepsets", "model.inputs=[entities,own]", "model.entity_mask=entity_mask")


def _policy_and_losses(name: str, overrides: list[str]):
    """The script's policy and per-group losses, built from its composed config."""
    from marlkit.train.scripts import env_factory

    cfg = _compose(name, overrides)
    check_config(cfg)
    module = _script_module(name)
    env = env_factory(cfg, 3, seed=0)()
    return env, cfg, module, module.make_policy(env, cfg)


def test_qmix_reads_navigation_through_a_gnn_and_its_mixer_trains_on_it():
    from marlkit.modules.graph import MultiAgentGNN
    from marlkit.objectives import QMixerLoss

    env, cfg, module, policy = _policy_and_losses("qmix_vdn", ["model.kind=gnn"])
    assert any(isinstance(m, MultiAgentGNN) for m in policy.modules())
    td = env.rollout(4, policy)  # [3 envs, 4 steps], eps-greedy actions of the GNN's values
    assert td["agents", "action_value"].shape == (3, 4, 3, 5)
    q_net = policy.module[0].module
    loss = QMixerLoss(q_net, module.make_mixer(env, "agents", cfg.loss), gamma=0.9)
    terms = loss(td.reshape(-1))
    terms["loss"].backward()
    grads = [
        p.grad for m in q_net.modules() if isinstance(m, MultiAgentGNN) for p in m.parameters()
    ]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


def test_iql_reads_smax_unit_lists_as_sets_and_acts_within_the_mask():
    from marlkit.modules.entities import DeepSets

    env, _, _, policy = _policy_and_losses("iql", ["env=smax/3m", *SMAX_SETS])
    assert any(isinstance(m, DeepSets) for m in policy.modules())
    assert ("ally", "observation") not in policy.in_keys
    td = env.reset()
    for _ in range(4):
        td = policy(td)
        allowed = td["ally", "action_mask"].gather(-1, td["ally", "action"][..., None])
        assert allowed.all()
        td = env.step(td)["next"]


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("qmix_vdn", []),  # q_actor's MultiAgentMLP
        ("iql", []),
        ("qmix_vdn", ["model.memory=gru", "model.memory_hidden=8", "policy.depth=1"]),
    ],
)
def test_policy_activation_reaches_the_q_networks(name, overrides):
    """``policy.activation=relu`` (EPyMARL's agents, issue 37): the agents' Q-networks, with
    and without memory, hold ReLU layers and no Tanh; by default, and for a checkpoint's config
    written before the key existed, marlkit's Tanh as before."""
    from omegaconf import OmegaConf

    from marlkit.modules import Tanh

    env, _, module, policy = _policy_and_losses(name, [*overrides, "policy.activation=relu"])
    assert activation_types(policy) == {torch.nn.ReLU}
    td = env.rollout(2, policy)  # the Q-values of the ReLU network choose the actions
    assert td["agents", "action_value"].isfinite().all()
    _, default, _, policy = _policy_and_losses(name, overrides)
    assert default.policy.activation == "tanh" and activation_types(policy) == {Tanh}
    old = OmegaConf.create(OmegaConf.to_container(default))
    del old.policy["activation"]  # as a checkpoint written before policy.activation holds it
    assert activation_types(module.make_policy(env, old)) == {Tanh}


def test_policy_activation_reaches_the_head_after_an_encoder():
    """With ``model.kind`` another encoder, ``policy.activation`` follows the head's hidden
    layers (``encoder_network``); the encoder keeps its own (the GNN's Tanh)."""
    from marlkit.modules import MultiAgentGNN, MultiAgentMLP

    _, _, _, policy = _policy_and_losses("qmix_vdn", ["model.kind=gnn", "policy.activation=relu"])
    encoder = {id(m) for g in policy.modules() if isinstance(g, MultiAgentGNN) for m in g.modules()}
    heads = [m for m in policy.modules() if isinstance(m, MultiAgentMLP) and id(m) not in encoder]
    assert len(heads) == 1 and activation_types(heads[0]) == {torch.nn.ReLU}


def test_a_kind_the_observation_does_not_fit_is_refused_naming_the_key():
    match = r"model=cnn expects observations \[\*B, n, C, H, W\]; got observation \[\*B, 3, "
    for name in ("qmix_vdn", "iql"):
        with pytest.raises(ValueError, match=match):
            _policy_and_losses(name, ["model.kind=cnn"])
    with pytest.raises(ConfigError, match=r"model.kind must be one of \['mlp', 'cnn'"):
        _policy_and_losses("qmix_vdn", ["model.kind=transformer"])


@pytest.mark.slow  # two script runs: about 25 s on 2 loaded cores
@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("qmix_vdn", ("model.kind=gnn", "model.memory=gru", "model.memory_hidden=8")),
        ("iql", ("env=smax/3m", "env.num_envs=8", *SMAX_SETS)),
    ],
)
def test_each_q_script_trains_an_iteration_with_another_encoder(tmp_path, name, kind):
    budget = (*ALGORITHMS[name].budget, "collector.total_frames=400", "eval.video=false")
    extra = ("env.max_steps=25",) if name == "qmix_vdn" else ("model.seq_len=5",)
    out = run(name, tmp_path / "run", (*budget, *kind, *extra)).stdout
    assert "iteration 1: frames 400" in out
    last = read_metrics(tmp_path / "run" / "metrics.csv")[-1]
    group = "agents" if name == "qmix_vdn" else "ally"
    assert abs(last[f"train/{group}/loss"]) < float("inf")


@pytest.mark.slow  # a run and its resumption: about 25 s on 2 loaded cores
def test_standardised_rewards_are_logged_and_their_statistics_resume(tmp_path):
    run_dir = tmp_path / "run"
    budget = (*ALGORITHMS["qmix_vdn"].budget, "eval.video=false", "loss.standardise_rewards=true")
    run("qmix_vdn", run_dir, budget)
    state = Checkpointer(run_dir / "checkpoints").load()
    stats = {k: v for k, v in state["reward_standardisers"].items() if k.endswith("count")}
    # 2 iterations x 2 epochs x (400 // 200) minibatches of 200 steps x 3 agents, pooled
    assert float(stats["agents.stats.count"]) == pytest.approx(2 * 4 * 200 * 3 + 1e-4)
    rows = read_metrics(run_dir / "metrics.csv")
    assert all(r["train/agents/reward_std"] > 0 for r in rows)
    more = (*budget, "collector.total_frames=1200", f"resume={run_dir}")
    run("qmix_vdn", run_dir, more)
    state = Checkpointer(run_dir / "checkpoints").load()
    count = state["reward_standardisers"]["agents.stats.count"]
    assert float(count) == pytest.approx(3 * 4 * 200 * 3 + 1e-4)  # went on, not restarted


@pytest.mark.parametrize(
    ("overrides", "layers", "scale"),
    [([], 1, 1.0), (["loss.hypernet_layers=2", "loss.mixer_state_scale=7"], 2, 7.0)],
)
def test_qmix_script_builds_the_hypernetworks_asked_for(overrides, layers, scale):
    """``loss.hypernet_layers``/``hypernet_embed``/``mixer_state_scale`` reach the QMixer, on
    the agents' observations (the default mixer_state) and on the env's state alike."""
    from torch import nn

    env, cfg, module, _ = _policy_and_losses("qmix_vdn", [*overrides, "loss.hypernet_embed=24"])
    for state in ("observation", "state"):
        cfg.loss.mixer_state = state
        mixer = module.make_mixer(env, "agents", cfg.loss)
        assert mixer.hypernet_layers == layers and mixer.state_scale == scale
        w1 = mixer.hyper_w_1
        assert isinstance(w1, nn.Linear if layers == 1 else nn.Sequential)
        if layers == 2:
            assert w1[0].out_features == 24 and w1[-1].out_features == 32 * 3


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.memory=gru", "model.memory_hidden=8"],  # recurrent_network
        ["model.memory=lstm", "model.memory_hidden=8", "model.kind=gnn"],  # build_model's head
    ],
)
def test_head_depth_puts_a_hidden_layer_between_the_cell_and_the_q_values(overrides):
    """``model.head_depth=1 model.head_cells=64`` (issue 38): the agents' Q-network has a
    ``[8 -> 64]`` layer and ``policy.activation`` between its cell and the ``[64 -> actions]``
    output, and the Q-values' shape of the linear head; without the keys (and for a
    checkpoint's config written before them), the same parameters from the same seed as
    before."""
    from omegaconf import OmegaConf
    from tensordict.nn import TensorDictModule

    from marlkit.modules import MultiAgentMLP

    def head(policy):
        return [
            next(m for m in part.module.modules() if isinstance(m, MultiAgentMLP))
            for part in policy.modules()
            if isinstance(part, TensorDictModule) and part.in_keys[0][-1] == "rnn_output"
        ]

    head_keys = ["model.head_depth=1", "model.head_cells=64", "policy.activation=relu"]
    env, _, module, policy = _policy_and_losses("qmix_vdn", [*overrides, *head_keys])
    (mlp,) = head(policy)
    assert [tuple(layer.weight.shape) for layer in mlp.layers] == [(1, 8, 64), (1, 64, 5)]
    assert [type(a) for a in mlp.activations] == [torch.nn.ReLU]
    td = env.rollout(3, policy)  # the Q-values of the deeper head choose the actions
    assert td["agents", "action_value"].shape == (3, 3, 3, 5)
    _, default, _, _ = _policy_and_losses("qmix_vdn", overrides)
    old = OmegaConf.create(OmegaConf.to_container(default))
    del old.model["head_depth"], old.model["head_cells"]  # as a checkpoint before the keys
    states = []
    for cfg in (default, old):
        torch.manual_seed(0)
        states.append(module.make_policy(env, cfg).state_dict())
    assert list(states[0]) == list(states[1])
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    (linear,) = head(module.make_policy(env, default))
    assert [tuple(layer.weight.shape) for layer in linear.layers] == [(1, 8, 5)]


@pytest.mark.slow  # a short run, ~15 s
def test_qmix_trains_a_recurrent_q_network_with_a_head_layer(tmp_path):
    run_dir = tmp_path / "run"
    budget = (*ALGORITHMS["qmix_vdn"].budget, "eval.video=false", "env.max_steps=25")
    memory = ("model.memory=gru", "model.memory_hidden=16", "model.seq_len=5")
    run("qmix_vdn", run_dir, (*budget, *memory, "model.head_depth=1", "model.head_cells=24"))
    last = read_metrics(run_dir / "metrics.csv")[-1]
    assert abs(last["train/agents/loss"]) < float("inf")
    state = Checkpointer(run_dir / "checkpoints").load()
    weights = {k: tuple(v.shape) for k, v in state["losses"].items() if k.endswith("weight")}
    head = [k for k in weights if ".module.2.module.layers." in k and "target" not in k]
    assert [weights[k] for k in sorted(head)] == [(1, 16, 24), (1, 24, 5)], sorted(weights)
