"""Mixed precision for the training scripts: ``train.precision=bf16``.

With ``bf16`` the agents' networks (every :class:`~marlkit.modules.MultiAgentMLP`,
:class:`~marlkit.modules.MultiAgentCNN`, :class:`~marlkit.modules.DeepSets`,
:class:`~marlkit.modules.EntityAttention`, :class:`~marlkit.modules.MultiAgentGNN`,
:class:`~marlkit.modules.MultiAgentGRU` and :class:`~marlkit.modules.MultiAgentLSTM` inside a
loss, target copies included) run their forward passes under ``torch.autocast(dtype=
torch.bfloat16)`` during the gradient steps, and their outputs come back as ``float32``; a
``MultiAgentMLP``'s output layer (its smallest) runs in ``float32`` on its bf16 input, so that
Q-values, logits and distribution parameters keep fp32's mantissa (without it QMIX's reward
on VMAS navigation fell, see ``docs/benchmarks.md``). What decides learning stays ``float32``:

* the parameters (the master weights) and the optimiser's state: autocast casts a copy of each
  weight for the matmul, the gradient lands on the ``float32`` parameter;
* everything the loss computes from the networks' outputs: log-probabilities, ratios, entropies,
  TD targets and the value loss, and QMIX's mixing (the :class:`~marlkit.modules.QMixer` is
  not a network autocast reaches: its hypernetworks and its ``bmm`` run in ``float32`` on the
  ``float32`` Q-values);
* GAE and its value targets (the scripts compute them outside the gradient steps);
* the rollout: collection runs the same modules outside :func:`autocast_scope`, in ``float32``
  (measured by ``benchmarks/precision.py``: at the recipes' 60-120 env x 3 agent batches the
  casts cost what the bf16 matmuls save).

The hooks are forward hooks on the network modules (no wrapper: a checkpoint's keys are the same
in both precisions, and a run can resume in the other one). They act only inside
:func:`autocast_scope`, which :func:`~marlkit.train.updates.gradient_steps` enters around each
loss call.

bf16 needs hardware for it to pay: on CPU the ``avx512_bf16``/``amx_bf16`` instructions (oneDNN
reports them: ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``), on CUDA
``torch.cuda.is_bf16_supported()``. Without it :func:`resolve_precision` warns once and the run
goes on in ``float32``.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Literal, get_args

import torch
from tensordict import TensorDictBase
from torch import nn

from marlkit.modules import (
    DeepSets,
    EntityAttention,
    MultiAgentCNN,
    MultiAgentGNN,
    MultiAgentGRU,
    MultiAgentLSTM,
    MultiAgentMLP,
)

__all__ = [
    "PRECISIONS",
    "Precision",
    "autocast_networks",
    "autocast_scope",
    "bf16_supported",
    "networks",
    "resolve_precision",
    "set_precision",
]

#: ``train.precision``'s values.
Precision = Literal["fp32", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)

#: The modules :func:`networks` finds: the agents' encoders, whatever the kind.
NETWORK_TYPES: tuple[type[nn.Module], ...] = (
    MultiAgentMLP,
    MultiAgentCNN,
    DeepSets,
    EntityAttention,
    MultiAgentGNN,
    MultiAgentGRU,
    MultiAgentLSTM,
)

# inside autocast_scope(): the hooks autocast
_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("marlkit_autocast", default=False)
# the device types whose fallback has been warned about (once per process)
_WARNED: set[str] = set()


def _bf16_hardware(device_type: str) -> bool:
    """Whether ``device_type`` computes bf16 in hardware (see the module notes)."""
    if device_type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if device_type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return False


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """Whether bf16 autocast on ``device`` runs on bf16 hardware (CPU: AVX512-BF16 or AMX;
    CUDA: compute capability 8.0 and later)."""
    return _bf16_hardware(torch.device(device).type)


def resolve_precision(precision: str, device: torch.device | str = "cpu") -> str:
    """The precision a run gets: ``precision`` itself, or ``"fp32"`` for ``"bf16"`` on a
    device without bf16 hardware, with a :class:`RuntimeWarning` (once per device type and
    process) that says so.

    Raises:
        ValueError: ``precision`` is not one of :data:`PRECISIONS`.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    device_type = torch.device(device).type
    if precision == "bf16" and not bf16_supported(device_type):
        if device_type not in _WARNED:
            _WARNED.add(device_type)
            warnings.warn(
                f"precision=bf16: this {device_type} has no bf16 hardware (CPU: avx512_bf16 or "
                "amx_bf16; CUDA: compute capability >= 8.0); training in fp32 instead",
                RuntimeWarning,
                stacklevel=2,
            )
        return "fp32"
    return precision


