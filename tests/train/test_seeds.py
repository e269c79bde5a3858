"""marlkit.train.seeds: a stack of seeds' losses, gradient clipping, Adam state and checkpoint
parts are each seed's own; options a stack does not support are refused by name."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from marlkit.modules import Categorical as CategoricalDist
from marlkit.modules import (
    MultiAgentMLP,
    ProbabilisticActor,
    QMixer,
    QValueActor,
    StateValueCritic,
)
from marlkit.modules.seeds import SeedStreams, stack_seeds
from marlkit.objectives import ClipPPOLoss, DQNLoss, QMixerLoss
from marlkit.train.config import ConfigError
from marlkit.train.seeds import (
    SeedState,
    check_seeds_config,
    clip_grad_norm_per_seed_,
    run_seeds,
)

K, N, OBS, ACTIONS = 3, 2, 4, 5


def parts(seed: int) -> tuple[ProbabilisticActor, StateValueCritic]:
    torch.manual_seed(seed)
    net = MultiAgentMLP(OBS, ACTIONS, N, num_cells=8)
    actor = ProbabilisticActor(net, group="agents", distribution_class=CategoricalDist)
    return actor, StateValueCritic(N, OBS, centralised=True, num_cells=8)


def batch(shape: tuple[int, ...], mask: bool = False) -> TensorDict:
    g = torch.Generator().manual_seed(3)
    sub = {
        "observation": torch.randn(*shape, N, OBS, generator=g),
        "action": torch.randint(0, ACTIONS, (*shape, N), generator=g),
        "action_log_prob": torch.randn(*shape, N, generator=g) - 2,
        "advantage": torch.randn(*shape, N, 1, generator=g),
        "value_target": torch.randn(*shape, N, 1, generator=g),
    }
    if mask:
        sub["mask"] = torch.rand(*shape, N, generator=g) > 0.3
    return TensorDict({"agents": TensorDict(sub, batch_size=[*shape, N])}, batch_size=shape)


def losses(**kwargs) -> tuple[list[ClipPPOLoss], ClipPPOLoss]:
    alone = [ClipPPOLoss(*parts(k), **kwargs) for k in range(K)]
    stacked_parts = [parts(k) for k in range(K)]
    actor = stack_seeds([p[0] for p in stacked_parts])
    critic = stack_seeds([p[1] for p in stacked_parts])
    return alone, ClipPPOLoss(actor, critic, separate_dims=1, **kwargs)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("mask", [False, True])
def test_the_loss_of_a_stack_is_each_seeds_loss(normalize: bool, mask: bool) -> None:
    alone, stacked = losses(normalize_advantage=normalize)
    data = batch((K, 16), mask=mask)
    terms = stacked(data.clone())
    assert terms.batch_size == (K,)
    objective = terms["loss_objective"] + terms["loss_critic"] + terms["loss_entropy"]
    objective.sum().backward()  # the sum over seeds: each seed's gradient is its own loss's
    for k, loss in enumerate(alone):
        own = loss(data[k].clone())
        for name in ("loss_objective", "loss_critic", "loss_entropy", "explained_variance"):
            torch.testing.assert_close(terms[name][k], own[name], atol=1e-6, rtol=1e-5)
        (own["loss_objective"] + own["loss_critic"] + own["loss_entropy"]).backward()
        grads = [p.grad for p in loss.parameters()]
        for g, p in zip(grads, stacked.parameters()):
            torch.testing.assert_close(p.grad.unflatten(0, (K, -1))[k], g, atol=1e-6, rtol=1e-4)


def q_parts(seed: int, mixer: bool) -> tuple[QValueActor, QMixer | None]:
    torch.manual_seed(seed)
    actor = QValueActor(MultiAgentMLP(OBS, ACTIONS, N, num_cells=8), n_actions=ACTIONS)
    return actor, QMixer([N, OBS], 8, N, state_key=("agents", "observation")) if mixer else None


def q_batch(shape: tuple[int, ...]) -> TensorDict:
    g = torch.Generator().manual_seed(4)

    def step() -> TensorDict:
        sub = {
            "observation": torch.randn(*shape, N, OBS, generator=g),
            "reward": torch.randn(*shape, N, 1, generator=g),
            "terminated": torch.rand(*shape, N, 1, generator=g) > 0.8,
            "action_mask": torch.rand(*shape, N, ACTIONS, generator=g) > 0.3,
        }
        sub["action_mask"][..., 0] = True
        return TensorDict(sub, batch_size=[*shape, N])

    now = step().update({"action": torch.zeros(*shape, N, dtype=torch.long)})
    return TensorDict({"agents": now, "next": TensorDict({"agents": step()}, shape)}, shape)


@pytest.mark.parametrize("algorithm", ["qmix", "iql"])
def test_the_q_losses_of_a_stack_are_each_seeds_loss(algorithm: str) -> None:
    """QMIX's mixer (its hypernetworks' layers stacked per seed) and IQL's DQN: with
    ``separate_dims=1`` a stack's terms and gradients are each seed's own."""
    mixer = algorithm == "qmix"

    def loss(parts: tuple, **kwargs) -> torch.nn.Module:
        if mixer:
            return QMixerLoss(parts[0], parts[1], double_dqn=True, **kwargs)
        return DQNLoss(parts[0], **kwargs)

    alone = [loss(q_parts(k, mixer)) for k in range(K)]
    seeds = [q_parts(k, mixer) for k in range(K)]
    stacked_parts = [
        stack_seeds([p[i] for p in seeds]) if mixer or i == 0 else None for i in (0, 1)
    ]
    stacked = loss(stacked_parts, separate_dims=1)
    assert len(list(stacked.parameters())) == len(list(alone[0].parameters()))
    data = q_batch((K, 16))
    terms = stacked(data.clone())
    assert terms["loss"].shape == (K,)
    terms["loss"].sum().backward()
    for k, own_loss in enumerate(alone):
        own = own_loss(data[k].clone())
        for name in ("loss", "q_value", "target_value"):
            torch.testing.assert_close(terms[name][k], own[name], atol=1e-6, rtol=1e-5)
        own["loss"].backward()
        for (name, p), (_, q) in zip(own_loss.named_parameters(), stacked.named_parameters()):
            if p.grad is None:  # the target networks
                assert q.grad is None, name
                continue
            grad = q.grad.unflatten(0, (K, -1))[k]
            if "mixer" in name:  # the stacked layers hold nn.Linear's [out, in] as [in, out]
                grad = grad[0].t() if name.endswith("weight") else grad.reshape(-1)
            torch.testing.assert_close(grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)
    with pytest.raises(ValueError, match=r"separate_dims=1 needs 1 batch dims"):
        stacked(q_batch(()))


def test_the_loss_needs_the_separate_dims() -> None:
    _, stacked = losses()
    with pytest.raises(ValueError, match="separate_dims=1 needs 1 batch dims"):
        stacked(batch(()))


def test_each_seeds_gradient_is_clipped_on_its_own() -> None:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(K * 2, 3, 4)), torch.nn.Parameter(torch.zeros(K, 1))]
    grads = [torch.randn(K * 2, 3, 4), torch.randn(K, 1)]
    grads[0][:2] *= 100  # seed 0's norm above the limit, the others' below
    for p, g in zip(params, grads):
        p.grad = g.clone()
    norms = clip_grad_norm_per_seed_(params, K, max_norm=1.0)
    for k in range(K):
        alone = [torch.nn.Parameter(p.detach().unflatten(0, (K, -1))[k]) for p in params]
        for a, g in zip(alone, grads):
            a.grad = g.unflatten(0, (K, -1))[k].clone()
        norm = torch.nn.utils.clip_grad_norm_(alone, 1.0)
        torch.testing.assert_close(norms[k], norm)
        for a, p in zip(alone, params):
            torch.testing.assert_close(p.grad.unflatten(0, (K, -1))[k], a.grad)
    assert norms[0] > 1.0 and float(norms[1:].max()) < 10.0


def test_adam_is_elementwise_so_each_seed_keeps_its_own_state() -> None:
    """One Adam over stacked parameters takes, in each seed's slice, the steps that seed's own
    Adam takes: its moments are elementwise (and every seed steps together)."""
    torch.manual_seed(0)
    stacked = torch.nn.Parameter(torch.randn(K * 2, 3))
    alone = [
        torch.nn.Parameter(stacked.detach().unflatten(0, (K, -1))[k].clone()) for k in range(K)
    ]
    big = torch.optim.Adam([stacked], lr=0.1, fused=True)
    small = [torch.optim.Adam([p], lr=0.1, fused=True) for p in alone]
    for _ in range(5):
        grads = torch.randn(K * 2, 3) * (1 + torch.arange(K * 2)[:, None])  # per-seed scales
        stacked.grad = grads.clone()
        big.step()
        for k, (p, opt) in enumerate(zip(alone, small)):
            p.grad = grads.unflatten(0, (K, -1))[k].clone()
            opt.step()
    for k, (p, opt) in enumerate(zip(alone, small)):
        torch.testing.assert_close(stacked.detach().unflatten(0, (K, -1))[k], p.detach())
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(
                big.state[stacked][key].unflatten(0, (K, -1))[k], opt.state[p][key]
            )


def test_a_seeds_checkpoint_part_holds_its_slices_and_loads_them_back() -> None:
    _, stacked = losses()
    modules = torch.nn.ModuleDict({"agents": stacked})
    optims = {"agents": torch.optim.Adam(stacked.parameters(), lr=0.01, fused=True)}
    streams = SeedStreams([torch.get_rng_state() for _ in range(K)])
    out = stacked(batch((K, 8)))
    (out["loss_objective"] + out["loss_critic"]).sum().backward()
    optims["agents"].step()
    state = SeedState(1, modules, optims, streams).state_dict()
    before = [p.detach().clone() for p in stacked.parameters()]
    moments = [optims["agents"].state[p]["exp_avg"].clone() for p in stacked.parameters()]
    # seed 1's slices only: another seed's part into seed 1 changes seed 1, nothing else
    SeedState(1, modules, optims, streams).load_state_dict(
        SeedState(2, modules, optims, streams).state_dict()
    )
    for p, b in zip(stacked.parameters(), before):
        torch.testing.assert_close(p.detach().unflatten(0, (K, -1))[1], b.unflatten(0, (K, -1))[2])
        torch.testing.assert_close(p.detach().unflatten(0, (K, -1))[0], b.unflatten(0, (K, -1))[0])
    SeedState(1, modules, optims, streams).load_state_dict(state)
    for p, b, m in zip(stacked.parameters(), before, moments):
        torch.testing.assert_close(p.detach(), b)
        torch.testing.assert_close(optims["agents"].state[p]["exp_avg"], m)


def test_the_seeds_of_a_stack_do_not_share_env_seeds() -> None:
    assert run_seeds(3, 4, 8) == [3, 11, 19, 27]
    assert run_seeds(0, 2, 1) == [0, 1]


def config(**overrides) -> object:
    base = {
        "seeds_in_process": 4,
        "device": "cpu",
        "callbacks": [],
        "env": {"device": None},
        "collector": {"kind": "single", "device": None},
        "train": {"precision": "fp32", "compile": False},
        "model": {"memory": "none", "kind": "mlp"},
    }
    return OmegaConf.merge(base, overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"seeds_in_process": 0}, "seeds_in_process must be an int >= 1, got 0"),
        (
            {"collector": {"kind": "multisync"}},
            "seeds_in_process=4 does not support collector.kind=multisync yet",
        ),
        ({"train": {"compile": True}}, "does not support train.compile=True yet"),
        ({"train": {"precision": "bf16"}}, "does not support train.precision=bf16 yet"),
        ({"model": {"memory": "gru"}}, "does not support model.memory=gru yet"),
        ({"model": {"kind": "gnn"}}, "does not support model.kind=gnn yet"),
        ({"device": "cuda"}, "does not support device=cuda yet"),
        ({"callbacks": ["EarlyStopping"]}, "seeds_in_process=4 does not support callbacks yet"),
    ],
)
def test_what_a_stack_cannot_do_is_refused_by_name(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        check_seeds_config(config(**overrides))


def test_one_seed_is_the_usual_run_whatever_the_options() -> None:
    assert check_seeds_config(config(seeds_in_process=1, train={"compile": True})) == 1
    assert check_seeds_config(config()) == 4
    # each seed keeps its own reward statistics (SeedRewardStandardiser)
    assert check_seeds_config(config(loss={"standardise_rewards": True})) == 4


@pytest.mark.parametrize(
    ("name", "kwargs", "steps"),
    [
        ("pettingzoo/mpe2.simple_spread_v3", {"N": 3, "max_cycles": 25}, 25),
        ("lbforaging/Foraging-8x8-2p-2f-coop-v3", {"time_limit": 10, "common_reward": True}, 10),
    ],
)
def test_one_env_of_the_seeds_instances_steps_as_each_seeds_own_env(
    name: str, kwargs: dict, steps: int
) -> None:
    """What seeds_in_process relies on for the Python adapters: instances k*n..(k+1)*n - 1 of
    one env seeded s are seed k's env of n instances seeded s + k*n, resets included."""
    from marlkit.train.builders import make_env
    from marlkit.train.seeds import one_env_for_seeds, seed_width

    seeds, n = 2, 3

    def make(num_envs: int, seed: int):
        return make_env(
            name, transforms=[], num_envs=num_envs, max_steps=steps, seed=seed, imports=[],
            actions=None, **kwargs,
        )  # fmt: skip

    big = make(seeds * n, 5)
    own = [make(n, 5 + k * n) for k in range(seeds)]
    assert one_env_for_seeds(big) and seed_width(own[0]) == n
    n_actions = big.action_spec["agents", "action"].n
    g = torch.Generator().manual_seed(0)
    root, roots = big.reset(), [env.reset() for env in own]
    for _ in range(2 * steps + 3):  # two episodes and more: the instances reset on their own
        action = torch.randint(0, n_actions, root["agents"].batch_size, generator=g)
        root["agents", "action"] = action
        out, root = big.step_and_maybe_reset(root)
        for k, env in enumerate(own):
            roots[k]["agents", "action"] = action[k * n : (k + 1) * n]
            mine, roots[k] = env.step_and_maybe_reset(roots[k])
            for key in (("next", "agents", "observation"), ("next", "agents", "reward")):
                torch.testing.assert_close(out[key][k * n : (k + 1) * n], mine[key])
            torch.testing.assert_close(root["agents", "observation"][k * n : (k + 1) * n],
                                       roots[k]["agents", "observation"])  # fmt: skip
    assert not one_env_for_seeds(make_env("navigation", transforms=[], num_envs=2, max_steps=5,
                                          seed=0, imports=[], actions=None))  # fmt: skip
