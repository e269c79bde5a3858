"""ClipPPOLoss: hand-computed values, where gradients go, masks, batch dims, errors, groups."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from marlkit.modules import (
    Categorical,
    MultiAgentMLP,
    Normal,
    NormalParamExtractor,
    ProbabilisticActor,
    StateValueCritic,
    TanhNormal,
)
from marlkit.objectives import ClipPPOLoss

N, OBS, ACT = 3, 4, 2


def make(group: str = "agents", dist=Normal, seed: int = 0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(MultiAgentMLP(OBS, 2 * ACT, N, num_cells=8), NormalParamExtractor())
    actor = ProbabilisticActor(net, group=group, distribution_class=dist)
    critic = StateValueCritic(N, OBS, group=group, centralised=True, num_cells=8)
    return actor, critic


def batch(group: str = "agents", shape: tuple = (6,), seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    sub = TensorDict(
        {
            "observation": torch.randn(*shape, N, OBS, generator=g),
            "action": torch.rand(*shape, N, ACT, generator=g) * 1.8 - 0.9,
            "action_log_prob": torch.randn(*shape, N, generator=g) - 2,
            "advantage": torch.randn(*shape, N, 1, generator=g),
            "value_target": torch.randn(*shape, N, 1, generator=g),
            "state_value": torch.randn(*shape, N, 1, generator=g),
        },
        [*shape, N],
    )
    return TensorDict({group: sub}, list(shape))


def total(out: TensorDict) -> torch.Tensor:
    return out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]


def test_hand_computed_values() -> None:
    actor, critic = make()
    td = batch()
    loss = ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=0.2,
        entropy_coef=0.05,
        critic_coef=0.5,
        normalize_advantage=False,
    )
    out = loss(td.clone())
    g = td["agents"]
    with torch.no_grad():
        loc, scale = actor.module[0].module(g["observation"])
        lp = torch.distributions.Normal(loc, scale).log_prob(g["action"]).sum(-1, keepdim=True)
        ratio = (lp - g["action_log_prob"].unsqueeze(-1)).exp()
        a = g["advantage"]
        obj = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a).mean()
        ent = torch.distributions.Normal(loc, scale).entropy().sum(-1).mean()
        v = critic.module(g["observation"])
        crit = 0.5 * ((v - g["value_target"]) ** 2).mean()
        clip_frac = ((ratio - 1).abs() > 0.2).float().mean()
        kl = ((ratio - 1) - ratio.log()).mean()
        ev = 1 - (g["value_target"] - v).var(unbiased=False) / g["value_target"].var(unbiased=False)
    torch.testing.assert_close(out["loss_objective"], obj)
    torch.testing.assert_close(out["loss_critic"], crit)
    torch.testing.assert_close(out["loss_entropy"], -0.05 * ent)
    torch.testing.assert_close(out["clip_fraction"], clip_frac)
    torch.testing.assert_close(out["kl_approx"], kl)
    torch.testing.assert_close(out["explained_variance"], ev)


def test_advantage_normalisation_and_value_clipping() -> None:
    actor, critic = make()
    td = batch()
    a = td["agents", "advantage"]
    per = ClipPPOLoss(actor, critic, normalize_advantage_per_agent=True)
    glob = ClipPPOLoss(actor, critic)
    norm_glob = (a - a.mean()) / (a.std() + 1e-8)
    norm_per = (a - a.mean(0, keepdim=True)) / (a.std(0, keepdim=True) + 1e-8)
    torch.testing.assert_close(glob._advantage(a, None), norm_glob)
    torch.testing.assert_close(per._advantage(a, None), norm_per)
    clipped = ClipPPOLoss(actor, critic, clip_value=0.1, critic_coef=1.0)
    with torch.no_grad():
        v = critic.module(td["agents", "observation"])
        old, tgt = td["agents", "state_value"], td["agents", "value_target"]
        vc = old + (v - old).clamp(-0.1, 0.1)
        ref = torch.maximum((v - tgt) ** 2, (vc - tgt) ** 2).mean()
    torch.testing.assert_close(clipped(td.clone())["loss_critic"], ref)


def test_refreshed_advantage_is_the_target_minus_the_critic_now() -> None:
    # EPyMARL's epochs: the TD error against the critic as it is at each epoch
    actor, critic = make()
    td = batch()
    g = td["agents"]
    mask = torch.ones(6, N, dtype=torch.bool)
    mask[0, 1] = mask[4, 2] = False
    g.set("mask", mask)
    refreshed = ClipPPOLoss(actor, critic, normalize_advantage=False, refresh_advantage=True)
    assert ("agents", "advantage") not in refreshed.in_keys
    with torch.no_grad():
        v = critic.module(g["observation"])
    given = td.clone()
    given["agents", "advantage"] = (g["value_target"] - v).masked_fill(~mask.unsqueeze(-1), 0.0)
    reference = ClipPPOLoss(actor, critic, normalize_advantage=False)(given)
    out = refreshed(td.exclude(("agents", "advantage")))  # the entry is not needed
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(out[key], reference[key])
    # the advantage moves no critic parameter: only loss_critic reaches the critic
    out["loss_objective"].backward()
    assert not any(grads(critic))
    with pytest.raises(KeyError, match="value_target"):
        refreshed(td.exclude(("agents", "value_target")))


def grads(module: torch.nn.Module) -> list[bool]:
    return [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in module.parameters()]


@pytest.mark.parametrize("term", ["loss_objective", "loss_entropy", "loss_critic"])
def test_gradients_flow_only_where_they_should(term: str) -> None:
    actor, critic = make()
    loss = ClipPPOLoss(actor, critic)
    loss(batch())[term].backward()
    if term == "loss_critic":
        assert not any(grads(actor)) and all(grads(critic))
    else:
        assert any(grads(actor)) and not any(grads(critic))


def test_absent_agents_contribute_nothing() -> None:
    actor, critic = make()
    td = batch(shape=(8,))
    mask = torch.ones(8, N, dtype=torch.bool)
    mask[:, 1] = False
    td["agents"].set("mask", mask)
    loss = ClipPPOLoss(actor, critic, critic_coef=1.0)
    out = loss(td.clone())
    changed = td.clone()
    for key in ("advantage", "value_target", "action_log_prob", "state_value"):
        changed["agents", key][:, 1] = 1e3
    changed["agents", "action"][:, 1] = 0.5
    out2 = loss(changed)
    for key in ("loss_objective", "loss_critic", "loss_entropy", "clip_fraction", "kl_approx"):
        torch.testing.assert_close(out[key], out2[key])
    total(out2).backward()
    actor_grad = actor.module[0].module[0].layers[-1].weight.grad
    assert actor_grad is not None and bool(actor_grad[1].abs().sum() == 0)
    assert bool(actor_grad[0].abs().sum() > 0)


def test_collector_mask_drops_padded_steps() -> None:
    actor, critic = make()
    td = batch(shape=(2, 5))
    steps = torch.ones(2, 5, dtype=torch.bool)
    steps[1, 3:] = False
    td.set(("collector", "mask"), steps)
    loss = ClipPPOLoss(actor, critic, normalize_advantage=False)
    out = loss(td.clone())
    real = td[steps]
    ref = loss(real.exclude("collector"))
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(out[key], ref[key])


@pytest.mark.parametrize("dist", [Normal, TanhNormal])
def test_any_leading_batch_dims(dist) -> None:
    actor, critic = make(dist=dist)
    td = batch(shape=(12,))
    loss = ClipPPOLoss(actor, critic, entropy_coef=0.0)
    flat = loss(td.clone())
    nested = loss(td.clone().reshape(3, 2, 2))
    for key in ("loss_objective", "loss_critic", "kl_approx", "explained_variance"):
        torch.testing.assert_close(flat[key], nested[key])


def test_categorical_actor() -> None:
    torch.manual_seed(0)
    actor = ProbabilisticActor(
        MultiAgentMLP(OBS, 5, N, num_cells=8), distribution_class=Categorical
    )
    critic = StateValueCritic(N, OBS, num_cells=8)
    td = batch()
    td["agents"].set("action", torch.randint(0, 5, (6, N)), inplace=False)
    out = ClipPPOLoss(actor, critic)(td)
    total(out).backward()
    assert all(bool(torch.isfinite(v)) for v in out.values())


def test_bad_keys_and_shapes_name_key_and_shape() -> None:
    actor, critic = make()
    loss = ClipPPOLoss(actor, critic)
    td = batch()
    with pytest.raises(KeyError, match=r"missing advantage \('agents', 'advantage'\)"):
        loss(td.exclude(("agents", "advantage")))
    bad = td.clone()
    bad["agents"].set("action_log_prob", torch.zeros(6, N, 1), inplace=False)
    with pytest.raises(
        ValueError, match=r"'action_log_prob'\) must have shape \[6, 3\].*got \[6, 3, 1\]"
    ):
        loss(bad)
    bad = td.clone()
    bad["agents"].set("value_target", torch.zeros(6, N), inplace=False)
    with pytest.raises(ValueError, match=r"'value_target'\) must have shape \[6, 3, 1\]"):
        loss(bad)
    bad = td.clone()
    bad["agents"].set("mask", torch.ones(6, N, 1, dtype=torch.bool), inplace=False)
    with pytest.raises(ValueError, match=r"'mask'\) must have shape \[6, 3\]"):
        loss(bad)
    with pytest.raises(ValueError, match="unknown key name 'advantages'"):
        loss.set_keys(advantages="x")
    renamed = td.clone()
    renamed["agents"].rename_key_("advantage", "adv")
    out = ClipPPOLoss(actor, critic).set_keys(advantage=("agents", "adv"))(renamed)
    torch.testing.assert_close(out["loss_objective"], loss(td.clone())["loss_objective"])
    with pytest.raises(TypeError, match="get_dist"):
        ClipPPOLoss(critic, critic)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="clip_epsilon"):
        ClipPPOLoss(actor, critic, clip_epsilon=0)


def test_loss_on_group_a_never_touches_group_b() -> None:
    actor_a, critic_a = make("a", seed=0)
    actor_b, critic_b = make("b", seed=1)
    td = batch("a")
    td.update(batch("b", seed=1))
    before = td["b"].clone()
    out = ClipPPOLoss(actor_a, critic_a, group="a")(td)
    total(out).backward()
    assert not any(grads(actor_b)) and not any(grads(critic_b))
    assert any(grads(actor_a)) and any(grads(critic_a))
    assert (td["b"] == before).all()


def test_an_action_that_would_broadcast_is_refused() -> None:
    loss = ClipPPOLoss(*make())
    td = batch()
    td["agents", "action"] = td["agents", "action"][..., :1]  # [6, 3, 1] against act_dim 2
    with pytest.raises(ValueError, match=r"'action'\) must have shape \(6, 3, 2\) \(the actor's"):
        loss(td)
    td = batch()
    td["agents", "mask"] = torch.ones(6, N)
    with pytest.raises(ValueError, match=r"'mask'\) must be a bool tensor, got torch.float32"):
        loss(td)


def _masked_loss(n_actions: int, cells: int, depth: int = 2) -> tuple[ClipPPOLoss, TensorDict]:
    """A PPO loss over a MaskedCategorical actor and a group minibatch [6, N] whose stored
    actions (1) are all allowed; action 0 is forbidden everywhere."""
    from marlkit.modules import MaskedCategorical

    torch.manual_seed(0)
    net = MultiAgentMLP(OBS, n_actions, N, num_cells=cells, depth=depth)
    actor = ProbabilisticActor(net, distribution_class=MaskedCategorical)
    loss = ClipPPOLoss(actor, StateValueCritic(N, OBS, num_cells=cells, depth=depth))
    mask = torch.ones(6, N, n_actions, dtype=torch.bool)
    mask[..., 0] = False
    sub = TensorDict(
        {
            "observation": torch.randn(6, N, OBS),
            "action": torch.ones(6, N, dtype=torch.long),
            "action_mask": mask,
            "action_log_prob": torch.randn(6, N) - 2,
            "advantage": torch.randn(6, N, 1),
            "value_target": torch.randn(6, N, 1),
        },
        [6, N],
    )
    return loss, sub


def test_an_action_its_mask_forbids_is_named() -> None:
    loss, sub = _masked_loss(5, 8)
    loss(TensorDict({"agents": sub.clone()}, [6]))  # allowed actions: fine
    sub["action"][0, 0] = 0  # one forbidden action
    with pytest.raises(ValueError, match=r"probability 0 at 1 present agent steps"):
        loss(TensorDict({"agents": sub.clone()}, [6]))
    sub["mask"] = torch.ones(6, N, dtype=torch.bool)
    sub["mask"][0, 0] = False  # ... of an absent agent: left out
    loss(TensorDict({"agents": sub}, [6]))


# dynamo warns about its own tracing of tensordict (.grad of non-leaf tensors): shown, not
# raised, as in a training script
@pytest.mark.filterwarnings("default::UserWarning")
def test_a_compiled_loss_names_a_forbidden_action_too() -> None:
    """Compiled, the check runs inside the graph (no graph break): a RuntimeError with the
    same words when the compiled forward runs, where it used to return kl_approx=inf."""
    eager, sub = _masked_loss(3, 4, depth=1)
    # dynamo traces the loss as under the default backend; aot_eager runs the traced graph
    # without inductor's C++ code generation (25 s of a cold cache). The MAPPO script's
    # train.compile runs inductor: tests/sota/test_mappo_ippo.py compiles it there.
    loss = torch.compile(eager, backend="aot_eager")
    out = loss(TensorDict({"agents": sub.clone()}, [6]))
    assert torch.isfinite(out["kl_approx"])
    sub["action"][0, 0] = 0  # forbidden: the same graph, now failing its assert
    with pytest.raises(RuntimeError, match=r"gives \('agents', 'action'\) probability 0 \("):
        loss(TensorDict({"agents": sub}, [6]))


def test_a_batch_cut_to_in_keys_keeps_masks_and_the_old_values() -> None:
    actor, critic = make()
    td = batch(shape=(8,))
    g = torch.Generator().manual_seed(1)
    td["agents"].set("mask", torch.rand(8, N, generator=g) > 0.4)
    td.set(("collector", "mask"), torch.rand(8, generator=g) > 0.3)
    td.set("junk", torch.zeros(8))
    for loss in (ClipPPOLoss(actor, critic), ClipPPOLoss(actor, critic, clip_value=0.2)):
        assert ("agents", "mask") in loss.in_keys and ("collector", "mask") in loss.in_keys
        assert (("agents", "state_value") in loss.in_keys) == (loss.clip_value is not None)
        cut = td.select(*loss.in_keys, strict=False)
        assert cut.get("junk", None) is None
        full, part = loss(td.clone()), loss(cut)
        for key in ("loss_objective", "loss_critic", "loss_entropy"):
            torch.testing.assert_close(full[key], part[key])


@pytest.mark.parametrize("dist", [Normal, TanhNormal])
def test_the_direct_critic_and_actor_calls_give_the_generic_module_path_s_loss(dist) -> None:
    # ClipPPOLoss calls a StateValueCritic's network directly (StateValueCritic.value) and a
    # ProbabilisticActor's plain network directly (its get_dist): the same terms and gradients,
    # bit for bit, as the same networks wrapped in tensordict's generic modules
    actor, critic = make(dist=dist)
    generic_critic = TensorDictModule(
        critic.module, in_keys=list(critic.in_keys), out_keys=list(critic.out_keys)
    )
    head = TensorDictModule(
        actor.module[0].module,
        in_keys=[("agents", "observation")],
        out_keys=[("agents", "loc"), ("agents", "scale")],
    )
    generic_actor = ProbabilisticActor(head, group="agents", distribution_class=dist)
    td = batch()
    results = []
    for a, c in ((actor, critic), (generic_actor, generic_critic)):
        loss = ClipPPOLoss(a, c, entropy_coef=0.01)
        torch.manual_seed(5)  # the TanhNormal entropy's sample
        out = loss(td.clone())
        params = list(loss.parameters())
        grads = torch.autograd.grad(total(out), params)
        results.append((out, grads))
    (out, grads), (ref, ref_grads) = results
    for key, value in ref.items():
        assert torch.equal(out[key], value), key
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads))


def test_torchrl_names_of_the_coefficients_are_accepted() -> None:
    # TorchRL 0.14 spells them entropy_coeff and critic_coeff: code ported from it runs as is.
    actor, critic = make()
    ours = ClipPPOLoss(actor, critic, entropy_coef=0.05, critic_coef=0.5)
    theirs = ClipPPOLoss(actor, critic, entropy_coeff=0.05, critic_coeff=0.5)
    assert (theirs.entropy_coef, theirs.critic_coef) == (0.05, 0.5)
    expected, got = ours(batch()), theirs(batch())
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(got[key], expected[key])
    defaults = ClipPPOLoss(actor, critic)
    assert (defaults.entropy_coef, defaults.critic_coef) == (0.01, 1.0)
    mixed = ClipPPOLoss(actor, critic, entropy_coeff=0.0, critic_coef=2.0)
    assert (mixed.entropy_coef, mixed.critic_coef) == (0.0, 2.0)


def test_a_coefficient_under_both_names_is_refused() -> None:
    actor, critic = make()
    with pytest.raises(
        TypeError,
        match=r"ClipPPOLoss: entropy_coef=0.05 and entropy_coeff=0.02 are one coefficient under "
        r"two names \(marlkit's and TorchRL's\): pass only one",
    ):
        ClipPPOLoss(actor, critic, entropy_coef=0.05, entropy_coeff=0.02)
    with pytest.raises(TypeError, match=r"critic_coef=1.0 and critic_coeff=1.0 are one coeff"):
        ClipPPOLoss(actor, critic, critic_coef=1.0, critic_coeff=1.0)
    # The checks name the spelling that was given; TorchRL's per-head mapping is not taken.
    with pytest.raises(ValueError, match=r"critic_coeff must be a finite number >= 0, got -1"):
        ClipPPOLoss(actor, critic, critic_coeff=-1.0)
    with pytest.raises(TypeError, match=r"entropy_coeff must be a number, got dict"):
        ClipPPOLoss(actor, critic, entropy_coeff={("agents", "action"): 0.01})  # type: ignore[arg-type]
