"""Segment trees: native kernels vs torch twin vs brute force, errors, and the 10**8 capacity."""

from __future__ import annotations

import doctest
import threading
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import marlkit.native.segment_tree as segment_tree_module
from marlkit.native import load_extension
from marlkit.native.segment_tree import (
    MAX_CAPACITY,
    MinSegmentTree,
    SumSegmentTree,
    prioritized_sample,
    prioritized_update,
)

_C = load_extension()  # a missing or stale build fails here, loudly

BACKENDS = ["native", "torch"]
DTYPES = [torch.float32, torch.float64]
TREES = [SumSegmentTree, MinSegmentTree]
NP_DTYPE = {torch.float32: np.float32, torch.float64: np.float64}


def _reference_reduce(tree_cls: type, values: np.ndarray) -> float:
    return float(values.sum() if tree_cls is SumSegmentTree else values.min())


def _neutral(tree_cls: type) -> float:
    return 0.0 if tree_cls is SumSegmentTree else float("inf")


def _reference_scan(priorities: np.ndarray, masses: np.ndarray) -> np.ndarray:
    """Smallest i with cumsum[i] > v; v >= total gives the last nonzero index (float64)."""
    cumulative = np.cumsum(priorities.astype(np.float64))
    found = np.searchsorted(cumulative, masses.astype(np.float64), side="right")
    last_nonzero = int(np.flatnonzero(priorities)[-1])
    return np.where(found >= len(priorities), last_nonzero, found)


def _state(tree: Any) -> np.ndarray:
    return tree[torch.arange(tree.capacity)].numpy().copy()


def _dyadic(rng: np.random.Generator, size: int, zero_fraction: float = 0.3) -> np.ndarray:
    """Multiples of 1/8 up to 8 (about a third zeros): every sum is exact in float32 and float64."""
    values = rng.integers(1, 65, size=size) / 8.0
    values[rng.random(size) < zero_fraction] = 0.0
    return values


# --------------------------------------------------------------------------------------------
# Construction
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree_cls", TREES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_fresh_tree_holds_the_neutral_element(tree_cls: type, dtype: torch.dtype, backend: str):
    tree = tree_cls(5, dtype=dtype, backend=backend)
    assert tree.capacity == len(tree) == 5
    assert tree.dtype == dtype
    assert tree.backend == backend
    assert tree.device == torch.device("cpu")
    values = tree[torch.arange(5)]
    assert values.dtype == dtype
    assert torch.equal(values, torch.full((5,), _neutral(tree_cls), dtype=dtype))
    assert tree.query() == _neutral(tree_cls)
    reduce_all = tree.total() if tree_cls is SumSegmentTree else tree.min()
    assert reduce_all == _neutral(tree_cls)
    assert f"capacity=5, dtype={dtype}, backend='{backend}'" in repr(tree)


def test_auto_backend_is_native_on_cpu():
    assert SumSegmentTree(4).backend == "native"
    assert MinSegmentTree(4, dtype=torch.float64).backend == "native"


@pytest.mark.parametrize("tree_cls", TREES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("capacity", [0, -3, MAX_CAPACITY + 1])
def test_capacity_out_of_range(tree_cls: type, backend: str, capacity: int):
    with pytest.raises(ValueError, match=rf"capacity must be in \[1, 100000000\], got {capacity}"):
        tree_cls(capacity, backend=backend)


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match="capacity must be an int, got float"):
        SumSegmentTree(10.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="capacity must be an int, got bool"):
        SumSegmentTree(True)
    with pytest.raises(ValueError, match=r"dtype must be torch.float32 or torch.float64, got "):
        SumSegmentTree(10, dtype=torch.float16)
    with pytest.raises(TypeError, match=r"dtype must be a torch\.dtype, got str"):
        SumSegmentTree(10, dtype="float32")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"backend must be one of \['auto', 'native', 'torch'\], got 'cuda'"
    ):
        SumSegmentTree(10, backend="cuda")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backend='native' runs on CPU only, got device meta"):
        SumSegmentTree(10, backend="native", device="meta")


def test_capacity_accepts_numpy_integers():
    assert SumSegmentTree(np.int64(7)).capacity == 7


