"""``marlkit.native.memory``: zeroed CPU tensors on transparent huge pages, checked against the
kernel's own accounting (``/proc/self/smaps``), and ``TensorStorage`` slots allocated with it."""

from __future__ import annotations

import ctypes
import mmap
import pathlib
import sys

import pytest
import torch
from tensordict import TensorDict

from marlkit.native import extension_available
from marlkit.native.memory import HUGE_PAGES_FROM, advise_huge_pages, zeros
from marlkit.replay import TensorStorage

THP = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or not THP.exists()
    or "[never]" in THP.read_text()
    or not extension_available(),
    reason="needs Linux with transparent huge pages (madvise or always) and marlkit._C",
)


def _mappings(first: int, last: int) -> list[tuple[int, bool]]:
    """``(AnonHugePages bytes, advised)`` for each mapping of ``/proc/self/smaps`` that overlaps
    the bytes ``[first, last)``; advised means ``VmFlags`` holds ``hg`` (``MADV_HUGEPAGE``)."""
    found: list[tuple[int, bool]] = []
    inside, huge = False, 0
    for line in pathlib.Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's first line: start-end perms ...
            start, end = (int(v, 16) for v in head.split("-"))
            inside = start < last and first < end
        elif inside and line.startswith("AnonHugePages:"):
            huge = int(line.split()[1]) * 1024
        elif inside and line.startswith("VmFlags:"):  # the last field of a mapping
            found.append((huge, "hg" in line.split()[1:]))
    return found


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    first = tensor.data_ptr()
    return first, first + tensor.numel() * tensor.element_size()


def huge_bytes(tensor: torch.Tensor) -> int:
    """The bytes of huge pages (``AnonHugePages``) in the mappings that hold ``tensor``'s memory
    (advising a range splits a mapping: the ends outside whole huge pages are their own)."""
    return sum(huge for huge, _ in _mappings(*_span(tensor)))


def is_advised(tensor: torch.Tensor) -> bool:
    """Whether some mapping holding ``tensor``'s memory carries the ``hg`` advice."""
    return any(advised for _, advised in _mappings(*_span(tensor)))


def kernel_grants_huge_pages() -> bool:
    """Whether Linux backs a fresh region advised by Python's own ``mmap.madvise`` with huge
    pages right now. Advice is a request: a kernel short of free 2 MiB blocks, or a sandbox
    whose ``smaps`` reports none, grants none however the region was advised."""
    # private, as the allocator's memory is (a shared anonymous map is shmem, under other rules)
    region = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
        region.write(b"\1" * len(region))  # fault every page in after the advice
        view = ctypes.c_char.from_buffer(region)
        first = ctypes.addressof(view)
        granted = sum(huge for huge, _ in _mappings(first, first + len(region))) > 0
        del view  # a live ctypes view keeps the region from closing
        return granted
    finally:
        region.close()


def _granted_or_skip() -> None:
    if not kernel_grants_huge_pages():
        pytest.skip("the kernel grants no huge pages even to a region Python advised itself")


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16]
)
@pytest.mark.parametrize("shape", [(0, 3), (7,), (1000, 4, 3), (300_000, 8)])
def test_zeros_is_torch_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    out = zeros(shape, dtype)
    expected = torch.zeros(shape, dtype=dtype)
    assert out.dtype == dtype and out.shape == expected.shape
    assert out.stride() == expected.stride() and out.device.type == "cpu"
    assert torch.equal(out, expected)


@needs_thp
def test_large_tensors_are_backed_by_huge_pages() -> None:
    out = zeros((16 << 20,), torch.float32)  # 64 MiB
    assert is_advised(out)  # what zeros controls: the advice, before the pages are touched
    small = zeros((1000,), torch.float32)
    assert advise_huge_pages(small) == 0  # no whole huge page in 4 KB
    assert not is_advised(small)
    _granted_or_skip()
    assert huge_bytes(out) >= 32 << 20  # most of it; the ends may be 4 KiB pages


@needs_thp
def test_advise_reports_the_whole_huge_pages_inside() -> None:
    # 40 MiB: above glibc's largest mmap threshold (32 MiB), so fresh pages never touched before
    # (smaller blocks may reuse heap memory whose pages exist already and stay 4 KiB ones)
    fresh = torch.empty(40 << 20, dtype=torch.uint8)
    advised = advise_huge_pages(fresh)
    assert advised % (2 << 20) == 0 and (38 << 20) <= advised <= (40 << 20)
    assert is_advised(fresh)
    fresh.fill_(1)
    _granted_or_skip()
    assert huge_bytes(fresh) > 0


@needs_thp
def test_tensor_storage_slots_are_on_huge_pages() -> None:
    storage = TensorStorage(300_000)
    items = TensorDict(
        {"obs": torch.ones(10, 32), "flag": torch.ones(10, 1, dtype=torch.bool)}, [10]
    )
    storage.set(torch.arange(10), items, length=10)
    obs = storage.data["obs"]  # 38.4 MB: advised, and fresh pages (past glibc's mmap threshold)
    assert obs.numel() * obs.element_size() >= HUGE_PAGES_FROM
    assert is_advised(obs)
    assert torch.equal(storage.get(torch.arange(10)).get("obs"), torch.ones(10, 32))
    assert storage.data["obs"][10:].eq(0).all()
    _granted_or_skip()
    assert huge_bytes(obs) > 0


def test_bad_tensors_are_refused() -> None:
    with pytest.raises(TypeError, match="expected a tensor, got list"):
        advise_huge_pages([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected a contiguous CPU tensor"):
        advise_huge_pages(torch.zeros(10, 10).t())
    with pytest.raises(ValueError, match="expected a contiguous CPU tensor, got one on meta"):
        advise_huge_pages(torch.empty(10, device="meta"))
    assert advise_huge_pages(torch.empty(0)) == 0
