"""Distributions, the probabilistic actor (keys, log-prob shapes, exploration mode), critics
and ValueNorm."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import ProbabilisticTensorDictSequential, TensorDictModule

from marlkit.data.exploration import set_exploration
from marlkit.modules import (
    Categorical,
    MaskedCategorical,
    MultiAgentMLP,
    Normal,
    NormalParamExtractor,
    ProbabilisticActor,
    StateValueCritic,
    TanhNormal,
    ValueNorm,
)


def obs_td(batch: tuple, n: int = 3, obs: int = 4, **extra: torch.Tensor) -> TensorDict:
    group = TensorDict({"observation": torch.randn(*batch, n, obs), **extra}, [*batch, n])
    return TensorDict({"agents": group}, list(batch))


def test_normal_log_prob_is_per_agent() -> None:
    loc, scale = torch.randn(5, 3, 2), torch.rand(5, 3, 2) + 0.1
    d = Normal(loc, scale)
    x = d.sample()
    ref = torch.distributions.Normal(loc, scale).log_prob(x).sum(-1)
    torch.testing.assert_close(d.log_prob(x), ref)
    torch.testing.assert_close(d.deterministic_sample, loc)


def test_tanh_normal_bounds_and_log_prob() -> None:
    loc, scale = torch.randn(100, 3, 2), torch.rand(100, 3, 2) + 0.1
    d = TanhNormal(loc, scale, low=-2.0, high=4.0)
    x = d.sample()
    assert bool((x > -2).all() and (x < 4).all())
    u = torch.atanh((x - 1) / 3)  # x = 1 + 3 tanh(u)
    base = torch.distributions.Normal(loc, scale).log_prob(u)
    ref = (base - torch.log(3 * (1 - torch.tanh(u) ** 2))).sum(-1)
    torch.testing.assert_close(d.log_prob(x), ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(d.deterministic_sample, 1 + 3 * torch.tanh(loc))
    with pytest.raises(ValueError, match="high > low"):
        TanhNormal(loc, scale, low=1.0, high=1.0)


def test_masked_categorical_never_samples_masked_actions() -> None:
    logits = torch.randn(200, 3, 5)
    mask = torch.rand(200, 3, 5) > 0.5
    mask[..., 0] = True
    d = MaskedCategorical(logits, mask)
    x = d.sample((20,))
    assert bool(mask.gather(-1, x.movedim(0, -1)).all())
    probs = d.probs
    assert bool((probs[~mask] == 0).all())
    torch.testing.assert_close(probs.sum(-1), torch.ones(200, 3))
    a = torch.zeros(200, 3, dtype=torch.long)
    ref = logits[..., 0] - torch.logsumexp(logits.masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(d.log_prob(a), ref)
    bad = (~mask).float().argmax(-1)
    has_bad = (~mask).any(-1)
    assert bool(torch.isinf(d.log_prob(bad)[has_bad]).all())
    greedy = d.deterministic_sample.unsqueeze(-1)
    assert bool(mask.gather(-1, greedy).all())  # the greedy action is an allowed one
    samples = d.sample((20,))  # log-probs of values with sample dims in front, as torch's
    torch.testing.assert_close(
        d.log_prob(samples), torch.distributions.Categorical(logits=d.logits).log_prob(samples)
    )
    with pytest.raises(ValueError, match="allows no action"):
        MaskedCategorical(logits, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="does not match logits"):
        MaskedCategorical(logits, mask[..., :2])


def _torchrl_scale(
    raw: torch.Tensor, bias: float = 1.0, min_val: float = 0.01, scale_lb: float = 1e-4
) -> torch.Tensor:
    """TorchRL's ``NormalParamExtractor(scale_mapping=f"biased_softplus_{bias}_{min_val}",
    scale_lb=scale_lb)`` scale, written from its source (tensordict 0.15.3, which
    ``torchrl.modules`` re-exports): ``tensordict/nn/utils.py`` ``inv_softplus`` and
    ``biased_softplus``, ``tensordict/nn/distributions/continuous.py`` ``forward``. The
    defaults are TorchRL's default mapping, ``"biased_softplus_1.0"``."""
    shift = torch.tensor(bias - min_val).expm1().clamp_min(1e-6).log().item()  # inv_softplus
    return (torch.nn.functional.softplus(raw + shift) + min_val).clamp_min(scale_lb)


