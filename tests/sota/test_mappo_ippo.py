"""What is MAPPO's own in ``sota-implementations/mappo_ippo`` (what every script does:
``test_scripts.py``)."""

from __future__ import annotations

import pytest

import marlkit
from marlkit.record import read_metrics
from marlkit.train import Checkpointer

from ._scripts import ALGORITHMS, activation_types, run, summary

BUDGET = ALGORITHMS["mappo_ippo"].budget


def test_ippo_on_vmas(tmp_path):
    run_dir = tmp_path / "run"
    run("mappo_ippo", run_dir, (*BUDGET, "env=vmas/navigation", "critic.centralised=false"))
    info = summary(run_dir)
    assert info["env"] == "vmas/navigation" and info["variant"] == "IPPO"
    assert "agents/episode_reward" in info["trained"]


def test_a_registered_env_without_a_config_file_runs_from_the_command_line(tmp_path):
    """As docs/training.md says: replace the default env's keyword arguments, do not merge
    into them (Gymnasium's single-agent Pendulum, one group "agents" of one agent)."""
    run_dir = tmp_path / "run"
    env = (
        "env.name=gymnasium/Pendulum-v1",
        "~env.kwargs",
        "+env.kwargs={g: 9.81}",
        "+env.eval_kwargs.render_mode=rgb_array",
    )
    run("mappo_ippo", run_dir, (*BUDGET, *env))
    assert list((run_dir / "videos").glob("*.mp4"))  # the evaluation filmed Pendulum
    info = summary(run_dir)
    assert info["env"] == "gymnasium/Pendulum-v1"
    assert info["random"]["agents/episode_reward"] < 0  # Pendulum's cost: always negative


@pytest.mark.slow
def test_compiled_loss_trains_like_the_eager_one(tmp_path):
    one = (*BUDGET, "collector.total_frames=400", "eval.video=false")
    run("mappo_ippo", tmp_path / "eager", one)
    run("mappo_ippo", tmp_path / "run", (*one, "train.compile=true"))
    eager, compiled = (read_metrics(tmp_path / n / "metrics.csv")[-1] for n in ("eager", "run"))
    for term in ("loss_objective", "loss_critic", "grad_norm"):
        key = f"train/agents/{term}"
        assert compiled[key] == pytest.approx(eager[key], rel=1e-3, abs=1e-5), key


def test_a_minibatch_larger_than_the_batch_is_refused(tmp_path):
    # each epoch cuts the batch into minibatches: one larger than the batch is named
    with pytest.raises(AssertionError, match=r"train.minibatch_size \(1000\) is larger than"):
        run("mappo_ippo", tmp_path / "run", (*BUDGET, "train.minibatch_size=1000"))


