"""Gymnasium spaces as marlkit specs, and values between the two.

``spec_from_space(space, batch_shape)`` maps:

=====================  =======================================================
``Box``                ``Bounded`` when every bound is finite, else ``Unbounded``;
                       a bool Box gives bool ``Binary`` (``Categorical(2)`` if 0-d);
                       uint16/32/64 are held as int32/int64 (torch cannot compare them)
``Discrete(n, start)`` ``Categorical(n)`` (values shifted by ``start``)
``MultiDiscrete``      ``MultiCategorical(nvec)`` (values shifted by ``start``)
``MultiBinary(n)``     ``Binary(n)``
``Dict``               ``Composite`` with the same keys
``Tuple``              ``Composite`` with keys ``"0"``, ``"1"``, ...
=====================  =======================================================

Spaces of the legacy ``gym`` package (VMAS still uses it) map the same way, without Gymnasium.

``to_tensor(space, value, ...)`` turns a simulator value into a tensor (or a dict of tensors for
Dict/Tuple) in spec terms; ``to_space(space, tensor)`` turns an action back into what the
simulator expects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from marlkit._utils import import_optional
from marlkit.data.composite import Composite
from marlkit.data.specs import Binary, Bounded, Categorical, MultiCategorical, TensorSpec, Unbounded

__all__ = ["box_dtype", "spec_from_space", "to_space", "to_tensor"]


def _spaces() -> Any:
    return import_optional("gymnasium", extra="gymnasium", purpose="space conversion").spaces


# Space class -> its spaces module: conversions run every step, the lookup once per class.
_SPACES_OF: dict[type, Any] = {}


def _spaces_of(space: Any) -> Any:
    """The spaces module ``space`` belongs to: Gymnasium's, or the legacy ``gym``'s (VMAS)."""
    cls = type(space)
    module = _SPACES_OF.get(cls)
    if module is None:
        if any(c.__module__.split(".")[0] == "gym" for c in cls.__mro__):
            module = import_optional(
                "gym", extra="vmas", purpose="legacy gym space conversion"
            ).spaces
        else:
            module = _spaces()
        _SPACES_OF[cls] = module
    return module


#: The attribute of a Gymnasium space made from a marlkit spec (``space_from_spec``) that holds
#: the spec: :func:`spec_from_space` gives it back as it was given.
GIVEN_SPEC = "_marlkit_spec"


def space_repr(space: Any) -> str:
    """``space`` for a message: the marlkit spec it was made from when the user gave one (they
    wrote ``Bounded(...)``, not the Gymnasium ``Box`` the adapter works in), else the space."""
    given = getattr(space, GIVEN_SPEC, None)
    return f"spec {given!r}" if given is not None else f"space {space}"


def _torch_dtype(dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.zeros((), dtype=np.dtype(dtype))).dtype


#: Unsigned ints wider than 8 bits, which torch cannot compare or clamp: held in the next signed
#: int that holds every value (a uint64 Box whose bounds pass 2**63 - 1 is refused).
_WIDER: dict[np.dtype[Any], np.dtype[Any]] = {
    np.dtype(np.uint16): np.dtype(np.int32),
    np.dtype(np.uint32): np.dtype(np.int64),
}
_WIDER[np.dtype(np.uint64)] = np.dtype(np.int64)


def box_dtype(space: Any) -> np.dtype[Any]:
    """The NumPy dtype a ``Box``'s values are held in: its own, except for unsigned ints wider
    than 8 bits (see :data:`_WIDER`).

    Raises:
        TypeError: a uint64 Box with a bound above ``2**63 - 1``.
    """
    dtype = np.dtype(space.dtype)
    wider = _WIDER.get(dtype)
    if wider is None:
        return dtype
    if dtype == np.uint64 and np.any(np.asarray(space.high) > np.iinfo(np.int64).max):
        raise TypeError(
            f"{space_repr(space)}: torch has no comparisons of uint64, and its bounds pass "
            f"int64's {np.iinfo(np.int64).max}; give the space bounds within int64"
        )
    return wider


def spec_from_space(
    space: Any,
    batch_shape: Sequence[int] = (),
    *,
    device: str | torch.device | None = None,
) -> TensorSpec | Composite:
    """The spec of ``space`` with ``batch_shape`` prepended (e.g. ``[*B, n_agents]``).

    Raises:
        TypeError: a space this function does not map (Text, Graph, Sequence, ...).
    """
    spaces = _spaces_of(space)
    batch = tuple(int(b) for b in batch_shape)
    given = getattr(space, GIVEN_SPEC, None)
    if isinstance(given, TensorSpec):  # a space made from a marlkit spec: that spec, as given
        placed = given if device is None else given.to(device)
        return placed.expand(*batch, *given.shape)
    if isinstance(space, spaces.Box):
        shape = (*batch, *space.shape)
        dtype = _torch_dtype(box_dtype(space))
        if dtype == torch.bool:  # e.g. board planes (go_v5): flags, which Bounded does not take
            if not space.shape:
                return Categorical(2, batch, torch.bool, device)
            return Binary(int(space.shape[-1]), shape, torch.bool, device)
        low, high = np.asarray(space.low), np.asarray(space.high)
        if np.isfinite(low).all() and np.isfinite(high).all():
            return Bounded(
                torch.as_tensor(low, dtype=dtype),
                torch.as_tensor(high, dtype=dtype),
                shape,
                dtype,
                device,
            )
        return Unbounded(shape, dtype, device)
    if isinstance(space, spaces.Discrete):
        return Categorical(int(space.n), batch, torch.int64, device)
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec).reshape(-1)
        return MultiCategorical(nvec.tolist(), (*batch, nvec.size), torch.int64, device)
    if isinstance(space, spaces.MultiBinary):
        n = int(np.prod(space.shape))
        return Binary(n, (*batch, n), torch.int8, device)
    if isinstance(space, spaces.Dict):
        return Composite(
            {str(k): spec_from_space(s, batch, device=device) for k, s in space.spaces.items()},
            shape=batch,
            device=device,
        )
    if isinstance(space, spaces.Tuple):
        return Composite(
            {str(i): spec_from_space(s, batch, device=device) for i, s in enumerate(space.spaces)},
            shape=batch,
            device=device,
        )
    raise TypeError(
        f"cannot map a {type(space).__name__} space to a marlkit spec (supported: Box, Discrete, "
        "MultiDiscrete, MultiBinary, Dict, Tuple)"
    )


class SimulatorOutputError(ValueError):
    """The simulator returned something that does not fit its spaces: a wrong shape, a missing
    agent, a non-finite value, a value its integer dtype cannot hold. The message names the
    agent, the key and the value."""


def describe(value: Any, limit: int = 120) -> str:
    """A short one-line rendering of a simulator value, for error messages."""
    text = np.array2string(value, threshold=12) if isinstance(value, np.ndarray) else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def changes_on_cast(array: np.ndarray, dtype: np.dtype[Any]) -> bool:
    """Whether storing ``array`` in an integer or bool ``dtype`` would change a value (NumPy
    wraps 300 to 44 in ``uint8`` and truncates 0.7 to 0, silently). Float targets are never
    refused: their rounding is the float's own."""
    if dtype.kind not in "biu" or array.dtype == dtype:
        return False
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and overflow: caught below
        back = array.astype(dtype).astype(array.dtype)
    return not np.array_equal(back, array)