def test_normal_param_extractor_reproduces_torchrl_where_its_docstring_says() -> None:
    raw = torch.tensor([-30.0, -8.0, -2.0, -0.5, 0.0, 0.3, 1.0, 4.0, 25.0])
    net_output = torch.cat([torch.zeros_like(raw), raw])  # loc, then the raw scale
    # The documented setting for TorchRL's default mapping...
    assert "``NormalParamExtractor(min_scale=0.01)`` is TorchRL's" in (
        " ".join((NormalParamExtractor.__doc__ or "").split())
    )
    _, scale = NormalParamExtractor(min_scale=0.01)(net_output)
    torch.testing.assert_close(scale, _torchrl_scale(raw))
    # ...marlkit's default is TorchRL's "biased_softplus_1.0_0.0001", not its default: the two
    # part where the scale nears its floor.
    _, ours = NormalParamExtractor()(net_output)
    torch.testing.assert_close(ours, _torchrl_scale(raw, min_val=1e-4))
    assert ours[0] < 1e-3 < 0.01 <= _torchrl_scale(raw)[0]
    # ...and any init_scale s and floor m is TorchRL's f"biased_softplus_{s}_{m}".
    _, scale = NormalParamExtractor(min_scale=0.05, init_scale=2.5)(net_output)
    torch.testing.assert_close(scale, _torchrl_scale(raw, bias=2.5, min_val=0.05))


def continuous_actor(n: int = 3) -> ProbabilisticActor:
    net = torch.nn.Sequential(MultiAgentMLP(4, 2 * 2, n, num_cells=8), NormalParamExtractor())
    return ProbabilisticActor(net, group="agents", distribution_class=TanhNormal)


@pytest.mark.parametrize("batch", [(5,), (2, 3)])
def test_actor_keys_and_log_prob_shape(batch: tuple) -> None:
    torch.manual_seed(0)  # the same draws whatever ran before in this process (xdist)
    actor = continuous_actor()
    td = actor(obs_td(batch))
    assert td["agents", "action"].shape == (*batch, 3, 2)
    assert td["agents", "action_log_prob"].shape == (*batch, 3)
    dist = actor.get_dist(td)
    # The stored log-prob scores the sample from its own pre-tanh value; scoring the action
    # again goes through atanh, which float32 rounds near the bounds (1.6e-5 apart seen).
    torch.testing.assert_close(
        dist.log_prob(td["agents", "action"]), td["agents", "action_log_prob"], rtol=1e-4, atol=1e-4
    )


def test_actor_follows_exploration_mode() -> None:
    torch.manual_seed(0)
    actor = continuous_actor()
    td = obs_td((6,))
    det = [actor(td.clone())["agents", "action"] for _ in range(2)]
    with set_exploration("deterministic"):
        d1 = actor(td.clone())["agents", "action"]
        d2 = actor(td.clone())["agents", "action"]
    torch.testing.assert_close(d1, d2)
    torch.testing.assert_close(d1, torch.tanh(actor.get_dist(td.clone()).loc))
    assert not torch.equal(det[0], det[1])  # outside any block: "random", samples
    with set_exploration("random"):
        assert not torch.equal(actor(td.clone())["agents", "action"], d1)


