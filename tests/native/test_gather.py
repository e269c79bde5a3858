"""The row-gather kernel: C++ (prefetching, raw bytes) vs its torch twin (index_select) on every
dtype and row shape, repeated and empty indices, threads, memory maps, and bad input."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from tensordict import MemoryMappedTensor

from marlkit.native import load_extension, set_num_threads
from marlkit.native.gather import gather_rows, gather_rows_torch


@pytest.fixture
def threads() -> Iterator[None]:
    yield
    set_num_threads(0)


def _source(rows: int, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand((rows, *shape), generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn((rows, *shape), generator=g).to(dtype)
    return torch.randint(-100 if dtype.is_signed else 0, 100, (rows, *shape), generator=g).to(dtype)


DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
    torch.complex64,
]
# Row widths that take the kernel's fixed-size copies (4, 16, 128 bytes in float32) and others.
SHAPES = [(), (1,), (4,), (32,), (3, 5), (2, 3, 7), (0,), (300,)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_native_equals_index_select(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    source = _source(1000, shape, dtype, seed=len(shape))
    index = torch.randint(0, 1000, (257,), generator=torch.Generator().manual_seed(1))
    (native,) = gather_rows([source], index, backend="native")
    (twin,) = gather_rows_torch([source], index)
    assert native.shape == (257, *shape) and native.dtype == dtype
    assert torch.equal(native, twin)
    assert source.numel() == 0 or native.data_ptr() != source.data_ptr()  # a copy


def test_several_tensors_repeated_and_empty_indices() -> None:
    tensors = [_source(50, s, d, seed=i) for i, (s, d) in enumerate(zip(SHAPES, DTYPES))]
    for index in (torch.tensor([3, 3, 3, 49, 0, 3]), torch.zeros(0, dtype=torch.int64)):
        native = gather_rows(tensors, index)
        twin = gather_rows_torch(tensors, index)
        for a, b, t in zip(native, twin, tensors):
            assert a.shape == (index.numel(), *t.shape[1:])
            assert torch.equal(a, b)
    assert gather_rows([], torch.tensor([5])) == []


def test_threads_give_identical_results(threads: None) -> None:
    tensors = [_source(100_000, (32,), torch.float32, 0), _source(100_000, (), torch.int64, 1)]
    index = torch.randint(0, 100_000, (20_000,), generator=torch.Generator().manual_seed(2))
    results = []
    for n_threads in (1, 2):  # 20,000 rows: split over two threads
        set_num_threads(n_threads)
        results.append(gather_rows(tensors, index, backend="native"))
    for a, b, twin in zip(*results, gather_rows_torch(tensors, index)):
        assert torch.equal(a, b) and torch.equal(a, twin)


def test_memory_mapped_sources(tmp_path) -> None:
    source = MemoryMappedTensor.from_tensor(
        _source(500, (6,), torch.float32, 3), filename=tmp_path / "x.memmap"
    )
    index = torch.tensor([499, 0, 250])
    (rows,) = gather_rows([source], index, backend="native")
    assert torch.equal(rows, torch.as_tensor(source)[index])


def test_auto_falls_back_where_the_kernel_does_not_apply() -> None:
    base = _source(40, (6,), torch.float32, 4)
    strided = base[:, ::2]  # not contiguous
    grad = base.clone().requires_grad_()
    index = torch.tensor([1, 39, 7])
    for tensor in (strided, grad):
        (rows,) = gather_rows([tensor], index)  # auto: index_select
        assert torch.equal(rows, tensor.detach()[index])
        with pytest.raises(ValueError, match="backend='native' needs contiguous CPU tensors"):
            gather_rows([tensor], index, backend="native")


@pytest.mark.parametrize("backend", ["native", "torch"])
@pytest.mark.parametrize("bad", [40, -1, 10**12])
def test_out_of_range_names_the_index_and_its_position(backend: str, bad: int) -> None:
    source = _source(40, (3,), torch.float32, 5)
    with pytest.raises(IndexError, match=rf"index {bad} at position 2 is out of range for 40 rows"):
        gather_rows([source], torch.tensor([0, 5, bad, 7]), backend=backend)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_bad_arguments(backend: str) -> None:
    a, b = _source(10, (2,), torch.float32, 6), _source(11, (2,), torch.float32, 7)
    with pytest.raises(ValueError, match=r"tensors\[1\] has 11 rows, tensors\[0\] 10"):
        gather_rows([a, b], torch.tensor([0]), backend=backend)  # type: ignore[arg-type]
    for index in (torch.tensor([0.0]), torch.tensor([[0]]), [0]):
        with pytest.raises(TypeError, match="index must be an int64 tensor"):
            gather_rows([a], index, backend=backend)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tensors\[0\] must be a tensor with rows along dim 0"):
        gather_rows([torch.tensor(1.0)], torch.tensor([0]), backend=backend)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backend must be"):
        gather_rows([a], torch.tensor([0]), backend="gpu")  # type: ignore[arg-type]


def test_kernel_checks_its_arrays() -> None:
    """The binding itself refuses what would make it read or write out of bounds."""
    kernel = load_extension().gather_rows
    source = np.arange(1, 31, dtype=np.float32).reshape(10, 3)
    out = np.zeros((2, 3), np.float32)
    index = np.array([0, 9], np.int64)
    kernel([source], index, [out])
    assert out.tolist() == [[1, 2, 3], [28, 29, 30]]
    out[:] = 0
    with pytest.raises(ValueError, match=r"outputs\[0\] must hold 2 rows of 12 bytes, got 2 of 8"):
        kernel([source], index, [np.zeros((2, 2), np.float32)])
    with pytest.raises(ValueError, match="1 sources but 2 outputs"):
        kernel([source], index, [out, out])
    with pytest.raises(ValueError, match="C-contiguous"):
        kernel([source[:, ::2]], index, [out])
    with pytest.raises(TypeError, match="index must be a contiguous 1-D int64"):
        kernel([source], index.astype(np.int32), [out])
    read_only = np.zeros((2, 3), np.float32)
    read_only.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        kernel([source], index, [read_only])
    with pytest.raises(IndexError, match="index 10 at position 1"):
        kernel([source], np.array([0, 10], np.int64), [out])
    assert not out.any()  # nothing written by the failed calls (row 0 is not zero)
