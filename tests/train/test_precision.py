"""train.precision=bf16: the networks autocast in the gradient steps, everything that decides
learning stays fp32, and a CPU without bf16 falls back with a warning."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from marlkit.modules import (
    MultiAgentMLP,
    NormalParamExtractor,
    ProbabilisticActor,
    QMixer,
    QValueActor,
    StateValueCritic,
    TanhNormal,
)
from marlkit.objectives import ClipPPOLoss, QMixerLoss, SoftUpdate
from marlkit.train import gradient_steps
from marlkit.train import precision as prec
from marlkit.train.config import ConfigError, TrainConfig, check_config
from marlkit.train.precision import autocast_scope, networks, resolve_precision, set_precision

needs_bf16 = pytest.mark.skipif(
    not prec.bf16_supported("cpu"), reason="this CPU has no bf16 hardware (avx512_bf16/amx)"
)

N, OBS, ACT, ROWS = 3, 6, 2, 64


def _ppo_loss() -> ClipPPOLoss:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        MultiAgentMLP(OBS, 2 * ACT, N, share_params=True, num_cells=64), NormalParamExtractor()
    )
    actor = ProbabilisticActor(net, group="agents", distribution_class=TanhNormal)
    critic = StateValueCritic(N, OBS, centralised=True, num_cells=64)
    return ClipPPOLoss(actor, critic, entropy_coef=0.0)  # entropy: a sample, not compared


def _ppo_batch() -> TensorDict:
    g = torch.Generator().manual_seed(1)
    shape = (ROWS, N)
    group = TensorDict(
        {
            "observation": torch.randn(*shape, OBS, generator=g),
            "action": torch.rand(*shape, ACT, generator=g) * 1.8 - 0.9,
            "action_log_prob": torch.randn(*shape, generator=g) - 1,
            "advantage": torch.randn(*shape, 1, generator=g),
            "value_target": torch.randn(*shape, 1, generator=g),
        },
        list(shape),
    )
    return TensorDict({"agents": group}, [ROWS])


def _qmix_loss() -> QMixerLoss:
    torch.manual_seed(0)
    q_net = MultiAgentMLP(OBS, 5, N, share_params=True, num_cells=64)
    mixer = QMixer([N, OBS], 16, N, state_key=("agents", "observation"))
    return QMixerLoss(QValueActor(q_net, n_actions=5), mixer, gamma=0.9, delay_value=True)


def _qmix_batch() -> TensorDict:
    g = torch.Generator().manual_seed(2)
    td = TensorDict(
        {
            "agents": TensorDict(
                {
                    "observation": torch.randn(ROWS, N, OBS, generator=g),
                    "action": torch.randint(5, (ROWS, N), generator=g),
                },
                [ROWS, N],
            ),
            "next": TensorDict(
                {
                    "agents": TensorDict(
                        {
                            "observation": torch.randn(ROWS, N, OBS, generator=g),
                            "reward": torch.randn(ROWS, N, 1, generator=g),
                        },
                        [ROWS, N],
                    ),
                    "terminated": torch.rand(ROWS, 1, generator=g) < 0.1,
                    "done": torch.zeros(ROWS, 1, dtype=torch.bool),
                },
                [ROWS],
            ),
        },
        [ROWS],
    )
    td["next", "done"] = td["next", "terminated"].clone()
    return td


def _dtypes_inside(module: torch.nn.Module) -> list[torch.dtype]:
    """The output dtypes of ``module``'s first MultiAgentMLP layer, recorded while it runs."""
    seen: list[torch.dtype] = []
    layer = networks(module)[0].layers[0]
    layer.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    return seen


# --------------------------------------------------------------------------------- config
def test_train_precision_is_checked_and_named():
    cfg = OmegaConf.merge(
        OmegaConf.structured(TrainConfig),
        {"minibatch_size": 8, "lr": 1e-3, "max_grad_norm": 1.0},
    )
    assert cfg.precision == "fp32"  # the default: nothing changes for existing configs
    cfg.precision = "bf16"
    check_config(OmegaConf.create({"train": cfg}))
    cfg.precision = "fp16"
    with pytest.raises(
        ConfigError, match=r"train\.precision must be one of \['fp32', 'bf16'\], got 'fp16'"
    ):
        check_config(OmegaConf.create({"train": cfg}))


