"""``Tanh``: ``nn.Tanh`` through whichever of two exact-to-2e-7 routes is fast on this machine.

PyTorch's CPU ``float32`` ``tanh`` is MKL's vector ``vsTanh`` (torch builds for x86 link
MKL). MKL picks its code path by CPU vendor: on Intel CPUs it runs a vectorised kernel, on
every other vendor a generic one about 8x slower. Measured on a ``[1200, 256]`` ``float32``
tensor, 1 thread, torch 2.13: 0.09 ms on an Intel Xeon (AVX-512), 0.79 ms on the same machine
with ``MKL_CBWR=COMPATIBLE`` (MKL's generic path), and 0.8-0.9 ms on the AMD EPYC machines the
project was first measured on; ``sigmoid`` is torch's own vectorised exponential, 0.12-0.13
ms on both. So the identity ``tanh(x) = 2 sigmoid(2x) - 1`` is 3-4x faster than ``torch.tanh``
where MKL takes its generic path, and 2.4x slower where it does not
(``benchmarks/modules.py --only activation``, ``docs/benchmarks.md``).

:func:`fast_tanh` therefore has two methods, chosen once per process:

* ``"torch"``: ``torch.tanh`` itself (error ``3e-8`` against ``float64``);
* ``"sigmoid"``: ``2 * sigmoid(2 x) - 1``, the backward torch's own ``tanh_backward`` from
  the saved output, as ``torch.tanh``'s is. The price is precision near zero: the result is
  within ``2e-7`` of the exact ``tanh`` everywhere, an absolute error, so for ``|x|`` below
  ``1e-6`` the relative error grows (``tanh(1e-8)`` comes out ``0``). For a hidden activation
  followed by a linear layer that is below the layer's own rounding.

``"auto"`` (the default, or the environment variable ``MARLKIT_TANH=auto|torch|sigmoid``)
picks ``"sigmoid"`` when torch was built with MKL and the CPU is an x86 one whose vendor is not
Intel (MKL's generic path), else ``"torch"``; :func:`set_tanh_method` fixes the method for the
process and :func:`get_tanh_method` says which one runs. Other dtypes and devices, and code
being traced by ``torch.compile`` (whose generated kernels have their own vectorised ``tanh``),
always run ``torch.tanh``.
"""

from __future__ import annotations

import os
import platform
from typing import Any, Literal

import torch
from torch import nn

from marlkit._checks import check_one_of

__all__ = [
    "ACTIVATIONS",
    "Tanh",
    "activation_class",
    "fast_tanh",
    "get_tanh_method",
    "set_tanh_method",
]

TanhMethod = Literal["torch", "sigmoid"]
_CHOICES = ("auto", "torch", "sigmoid")
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")
#: The resolved method; ``None`` until the first call (or after ``set_tanh_method("auto")``).
_method: TanhMethod | None = None