def test_masked_categorical_actor_reads_action_mask() -> None:
    mask = torch.zeros(50, 3, 4, dtype=torch.bool)
    mask[..., 2] = True
    td = obs_td((50,), action_mask=mask)
    actor = ProbabilisticActor(
        MultiAgentMLP(4, 4, 3, num_cells=8), group="agents", distribution_class=MaskedCategorical
    )
    out = actor(td)
    assert bool((out["agents", "action"] == 2).all())
    torch.testing.assert_close(out["agents", "action_log_prob"], torch.zeros(50, 3))
    cat = ProbabilisticActor(
        MultiAgentMLP(4, 4, 3, num_cells=8), group="agents", distribution_class=Categorical
    )
    assert cat(obs_td((2, 5)))["agents", "action_log_prob"].shape == (2, 5, 3)
    with pytest.raises(TypeError, match="is the action mask in the actor's input"):
        actor(obs_td((2,)))  # a masked actor on data without its action_mask


def test_actor_rejects_non_modules() -> None:
    with pytest.raises(TypeError, match=r"nn\.Module or a TensorDictModule"):
        ProbabilisticActor(lambda x: x, distribution_class=Normal)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no default keys"):
        ProbabilisticActor(torch.nn.Identity(), distribution_class=torch.distributions.Beta)


@pytest.mark.parametrize("kind", ["tanh_normal", "masked_categorical"])
def test_actor_get_dist_is_the_generic_sequence_s(kind: str) -> None:
    # ProbabilisticActor.get_dist calls a plain network directly: the same distribution and
    # the same parameters written into the input as tensordict's generic get_dist
    torch.manual_seed(0)
    if kind == "tanh_normal":
        actor = continuous_actor()
        td = obs_td((5,))
    else:
        actor = ProbabilisticActor(
            MultiAgentMLP(4, 5, 3, num_cells=8),
            group="agents",
            distribution_class=MaskedCategorical,
        )
        td = obs_td((5,), action_mask=torch.rand(5, 3, 5) > 0.3)
        td["agents", "action_mask"][..., 0] = True
    fast_td, generic_td = td.clone(), td.clone()
    fast = actor.get_dist(fast_td)
    generic = ProbabilisticTensorDictSequential.get_dist(actor, generic_td)
    assert type(fast) is type(generic)
    assert set(fast_td.keys(True, True)) == set(generic_td.keys(True, True))
    for key in generic_td.keys(True, True):
        assert torch.equal(fast_td[key], generic_td[key]), key
    action = generic.sample().clone()  # neither's own sample: both score it the same way
    assert torch.equal(fast.log_prob(action), generic.log_prob(action))
    with pytest.raises(KeyError, match="observation"):
        actor.get_dist(TensorDict({"agents": TensorDict({}, [5, 3])}, [5]))


def test_actor_get_dist_keeps_a_tensordict_module_network_s_path() -> None:
    # a network given as a TensorDictModule (hooks, other keys) runs through tensordict's
    # sequence, as before
    net = torch.nn.Sequential(MultiAgentMLP(4, 4, 3, num_cells=8), NormalParamExtractor())
    seen: list[str] = []
    head = TensorDictModule(
        net, in_keys=[("agents", "observation")], out_keys=[("agents", "loc"), ("agents", "scale")]
    )
    head.register_forward_hook(lambda *args: seen.append("hook"))
    actor = ProbabilisticActor(head, group="agents", distribution_class=TanhNormal)
    actor.get_dist(obs_td((5,)))
    assert seen == ["hook"]


def test_state_value_critic_value_is_what_it_writes() -> None:
    td = obs_td((2, 5))
    td.set("state", torch.randn(2, 5, 7))
    for critic in (
        StateValueCritic(3, 4, num_cells=8),
        StateValueCritic(3, 4, centralised=True, num_cells=8),
        StateValueCritic(3, state_dim=7, num_cells=8),
    ):
        before = set(td.keys(True, True))
        value = critic.value(td)
        assert set(td.keys(True, True)) == before  # not written
        assert torch.equal(value, critic(td.clone())["agents", "state_value"])
    doubled = StateValueCritic(3, 4, num_cells=8)
    doubled.register_forward_hook(lambda module, args, out: out.apply(lambda x: 2 * x))
    expected = 2 * doubled.module(td["agents", "observation"])
    assert torch.equal(doubled.value(td), expected)  # a hooked critic's value goes through it
    with pytest.raises(KeyError, match="observation"):
        doubled.value(TensorDict({}, [2, 5]))