def test_resolve_precision_refuses_an_unknown_one():
    with pytest.raises(
        ValueError, match=r"precision must be one of \['fp32', 'bf16'\], got 'half'"
    ):
        resolve_precision("half")
    with pytest.raises(ValueError, match="precision must be one of"):
        set_precision(torch.nn.Linear(2, 2), "float16")


# ------------------------------------------------------------------------------- fallback
def test_no_bf16_hardware_warns_once_and_trains_in_fp32(monkeypatch):
    monkeypatch.setattr(prec, "_bf16_hardware", lambda device_type: False)
    monkeypatch.setattr(prec, "_WARNED", set())
    loss = _ppo_loss()
    with pytest.warns(RuntimeWarning, match="precision=bf16: this cpu has no bf16 hardware"):
        assert set_precision(loss, "bf16") == "fp32"
    assert not any(hasattr(m, "_marlkit_autocast") for m in loss.modules())  # nothing hooked
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: the second run stays quiet
        assert set_precision(_ppo_loss(), "bf16") == "fp32"
    seen = _dtypes_inside(loss)
    with autocast_scope():
        loss(_ppo_batch())
    assert seen and set(seen) == {torch.float32}
    assert set_precision(_ppo_loss(), "fp32") == "fp32"  # fp32 asks nothing of the hardware


# ------------------------------------------------------------------------------ the hooks
@needs_bf16
def test_networks_autocast_only_inside_the_scope_and_return_fp32():
    loss = _ppo_loss()
    assert set_precision(loss, "bf16") == "bf16"
    # the actor's MLP and the critic's: outermost networks only, none twice
    assert len(networks(loss)) == 2
    assert all(isinstance(m, MultiAgentMLP) for m in networks(loss))
    seen = _dtypes_inside(loss)
    actor = loss.actor_network
    td = _ppo_batch()
    actor(td)  # collection: outside the scope, fp32
    assert seen == [torch.float32]
    with autocast_scope():
        actor(td)
    assert seen[-1] == torch.bfloat16  # the matmul ran in bf16 ...
    assert td["agents", "loc"].dtype == torch.float32  # ... what leaves the network is fp32
    assert td["agents", "action_log_prob"].dtype == torch.float32
    assert not torch.is_autocast_enabled("cpu")  # nothing left on after the forward


@needs_bf16
def test_an_mlps_output_layer_runs_in_fp32_on_its_bf16_input():
    mlp = MultiAgentMLP(OBS, 5, N, share_params=True, num_cells=32)
    set_precision(mlp, "bf16")
    seen: dict[str, torch.dtype] = {}
    mlp.layers[-2].register_forward_hook(lambda m, a, out: seen.update(hidden=out.dtype))
    mlp.layers[-1].register_forward_hook(lambda m, a, out: seen.update(head=out.dtype))
    x = torch.randn(16, N, OBS)
    with autocast_scope():
        out = mlp(x)
    assert seen == {"hidden": torch.bfloat16, "head": torch.float32}
    assert not torch.is_autocast_enabled("cpu")
    # elementwise, a network's outputs (about 0.1-1 here) are within 1e-2 of fp32's
    torch.testing.assert_close(out, mlp(x), rtol=RTOL, atol=1e-2)


@needs_bf16
def test_a_failing_forward_leaves_autocast_off():
    mlp = MultiAgentMLP(OBS, 2, N, num_cells=8)
    set_precision(mlp, "bf16")
    with autocast_scope(), pytest.raises(ValueError, match="MultiAgentMLP input"):
        mlp(torch.randn(4, N + 1, OBS))  # wrong agent count
    assert not torch.is_autocast_enabled("cpu")
    with autocast_scope():
        assert mlp(torch.randn(4, N, OBS)).dtype == torch.float32


