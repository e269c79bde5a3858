"""``marlkit.native.memory``: zeroed CPU tensors on transparent huge pages, checked against the
kernel's own accounting (``/proc/self/smaps``), and ``TensorStorage`` slots allocated with it."""

from __future__ import annotations

import contextlib
import gc
import mmap
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import torch
from tensordict import TensorDict

from marlkit.native import extension_available
from marlkit.native.memory import HUGE_PAGES_FROM, advise_huge_pages, huge_pages_possible, zeros
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


VMSTAT = pathlib.Path("/proc/vmstat")


def _thp_fault_counters() -> tuple[int, int] | None:
    """Linux's own count of page faults that tried a huge page, ``(thp_fault_alloc,
    thp_fault_fallback)``: granted, and refused (no free 2 MiB block, compaction deferred, the
    cgroup's limit). None where ``/proc/vmstat`` does not keep them."""
    if not VMSTAT.exists():
        return None
    counts = dict(line.split() for line in VMSTAT.read_text().splitlines())
    if "thp_fault_alloc" not in counts or "thp_fault_fallback" not in counts:
        return None
    return int(counts["thp_fault_alloc"]), int(counts["thp_fault_fallback"])


@contextlib.contextmanager
def thp_faults() -> Iterator[list[int]]:
    """Yields ``[granted, refused]``, filled on exit with the huge-page faults of the block."""
    before = _thp_fault_counters()
    if before is None:
        pytest.skip("/proc/vmstat does not count huge-page faults (thp_fault_alloc/_fallback)")
    result: list[int] = []
    yield result
    after = _thp_fault_counters()
    assert after is not None
    result.extend(b - a for a, b in zip(before, after))


def assert_faulted_on_huge_pages(tensor: torch.Tensor, faults: list[int], pages: int) -> None:
    """What ``zeros`` controls, checked against the kernel's accounting: the first touch of each
    of the tensor's ``pages`` whole 2 MiB pages tried a huge page (a region touched before its
    advice, or not advised under THP ``madvise``, tries none). Whether the kernel granted it is
    its own affair: a machine short of free 2 MiB blocks, or whose compaction is deferred after
    earlier failures, refuses some or all (one CI machine refused every one of ``zeros``' yet
    granted a region advised a moment later). When it refused none, ``smaps`` shows them all.

    The counters are the machine's: another process's huge-page faults in the same moment can
    only add to them, never hide ours."""
    granted, refused = faults
    assert granted + refused >= pages, (granted, refused, pages)
    if refused == 0:
        assert huge_bytes(tensor) >= pages * (2 << 20)


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
    with thp_faults() as faults:
        out = zeros((16 << 20,), torch.float32)  # 64 MiB
    assert out.data_ptr() % (2 << 20) == 0  # a mapping of its own, aligned: 32 whole pages
    assert is_advised(out)
    assert_faulted_on_huge_pages(out, faults, pages=32)
    small = zeros((1000,), torch.float32)  # from the heap, whose mapping may carry the advice
    advised_before = is_advised(small)  # already: a range of it advised by an earlier test
    assert advise_huge_pages(small) == 0  # no whole huge page in 4 KB
    assert is_advised(small) == advised_before  # and nothing advised