# --------------------------------------------------------------------------------------------
# Correctness against brute force
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree_cls", TREES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("capacity", [1, 2, 3, 7, 15, 16, 17, 64, 1000, 1025])
def test_update_get_query_match_brute_force(
    tree_cls: type, dtype: torch.dtype, backend: str, capacity: int
):
    rng = np.random.default_rng(capacity)
    tree = tree_cls(capacity, dtype=dtype, backend=backend)
    reference = np.full(capacity, _neutral(tree_cls))
    for _ in range(5):
        indices = rng.integers(0, capacity, size=rng.integers(1, 2 * capacity + 2))
        values = rng.random(len(indices)).astype(NP_DTYPE[dtype]) * 10
        tree.update(indices, values)
        for i, v in zip(indices, values):  # sequential writes: the last occurrence wins
            reference[i] = v
    np.testing.assert_array_equal(_state(tree), reference.astype(NP_DTYPE[dtype]))
    rtol = 1e-5 if dtype == torch.float32 else 1e-12
    for _ in range(30):
        start = int(rng.integers(0, capacity))
        end = int(rng.integers(start + 1, capacity + 1))
        got = tree.query(start, end)
        expected = _reference_reduce(tree_cls, reference[start:end])
        if tree_cls is MinSegmentTree:
            assert got == expected  # min is exact
        else:
            assert got == pytest.approx(expected, rel=rtol, abs=1e-6)
    full = tree.total() if tree_cls is SumSegmentTree else tree.min()
    assert full == pytest.approx(_reference_reduce(tree_cls, reference), rel=rtol)
    assert tree.query(0, capacity) == pytest.approx(full, rel=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("capacity", [1, 2, 5, 8, 16, 17, 333, 4096, 4097])
def test_scan_lower_bound_matches_searchsorted(dtype: torch.dtype, backend: str, capacity: int):
    rng = np.random.default_rng(7 + capacity)
    priorities = _dyadic(rng, capacity)
    priorities[rng.integers(capacity)] = 1.0  # a positive total
    tree = SumSegmentTree(capacity, dtype=dtype, backend=backend)
    tree.update(np.arange(capacity), priorities)
    cumulative = np.cumsum(priorities)
    total = cumulative[-1]
    assert tree.total() == total
    masses = np.concatenate(
        [
            rng.integers(0, int(total * 16), size=500) / 16.0,  # dyadic: exact everywhere
            cumulative,  # exactly on every boundary: must go to the next nonzero index
            [0.0, total - 1 / 16, total, total + 1, 1e30],
        ]
    )
    got = tree.scan_lower_bound(masses)
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), _reference_scan(priorities, masses))
    assert (priorities[got.numpy()] > 0).all()  # a zero priority is never sampled


@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_lower_bound_boundaries_by_hand(backend: str):
    tree = SumSegmentTree(8, backend=backend)
    tree.update([0, 3, 5], [1.0, 2.0, 1.0])  # prefix sums 1 1 1 3 3 4 4 4
    masses = torch.tensor([0.0, 0.5, 1.0, 2.999, 3.0, 3.5, 4.0, 100.0])
    expected = torch.tensor([0, 0, 3, 3, 5, 5, 5, 5])
    assert torch.equal(tree.scan_lower_bound(masses), expected)
    tree.update(0, 0.0)  # leading zeros are skipped
    assert torch.equal(tree.scan_lower_bound([0.0, 2.0]), torch.tensor([3, 5]))
    tree.update(5, 0.0)  # v >= total: the last nonzero index, not the last index
    assert torch.equal(tree.scan_lower_bound([2.0, 1e9]), torch.tensor([3, 3]))


# float32 trees and masses v < total where rounding in the descent (v - left sums) sends a
# naive search into a subtree or block of sum 0, or past the end of a block: the first three
# (one block) end on a zero leaf without care, the fourth needs the in-block fallback and the
# fifth the careful tree descent (found by a randomized search over the native kernel).
_ROUNDING_CASES = [
    (
        [
            0.0,
            6.03443717956543,
            54.57344055175781,
            0.0,
            0.0,
            0.0,
            5.058675289154053,
            0.02365892007946968,
        ],
        60.60787582397461,
    ),
    (
        [
            0.04680013656616211,
            0.49065130949020386,
            1.1108670234680176,
            0.0,
            0.0,
            2.456035819164981e-09,
            0.0,
            0.0,
        ],
        1.6483184099197388,
    ),
    (
        [
            5.98135841300973e-07,
            9.006240725284442e-05,
            5.085632801637985e-05,
            8.510313637088984e-05,
            0.0,
            0.0,
            0.0023836232721805573,
            0.0,
        ],
        0.00261024315841496,
    ),
    (
        [
            0,
            6.42425657e-05,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            1.88693818e-07,
            0.000931926537,
            0,
            0,
            10.7561798,
            4.0079085e-05,
            0,
            0,
            0.412401855,
            2.92853892e-05,
            0,
            15.1430387,
            0,
            0.07810653,
            0,
            1.75641066e-08,
            1.99667597,
            3.15217719e-09,
            0,
            0,
            0,
            3.53156736e-07,
            0.000343824242,
            0,
            0,
            0,
            0,
            1.60159548e-08,
            7.58697752e-06,
            0,
            1.41616852e-09,
            5.87687874,
            0,
            5.95092752e-06,
            0.723039448,
            0,
            0.0138703678,
            2.05832601,
            5.57308681e-07,
        ]
        + [0] * 16,
        28.3878117,
    ),
    (
        [0] * 16
        + [
            2.5992856,
            1.74876025e-09,
            0,
            4.06302343e-06,
            1.47965598,
            0,
            0,
            0.134222567,
            1.62671876e-10,
            0,
            1.98484528e-07,
            0,
            29.4482327,
            0,
            0,
            9.07861686e-05,
            0,
            0,
            0,
            0,
            0.000471617474,
            3.7403654e-06,
            0.00217298674,
            193.111862,
            0.00626665028,
            2.44322041e-06,
            3.54433346,
            0,
            0,
            1.7379158e-12,
            0,
            1.9831053,
        ]
        + [0] * 16,
        232.309708,
    ),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("leaves", "mass"), _ROUNDING_CASES)
