"""``marlkit.modules.Tanh`` / ``fast_tanh``: torch's ``tanh`` within 2e-7, its gradient, and torch's
own ``tanh`` wherever the sigmoid route does not apply; how the method is chosen."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from marlkit.modules import (
    ACTIVATIONS,
    MultiAgentMLP,
    StateValueCritic,
    Tanh,
    activation_class,
    activations,
    fast_tanh,
    get_tanh_method,
    set_tanh_method,
)
from marlkit.modules.activations import _SigmoidTanh


@pytest.fixture(autouse=True)
def _restore_method() -> Iterator[None]:
    saved = activations._method
    yield
    activations._method = saved


@pytest.fixture
def sigmoid() -> None:
    set_tanh_method("sigmoid")


@pytest.fixture(params=["torch", "sigmoid"])
def method(request: pytest.FixtureRequest) -> str:
    set_tanh_method(request.param)
    return str(request.param)


def test_values_within_2e7_of_exact_tanh(method: str) -> None:
    torch.manual_seed(0)
    x = torch.cat([torch.linspace(-30, 30, 200_001), torch.randn(200_000) * 0.3])
    exact = torch.tanh(x.double())
    err = (fast_tanh(x).double() - exact).abs().max().item()
    assert err < 2e-7
    if method == "sigmoid":
        assert err > 1e-7  # the sigmoid route, not torch.tanh (whose error here is ~3e-8)
    else:
        assert torch.equal(fast_tanh(x), torch.tanh(x))


def test_special_values(method: str) -> None:
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, 1e30, -1e30, 88.0, -88.0])
    out = fast_tanh(x)
    torch.testing.assert_close(
        out,
        torch.tensor([1.0, -1.0, float("nan"), 0.0, 1.0, -1.0, 1.0, -1.0]),
        equal_nan=True,
        rtol=0,
        atol=0,
    )
    assert out.abs().le(1).logical_or(out.isnan()).all()


def test_input_is_not_written_and_strided_inputs_work(method: str) -> None:
    x = torch.randn(4, 6, 5).transpose(0, 2)  # not contiguous
    before = x.clone()
    out = fast_tanh(x)
    torch.testing.assert_close(x, before, rtol=0, atol=0)
    torch.testing.assert_close(out, torch.tanh(x), rtol=0, atol=2e-7)


def test_gradient_matches_torch_tanh(method: str) -> None:
    torch.manual_seed(1)
    x = (torch.randn(64, 32) * 2).requires_grad_()
    g = torch.randn(64, 32)
    (grad_fast,) = torch.autograd.grad(fast_tanh(x), x, g)
    (grad_torch,) = torch.autograd.grad(torch.tanh(x), x, g)
    torch.testing.assert_close(grad_fast, grad_torch, rtol=0, atol=2e-6)


def test_function_passes_gradcheck_and_gradgradcheck() -> None:
    # float64 inputs take torch.tanh through fast_tanh; the autograd function itself is checked
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_SigmoidTanh.apply, (x,))
    assert torch.autograd.gradgradcheck(_SigmoidTanh.apply, (x,))


def test_saved_output_modified_in_place_is_caught(method: str) -> None:
    x = torch.randn(8, requires_grad=True)
    y = fast_tanh(x)
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_other_dtypes_run_torch_tanh_exactly(dtype: torch.dtype, sigmoid: None) -> None:
    x = torch.randn(100).to(dtype)
    assert torch.equal(fast_tanh(x), torch.tanh(x))


def test_no_grad_and_grad_free_inputs_skip_the_autograd_function(sigmoid: None) -> None:
    x = torch.randn(10, requires_grad=True)
    with torch.no_grad():
        assert fast_tanh(x).grad_fn is None
    assert fast_tanh(torch.randn(10)).grad_fn is None
    assert type(fast_tanh(x).grad_fn).__name__ == "_SigmoidTanhBackward"


def test_module_is_an_nn_tanh_and_the_mlp_default() -> None:
    assert isinstance(Tanh(), nn.Tanh)
    mlp = MultiAgentMLP(3, 2, 4, num_cells=8)
    assert all(type(a) is Tanh for a in mlp.activations)
    critic_mlp = StateValueCritic(4, 3, num_cells=8).module
    assert all(type(a) is Tanh for a in critic_mlp.activations)
    plain = MultiAgentMLP(3, 2, 4, num_cells=8, activation=nn.Tanh)
    assert all(type(a) is nn.Tanh for a in plain.activations)


def test_mlp_with_fast_tanh_matches_torch_tanh_mlp(method: str) -> None:
    torch.manual_seed(2)
    fast = MultiAgentMLP(5, 3, 4, num_cells=64)
    plain = MultiAgentMLP(5, 3, 4, num_cells=64, activation=nn.Tanh)
    plain.load_state_dict(fast.state_dict())
    x = torch.randn(32, 4, 5)
    torch.testing.assert_close(fast(x), plain(x), rtol=0, atol=1e-5)


def test_torch_func_transforms_run_through_it(method: str) -> None:
    torch.manual_seed(3)
    x = torch.randn(3, 4)
    exact = 1 - torch.tanh(x) ** 2
    grad = torch.func.vmap(torch.func.grad(lambda t: fast_tanh(t).sum()))(x)
    torch.testing.assert_close(grad, exact, rtol=0, atol=1e-6)
    jac = torch.func.jacrev(fast_tanh)(x[0])
    torch.testing.assert_close(jac, torch.diag(exact[0]), rtol=0, atol=1e-6)


def test_torch_method_runs_torch_tanh_itself() -> None:
    set_tanh_method("torch")
    assert get_tanh_method() == "torch"
    x = torch.randn(50, requires_grad=True)
    assert type(fast_tanh(x).grad_fn).__name__ == "TanhBackward0"
    assert torch.equal(Tanh()(x), torch.tanh(x))


def test_auto_takes_the_sigmoid_route_only_where_mkl_runs_its_generic_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def rule(mkl: bool, machine: str, vendor: str | None) -> str:
        monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)
        monkeypatch.setattr(activations.platform, "machine", lambda: machine)
        monkeypatch.setattr(activations, "_cpu_vendor", lambda: vendor)
        set_tanh_method("auto")
        return get_tanh_method()

    assert rule(True, "x86_64", "AuthenticAMD") == "sigmoid"
    assert rule(True, "AMD64", "HygonGenuine") == "sigmoid"
    assert rule(True, "x86_64", "GenuineIntel") == "torch"
    assert rule(True, "x86_64", None) == "torch"  # unknown vendor: no guess
    assert rule(False, "x86_64", "AuthenticAMD") == "torch"  # no MKL: torch's own tanh
    assert rule(True, "aarch64", None) == "torch"


def test_this_machines_vendor_is_read() -> None:
    vendor = activations._cpu_vendor()
    if os.path.exists("/proc/cpuinfo") and activations.platform.machine() == "x86_64":
        assert vendor in ("GenuineIntel", "AuthenticAMD", "HygonGenuine", "CentaurHauls")
    assert get_tanh_method() in ("torch", "sigmoid")


@pytest.mark.parametrize("bad", ["fast", "", "TORCH "])
def test_bad_methods_are_refused_and_change_nothing(bad: str) -> None:
    set_tanh_method("sigmoid")
    with pytest.raises(
        ValueError, match=r"the tanh method must be one of \['auto', 'torch', 'sigmoid'\]"
    ):
        set_tanh_method(bad)
    with pytest.raises(TypeError, match="must be a str, got int"):
        set_tanh_method(1)  # type: ignore[arg-type]
    assert get_tanh_method() == "sigmoid"


def _method_in_subprocess(value: str) -> subprocess.CompletedProcess[str]:
    code = "from marlkit.modules import get_tanh_method; print(get_tanh_method())"
    env = {**os.environ, "MARLKIT_TANH": value}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_environment_variable_sets_the_method_of_a_new_process() -> None:
    for value in ("sigmoid", "torch"):  # both, so one of them differs from this machine's auto
        proc = _method_in_subprocess(value)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == value


def test_environment_variable_is_read_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """The values a new process may find (the subprocess test above shows it reads them)."""
    for value, expected in ((" Torch", "torch"), ("SIGMOID", "sigmoid"), ("auto", None)):
        monkeypatch.setenv("MARLKIT_TANH", value)
        monkeypatch.setattr(activations, "_method", None)  # a process that has not used it yet
        assert get_tanh_method() == (expected or activations._auto_method())
    monkeypatch.setenv("MARLKIT_TANH", "fastest")
    monkeypatch.setattr(activations, "_method", None)
    with pytest.raises(
        ValueError,
        match=r"MARLKIT_TANH must be one of \['auto', 'torch', 'sigmoid'\], got 'fastest'",
    ):
        get_tanh_method()


def test_activation_class_maps_each_name_to_its_class_and_refuses_others() -> None:
    """What a config's ``activation`` names (issue 37: EPyMARL's networks use ReLU)."""
    classes = {name: activation_class(name) for name in ACTIVATIONS}
    assert classes == {"tanh": Tanh, "relu": nn.ReLU, "elu": nn.ELU, "leaky_relu": nn.LeakyReLU}
    mlp = MultiAgentMLP(4, 2, 3, depth=2, num_cells=8, activation=activation_class("relu"))
    assert [type(a) for a in mlp.activations] == [nn.ReLU, nn.ReLU]
    with pytest.raises(
        ValueError,
        match=r"policy.activation must be one of \['tanh', 'relu', 'elu', 'leaky_relu'\], got "
        r"'relo'. Did you mean: relu\?",
    ):
        activation_class("relo", key="policy.activation")
    with pytest.raises(ValueError, match=r"^activation must be one of"):
        activation_class("ReLU")  # the names are lower case, as the configs write them