@needs_thp
def test_zeros_maps_fresh_pages_even_where_the_heap_has_room(tmp_path: pathlib.Path) -> None:
    """glibc serves a block from a free chunk of its heap when one fits, pages long touched:
    a long test run handed a 64 MiB ``torch.empty`` such a chunk (no huge page). Here the heap
    is made to hold one (``mallopt``, in a child process so this one keeps glibc's settings)."""
    child = tmp_path / "child.py"
    child.write_text(
        textwrap.dedent(
            f"""
            import ctypes, pathlib, sys
            import torch
            sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
            from test_memory import _thp_fault_counters
            from marlkit.native.memory import zeros

            libc = ctypes.CDLL("libc.so.6")
            assert libc.mallopt(-3, 1 << 30) == 1  # M_MMAP_THRESHOLD: large blocks on the heap
            assert libc.mallopt(-1, 1 << 30) == 1  # M_TRIM_THRESHOLD: freed ones stay there
            heap = torch.ones(32 << 20)  # 128 MiB on the heap, touched, then freed
            address = heap.data_ptr()
            del heap
            before = _thp_fault_counters()
            out = zeros((16 << 20,), torch.float32)  # 64 MiB: the free chunk would fit it
            after = _thp_fault_counters()
            probe = torch.empty(16 << 20)  # where glibc puts the same size: the free chunk
            faults = (b - a for a, b in zip(before, after))
            print(out.data_ptr() == address, probe.data_ptr() == address, *faults)
            """
        )
    )
    proc = subprocess.run([sys.executable, str(child)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    zeros_took_it, probe_took_it, granted, refused = proc.stdout.split()
    assert zeros_took_it == "False", "zeros took the heap's free chunk, touched pages"
    assert probe_took_it == "True", "the set-up failed: glibc did not keep the chunk for reuse"
    assert int(granted) + int(refused) >= 32, proc.stdout


@needs_thp
def test_advise_reports_the_whole_huge_pages_inside() -> None:
    # a mapping of Python's own: fresh pages, never touched (a large torch.empty may reuse heap
    # memory whose pages exist already and stay 4 KiB ones)
    region = mmap.mmap(-1, 40 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    fresh = torch.frombuffer(region, dtype=torch.uint8)
    advised = advise_huge_pages(fresh)
    assert advised % (2 << 20) == 0 and (38 << 20) <= advised <= (40 << 20)
    assert is_advised(fresh)
    with thp_faults() as faults:
        fresh.fill_(1)
    assert_faulted_on_huge_pages(fresh, faults, pages=advised >> 21)
    del fresh  # the tensor holds the buffer: release it before the map closes
    region.close()


def test_a_large_zeros_owns_its_mapping_and_returns_it_when_freed() -> None:
    out = zeros((2 << 20,), torch.float64)  # 16 MiB
    if not huge_pages_possible():
        assert out.data_ptr() % 64 == 0 and torch.equal(
            out, torch.zeros(2 << 20, dtype=torch.float64)
        )
        return
    start = out.data_ptr()
    view = out[1::2]  # a view keeps the mapping alive
    del out
    gc.collect()
    assert _mapping_starts_at(start) and view.eq(0).all()
    del view
    gc.collect()
    assert not _mapping_starts_at(start)


def _mapping_starts_at(address: int) -> bool:
    return any(
        int(line.split("-", 1)[0], 16) == address
        for line in pathlib.Path("/proc/self/maps").read_text().splitlines()
    )


def test_a_bad_shape_is_named_before_anything_is_mapped() -> None:
    with pytest.raises(RuntimeError, match="must be non-negative"):
        zeros((-4096, -4096), torch.float32)  # its product would be 64 MiB


def test_a_tensor_the_kernel_cannot_map_is_named() -> None:
    if not huge_pages_possible():
        pytest.skip("zeros maps its own memory only on Linux with THP and marlkit._C")
    with pytest.raises(MemoryError, match=r"cannot map \d+ bytes for a torch.float32 tensor"):
        zeros((1 << 50,), torch.float32)  # 4 PiB


@needs_thp
def test_tensor_storage_slots_are_on_huge_pages() -> None:
    storage = TensorStorage(300_000)
    items = TensorDict(
        {"obs": torch.ones(10, 32), "flag": torch.ones(10, 1, dtype=torch.bool)}, [10]
    )
    with thp_faults() as faults:
        storage.set(torch.arange(10), items, length=10)
    obs = storage.data["obs"]  # 38.4 MB, mapped by zeros: advised, fresh pages
    assert obs.numel() * obs.element_size() >= HUGE_PAGES_FROM
    assert is_advised(obs)
    assert torch.equal(storage.get(torch.arange(10)).get("obs"), torch.ones(10, 32))
    assert storage.data["obs"][10:].eq(0).all()
    whole_pages = obs.numel() * obs.element_size() // (2 << 20)  # the tail: 4 KiB pages
    assert_faulted_on_huge_pages(obs, faults, pages=whole_pages)


def test_bad_tensors_are_refused() -> None:
    with pytest.raises(TypeError, match="expected a tensor, got list"):
        advise_huge_pages([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected a contiguous CPU tensor"):
        advise_huge_pages(torch.zeros(10, 10).t())
    with pytest.raises(ValueError, match="expected a contiguous CPU tensor, got one on meta"):
        advise_huge_pages(torch.empty(10, device="meta"))
    assert advise_huge_pages(torch.empty(0)) == 0