def _cpu_vendor() -> str | None:
    """The CPU's vendor string (``"GenuineIntel"``, ``"AuthenticAMD"``, ...), or ``None``."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    for vendor in ("GenuineIntel", "AuthenticAMD", "HygonGenuine", "CentaurHauls"):
        if vendor in platform.processor():  # Windows names the vendor here
            return vendor
    return None


def _auto_method() -> TanhMethod:
    """``"sigmoid"`` where ``torch.tanh`` runs MKL's generic (slow) path: an MKL build of
    torch on an x86 CPU whose vendor is known and not Intel; ``"torch"`` everywhere else."""
    if not torch.backends.mkl.is_available():
        return "torch"  # no MKL: torch's own vectorised (SLEEF) tanh
    if platform.machine().lower() not in _X86:
        return "torch"
    vendor = _cpu_vendor()
    return "sigmoid" if vendor is not None and vendor != "GenuineIntel" else "torch"


def _resolve(method: str, source: str) -> TanhMethod:
    check_one_of(source, method, _CHOICES)
    return _auto_method() if method == "auto" else method  # type: ignore[return-value]


def set_tanh_method(method: str) -> None:
    """Fix how :func:`fast_tanh` (and so :class:`Tanh`) computes CPU ``float32`` ``tanh`` in
    this process: ``"torch"``, ``"sigmoid"`` or ``"auto"`` (the rule of the module's notes).
    Worker processes started later read ``MARLKIT_TANH`` instead; set that to carry the choice.

    Raises:
        TypeError: ``method`` is not a string.
        ValueError: any other string.
    """
    global _method
    if not isinstance(method, str):
        raise TypeError(f"the tanh method must be a str, got {type(method).__name__}")
    _method = _resolve(method, "the tanh method")


def get_tanh_method() -> TanhMethod:
    """The method :func:`fast_tanh` uses for CPU ``float32`` tensors: ``"torch"`` or
    ``"sigmoid"`` (resolved from ``MARLKIT_TANH``, default ``"auto"``, on first use).

    Raises:
        ValueError: ``MARLKIT_TANH`` holds something other than ``auto``, ``torch`` or
            ``sigmoid``.

    Examples:
        >>> from marlkit.modules import get_tanh_method
        >>> get_tanh_method() in ("torch", "sigmoid")
        True
    """
    global _method
    if _method is None:
        _method = _resolve(os.environ.get("MARLKIT_TANH", "auto").strip().lower(), "MARLKIT_TANH")
    return _method


def _sigmoid_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid_(x.mul(2.0)).mul_(2.0).sub_(1.0)


class _SigmoidTanh(torch.autograd.Function):
    """``tanh`` forward through ``sigmoid``; the backward from the saved output, as torch's.
    Written in the ``setup_context`` form with a generated vmap rule, so ``torch.func``
    transforms (``grad``, ``vmap``, ``jacrev``) run through it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return _sigmoid_tanh(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def fast_tanh(x: torch.Tensor) -> torch.Tensor:
    """``tanh(x)``: for a CPU ``float32`` tensor by this process's method
    (:func:`get_tanh_method`: ``torch.tanh`` or ``2 * sigmoid(2 x) - 1``, see the module's notes
    on speed and precision), ``torch.tanh(x)`` otherwise. Differentiable; the input is never
    written.

    Examples:
        >>> import torch
        >>> from marlkit.modules import fast_tanh
        >>> x = torch.linspace(-4, 4, 9)
        >>> bool((fast_tanh(x) - torch.tanh(x)).abs().max() < 2e-7)
        True
    """
    if (
        x.dtype != torch.float32
        or x.device.type != "cpu"
        or torch.compiler.is_compiling()
        or (_method or get_tanh_method()) == "torch"
    ):
        return torch.tanh(x)
    if x.requires_grad and torch.is_grad_enabled():
        return _SigmoidTanh.apply(x)
    return _sigmoid_tanh(x)


class Tanh(nn.Tanh):
    """``nn.Tanh`` through :func:`fast_tanh`: the default activation of marlkit's MLPs
    (:class:`~marlkit.modules.MultiAgentMLP` and the critics built on it).

    A subclass of ``nn.Tanh``, so code that looks for ``nn.Tanh`` layers still finds it; pass
    ``activation=torch.nn.Tanh`` to a module for torch's own ``tanh``.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # nn.Tanh's argument name
        return fast_tanh(input)


#: the names an ``activation`` setting takes (the training scripts' ``policy.activation`` and
#: ``critic.activation``, :attr:`ModelConfig.activation <marlkit.modules.ModelConfig.activation>`)
ACTIVATIONS: tuple[str, ...] = ("tanh", "relu", "elu", "leaky_relu")
_CLASSES: dict[str, type[nn.Module]] = {
    "tanh": Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
}


def activation_class(name: str, *, key: str = "activation") -> type[nn.Module]:
    """The activation class a setting names: ``"tanh"`` marlkit's :class:`Tanh` (the default of
    every network), ``"relu"`` ``nn.ReLU`` (EPyMARL's agents and critics), ``"elu"``
    ``nn.ELU``, ``"leaky_relu"`` ``nn.LeakyReLU`` (torch's default slope, 0.01).

    Raises:
        ValueError: another name; the message names ``key``, e.g. ``"policy.activation must be
            one of ['tanh', 'relu', 'elu', 'leaky_relu'], got 'relo'. Did you mean: relu?"``.

    Examples:
        >>> activation_class("relu")
        <class 'torch.nn.modules.activation.ReLU'>
        >>> activation_class("tanh").__name__
        'Tanh'
    """
    return _CLASSES[check_one_of(key, name, ACTIVATIONS)]