def test_uniform_action_bounds_reach_tanh_normal_as_numbers() -> None:
    import importlib.util

    from omegaconf import OmegaConf

    from ._scripts import script

    spec = importlib.util.spec_from_file_location("_mappo_bounds", script("mappo_ippo"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = marlkit.make("navigation", num_envs=2, n_agents=3)
    cfg = OmegaConf.create({"share_params": True, "depth": 1, "num_cells": 8})
    actor = module.make_actor(env, "agents", cfg)
    assert actor.module[-1].distribution_kwargs == {"low": -1.0, "high": 1.0}


@pytest.mark.slow  # two short runs, ~30 s
def test_anneal_lr_falls_linearly_over_the_batches_and_goes_on_after_a_resume(tmp_path):
    """``train.anneal_lr`` (JaxMARL's ``ANNEAL_LR``): batch i of n at ``lr * (1 - i / n)``,
    logged as ``lr`` and set on the optimiser the checkpoint saves; a resumed run with a larger
    budget goes on from its collector's count, not from the start."""
    run_dir = tmp_path / "run"
    budget = (*BUDGET, "eval.every=0", "eval.video=false", "train.lr=1e-3")
    run("mappo_ippo", run_dir, (*budget, "train.anneal_lr=true"))  # 2 batches of 400
    assert [row["lr"] for row in read_metrics(run_dir / "metrics.csv")] == [1e-3, 5e-4]
    resumed = (*budget, "train.anneal_lr=true", "collector.total_frames=1600", f"resume={run_dir}")
    run("mappo_ippo", run_dir, resumed)  # now 4 batches: the 3rd and 4th at 1/2 and 1/4
    assert [row["lr"] for row in read_metrics(run_dir / "metrics.csv")] == [
        1e-3,
        5e-4,
        5e-4,
        2.5e-4,
    ]
    optims = Checkpointer(run_dir / "checkpoints").load()["optims"]
    assert {g["lr"] for o in optims.values() for g in o["param_groups"]} == {2.5e-4}


def _mappo_module():
    import importlib.util

    from ._scripts import script

    spec = importlib.util.spec_from_file_location("_mappo_advantages", script("mappo_ippo"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_standardised_rewards_reach_gae_and_leave_the_batch_as_collected():
    """``loss.standardise_rewards`` (EPyMARL's): GAE reads ``(r - mean) / std`` of the
    rewards seen so far; the batch the run logs keeps the env's rewards."""
    import torch
    from omegaconf import OmegaConf

    from marlkit.objectives import GAE

    module = _mappo_module()
    torch.manual_seed(0)
    env = marlkit.make("navigation", num_envs=4, n_agents=3, seed=0)
    batch = env.rollout(20)
    raw = batch["next", "agents", "reward"].clone()
    assert raw.std() > 0  # navigation's shaped reward: something to standardise
    cells = {"centralised": True, "share_params": True, "depth": 1, "num_cells": 8}
    cells = OmegaConf.create(cells)
    model = OmegaConf.create({"memory": "none", "critic_memory": False, "kind": "mlp"})
    critic = module.make_critic(env, "agents", cells, model)
    gae = {"agents": GAE(0.99, 0.95, value_network=critic, group="agents")}
    on = OmegaConf.create({"loss": {"standardise_rewards": True}})
    off = OmegaConf.create({"loss": {"standardise_rewards": False}})
    assert module.reward_standardisers(["agents"], off) is None
    standardisers = module.reward_standardisers(["agents"], on)

    out = module.advantages(batch, gae, standardisers)
    assert torch.equal(batch["next", "agents", "reward"], raw)  # as collected
    expected = batch.clone()
    # EPyMARL's running moments after one batch of n rewards, from mean 0 and variance 1
    # weighted as eps = 1e-4 samples (which counts here: navigation's rewards are ~1e-3)
    n, eps, m = raw.numel(), 1e-4, raw.mean().double()
    mean = m * n / (n + eps)
    var = (eps + raw.double().var() * n + m**2 * eps * n / (n + eps)) / (n + eps)
    expected["next", "agents", "reward"] = ((raw - mean) / var.sqrt()).float()
    module.advantages(expected, gae, None)
    for key in ("advantage", "value_target"):
        torch.testing.assert_close(
            out["agents", key], expected["agents", key], rtol=1e-4, atol=1e-5
        )
    stats = standardisers["agents"].stats
    assert float(stats.count) == pytest.approx(raw.numel() + 1e-4)  # every agent's reward
    # without standardisers GAE reads the rewards as they are: other advantages
    plain = module.advantages(batch.clone(), gae, None)
    assert not torch.allclose(plain["agents", "value_target"], out["agents", "value_target"])


@pytest.mark.slow  # two short runs, ~30 s
def test_standardised_rewards_resume_their_statistics(tmp_path):
    run_dir = tmp_path / "run"
    budget = (*BUDGET, "eval.every=0", "eval.video=false", "loss.standardise_rewards=true")
    run("mappo_ippo", run_dir, budget)  # 2 batches of 400 frames, 3 agents each
    count = Checkpointer(run_dir / "checkpoints").load()["reward_standardisers"]
    assert float(count["agents.stats.count"]) == pytest.approx(2 * 400 * 3 + 1e-4)
    run("mappo_ippo", run_dir, (*budget, "collector.total_frames=1200", f"resume={run_dir}"))
    count = Checkpointer(run_dir / "checkpoints").load()["reward_standardisers"]
    assert float(count["agents.stats.count"]) == pytest.approx(3 * 400 * 3 + 1e-4)  # went on


#: critic.input=state on native SMAX 3m: 1 batch of 4 envs x 64 steps, windows of 32
SMAX_STATE = (
    "critic.input=state",
    "env.num_envs=4",
    "collector.frames_per_batch=256",
    "collector.total_frames=256",
    "model.seq_len=32",
    "train.minibatch_size=128",
    "train.epochs=1",
    "eval.video=false",
)


@pytest.mark.parametrize("critic_memory", [False, True])
def test_a_state_critic_reads_the_state_and_each_agents_one_hot_id(critic_memory):
    """``critic.input=state`` (JaxMARL's and EPyMARL's MAPPO critic): each agent's critic
    input is SMAX's root state joined with its one-hot index, ``cat(state, eye(n)[i])``, through
    one network shared by the agents, which gives each agent its own value."""
    import torch
    from omegaconf import OmegaConf

    from marlkit.modules import MultiAgentMLP
    from marlkit.train.scripts import env_factory

    from .test_configs import _compose

    module = _mappo_module()
    cfg = _compose("mappo_smax", ["critic.input=state", f"model.critic_memory={critic_memory}"])
    env = env_factory(cfg, 2, seed=0)()  # native SMAX 3m, with the script's transforms
    critic = module.make_critic(env, "ally", cfg.critic, cfg.model)
    assert "state" in critic.in_keys and ("ally", "observation") not in critic.in_keys
    seen = []
    first = next(m for m in critic.modules() if isinstance(m, MultiAgentMLP))
    first.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    td = env.reset()
    state = td["state"]  # [2, 72]
    value = critic(td)["ally", "state_value"]
    assert value.shape == (2, 3, 1)
    expected = torch.cat([state[:, None].expand(2, 3, 72), torch.eye(3).expand(2, 3, 3)], -1)
    assert len(seen) == 1 and torch.equal(seen[0], expected)
    assert first.n_agent_inputs == 75 and first.share_params  # one network for the 3 agents
    assert not torch.allclose(value[:, 0], value[:, 1])  # the same state, each its own value
    # a checkpoint's config written before critic.input: the observations' critic, as before
    old = OmegaConf.create({k: v for k, v in cfg.critic.items() if k != "input"})
    assert ("ally", "observation") in module.make_critic(env, "ally", old, cfg.model).in_keys


SMALL_NETS = ("policy.num_cells=16", "critic.num_cells=16", "model.memory_hidden=8")


@pytest.mark.parametrize(
    ("config", "overrides"),
    [
        ("mappo_ippo", ["critic.centralised=false"]),  # feed-forward, continuous actions
        ("mappo_ippo", ["model.memory=gru"]),  # a GRU actor and critic
        ("mappo_smax", ["critic.input=state", "model.critic_memory=false"]),  # the state's
        ("mappo_smax", ["critic.input=state"]),  # GRU actor and state critic (mappo_smax's)
    ],
)
def test_the_activations_reach_the_actor_and_the_critic(config, overrides):
    """``policy.activation`` and ``critic.activation`` (issue 37: EPyMARL's networks use
    ReLU) reach the actor and the critic of every kind, each its own section's; the default,
    and a checkpoint's config written before the keys, is marlkit's Tanh."""
    from omegaconf import OmegaConf
    from torch import nn

    from marlkit.modules import Tanh
    from marlkit.train.scripts import env_factory

    from .test_configs import _compose

    module = _mappo_module()
    relu = ["policy.activation=relu", "critic.activation=relu"]
    cfg = _compose(config, [*SMALL_NETS, *overrides, *relu])
    env = env_factory(cfg, 2, seed=0)()
    group = env.groups[0]
    policy = module.make_policy(env, cfg)
    critic = module.make_critic(env, group, cfg.critic, cfg.model)
    assert activation_types(policy) == activation_types(critic) == {nn.ReLU}
    assert critic(policy(env.reset()))[group, "state_value"].isfinite().all()
    # each section its own: the critic of a config that sets only the policy's is as before
    cfg = _compose(config, [*SMALL_NETS, *overrides, "policy.activation=relu"])
    assert activation_types(module.make_policy(env, cfg)) == {nn.ReLU}
    assert activation_types(module.make_critic(env, group, cfg.critic, cfg.model)) == {Tanh}
    old = OmegaConf.create(OmegaConf.to_container(_compose(config, [*SMALL_NETS, *overrides])))
    for net in ("policy", "critic"):
        del old[net]["activation"]  # as a checkpoint written before the key holds its config
    assert activation_types(module.make_policy(env, old)) == {Tanh}
    assert activation_types(module.make_critic(env, group, old.critic, old.model)) == {Tanh}


@pytest.mark.parametrize("critic_memory", ["false", "true"])
def test_mappo_on_smax_trains_a_state_critic(tmp_path, critic_memory):
    """A short MAPPO run on native SMAX 3m with ``critic.input=state``, the critic with and
    without memory: its critic reads the state and ids (75 = 72 + 3 inputs, where the joined
    observations would be 3 x 75), and its policy reads back (``trained_policy``)."""
    import math

    import torch
    from omegaconf import OmegaConf

    from marlkit.train.scripts import env_factory

    run_dir = tmp_path / "run"
    run(
        "mappo_ippo",
        run_dir,
        (*SMAX_STATE, f"model.critic_memory={critic_memory}"),
        config="mappo_smax",
    )
    last = read_metrics(run_dir / "metrics.csv")[-1]
    assert math.isfinite(last["train/ally/loss_critic"]) and last["train/ally/loss_critic"] > 0
    state = Checkpointer(run_dir / "checkpoints").load()
    first = "module.0.module.1" if critic_memory == "true" else "module.mlp"
    weight = state["losses"][f"ally.critic_network.{first}.layers.0.weight"]
    assert weight.shape == (1, 72 + 3, 128)
    assert state["config"]["critic"]["input"] == "state"
    module = _mappo_module()
    env = env_factory(OmegaConf.create(state["config"]), 2, seed=1)()
    td = module.trained_policy(env, str(run_dir))(env.reset())
    assert td["ally", "action"].shape == (2, 3) and td["ally", "action"].dtype == torch.long


def test_a_state_critic_on_an_env_without_a_state_is_refused_before_anything_trains(tmp_path):
    run_dir = tmp_path / "run"
    override = (*BUDGET, "env=vmas/navigation", "critic.input=state")
    with pytest.raises(AssertionError) as refused:
        run("mappo_ippo", run_dir, override)
    message = str(refused.value)
    assert "ConfigError: critic.input=state reads the env's global 'state' [*B, s]" in message
    assert "its keys: [('agents', 'observation')" in message  # what VMAS's env has
    assert "smax/<map>" in message and "use critic.input=observations" in message
    assert not (run_dir / "metrics.csv").exists()


@pytest.mark.parametrize(
    ("config", "overrides", "message"),
    [
        # IPPO's critic reads the agent's own observation
        ("ippo_smax", ["critic.input=state"], r"critic.input=state is MAPPO's critic \(critic"),
        (
            "mappo_smax",
            ["critic.input=state", "model.kind=deepsets", "model.inputs=[entities,own]"],
            r"critic.input=state reads the env's state through the mlp encoder; "
            r"model.kind=deepsets reads the group's observations",
        ),
    ],
)
def test_a_state_critic_is_refused_for_ippo_and_other_encoders(config, overrides, message):
    from marlkit.train.config import ConfigError, check_config

    from .test_configs import _compose

    with pytest.raises(ConfigError, match=message):
        check_config(_compose(config, overrides))
    check_config(_compose(config, overrides[1:]))  # without the state: a run it would train


def test_clip_value_reaches_the_loss_and_clips_the_critics_loss():
    """``loss.clip_value`` (JaxMARL's value clipping): the group's ClipPPOLoss gets it, and a
    value moved past ``old +- clip_value`` pays the larger of the two squared errors."""
    import torch
    from omegaconf import OmegaConf

    from .test_configs import _compose

    module = _mappo_module()
    cfg = _compose("mappo_ippo", ["loss.clip_value=0.2", "loss.loss_critic_type=l2"])
    assert cfg.loss.clip_value == 0.2 and _compose("mappo_ippo").loss.clip_value is None
    env = marlkit.make("navigation", num_envs=2, n_agents=3, seed=0)
    cells = OmegaConf.create(
        {"centralised": True, "share_params": True, "depth": 1, "num_cells": 8}
    )
    model = OmegaConf.create({"memory": "none", "critic_memory": False, "kind": "mlp"})
    actor = module.make_actor(env, "agents", cells)
    critic = module.make_critic(env, "agents", cells, model)
    loss = module.make_loss(actor, critic, "agents", cfg)
    assert loss.clip_value == 0.2
    with torch.no_grad():
        td = env.rollout(4, actor)  # the actions' log-probabilities, as collected
    with torch.no_grad():
        value = critic(td.clone())["agents", "state_value"]
    td["agents", "advantage"] = torch.zeros_like(value)
    td["agents", "value_target"] = value + 1.0  # the critic is 1 below its target
    td["agents", "state_value"] = value - 0.5  # collected lower: clipped to old + 0.2 = v - 0.3
    coef = cfg.loss.critic_coef
    # the larger squared error: the clipped value's, 1.3 ** 2, over the new value's 1.0
    torch.testing.assert_close(loss(td)["loss_critic"].detach(), torch.tensor(1.69 * coef))
    loss.clip_value = None
    torch.testing.assert_close(loss(td)["loss_critic"].detach(), torch.tensor(1.0 * coef))


@pytest.mark.slow  # a short run, ~15 s
def test_clip_per_network_gives_actor_and_critic_a_parameter_group_each(tmp_path):
    """``train.clip_per_network``: one Adam with the actor's and the critic's parameters in a
    group each (clipped apart), every group annealed; refused with a stack of seeds."""
    run_dir = tmp_path / "run"
    budget = (*BUDGET, "eval.every=0", "eval.video=false", "train.anneal_lr=true")
    run("mappo_ippo", run_dir, (*budget, "train.clip_per_network=true"))
    state = Checkpointer(run_dir / "checkpoints").load()
    groups = state["optims"]["agents"]["param_groups"]
    assert len(groups) == 2 and {g["lr"] for g in groups} == {1.5e-4}  # 2nd of 2 batches
    actor = [k for k in state["losses"] if k.startswith("agents.actor_network")]
    assert len(groups[0]["params"]) == len(actor)  # the actor's tensors, then the critic's
    with pytest.raises(AssertionError, match=r"does not support train\.clip_per_network=True"):
        run("mappo_ippo", tmp_path / "stack", (*budget, "train.clip_per_network=true",
                                               "seeds_in_process=2"))  # fmt: skip


def test_orthogonal_init_draws_jaxmarls_gains_into_the_actor_and_the_critic():
    """``model.init=orthogonal`` with ``model.init_head_gain=2``: JaxMARL's SMAX MAPPO
    (Dense sqrt(2), GRU, Dense 2, output 0.01 for the actor and 1.0 for the critic); the
    default leaves the networks and torch's generator as built."""
    import math

    import torch

    from marlkit.modules import MultiAgentGRU, dense_layers
    from marlkit.train.scripts import env_factory

    from .test_configs import _compose

    module = _mappo_module()
    layers = ["policy.depth=0", "critic.depth=0", "model.head_depth=1", *SMALL_NETS]

    def build(*overrides):
        cfg = _compose("mappo_smax", [*layers, *overrides])
        env = env_factory(cfg, 2, seed=0)()
        torch.manual_seed(0)
        policy = module.make_policy(env, cfg)
        critics = {g: module.make_critic(env, g, cfg.critic, cfg.model) for g in env.groups}
        module.init_networks(cfg, policy, critics)
        return policy, critics["ally"], torch.rand(1)

    policy, critic, after = build("model.init=orthogonal", "model.init_head_gain=2")
    for net, output_gain in ((policy.module[0], 0.01), (critic, 1.0)):
        found = dense_layers(net)
        assert [a for _, a in found] == [False, True, True]  # encoder, head, output
        for (layer, _), gain in zip(found, (math.sqrt(2.0), 2.0, output_gain), strict=True):
            w = layer.weight.detach()[0]  # [in, out], one network shared by the agents
            small = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            eye = torch.eye(min(w.shape))
            torch.testing.assert_close(small, gain**2 * eye, atol=1e-4, rtol=0)
            assert torch.count_nonzero(layer.bias) == 0
    # the default: the networks torch drew, and the generator where they left it
    default, default_critic, untouched = build()
    plain, plain_critic, plain_after = build("model.init=default")
    for a, b in zip(
        [*default.parameters(), *default_critic.parameters()],
        [*plain.parameters(), *plain_critic.parameters()],
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert torch.equal(untouched, plain_after) and not torch.equal(untouched, after)
    cell = next(m for m in policy.modules() if isinstance(m, MultiAgentGRU))
    default_cell = next(m for m in default.modules() if isinstance(m, MultiAgentGRU))
    for a, b in zip(cell.parameters(), default_cell.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the cell keeps torch's draw


@pytest.mark.slow  # two short runs, ~20 s
def test_adam_eps_and_orthogonal_init_train_alone_and_in_a_stack_of_seeds(tmp_path):
    """``train.adam_eps`` reaches Adam's parameter groups (here the actor's and the critic's,
    clipped apart); ``model.init=orthogonal`` trains alone and in a stack of seeds (each
    seed's networks drawn under its own seed)."""
    budget = (*BUDGET, "eval.every=0", "eval.video=false", "model.init=orthogonal")
    run("mappo_ippo", tmp_path / "run", (*budget, "train.adam_eps=1e-5",
                                         "train.clip_per_network=true"))  # fmt: skip
    optims = Checkpointer(tmp_path / "run" / "checkpoints").load()["optims"]
    assert [g["eps"] for o in optims.values() for g in o["param_groups"]] == [1e-5, 1e-5]
    run("mappo_ippo", tmp_path / "stack", (*budget, "seeds_in_process=2"))
    for seed in (0, 1):
        assert summary(tmp_path / "stack" / f"seed_{seed}")["frames"] == 800


#: JaxMARL's SMAX actor and critic: one hidden layer after the GRU (issue 38)
HEAD = ("model.head_depth=1", "model.head_cells=64")


def _head_mlps(network):
    """The ``MultiAgentMLP`` reading each cell's output in ``network`` (its head)."""
    from tensordict.nn import TensorDictModule

    from marlkit.modules import MultiAgentMLP

    return [
        next(m for m in part.module.modules() if isinstance(m, MultiAgentMLP))
        for part in network.modules()
        if isinstance(part, TensorDictModule) and str(part.in_keys[0][-1]).endswith("rnn_output")
    ]


def _shapes(network, leave_out=()) -> dict:
    """``network``'s parameter names and shapes, without those of the modules ``leave_out``."""
    skip = {id(p) for m in leave_out for p in m.parameters()}
    return {n: tuple(p.shape) for n, p in network.named_parameters() if id(p) not in skip}


@pytest.mark.parametrize(
    ("config", "overrides", "critic_cells"),
    [
        ("mappo_ippo", ["model.memory=gru"], 1),  # continuous actions, MAPPO's critic
        (  # IPPO, a network per agent (the layers stacked over the agents)
            "mappo_ippo",
            ["model.memory=lstm", "critic.centralised=false", "policy.share_params=false"],
            1,
        ),
        ("mappo_smax", ["critic.input=state"], 1),  # masked actions; the state's critic
        ("mappo_ippo", ["model.memory=gru", "model.kind=gnn"], 1),  # build_model's head
        ("mappo_ippo", ["model.memory=gru", "model.critic_memory=false"], 0),  # no cell: as is
    ],
)
def test_head_depth_puts_a_hidden_layer_after_every_cell(config, overrides, critic_cells):
    """``model.head_depth=1 model.head_cells=64``: the head of the actor and of a recurrent
    critic is ``[cell width -> 64]``, the section's activation, ``[64 -> outputs]``, batched
    over the agents as the linear head was; every other parameter, and every output's shape,
    as without the keys (the rollout and the training pass agree: test_sequences.py)."""
    from torch import nn

    from marlkit.modules import Tanh
    from marlkit.train.config import check_config
    from marlkit.train.scripts import env_factory

    from .test_configs import _compose

    module = _mappo_module()
    base = _compose(config, [*SMALL_NETS, *overrides])
    cfg = _compose(config, [*SMALL_NETS, *overrides, *HEAD, "policy.activation=relu"])
    check_config(cfg)
    env = env_factory(cfg, 2, seed=0)()
    group = env.groups[0]

    def networks(c):
        return module.make_policy(env, c), module.make_critic(env, group, c.critic, c.model)

    td = env.reset()
    for before, after, activation, cells in zip(
        networks(base), networks(cfg), (nn.ReLU, Tanh), (1, critic_cells)
    ):
        old_heads, heads = _head_mlps(before), _head_mlps(after)
        assert len(heads) == len(old_heads) == cells
        for old, head in zip(old_heads, heads):
            assert len(old.layers) == 1  # the linear head without the keys
            stacks, width, outputs = old.layers[0].weight.shape
            shapes = [tuple(layer.weight.shape) for layer in head.layers]
            assert shapes == [(stacks, width, 64), (stacks, 64, outputs)]
            assert [type(a) for a in head.activations] == [activation]  # its section's
            assert head.share_params == old.share_params
        assert _shapes(after, heads) == _shapes(before, old_heads)
        new, old_out = after(td.clone()), before(td.clone())
        shapes = {k: v.shape for k, v in new.items(True, True)}
        assert shapes == {k: v.shape for k, v in old_out.items(True, True)}


@pytest.mark.parametrize(
    ("config", "overrides"),
    [
        ("mappo_smax", []),  # a GRU actor and critic (JaxMARL's recipe)
        ("mappo_ippo", ["model.memory=lstm", "model.kind=gnn"]),
        ("mappo_smax", ["critic.input=state"]),
    ],
)
def test_without_head_depth_the_networks_are_those_before_the_keys(config, overrides):
    """The default (``head_depth=0``), an explicit 0 with any ``head_cells``, and a
    checkpoint's config written before the keys build the same parameters from the same
    seed: the linear head after the cell, and no other random draw."""
    import torch
    from omegaconf import OmegaConf

    from marlkit.train.scripts import env_factory

    from .test_configs import _compose

    module = _mappo_module()
    default = _compose(config, [*SMALL_NETS, *overrides])
    assert (default.model.head_depth, default.model.head_cells) == (0, None)
    explicit = _compose(config, [*SMALL_NETS, *overrides, "model.head_depth=0", HEAD[1]])
    old = OmegaConf.create(OmegaConf.to_container(default))
    del old.model["head_depth"], old.model["head_cells"]  # as a checkpoint before them
    env = env_factory(default, 2, seed=0)()
    group = env.groups[0]
    built = []
    for cfg in (default, explicit, old):
        torch.manual_seed(0)
        policy = module.make_policy(env, cfg)
        critic = module.make_critic(env, group, cfg.critic, cfg.model)
        built.append((policy.state_dict(), critic.state_dict(), torch.rand(2)))
    for policy_state, critic_state, draw in built[1:]:
        assert torch.equal(draw, built[0][2])  # the random stream where it was
        for state, expected in ((policy_state, built[0][0]), (critic_state, built[0][1])):
            assert list(state) == list(expected)
            assert all(torch.equal(state[k], expected[k]) for k in state)
    heads = _head_mlps(module.make_policy(env, default))
    assert [len(h.layers) for h in heads] == [1] and heads[0].n_agent_inputs == 8  # the cell's


def test_mappo_smax_networks_keep_their_parameters_names_and_shapes():
    """mappo_smax's actor and critic, parameter by parameter, as before ``model.head_depth``
    (a checkpoint of theirs loads into them)."""
    from marlkit.train.scripts import env_factory

    from .test_configs import _compose

    module = _mappo_module()
    cfg = _compose("mappo_smax", list(SMALL_NETS))
    env = env_factory(cfg, 2, seed=0)()
    cell = {
        "1.input_gates.weight": (1, 8, 24),
        "1.input_gates.bias": (1, 1, 24),
        "1.hidden_gates.weight": (1, 8, 24),
        "1.hidden_gates.bias": (1, 1, 24),
    }
    actor = "module.0.module.0.module."
    assert _shapes(module.make_policy(env, cfg)) == {
        f"{actor}0.module.0.layers.0.weight": (1, 75, 16),
        f"{actor}0.module.0.layers.0.bias": (1, 1, 16),
        f"{actor}0.module.0.layers.1.weight": (1, 16, 8),
        f"{actor}0.module.0.layers.1.bias": (1, 1, 8),
        **{f"{actor}{k}": v for k, v in cell.items()},
        f"{actor}2.module.layers.0.weight": (1, 8, 8),  # the linear head: 8 actions
        f"{actor}2.module.layers.0.bias": (1, 1, 8),
    }
    assert _shapes(module.make_critic(env, "ally", cfg.critic, cfg.model)) == {
        "module.0.module.0.layers.0.weight": (1, 225, 16),  # the 3 allies' observations
        "module.0.module.0.layers.0.bias": (1, 1, 16),
        "module.0.module.0.layers.1.weight": (1, 16, 8),
        "module.0.module.0.layers.1.bias": (1, 1, 8),
        **{f"module.{k}": v for k, v in cell.items()},
        "module.2.module.layers.0.weight": (1, 8, 1),
        "module.2.module.layers.0.bias": (1, 1, 1),
    }


@pytest.mark.slow  # a short run, ~15 s
def test_mappo_trains_a_recurrent_actor_and_critic_with_a_head_layer(tmp_path):
    """Two iterations on native navigation with ``model.head_depth=1``: the checkpoint holds
    the actor's and the critic's extra layer, and the trained policy reads back from it."""
    import math

    import torch
    from omegaconf import OmegaConf

    from marlkit.train.scripts import env_factory

    run_dir = tmp_path / "run"
    overrides = ("model.memory=gru", "model.memory_hidden=16", "model.seq_len=10", *HEAD)
    run("mappo_ippo", run_dir, (*BUDGET, "eval.video=false", *overrides))
    last = read_metrics(run_dir / "metrics.csv")[-1]
    assert math.isfinite(last["train/agents/loss_objective"])
    assert math.isfinite(last["train/agents/loss_critic"])
    state = Checkpointer(run_dir / "checkpoints").load()
    assert state["config"]["model"]["head_depth"] == 1
    weights = {k: tuple(v.shape) for k, v in state["losses"].items() if k.endswith("weight")}
    actor = "agents.actor_network.module.0.module.2.module.0.layers"  # then NormalParamExtractor
    critic = "agents.critic_network.module.2.module.layers"
    assert weights[f"{actor}.0.weight"] == (1, 16, 64)
    assert weights[f"{actor}.1.weight"] == (1, 64, 4)  # loc and scale of 2 action dims
    assert weights[f"{critic}.0.weight"] == (1, 16, 64)
    assert weights[f"{critic}.1.weight"] == (1, 64, 1)
    env = env_factory(OmegaConf.create(state["config"]), 2, seed=1)()
    td = _mappo_module().trained_policy(env, str(run_dir))(env.reset())
    assert td["agents", "action"].shape == (2, 3, 2) and td["agents", "action"].isfinite().all()
    assert torch.is_floating_point(td["agents", "action"])