def test_critics_local_centralised_state() -> None:
    td = obs_td((2, 5))
    td.set("state", torch.randn(2, 5, 7))
    local = StateValueCritic(3, 4, num_cells=8)
    central = StateValueCritic(3, 4, centralised=True, num_cells=8)
    state = StateValueCritic(3, state_dim=7, num_cells=8)
    for critic in (local, central, state):
        assert critic(td.clone())["agents", "state_value"].shape == (2, 5, 3, 1)
    # A centralised critic's value of agent 0 depends on agent 1's observation; a local one not.
    other = td.clone()
    other["agents", "observation"][..., 1, :] += 1.0
    v0, v1 = (
        local(td.clone())["agents", "state_value"],
        local(other.clone())["agents", "state_value"],
    )
    torch.testing.assert_close(v0[..., 0, :], v1[..., 0, :])
    c0, c1 = central(td.clone())["agents", "state_value"], central(other)["agents", "state_value"]
    assert not torch.allclose(c0[..., 0, :], c1[..., 0, :])
    with pytest.raises(ValueError, match="not both"):
        StateValueCritic(3, 4, centralised=True, state_dim=7)
    with pytest.raises(ValueError, match=r"state of shape \[\*B, 7\], got \[2, 5, 6\]"):
        td.set("state", torch.randn(2, 5, 6))
        state(td)


def test_value_norm_tracks_mean_and_std() -> None:
    torch.manual_seed(0)
    norm = ValueNorm(beta=0.9)
    data = torch.randn(4000, 3, 1) * 5 + 2
    for chunk in data.split(100):
        norm.update(chunk)
    mean, var = norm.mean_var()
    assert abs(mean.item() - 2) < 0.5 and abs(var.sqrt().item() - 5) < 0.5
    x = torch.randn(10, 1)
    torch.testing.assert_close(norm.denormalize(norm.normalize(x)), x)
    state = norm.state_dict()
    assert set(state) == {"running_mean", "running_mean_sq", "debiasing_term"}
    masked = ValueNorm()
    masked.update(torch.tensor([[1.0], [100.0]]), mask=torch.tensor([True, False]))
    torch.testing.assert_close(masked.mean_var()[0], torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"expected values of shape \[\*B, 1\], got \[3, 2\]"):
        norm.normalize(torch.zeros(3, 2))


def test_normal_param_extractor_starts_at_its_init_scale():
    _, scale = NormalParamExtractor()(torch.zeros(5, 3, 4))
    torch.testing.assert_close(scale, torch.ones(5, 3, 2))  # TorchRL's biased_softplus_1.0
    _, small = NormalParamExtractor(min_scale=0.01, init_scale=0.3)(torch.zeros(2, 2))
    torch.testing.assert_close(small, torch.full((2, 1), 0.3))
    _, floor = NormalParamExtractor(min_scale=0.01)(torch.full((2, 2), -1e4))
    assert (floor >= 0.01).all()
    with pytest.raises(ValueError, match="init_scale must exceed min_scale"):
        NormalParamExtractor(min_scale=0.5, init_scale=0.5)