@contextlib.contextmanager
def autocast_scope() -> Iterator[None]:
    """The networks hooked by :func:`autocast_networks` autocast inside this block (and only
    there): :func:`~marlkit.train.updates.gradient_steps` wraps each loss call in it."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def networks(module: nn.Module) -> list[nn.Module]:
    """The outermost modules of :data:`NETWORK_TYPES` in ``module`` (itself included), in
    ``modules()`` order: one each, never one inside another."""
    found: list[nn.Module] = []
    prefixes: list[str] = []
    for name, sub in module.named_modules():
        if any(name.startswith(prefix) for prefix in prefixes):
            continue  # inside a network found already
        if isinstance(sub, NETWORK_TYPES):
            found.append(sub)
            prefixes.append(f"{name}." if name else "")
    return found


def _to_float(value: Any) -> Any:
    """``value`` (a tensor, a TensorDict written in place, or a tuple or list of them) with its
    bf16 tensors as float32."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype == torch.bfloat16 else value
    if isinstance(value, TensorDictBase):
        for key, item in list(value.items(include_nested=True, leaves_only=True)):
            if isinstance(item, torch.Tensor) and item.dtype == torch.bfloat16:
                value.set(key, item.float())
        return value
    if isinstance(value, tuple | list):
        return type(value)(_to_float(v) for v in value)
    return value


class _AutocastHook:
    """The pre- and post-forward hooks of one network: autocast on (inside
    :func:`autocast_scope`) before its forward, off after it, its bf16 outputs cast to
    float32. A class (not a closure), so that hooked modules pickle and deep-copy."""

    def __init__(self, device_type: str):
        self.device_type = device_type
        self._open: list[Any] = []

    def __getstate__(self) -> dict[str, Any]:
        return {"device_type": self.device_type}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.device_type = state["device_type"]
        self._open = []

    def before(self, module: nn.Module, args: Any) -> None:
        if not _ACTIVE.get():
            self._open.append(None)
            return
        context = torch.autocast(self.device_type, dtype=torch.bfloat16)
        context.__enter__()
        self._open.append(context)

    def after(self, module: nn.Module, args: Any, output: Any) -> Any:
        if not self._open:  # the forward hook of a call whose pre-hook did not run
            return None
        context = self._open.pop()
        if context is None:
            return None
        context.__exit__(None, None, None)
        return _to_float(output)


class _Fp32Hook:
    """The hooks of a :class:`~marlkit.modules.MultiAgentMLP`'s output layer: where autocast is
    on, the layer runs with it off, on its input cast to float32, so the values, logits and
    distribution parameters leave the network with fp32's mantissa (their rounding to bf16 is
    what decides an argmax over Q-values or a log-probability; the layer is the network's
    smallest)."""

    def __init__(self, device_type: str):
        self.device_type = device_type
        self._open: list[Any] = []

    def __getstate__(self) -> dict[str, Any]:
        return {"device_type": self.device_type}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.device_type = state["device_type"]
        self._open = []

    def before(self, module: nn.Module, args: Any) -> Any:
        if not torch.is_autocast_enabled(self.device_type):
            self._open.append(None)
            return None
        context = torch.autocast(self.device_type, enabled=False)
        context.__enter__()
        self._open.append(context)
        return _to_float(tuple(args))

    def after(self, module: nn.Module, args: Any, output: Any) -> None:
        context = self._open.pop() if self._open else None
        if context is not None:
            context.__exit__(None, None, None)


def autocast_networks(module: nn.Module, device: torch.device | str = "cpu") -> list[nn.Module]:
    """Hook every network of ``module`` (:func:`networks`) to run in bf16 autocast on
    ``device``'s type inside :func:`autocast_scope`, its outputs returned as float32. A network
    hooked before is left as it is.

    Returns:
        the networks hooked now.
    """
    device_type = torch.device(device).type
    hooked = []
    for network in networks(module):
        if getattr(network, "_marlkit_autocast", None) is not None:
            continue
        hook = _AutocastHook(device_type)
        network.register_forward_pre_hook(hook.before)
        network.register_forward_hook(hook.after, always_call=True)
        network._marlkit_autocast = hook  # type: ignore[assignment]
        if isinstance(network, MultiAgentMLP):  # its output layer in fp32
            head, fp32 = network.layers[-1], _Fp32Hook(device_type)
            head.register_forward_pre_hook(fp32.before)
            head.register_forward_hook(fp32.after, always_call=True)
        hooked.append(network)
    return hooked


def set_precision(
    modules: nn.Module | Iterable[nn.Module], precision: str, device: torch.device | str = "cpu"
) -> str:
    """A training script's ``train.precision``: for ``bf16`` (on bf16 hardware),
    :func:`autocast_networks` on each of ``modules`` (the losses: their online and target
    networks); ``fp32`` changes nothing.

    Returns:
        the precision the run trains in (``fp32`` where bf16 fell back, see
        :func:`resolve_precision`).

    Raises:
        ValueError: an unknown ``precision``.

    Examples:
        >>> import torch
        >>> from marlkit.modules import MultiAgentMLP
        >>> mlp = MultiAgentMLP(4, 2, n_agents=3, share_params=True, num_cells=8)
        >>> precision = set_precision(mlp, "bf16")  # "fp32" on a CPU without bf16
        >>> with autocast_scope():
        ...     out = mlp(torch.randn(5, 3, 4))
        >>> out.dtype, mlp.layers[0].weight.dtype
        (torch.float32, torch.float32)
    """
    effective = resolve_precision(precision, device)
    if effective == "bf16":
        for module in [modules] if isinstance(modules, nn.Module) else modules:
            autocast_networks(module, device)
    return effective
