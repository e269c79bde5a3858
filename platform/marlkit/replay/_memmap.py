"""Items on disk in tensordict's memory-map layout, read and written without pickle.

The layout is :meth:`tensordict.TensorDictBase.memmap`'s (format 1): one folder per
(sub-)TensorDict, its ``meta.json`` (batch dims, and each entry: a sub-TensorDict, or a tensor's
shape and dtype) and one raw ``<key>.memmap`` file per tensor, so tensordict reads what marlkit
writes. ``TensorDict.load_memmap`` also unpickles what it finds there (an ``other.pickle`` of
non-tensor entries, classes named in ``meta.json``): a crafted folder runs code on load. marlkit
never calls it on a folder: :func:`read_items` takes plain TensorDicts of tensors of the dtypes
below and nothing else, and refuses any other file, entry or name, naming it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tensordict import MemoryMappedTensor, TensorDict, TensorDictBase

from marlkit._files import write_bytes

__all__ = ["read_items", "write_items"]

_META = "meta.json"
_SUFFIX = ".memmap"
_TYPE = "<class 'tensordict._td.TensorDict'>"
_CLASS = "tensordict:TensorDict"
#: What a node's meta.json holds besides its entries.
_NODE_FIELDS = {"shape", "device", "_type", "_format_version", "_class", "names"}
_LEAF_FIELDS = {"device", "shape", "dtype", "is_nested"}
_DTYPES = {
    str(dtype): dtype
    for dtype in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    )
}
#: An entry's name becomes a file name: no separators, no '.'/'..', nothing unprintable.
_NAME = re.compile(r"^(?!\.\.?$)[^/\\\x00-\x1f]{1,255}$")
_CHUNK = 1 << 23


class _Damaged(ValueError):
    pass


def _chunks(tensor: torch.Tensor) -> Iterator[memoryview]:
    """The bytes of ``tensor`` (C order), in chunks, without copying a contiguous tensor."""
    flat = tensor.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    view = raw.numpy().data.cast("B")
    for start in range(0, len(view), _CHUNK):
        yield view[start : start + _CHUNK]


def write_items(data: TensorDictBase, folder: Path) -> dict[str, tuple[int, str]]:
    """Write the CPU TensorDict ``data`` of tensors under the new folder ``folder`` in
    tensordict's memory-map layout, each file written whole with its space reserved first.
    Returns each file (its path relative to ``folder``) with its size and digest.

    Raises:
        OSError: ENOSPC naming the file and the bytes needed.
    """
    files: dict[str, tuple[int, str]] = {}
    _write_node(data, folder, folder, files)
    return files


def _write_node(
    td: TensorDictBase, folder: Path, root: Path, files: dict[str, tuple[int, str]]
) -> None:
    folder.mkdir(parents=True)
    meta: dict[str, Any] = {}
    for name, value in td.items():
        if isinstance(value, TensorDictBase):
            _write_node(value, folder / name, root, files)
            meta[name] = {"type": "TensorDict"}
            continue
        if not isinstance(value, torch.Tensor):  # storages hold tensors only (Storage.check)
            raise TypeError(f"{name!r} is a {type(value).__name__}, not a tensor")
        tensor = value.cpu()
        meta[name] = {
            "device": "cpu",
            "shape": list(tensor.shape),
            "dtype": str(tensor.dtype),
            "is_nested": False,
        }
        if tensor.numel():  # tensordict writes no file for an empty tensor
            path = folder / f"{name}{_SUFFIX}"
            size = tensor.numel() * tensor.element_size()
            files[path.relative_to(root).as_posix()] = (
                size,
                write_bytes(path, _chunks(tensor), size),
            )
    meta.update(
        shape=list(td.batch_size), device="cpu", _type=_TYPE, _format_version=1, _class=_CLASS
    )
    text = json.dumps(meta).encode()
    path = folder / _META
    files[path.relative_to(root).as_posix()] = (
        len(text),
        write_bytes(path, [memoryview(text)], len(text)),
    )


def read_items(folder: Path, what: str, *, writable: bool) -> TensorDict:
    """The TensorDict stored under ``folder`` (tensordict's memory-map layout), its tensors
    mapped from their files: shared with the files when ``writable`` (writes reach them), else
    copy-on-write. Nothing is unpickled or imported.

    Raises:
        ValueError: naming ``what`` (the checkpoint or storage) and the file: a ``meta.json``
            that does not parse or declares anything but plain TensorDicts and tensors of
            known dtypes (non-tensor entries, other classes, nested tensors), an entry name
            that is not a plain file name, a file the layout does not define (an
            ``other.pickle``, say), a link, or a tensor file of another size.
    """
    try:
        return _read_node(folder, writable)
    except _Damaged as err:
        raise ValueError(f"{what} is damaged: {err}; nothing was loaded") from None


def _shape(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value
    ):
        raise _Damaged(f"{where} declares the shape {value!r}, not a list of sizes")
    return value


def _read_meta(folder: Path, label: str) -> dict[str, Any]:
    if folder.is_symlink() or not folder.is_dir():
        raise _Damaged(f"{folder} is {'missing' if not folder.exists() else 'not a folder'}")
    try:
        meta = json.loads((folder / _META).read_text())
    except FileNotFoundError:
        raise _Damaged(f"{label} is missing") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise _Damaged(f"{label} does not parse ({err})") from None
    if not isinstance(meta, dict):
        raise _Damaged(f"{label} holds a {type(meta).__name__}, not an object")
    if meta.get("_type", _TYPE) != _TYPE or meta.get("_class", _CLASS) != _CLASS:
        raise _Damaged(
            f"{label} declares a {meta.get('_class') or meta.get('_type')!r}; marlkit loads "
            "plain TensorDicts only"
        )
    return meta


def _leaf_of(label: str, name: str, entry: dict[str, Any]) -> tuple[torch.dtype, list[int]]:
    """The dtype and shape a tensor entry declares."""
    if set(entry) != _LEAF_FIELDS or entry["is_nested"] is not False:
        raise _Damaged(
            f"{label}: entry {name!r} is not a tensor or a TensorDict ({entry!r}); marlkit "
            "loads tensors only (non-tensor and nested entries would need unpickling)"
        )
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:
        raise _Damaged(f"{label}: entry {name!r} has the unknown dtype {entry['dtype']!r}")
    return dtype, _shape(entry["shape"], f"{label}: entry {name!r}")


def _read_node(folder: Path, writable: bool) -> TensorDict:
    label = str(folder / _META)
    meta = _read_meta(folder, label)
    batch = _shape(meta.get("shape"), label)
    expected = {_META}
    entries: dict[str, Any] = {}
    for name, entry in meta.items():
        if name in _NODE_FIELDS:
            continue
        if not _NAME.match(name):
            raise _Damaged(f"{label} declares an entry named {name!r}, not a plain file name")
        if not isinstance(entry, dict):
            raise _Damaged(f"{label}: entry {name!r} is {entry!r}, not an entry's description")
        if entry == {"type": "TensorDict"}:
            expected.add(name)
            entries[name] = _read_node(folder / name, writable)
            continue
        dtype, shape = _leaf_of(label, name, entry)
        file = folder / f"{name}{_SUFFIX}"
        expected.add(file.name)
        entries[name] = _read_leaf(file, dtype, shape, writable)
    for child in sorted(os.listdir(folder)):
        if child not in expected:
            raise _Damaged(f"{folder / child} is not part of the format (no entry of {label})")
        if (folder / child).is_symlink():
            raise _Damaged(f"{folder / child} is a link; item folders hold plain files only")
    try:
        return TensorDict(entries, batch_size=batch)
    except (RuntimeError, ValueError) as err:
        raise _Damaged(f"{label}: its entries do not fit the batch {batch} ({err})") from None


def _read_leaf(file: Path, dtype: torch.dtype, shape: list[int], writable: bool) -> torch.Tensor:
    numel = math.prod(shape)
    size = numel * torch.empty((), dtype=dtype).element_size()
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if file.is_symlink() or not file.is_file():
        raise _Damaged(f"{file} is missing" if not file.exists() else f"{file} is not a plain file")
    found = file.stat().st_size
    if found != size:
        raise _Damaged(f"{file} holds {found:,} bytes; {shape} of {dtype} take {size:,}")
    if writable:
        return MemoryMappedTensor.from_filename(file, dtype, torch.Size(shape))
    return torch.from_file(str(file), shared=False, size=numel, dtype=dtype).view(shape)