def test_scan_lower_bound_never_lands_on_zero_through_rounding(
    backend: str, leaves: list[float], mass: float
):
    priorities = np.array(leaves, dtype=np.float32)
    tree = SumSegmentTree(len(leaves), backend=backend)
    tree.update(np.arange(len(leaves)), priorities)
    v = np.float32(mass)
    index = int(tree.scan_lower_bound(v))
    assert priorities[index] > 0
    cumulative = np.cumsum(priorities.astype(np.float64))
    before = cumulative[index - 1] if index > 0 else 0.0
    assert before * (1 - 1e-6) <= v < cumulative[index] * (1 + 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_lower_bound_random_floats_bracket_the_mass(dtype: torch.dtype, backend: str):
    rng = np.random.default_rng(3)
    capacity = 100_000
    priorities = rng.random(capacity) * (rng.random(capacity) < 0.7)
    tree = SumSegmentTree(capacity, dtype=dtype, backend=backend)
    tree.update(np.arange(capacity), priorities)
    stored = _state(tree).astype(np.float64)
    masses = torch.rand(20_000, dtype=dtype) * tree.total()
    got = tree.scan_lower_bound(masses).numpy()
    assert (stored[got] > 0).all()
    cumulative = np.cumsum(stored)
    before = np.where(got > 0, cumulative[got - 1], 0.0)
    tolerance = (1e-4 if dtype == torch.float32 else 1e-9) * cumulative[-1]
    m = masses.numpy().astype(np.float64)
    assert (before - tolerance <= m).all()
    assert (m < cumulative[got] + tolerance).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampling_frequencies_follow_priorities(backend: str):
    tree = SumSegmentTree(4, dtype=torch.float64, backend=backend)
    tree.update([0, 1, 2, 3], [1.0, 0.0, 3.0, 6.0])
    generator = torch.Generator().manual_seed(0)
    samples = tree.scan_lower_bound(
        torch.rand(100_000, generator=generator, dtype=torch.float64) * tree.total()
    )
    frequencies = torch.bincount(samples, minlength=4).double() / samples.numel()
    assert frequencies[1] == 0
    torch.testing.assert_close(
        frequencies, torch.tensor([0.1, 0.0, 0.3, 0.6], dtype=torch.float64), atol=0.01, rtol=0
    )


@pytest.mark.parametrize("tree_cls", TREES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_index_keeps_the_last_value(tree_cls: type, backend: str):
    tree = tree_cls(10, backend=backend)
    tree.update([4, 2, 4, 4, 2, 9], [1.0, 2.0, 3.0, 7.0, 5.0, 0.5])
    assert tree[[2, 4, 9]].tolist() == [5.0, 7.0, 0.5]
    if tree_cls is SumSegmentTree:
        assert tree.total() == 12.5
    else:
        assert tree.min() == 0.5


@pytest.mark.parametrize("tree_cls", TREES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_input_forms_and_shapes(tree_cls: type, backend: str):
    tree = tree_cls(12, dtype=torch.float64, backend=backend)
    tree.update(3, 2.5)  # python scalars
    tree.update(np.array([[0, 1], [5, 6]], dtype=np.int32), 4)  # [2, 2] indices, int scalar
    tree[torch.tensor([7, 8], dtype=torch.int16)] = torch.tensor([1, 2])  # __setitem__, ints
    readonly = np.arange(9, 12)
    readonly.setflags(write=False)
    tree.update(readonly, np.broadcast_to(np.float32(0.25), (3,)))  # read-only arrays
    tree.update([], [])  # an empty batch is a no-op
    assert tree[3].shape == ()
    assert tree[3].item() == 2.5
    assert tree[[[0, 1], [5, 6]]].tolist() == [[4.0, 4.0], [4.0, 4.0]]
    assert tree[np.array([7, 8, 9])].tolist() == [1.0, 2.0, 0.25]
    assert tree[[]].shape == (0,)
    leaf = torch.tensor([2.0], requires_grad=True)
    tree.update([2], leaf * 2)  # autograd tensors are detached
    assert tree[2].item() == 4.0
    if tree_cls is SumSegmentTree:
        masses = torch.tensor([[0.0, 4.5], [30.0, 0.1]])
        assert tree.scan_lower_bound(masses).shape == (2, 2)
        assert tree.scan_lower_bound(0.0).shape == ()
        assert tree.scan_lower_bound([]).shape == (0,)


# --------------------------------------------------------------------------------------------
# Native vs torch twin on random operation sequences
# --------------------------------------------------------------------------------------------


_dyadic_value = st.integers(0, 64).map(lambda k: k / 8.0)


@st.composite
def _operations(draw: st.DrawFn) -> tuple[int, list[tuple]]:
    capacity = draw(st.integers(1, 70))
    index = st.integers(0, capacity - 1)
    operations: list[tuple] = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["update", "update", "query", "scan", "get"]))
        if kind == "update":
            indices = draw(st.lists(index, min_size=0, max_size=2 * capacity + 3))
            values = draw(st.lists(_dyadic_value, min_size=len(indices), max_size=len(indices)))
            operations.append(("update", indices, values))
        elif kind == "query":
            start = draw(st.integers(0, capacity - 1))
            operations.append(("query", start, draw(st.integers(start + 1, capacity))))
        elif kind == "get":
            operations.append(("get", draw(st.lists(index, max_size=capacity))))
        else:
            operations.append(("scan", draw(st.lists(st.integers(0, 16 * 64 * 80), max_size=40))))
    return capacity, operations


def _apply(tree: Any, operation: tuple) -> Any:
    kind = operation[0]
    if kind == "update":
        return tree.update(operation[1], operation[2])
    if kind == "query":
        return tree.query(operation[1], operation[2])
    if kind == "get":
        return tree[operation[1]].tolist()
    total = tree.total()
    masses = [min(m / 16.0, total * 1.25) for m in operation[1]]
    if total == 0 and masses:
        with pytest.raises(ValueError, match="needs a positive total priority"):
            tree.scan_lower_bound(masses)
        return "zero total"
    return tree.scan_lower_bound(masses).tolist()


@pytest.mark.parametrize("tree_cls", TREES)
@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=60, deadline=None)
@given(case=_operations())
def test_native_and_torch_twin_agree(tree_cls: type, dtype: torch.dtype, case: tuple):
    capacity, operations = case
    native = tree_cls(capacity, dtype=dtype, backend="native")
    twin = tree_cls(capacity, dtype=dtype, backend="torch")
    reference = np.full(capacity, _neutral(tree_cls))
    for operation in operations:
        if operation[0] == "scan" and tree_cls is MinSegmentTree:
            continue
        assert _apply(native, operation) == _apply(twin, operation), operation
        if operation[0] == "update":
            for i, v in zip(operation[1], operation[2]):
                reference[i] = v
        if operation[0] == "query":
            _, start, end = operation
            assert native.query(start, end) == _reference_reduce(tree_cls, reference[start:end])
        if operation[0] == "scan" and tree_cls is SumSegmentTree and reference.sum() > 0:
            masses = np.array([min(m / 16.0, reference.sum() * 1.25) for m in operation[1]])
            expected = _reference_scan(reference, masses).tolist() if len(masses) else []
            assert native.scan_lower_bound(masses).tolist() == expected
    np.testing.assert_array_equal(_state(native), _state(twin))
    np.testing.assert_array_equal(_state(native), reference.astype(NP_DTYPE[dtype]))