@pytest.mark.parametrize("loc0", [2.0, 10.0])
def test_tanh_normal_scores_its_own_sample_exactly_where_tanh_saturates(loc0: float) -> None:
    # At loc 10 tanh rounds to 1.0 in float32: the sample's log-prob must come from its
    # pre-tanh value (torch's cached transform), not from atanh of the rounded bound.
    loc = torch.full((4, 3, 2), loc0, requires_grad=True)
    scale = torch.full((4, 3, 2), 0.5)
    torch.manual_seed(1)
    d = TanhNormal(loc, scale, low=-2.0, high=4.0)
    x = d.rsample()
    (grad,) = torch.autograd.grad(d.log_prob(x).sum(), loc)
    loc_ref = loc.detach().clone().requires_grad_()
    torch.manual_seed(1)
    base = torch.distributions.Normal(loc_ref, scale).rsample()
    ref = (
        torch.distributions.Normal(loc_ref, scale).log_prob(base)
        - 2 * (torch.log(torch.tensor(2.0)) - base - torch.nn.functional.softplus(-2 * base))
        - torch.log(torch.tensor(3.0))
    ).sum(-1)
    (grad_ref,) = torch.autograd.grad(ref.sum(), loc_ref)
    torch.testing.assert_close(d.log_prob(x), ref.detach())
    torch.testing.assert_close(grad, grad_ref)
    if loc0 == 10.0:
        assert bool((x == 4.0).all())  # saturated: the bound itself
        assert bool((grad > 0).all())  # the density rises with loc towards the bound


def test_tanh_normal_scores_other_values_through_atanh() -> None:
    loc, scale = torch.zeros(2, 1, 1), torch.ones(2, 1, 1)
    d = TanhNormal(loc, scale)
    on_bounds = d.log_prob(torch.tensor([[[1.0]], [[-1.0]]]))
    assert bool(torch.isfinite(on_bounds).all())  # moved just inside, as tanh never reaches them
    beyond = d.log_prob(torch.tensor([[[1.5]], [[0.5]]]))
    assert beyond[0].item() == float("-inf")  # a value the distribution never gives
    assert bool(torch.isfinite(beyond[1]))


def _torch_tanh_normal(
    loc: torch.Tensor, scale: torch.Tensor, low: Any, high: Any
) -> torch.distributions.Distribution:
    """torch's composition of the same distribution (what TanhNormal computes in closed form)."""
    transforms: list[Any] = [torch.distributions.TanhTransform(cache_size=1)]
    if not (isinstance(low, float) and (low, high) == (-1.0, 1.0)):
        low, high = torch.as_tensor(low), torch.as_tensor(high)
        half = (high - low) / 2
        transforms.append(torch.distributions.AffineTransform(low + half, half, cache_size=1))
    base = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(loc, scale), transforms
    )
    return torch.distributions.Independent(base, 1)


@pytest.mark.parametrize(
    "low, high",
    [
        (-1.0, 1.0),
        (-2.0, 4.0),
        (torch.full((3, 2), -1.0), torch.full((3, 2), 1.0)),
        (torch.tensor([[-1.0, -3.0]] * 3), torch.tensor([[2.0, 0.5]] * 3)),
    ],
)
def test_tanh_normal_is_torchs_composed_distribution_bit_for_bit(low: Any, high: Any) -> None:
    # TanhNormal computes in closed form what torch's Independent(TransformedDistribution(
    # Normal, [TanhTransform, AffineTransform])) does: the same samples from the same random
    # state, the same log-probs of its own samples and of other values, the same gradients
    torch.manual_seed(0)
    loc = torch.randn(50, 3, 2, requires_grad=True)
    scale = (torch.rand(50, 3, 2) + 0.1).requires_grad_()
    ours, ref = TanhNormal(loc, scale, low, high), _torch_tanh_normal(loc, scale, low, high)
    for method in ("rsample", "sample"):
        torch.manual_seed(3)
        a = getattr(ref, method)((2,))
        torch.manual_seed(3)
        b = getattr(ours, method)((2,))
        assert torch.equal(a, b)
        lp_ref, lp = ref.log_prob(a), ours.log_prob(b)
        assert torch.equal(lp_ref, lp)
        if method == "rsample":  # through the sample too
            grads = torch.autograd.grad(lp.sum(), [loc, scale])
            grads_ref = torch.autograd.grad(lp_ref.sum(), [loc, scale])
            assert all(torch.equal(x, y) for x, y in zip(grads, grads_ref))
    lo, hi = torch.as_tensor(low), torch.as_tensor(high)
    other = lo + (hi - lo) * torch.rand(50, 3, 2)
    eps = torch.finfo(torch.float32).eps  # torch's has no clamp: given values inside it
    lp_ref = ref.log_prob(other.clamp(lo + eps * (hi - lo), hi - eps * (hi - lo)))
    lp = ours.log_prob(other)
    assert torch.equal(lp_ref, lp)
    grads = torch.autograd.grad(lp.sum(), [loc, scale])
    grads_ref = torch.autograd.grad(lp_ref.sum(), [loc, scale])
    assert all(torch.equal(x, y) for x, y in zip(grads, grads_ref))
    assert ours.batch_shape == ref.batch_shape and ours.event_shape == ref.event_shape