@needs_bf16
def test_hooking_twice_hooks_once_and_hooked_networks_pickle_and_copy():
    mlp = MultiAgentMLP(OBS, 2, N, num_cells=8)
    assert prec.autocast_networks(mlp) == [mlp]
    assert prec.autocast_networks(mlp) == []
    x = torch.randn(4, N, OBS)
    for clone in (pickle.loads(pickle.dumps(mlp)), copy.deepcopy(mlp)):
        seen = _dtypes_inside(clone)
        with autocast_scope():
            out = clone(x)
        assert seen == [torch.bfloat16] and out.dtype == torch.float32
        torch.testing.assert_close(out, mlp(x), atol=0.05, rtol=0.05)


# ----------------------------------------------------------------------------------- losses
#: bf16 keeps 8 bits of mantissa (relative rounding 2**-9 ~ 0.2 %) per matmul; through two
#: hidden layers of 64 and the loss maths in fp32, the loss terms stay within 2 % of fp32's
#: (measured: < 0.5 % on these minibatches).
RTOL, ATOL = 2e-2, 1e-3


@needs_bf16
def test_ppo_loss_in_bf16_is_finite_and_close_to_fp32():
    fp32 = _ppo_loss()
    bf16 = copy.deepcopy(fp32)
    set_precision(bf16, "bf16")
    batch = _ppo_batch()
    ref = fp32(batch.clone())
    with autocast_scope():
        low = bf16(batch.clone())
    for name in ("loss_objective", "loss_critic", "kl_approx", "clip_fraction"):
        assert low[name].dtype == torch.float32, name
        assert torch.isfinite(low[name]), name
        torch.testing.assert_close(low[name], ref[name], rtol=RTOL, atol=ATOL, msg=name)
    assert not torch.equal(low["loss_critic"], ref["loss_critic"])  # bf16 did run


@needs_bf16
def test_qmix_loss_in_bf16_mixes_in_fp32_and_is_close_to_fp32():
    fp32 = _qmix_loss()
    bf16 = copy.deepcopy(fp32)
    set_precision(bf16, "bf16")
    # the Q-networks (online and target) autocast; the mixers are no network of autocast
    assert len(networks(bf16)) == 2
    assert not any(isinstance(m, QMixer) for m in networks(bf16))
    mixed: list[torch.dtype] = []
    bf16.mixer_network.hyper_w_1.register_forward_hook(lambda m, a, out: mixed.append(out.dtype))
    batch = _qmix_batch()
    ref = fp32(batch.clone())
    with autocast_scope():
        low = bf16(batch.clone())
    assert mixed and set(mixed) == {torch.float32}
    assert torch.isfinite(low["loss"])
    torch.testing.assert_close(low["loss"], ref["loss"], rtol=RTOL, atol=ATOL)


@needs_bf16
@pytest.mark.parametrize("which", ["ppo", "qmix"])
def test_gradients_and_adam_state_stay_fp32(which):
    loss = _ppo_loss() if which == "ppo" else _qmix_loss()
    batch = _ppo_batch() if which == "ppo" else _qmix_batch()
    set_precision(loss, "bf16")
    seen = _dtypes_inside(loss)
    params = list(getattr(loss, "online_parameters", loss.parameters)())
    optim = torch.optim.Adam(params, lr=1e-3, fused=True)
    before = [p.detach().clone() for p in params]
    objective = (
        (lambda t: t["loss_objective"] + t["loss_critic"])
        if which == "ppo"
        else (lambda t: t["loss"])
    )
    after = SoftUpdate(loss, tau=0.01).step if which == "qmix" else None
    terms = gradient_steps(
        loss, optim, lambda: batch, 2, max_grad_norm=1.0, objective=objective, after_step=after
    )
    assert torch.bfloat16 in seen  # gradient_steps runs the loss inside the scope
    assert all(torch.isfinite(torch.tensor(v)) for v in terms.values())
    for p in params:
        assert p.dtype == torch.float32 and p.grad is not None
        assert p.grad.dtype == torch.float32
    assert any(not torch.equal(p, p0) for p, p0 in zip(params, before))  # it learned
    state = [t for s in optim.state.values() for t in s.values() if t.is_floating_point()]
    assert state and all(t.dtype == torch.float32 for t in state if t.numel() > 1)