def check_seed(seed: int, who: str) -> None:
    """Refuse a negative seed, which NumPy's generators (Gymnasium's and PettingZoo's spaces and
    envs) refuse, before anything is seeded.

    Raises:
        ValueError: ``seed < 0``.
    """
    if seed < 0:
        raise ValueError(f"{who} takes seeds >= 0 (NumPy's generators refuse others), got {seed}")


def check_steppable(who: str, never_reset: bool, needs_reset: np.ndarray, ended: str) -> None:
    """Refuse a step before the first reset, or of envs whose episode ended at the last step
    (``needs_reset``, ``[E]`` bool) and that were not reset since: ``ended`` says how they
    ended, e.g. ``"terminated"``.

    Raises:
        RuntimeError: naming the envs.
    """
    if never_reset:
        raise RuntimeError(f"{who}: call reset() before step()")
    if needs_reset.any():
        envs = np.flatnonzero(needs_reset).tolist()
        raise RuntimeError(
            f"{who}: env(s) {envs} {ended} at the last step; reset them (set '_reset', or use "
            "step_and_maybe_reset / rollout) before stepping again"
        )


def to_tensor(
    space: Any, value: Any, *, device: str | torch.device | None = None
) -> torch.Tensor | dict[str, Any]:
    """A simulator value of ``space`` (one sample or a stack of them) as tensors in spec terms.

    Dict and Tuple spaces give nested dicts (Tuple keys ``"0"``, ``"1"``, ...).
    """
    spaces = _spaces_of(space)
    if isinstance(space, spaces.Dict):
        if not isinstance(value, Mapping):
            raise TypeError(f"a Dict space value must be a mapping, got {type(value).__name__}")
        return {str(k): to_tensor(s, value[k], device=device) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return {str(i): to_tensor(s, value[i], device=device) for i, s in enumerate(space.spaces)}
    array = np.asarray(value)
    if isinstance(space, spaces.Box):
        if changes_on_cast(array, space.dtype):
            raise SimulatorOutputError(
                f"values of the {space_repr(space)} that {space.dtype} cannot hold exactly (they "
                f"would wrap or be truncated): {describe(array)}"
            )
        held = array.astype(space.dtype, copy=False).astype(box_dtype(space), copy=False)
        return torch.as_tensor(held, device=device)
    if isinstance(space, spaces.Discrete):
        return torch.as_tensor(array.astype(np.int64) - int(space.start), device=device)
    if isinstance(space, spaces.MultiDiscrete):
        start = np.asarray(space.start).reshape(-1)
        flat = array.reshape(*array.shape[: array.ndim - np.ndim(space.nvec)], -1)
        return torch.as_tensor(flat.astype(np.int64) - start, device=device)
    if isinstance(space, spaces.MultiBinary):
        flat = array.reshape(*array.shape[: array.ndim - len(space.shape)], -1)
        return torch.as_tensor(flat.astype(np.int8), device=device)
    raise TypeError(f"cannot convert values of a {type(space).__name__} space")


def numpy_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    """The NumPy dtype of a torch dtype."""
    return torch.zeros((), dtype=dtype).numpy().dtype


def to_space(space: Any, value: torch.Tensor | Mapping[str, Any]) -> Any:
    """An action in spec terms as the simulator expects it for ``space`` (NumPy, ``start`` added).

    Works on one action or a stack of them (leading dims kept). A space made from a marlkit spec
    (:data:`GIVEN_SPEC`) gets arrays in that spec's dtype: a ``Binary(dtype=torch.bool)`` action
    arrives as ``bool``, not as ``MultiBinary``'s ``int8``; an ``int32`` ``Categorical`` of a
    shape as ``int32``.
    """
    spaces = _spaces_of(space)
    if isinstance(space, spaces.Dict):
        return {k: to_space(s, value[str(k)]) for k, s in space.spaces.items()}  # type: ignore[index]
    if isinstance(space, spaces.Tuple):
        return tuple(to_space(s, value[str(i)]) for i, s in enumerate(space.spaces))  # type: ignore[index]
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if isinstance(space, spaces.Box):
        return array.astype(space.dtype, copy=False)
    if isinstance(space, spaces.Discrete):
        out = array.astype(np.int64) + int(space.start)
        return out.item() if out.ndim == 0 else out
    given = getattr(space, GIVEN_SPEC, None)
    dtype = space.dtype if given is None else numpy_dtype(given.dtype)
    # the value's own dims: one flat dim in spec terms, or the given spec's shape (kept)
    own = 1 if given is None else len(given.shape)
    lead = array.shape[: array.ndim - own]
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec)
        return (array.reshape(*lead, *nvec.shape) + np.asarray(space.start)).astype(dtype)
    if isinstance(space, spaces.MultiBinary):
        return array.reshape(*lead, *space.shape).astype(dtype)
    raise TypeError(f"cannot convert actions for a {type(space).__name__} space")