def test_tanh_normal_names_nan_parameters_and_actions() -> None:
    loc, scale = torch.zeros(4, 3, 2), torch.ones(4, 3, 2)
    with pytest.raises(ValueError, match="scale"):
        TanhNormal(loc, scale.masked_fill(torch.rand(4, 3, 2) < 2, float("nan")))
    with pytest.raises(ValueError, match="loc"):
        TanhNormal(loc.masked_fill(torch.rand(4, 3, 2) < 2, float("nan")), scale)
    with pytest.raises(ValueError, match="NaN"):
        TanhNormal(loc, scale).log_prob(torch.full((4, 3, 2), float("nan")))


def test_tanh_normal_number_bounds_give_the_tensor_bounds_values() -> None:
    # The MAPPO script passes uniform bounds as numbers (no identity affine map per update):
    # the same samples, log-probs and greedy actions as the tensor bounds, bit for bit.
    torch.manual_seed(0)
    loc, scale = torch.randn(40, 3, 2), torch.rand(40, 3, 2) + 0.1
    tensors = TanhNormal(loc, scale, low=torch.full((3, 2), -1.0), high=torch.full((3, 2), 1.0))
    numbers = TanhNormal(loc, scale, low=-1.0, high=1.0)
    torch.manual_seed(1)
    a = tensors.rsample()
    torch.manual_seed(1)
    b = numbers.rsample()
    assert torch.equal(a, b) and torch.equal(tensors.log_prob(a), numbers.log_prob(b))
    other = torch.rand(40, 3, 2) * 1.8 - 0.9
    assert torch.equal(tensors.log_prob(other), numbers.log_prob(other))
    assert torch.equal(tensors.mean, numbers.mean)


def test_a_state_critic_with_agent_ids_gives_each_agent_its_own_value() -> None:
    """``agent_id=True`` (JaxMARL's and EPyMARL's MAPPO critic input): agent i reads
    ``cat(state, eye(n)[i])``; one shared network then values the agents apart, where the
    state alone gives every agent the same value."""
    from marlkit.modules import StateWithAgentId

    torch.manual_seed(0)
    state = torch.randn(2, 5, 7)
    td = TensorDict({"state": state}, [2, 5])
    joined = StateWithAgentId(3)(state)
    assert joined.shape == (2, 5, 3, 10)
    for i in range(3):
        assert torch.equal(joined[..., i, :7], state)
        assert torch.equal(joined[..., i, 7:], torch.eye(3)[i].expand(2, 5, 3))
    same = StateValueCritic(3, state_dim=7, num_cells=8)(td.clone())["agents", "state_value"]
    torch.testing.assert_close(same[..., 1, :], same[..., 0, :])
    critic = StateValueCritic(3, state_dim=7, agent_id=True, num_cells=8)
    value = critic(td.clone())["agents", "state_value"]
    assert torch.equal(value, critic.module.mlp(joined)) and value.shape == (2, 5, 3, 1)
    assert not torch.allclose(value[..., 1, :], value[..., 0, :])
    assert torch.equal(critic.value(td), value)  # the loss's path reads the same
    with pytest.raises(ValueError, match=r"state of shape \[\*B, 7\], got \[2, 5, 10\]"):
        critic(TensorDict({"state": joined[..., 0, :]}, [2, 5]))
    with pytest.raises(ValueError, match="agent_id=True joins the state: pass state_dim"):
        StateValueCritic(3, 4, agent_id=True)
