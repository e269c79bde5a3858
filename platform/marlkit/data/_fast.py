"""Building TensorDicts on hot paths (env steps, ``step_mdp``) without re-checking shapes."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = [
    "any_true",
    "get_entry",
    "has_any",
    "is_tensordict",
    "own_items",
    "set_leaf",
    "stack_tensordicts",
    "unchecked_tensordict",
]

# tensordict's private API, which the fast paths below rely on: 2.5x (a nested constructor) to
# 13x (a key lookup) faster than the public methods with tensordict 0.15.3. Private names change
# without notice, so tests/data/test_fast.py pins them: it fails on any other tensordict version
# until someone re-checks them (those tests say how) and updates _CHECKED_TENSORDICT.
_CHECKED_TENSORDICT = "0.15.3"
_PRIVATE_API = (
    "TensorDict._new_unsafe(source, batch_size=, device=, nested=)",
    "TensorDict._get_str(key, default)",
    "TensorDict._get_tuple(key, default)",
    "TensorDict._set_str(key, value, inplace=, validated=)",
    "TensorDict._tensordict (the dict of a TensorDict's own entries)",
    "TensorDict's instance attributes _tensordict, _batch_size, _device, _td_dim_names "
    "(what _new_unsafe sets, without nested entries, a lock or names)",
)

_NEW_UNSAFE = getattr(TensorDict, "_new_unsafe", None)
# tensordict's key lookups and leaf writes without the public methods' normalisation and checks
# (a third to a fifth of their time); the public methods where a version lacks them.
_FAST_ACCESS = all(hasattr(TensorDict, name) for name in ("_get_str", "_get_tuple", "_set_str"))
# A TensorDict's own entries live in a dict: a lookup there costs no exception when the key is
# absent (tensordict's _get_str raises and catches one).
_OWN_ENTRIES = _FAST_ACCESS and isinstance(getattr(TensorDict({}, []), "_tensordict", None), dict)
#: The attributes ``_new_unsafe`` gives a TensorDict of plain entries (no nested dicts, lock or
#: names); where that is all it sets, :func:`_flat_tensordict` sets them itself: a third of
#: ``_new_unsafe``'s time, which also asks whether torch is compiling and whether MPS exists.
_FLAT_ATTRIBUTES = ("_device", "_tensordict", "_batch_size", "_td_dim_names")


def _sets_only(attributes: tuple[str, ...]) -> bool:
    if _NEW_UNSAFE is None or not _OWN_ENTRIES:
        return False
    made = _NEW_UNSAFE({"a": torch.zeros(1)}, batch_size=torch.Size([1]), device=None, nested=False)
    return sorted(vars(made)) == sorted(attributes) and made._td_dim_names is None


# (tensordict's invariant checks, an environment variable of its own, are left to _new_unsafe)
_DIRECT = _sets_only(_FLAT_ATTRIBUTES) and not getattr(
    sys.modules.get(TensorDict.__module__), "_CHECK_INVARIANTS", False
)
_ENTRIES_TYPE = type(TensorDict({}, [])._tensordict) if _OWN_ENTRIES else dict
_NEW = object.__new__
_COMPILING = torch.compiler.is_compiling


def _flat_tensordict(
    entries: Mapping[str, Any], batch_size: torch.Size, device: torch.device | None
) -> TensorDict:
    """``TensorDict._new_unsafe(entries, batch_size, device, nested=False)``, its four
    attributes set directly (what it does outside ``torch.compile``)."""
    td = _NEW(TensorDict)
    td._device = device
    td._tensordict = _ENTRIES_TYPE(entries)
    td._batch_size = batch_size
    td._td_dim_names = None
    return td


def unchecked_tensordict(
    entries: Mapping[str, Any],
    batch_size: Sequence[int] | torch.Size,
    device: torch.device | str | None,
    *,
    nested: bool = True,
) -> TensorDict:
    """A TensorDict of ``entries`` whose shapes already start with ``batch_size`` and that
    already live on ``device``: by construction, so nothing is checked again.

    Uses tensordict's unchecked constructor when the installed version has one (a third of the
    checked constructor's time), else the checked one. ``nested`` turns plain dicts among the
    entries into TensorDicts of the same batch size (``False`` when there are none: faster).
    """
    if _NEW_UNSAFE is not None:
        if type(batch_size) is not torch.Size:  # kept as given: a tuple breaks td.numel()
            batch_size = torch.Size(batch_size)
        if device is not None and type(device) is not torch.device:
            device = torch.device(device)
        if not nested and _DIRECT and not _COMPILING():
            return _flat_tensordict(entries, batch_size, device)
        return _NEW_UNSAFE(entries, batch_size=batch_size, device=device, nested=nested)
    return TensorDict(dict(entries), batch_size=batch_size, device=device)


def get_entry(td: Any, key: str | tuple[str, ...], default: Any = None) -> Any:
    """``td.get(key, default)`` for a normalised key (a str, or a tuple of two or more strs)."""
    if _FAST_ACCESS and type(td) is TensorDict:
        if isinstance(key, str):
            if _OWN_ENTRIES:
                return td._tensordict.get(key, default)
            return td._get_str(key, default)
        return td._get_tuple(key, default)
    return td.get(key, default)


def has_any(td: Any, names: frozenset[str]) -> bool:
    """Whether ``td`` has an entry of its own named in ``names`` (one set operation on its dict
    of entries where it has one)."""
    if _OWN_ENTRIES and type(td) is TensorDict:
        return not td._tensordict.keys().isdisjoint(names)
    return any(td.get(name, None) is not None for name in names)


def any_true(flags: Any) -> bool:
    """Whether a bool tensor or NumPy array has a true entry; on the CPU by a search of its
    bytes (a tenth of NumPy's ``any`` on the small arrays of a step, a twentieth of torch's)."""
    if isinstance(flags, torch.Tensor):
        if flags.device.type != "cpu" or flags.dtype is not torch.bool:
            return bool(flags.any())
        flags = flags.numpy()
    elif flags.dtype != bool:
        return bool(flags.any())
    return 1 in flags.tobytes()


def is_tensordict(value: Any) -> bool:
    """``isinstance(value, TensorDictBase)``, answered from the type for a TensorDict or a plain
    tensor (an ABC's ``isinstance`` costs half a microsecond each time)."""
    cls = type(value)
    if cls is TensorDict:
        return True
    if cls is torch.Tensor:
        return False
    return isinstance(value, TensorDictBase)


def own_items(td: Any) -> Any:
    """``td.items()`` (a TensorDict's own entries, sub-TensorDicts as values), read from its
    dict of entries where it has one: a fifth of the public iterator's time."""
    if _OWN_ENTRIES and type(td) is TensorDict:
        return td._tensordict.items()
    return td.items()


def set_leaf(td: Any, name: str, value: torch.Tensor) -> None:
    """``td.set(name, value)`` for a tensor whose shape starts with ``td``'s batch size and that
    lives on ``td``'s device, by construction: nothing is checked again."""
    if _FAST_ACCESS and type(td) is TensorDict:
        td._set_str(name, value, validated=True, inplace=False)
    else:
        td.set(name, value)


def stack_tensordicts(tds: Sequence[TensorDictBase], dim: int) -> TensorDictBase:
    """``torch.stack`` of TensorDicts along ``dim`` (tensordict overloads ``torch.stack``;
    torch's type stubs only know tensors)."""
    return torch.stack(list(tds), dim=dim)  # type: ignore[return-value]