@pytest.mark.parametrize("tree_cls", TREES)
def test_native_and_torch_twin_agree_on_random_floats(tree_cls: type):
    rng = np.random.default_rng(11)
    capacity = 50_000
    native = tree_cls(capacity, backend="native")
    twin = tree_cls(capacity, backend="torch")
    for _ in range(10):
        indices = rng.integers(0, capacity, size=4096)
        values = rng.random(4096).astype(np.float32) * 5
        native.update(indices, values)
        twin.update(indices, values)
    np.testing.assert_array_equal(_state(native), _state(twin))
    for start, end in [(0, capacity), (17, 18), (100, 40_000), (capacity - 3, capacity)]:
        if tree_cls is MinSegmentTree:
            assert native.query(start, end) == twin.query(start, end)
        else:
            assert native.query(start, end) == pytest.approx(twin.query(start, end), rel=1e-5)
    if tree_cls is SumSegmentTree:
        masses = torch.rand(10_000) * native.total() * 0.999
        agree = (native.scan_lower_bound(masses) == twin.scan_lower_bound(masses)).double().mean()
        assert agree > 0.99  # float32 prefix sums differ in the last bits near boundaries


@pytest.mark.parametrize("tree_cls", TREES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_small_batches_into_a_large_tree(tree_cls: type, dtype: torch.dtype):
    # Batches much smaller than the number of leaf blocks take the per-item path of the native
    # update (leaf, block, ancestors) rather than whole-level refolds.
    rng = np.random.default_rng(17)
    capacity = 200_003
    native = tree_cls(capacity, dtype=dtype, backend="native")
    reference = np.full(capacity, _neutral(tree_cls))
    for size in [1, 2, 7, 100, 3000, 1, 500]:
        hot = rng.integers(0, capacity, size=max(1, size // 3))  # repeated indices
        indices = rng.choice(np.concatenate([hot, rng.integers(0, capacity, size=size)]), size)
        values = _dyadic(rng, size, zero_fraction=0.1)
        native.update(indices, values)
        for i, v in zip(indices, values):
            reference[i] = v
        reduce_all = native.total() if tree_cls is SumSegmentTree else native.min()
        assert reduce_all == _reference_reduce(tree_cls, reference)
    np.testing.assert_array_equal(_state(native), reference.astype(NP_DTYPE[dtype]))
    for _ in range(50):
        start = int(rng.integers(0, capacity))
        end = int(rng.integers(start + 1, capacity + 1))
        assert native.query(start, end) == _reference_reduce(tree_cls, reference[start:end])
    if tree_cls is SumSegmentTree:
        masses = rng.integers(0, int(reference.sum() * 8) + 8, size=5000) / 8.0
        np.testing.assert_array_equal(
            native.scan_lower_bound(masses).numpy(), _reference_scan(reference, masses)
        )


@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_large_batch_scan_is_the_same_with_any_thread_count(num_threads: int):
    rng = np.random.default_rng(5)
    capacity = 20_000
    priorities = _dyadic(rng, capacity)
    tree = SumSegmentTree(capacity, backend="native", dtype=torch.float64)
    tree.update(np.arange(capacity), priorities)
    masses = rng.integers(0, int(priorities.sum() * 8), size=50_000) / 8.0
    previous = _C.get_num_threads()
    try:
        _C.set_num_threads(num_threads)
        got = tree.scan_lower_bound(masses).numpy()
    finally:
        _C.set_num_threads(previous)
    np.testing.assert_array_equal(got, _reference_scan(priorities, masses))


def test_concurrent_python_threads_on_one_native_tree():
    capacity = 40_000
    tree = SumSegmentTree(capacity, dtype=torch.float64, backend="native")
    errors: list[BaseException] = []

    def writer(part: int) -> None:
        try:
            indices = np.arange(part, capacity, 4)
            for _ in range(20):
                tree.update(indices, np.full(len(indices), float(part + 1)))
                if tree.total() > 0:
                    tree.scan_lower_bound(np.random.default_rng(part).random(4096) * tree.total())
        except BaseException as err:  # re-raised in the main thread
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(part,)) for part in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert tree.total() == (1 + 2 + 3 + 4) * capacity / 4


# --------------------------------------------------------------------------------------------
# Errors: clear messages, and nothing written
# --------------------------------------------------------------------------------------------


def _filled(tree_cls: type, backend: str, dtype: torch.dtype = torch.float32) -> Any:
    tree = tree_cls(10, dtype=dtype, backend=backend)
    tree.update(np.arange(10), np.arange(10) * 0.5 + 0.5)
    return tree


@pytest.mark.parametrize("tree_cls", TREES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("indices", "values", "error", "message"),
    [
        (
            [1, 10, 2],
            [1.0, 1.0, 1.0],
            IndexError,
            r"index 10 at position 1 is out of range for a segment tree of capacity 10 "
            r"\(expected 0 <= index < 10\)",
        ),
        ([0, 1, -1], [1.0, 1.0, 1.0], IndexError, r"index -1 at position 2 is out of range"),
        (
            [1, 2, 3],
            [1.0, -0.5, 1.0],
            ValueError,
            r"priority -0.5 at position 1 is invalid: priorities must be finite and >= 0",
        ),
        ([1, 2, 3], [1.0, 2.0, float("nan")], ValueError, r"priority nan at position 2"),
        ([1, 2, 3], [float("inf"), 2.0, 1.0], ValueError, r"priority inf at position 0"),
        ([1, 2, 3], [1.0, float("-inf"), 1.0], ValueError, r"priority -inf at position 1"),
        ([1, 99, 3], [1.0, -1.0, 1.0], IndexError, r"index 99 at position 1"),  # indices first
        (
            [1, 2, 3],
            [1.0, 2.0],
            ValueError,
            r"indices and values must have the same shape \(or values a scalar\), got indices "
            r"\(3,\) and values \(2,\)",
        ),
        ([1.0, 2.0], [1.0, 2.0], TypeError, r"indices must be integers, got dtype torch.float64"),
        ([True, False], [1.0, 2.0], TypeError, r"indices must be integers, got dtype torch.bool"),
        ([1, 2], ["a", "b"], TypeError, r"values must be numbers, got a numpy array of dtype <U1"),
        ([1, 2], [1 + 1j, 2], TypeError, r"values must be numbers, got a numpy array of dtype"),
    ],
)
def test_bad_update_raises_and_writes_nothing(
    tree_cls: type,
    dtype: torch.dtype,
    backend: str,
    indices: list,
    values: list,
    error: type,
    message: str,
):
    tree = _filled(tree_cls, backend, dtype)
    before = _state(tree)
    reduce_before = tree.query()
    with pytest.raises(error, match=message):
        tree.update(indices, values)
    np.testing.assert_array_equal(_state(tree), before)
    assert tree.query() == reduce_before


@pytest.mark.parametrize("backend", BACKENDS)
def test_min_tree_refuses_inf_although_it_is_the_neutral_element(backend: str):
    tree = MinSegmentTree(4, backend=backend)
    with pytest.raises(ValueError, match="priority inf at position 0 is invalid"):
        tree.update([0], [float("inf")])
    assert tree.min() == float("inf")


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_tree_reports_float64_overflow_as_inf(backend: str):
    tree = SumSegmentTree(4, backend=backend)
    with pytest.raises(ValueError, match="priority inf at position 1"):
        tree.update([0, 1], np.array([1.0, 1e300]))
    assert tree.total() == 0.0


@pytest.mark.parametrize("tree_cls", TREES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_get_and_query(tree_cls: type, backend: str):
    tree = _filled(tree_cls, backend)
    with pytest.raises(IndexError, match=r"index 10 at position 0 is out of range .* capacity 10"):
        tree[10]
    with pytest.raises(IndexError, match=r"index -1 at position 1"):
        tree[[0, -1]]
    with pytest.raises(ValueError, match=r"query range \[4, 4\) is empty: expected start < end"):
        tree.query(4, 4)
    with pytest.raises(ValueError, match=r"query range \[5, 2\) is empty"):
        tree.query(5, 2)
    with pytest.raises(IndexError, match=r"query start -1 is out of range .* capacity 10"):
        tree.query(-1, 3)
    with pytest.raises(IndexError, match=r"query start 10 is out of range"):
        tree.query(10)
    with pytest.raises(IndexError, match=r"query end 11 is out of range .*0 < end <= 10"):
        tree.query(0, 11)
    with pytest.raises(TypeError, match="end must be an int, got float"):
        tree.query(0, 2.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("masses", "message"),
    [
        (
            [0.5, -1.0],
            r"prefix-sum value -1.0 at position 1 is invalid: expected a finite value >= 0",
        ),
        ([float("nan")], r"prefix-sum value nan at position 0"),
        ([1.0, 2.0, float("inf")], r"prefix-sum value inf at position 2"),
    ],
)
def test_bad_scan_masses(backend: str, masses: list, message: str):
    tree = _filled(SumSegmentTree, backend)
    with pytest.raises(ValueError, match=message):
        tree.scan_lower_bound(masses)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_of_a_zero_tree(backend: str):
    tree = SumSegmentTree(6, backend=backend)
    tree.update([1, 2], [0.0, 0.0])
    assert tree.scan_lower_bound([]).shape == (0,)
    with pytest.raises(
        ValueError, match=r"needs a positive total priority, but the tree's total is 0.0"
    ):
        tree.scan_lower_bound([0.0])


def test_min_tree_has_no_scan():
    assert not hasattr(MinSegmentTree(3), "scan_lower_bound")
    assert not hasattr(_C.MinSegmentTreeFp32(3), "scan_lower_bound")


# --------------------------------------------------------------------------------------------
# marlkit._C directly: strict arrays
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "np_dtype"),
    [
        ("SumSegmentTreeFp32", np.float32),
        ("SumSegmentTreeFp64", np.float64),
        ("MinSegmentTreeFp32", np.float32),
        ("MinSegmentTreeFp64", np.float64),
    ],
)
def test_extension_classes_check_their_arrays(name: str, np_dtype: type):
    cls = getattr(_C, name)
    other = np.float64 if np_dtype is np.float32 else np.float32
    tree = cls(100)
    assert tree.capacity == len(tree) == 100
    itemsize = np.dtype(np_dtype).itemsize
    # 16-leaf blocks under a 16-ary tree: 7 blocks (112 leaves), their totals padded to 16,
    # and one root level (its 16 running sums for sum trees, its total padded to 16).
    root_level = (16 if name.startswith("Sum") else 0) + 16
    assert tree.nbytes == (7 * 16 + 16 + root_level) * itemsize
    assert repr(tree) == f"{name}(capacity=100)"
    idx = np.array([1, 2], dtype=np.int64)
    with pytest.raises(TypeError, match=rf"{name}.update: values must be a numpy array of dtype "):
        tree.update(idx, np.ones(2, dtype=other))
    with pytest.raises(
        TypeError,
        match=rf"{name}.update: indices must be a numpy array of dtype int64, got dtype int32",
    ):
        tree.update(idx.astype(np.int32), np.ones(2, dtype=np_dtype))
    with pytest.raises(
        ValueError, match=rf"{name}.update: indices must be 1-D \[B\], got 2-D with shape \(1, 2\)"
    ):
        tree.update(idx[None], np.ones(2, dtype=np_dtype))
    with pytest.raises(
        ValueError,
        match=rf"{name}.update: indices and values must have the same length, "
        r"got 2 indices and 3 values",
    ):
        tree.update(idx, np.ones(3, dtype=np_dtype))
    with pytest.raises(TypeError, match="incompatible function arguments"):
        tree.update([1, 2], [1.0, 2.0])
    with pytest.raises(
        TypeError, match=rf"{name}.get: indices must be a numpy array of dtype int64"
    ):
        tree.get(np.array([1.0]))
    with pytest.raises(IndexError, match="index 100 at position 0 is out of range"):
        tree.update(np.array([100]), np.ones(1, dtype=np_dtype))
    with pytest.raises(ValueError, match=r"priority -1\.0 at position 0 is invalid"):
        tree.update(np.array([0]), -np.ones(1, dtype=np_dtype))
    with pytest.raises(ValueError, match=r"capacity must be in \[1, 100000000\], got 0"):
        cls(0)
    with pytest.raises(TypeError):
        cls(10.5)
    # a strided array of the right dtype is fine (copied to contiguous)
    strided_idx = np.arange(0, 20, dtype=np.int64)[::2]
    tree.update(strided_idx, np.arange(10, dtype=np_dtype)[::-1] + 1)
    np.testing.assert_array_equal(tree.get(strided_idx), np.arange(10, 0, -1, dtype=np_dtype))
    assert tree.query(0, 19) == (55.0 if name.startswith("Sum") else 1.0)
    if name.startswith("Sum"):
        assert tree.total() == 55.0
        with pytest.raises(
            TypeError, match=rf"{name}.scan_lower_bound: values must be a numpy array of dtype"
        ):
            tree.scan_lower_bound(np.zeros(2, dtype=other))
        np.testing.assert_array_equal(
            tree.scan_lower_bound(np.array([0.0, 9.99, 10.0], dtype=np_dtype)), [0, 0, 2]
        )
    else:
        assert tree.min() == 1.0
    assert _C.SEGMENT_TREE_MAX_CAPACITY == MAX_CAPACITY


# --------------------------------------------------------------------------------------------
# Prioritized replay's steps on a (sum, min) pair: one native call, or the same in torch
# --------------------------------------------------------------------------------------------


def _pair(capacity: int, dtype: torch.dtype, backend: str) -> tuple[SumSegmentTree, MinSegmentTree]:
    return (
        SumSegmentTree(capacity, dtype=dtype, backend=backend),
        MinSegmentTree(capacity, dtype=dtype, backend=backend),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_prioritized_steps_agree_between_backends_and_with_their_formulas(dtype: torch.dtype):
    eps, alpha, beta, length = 1e-3, 0.6, 0.4, 1000
    g = torch.Generator().manual_seed(0)
    index = torch.randperm(length, generator=g)[:900]  # any order, 100 slots left unwritten
    priority = (torch.rand(900, generator=g, dtype=torch.float64) * 5).to(dtype)
    priority[::7] = 0.0
    pairs = {backend: _pair(1000, dtype, backend) for backend in BACKENDS}
    assert pairs["native"][0]._native is not None  # the fused kernels run
    for total, lowest in pairs.values():
        largest = prioritized_update(
            total, lowest, index, priority, length=length, eps=eps, alpha=alpha
        )
        assert largest == float(priority.max())
        value = (priority.double() + eps) ** alpha
        tolerance = 1e-6 if dtype == torch.float32 else 1e-13
        np.testing.assert_allclose(total[index].double(), value, rtol=tolerance)
        np.testing.assert_allclose(lowest[index].double(), value, rtol=tolerance)
        assert lowest.min() == pytest.approx(float(value.min()), rel=tolerance)
    uniforms = torch.rand(5000, generator=g, dtype=dtype)
    out = {b: prioritized_sample(*pair, uniforms, beta) for b, pair in pairs.items()}
    for sample_index, weight in out.values():
        assert sample_index.dtype == torch.int64 and weight.dtype == torch.float32
        assert bool((weight > 0).all()) and bool((weight <= 1).all())
    native_index, native_weight = out["native"]
    torch_index, torch_weight = out["torch"]
    # the trees' own prefix sums against cumsum: equal but for masses at a rounding boundary
    assert float((native_index == torch_index).double().mean()) > 0.999
    same = native_index == torch_index
    np.testing.assert_allclose(native_weight[same], torch_weight[same], rtol=1e-5)
    leaf = pairs["native"][0][native_index].double()
    expected = (leaf / pairs["native"][1].min()) ** -beta
    np.testing.assert_allclose(native_weight.double(), expected, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prioritized_update_refuses_bad_batches_and_writes_nothing(backend: str):
    total, lowest = _pair(16, torch.float32, backend)
    prioritized_update(total, lowest, torch.arange(6), torch.ones(6), length=6, eps=1e-6, alpha=0.5)
    before = (_state(total), _state(lowest))
    one, two = torch.tensor([0]), torch.tensor([0, 1])
    cases = [  # index, priority, alpha, error, message
        (torch.tensor([0, 6]), torch.ones(2), 0.5, IndexError, "index 6 is out of range for 6"),
        (torch.tensor([-3, 1]), torch.ones(2), 0.5, IndexError, "index -3 is out of range"),
        (two, torch.tensor([2.0, -0.5]), 0.5, ValueError, "priority -0.5 at position 1"),
        (one, torch.tensor([float("nan")]), 0.5, ValueError, "priority nan at position 0"),
        (one, torch.tensor([float("inf")]), 0.5, ValueError, "priority inf at position 0"),
        (one, torch.tensor([-float("inf")]), 0.5, ValueError, "priority -inf at position 0"),
        (two, torch.ones(1), 0.5, ValueError, "2 indices but 1 priorities"),
        # finite, but (1e30 + eps) ** 2 overflows float32: the trees refuse the value
        (one, torch.tensor([1e30]), 2.0, ValueError, "priority inf at position 0 is invalid"),
    ]
    for index, priority, alpha, error, message in cases:
        with pytest.raises(error, match=message):
            prioritized_update(total, lowest, index, priority, length=6, eps=1e-6, alpha=alpha)
        np.testing.assert_array_equal(_state(total), before[0])
        np.testing.assert_array_equal(_state(lowest), before[1])
    empty = torch.zeros(0, dtype=torch.int64)
    assert prioritized_update(
        total, lowest, empty, torch.zeros(0), length=6, eps=1e-6, alpha=0.5
    ) == -float("inf")


def test_prioritized_kernels_check_their_arguments():
    total, lowest = _C.SumSegmentTreeFp32(8), _C.MinSegmentTreeFp32(8)
    idx = np.array([0, 1], dtype=np.int64)
    with pytest.raises(TypeError, match="prioritized_update: priorities must be a numpy array"):
        _C.prioritized_update(total, lowest, idx, np.ones(2), 2, 1e-6, 0.5)  # float64
    with pytest.raises(ValueError, match="length 9 is outside"):
        _C.prioritized_update(total, lowest, idx, np.ones(2, np.float32), 9, 1e-6, 0.5)
    with pytest.raises(TypeError, match="incompatible function arguments"):  # mixed dtypes
        _C.prioritized_update(
            total, _C.MinSegmentTreeFp64(8), idx, np.ones(2, np.float32), 2, 1e-6, 0.5
        )
    with pytest.raises(ValueError, match="needs a positive total priority"):
        _C.prioritized_sample(total, lowest, np.zeros(3, np.float32), 0.4)
    _C.prioritized_update(total, lowest, idx, np.array([1.0, 3.0], np.float32), 2, 0.0, 1.0)
    index, weight = _C.prioritized_sample(total, lowest, np.array([0.1, 0.5], np.float32), 1.0)
    np.testing.assert_array_equal(index, [0, 1])
    np.testing.assert_allclose(weight, [1.0, 1 / 3], rtol=1e-6)


def test_module_docstring_examples():
    result = doctest.testmod(segment_tree_module, raise_on_error=False, verbose=False)
    assert result.attempted > 0
    assert result.failed == 0


# --------------------------------------------------------------------------------------------
# Big and device tests
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_capacity_of_one_hundred_million():
    capacity = MAX_CAPACITY
    tree = SumSegmentTree(capacity, backend="native")  # 445 MiB of float32
    indices = np.array([0, 12_345_678, capacity - 1], dtype=np.int64)
    tree.update(indices, [1.0, 2.0, 4.0])
    assert tree.total() == 7.0
    assert tree.query(1, capacity) == 6.0
    assert tree.query(capacity - 1) == 4.0
    assert tree.scan_lower_bound([0.5, 1.0, 2.99, 3.0, 7.0, 1e9]).tolist() == [
        0,
        12_345_678,
        12_345_678,
        capacity - 1,
        capacity - 1,
        capacity - 1,
    ]
    with pytest.raises(IndexError, match=f"index {capacity} at position 0"):
        tree.update([capacity], [1.0])
    batch = np.random.default_rng(0).integers(0, capacity, size=100_000)
    tree.update(batch, 1.0)
    untouched = [v for i, v in zip(indices, [1.0, 2.0, 4.0]) if i not in set(batch.tolist())]
    assert tree.total() == len(np.unique(batch)) + sum(untouched)  # small integers: exact
    del tree
    minimum = MinSegmentTree(capacity, backend="native")
    minimum.update([capacity - 1], [3.0])
    assert minimum.min() == 3.0
    assert minimum.query(0, capacity - 1) == float("inf")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torch_twin_on_cuda_agrees_with_native():
    rng = np.random.default_rng(2)
    priorities = _dyadic(rng, 5000)
    cuda = SumSegmentTree(5000, backend="auto", device="cuda")
    assert cuda.backend == "torch"
    native = SumSegmentTree(5000, backend="native")
    for tree in (cuda, native):
        tree.update(np.arange(5000), priorities)
    masses = rng.integers(0, int(priorities.sum() * 8), size=1000) / 8.0
    got = cuda.scan_lower_bound(masses)
    assert got.device.type == "cuda"
    assert torch.equal(got.cpu(), native.scan_lower_bound(masses))
