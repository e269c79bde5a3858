"""Leaf specs: construction errors, rand/zero/is_in/explain/project/expand/to/clone/==/repr,
masks, and hypothesis properties (rand, zero and project always land inside, expand keeps it)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marlkit.data import (
    Binary,
    Bounded,
    Categorical,
    MultiCategorical,
    OneHot,
    TensorSpec,
    Unbounded,
)

NAN, INF = math.nan, math.inf
INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
PROPERTY = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ====================================================================== construction errors
class TestConstructionErrors:
    def test_dtype_must_be_a_torch_dtype(self):
        with pytest.raises(TypeError, match=r"dtype must be a torch\.dtype"):
            Unbounded((2,), dtype="float32")  # type: ignore[arg-type]

    @pytest.mark.parametrize("shape", ["ab", 2.5, [1, "x"]])
    def test_shape_must_be_ints(self, shape):
        with pytest.raises(TypeError, match="shape must be a sequence of ints"):
            Unbounded(shape)

    def test_shape_must_be_non_negative(self):
        with pytest.raises(ValueError, match=r"non-negative sizes, got \[2, -1\]"):
            Unbounded((2, -1))

    def test_int_shape_is_one_dim(self):
        assert Unbounded(3).shape == torch.Size([3])

    def test_bounded_low_above_high(self):
        with pytest.raises(ValueError, match="low <= high everywhere"):
            Bounded(1.0, 0.0)
        with pytest.raises(ValueError, match="low <= high everywhere"):
            Bounded(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 1.0]), (2,))

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
    @pytest.mark.parametrize(("low", "high"), [(NAN, 1.0), (0.0, NAN), (-INF, 0.0), (0.0, INF)])
    def test_bounded_non_finite_bounds(self, low, high, dtype):
        with pytest.raises(ValueError, match="finite low and high"):
            Bounded(low, high, (2,), dtype=dtype)

    def test_bounded_non_finite_tensor_bound(self):
        with pytest.raises(ValueError, match="finite low and high"):
            Bounded(torch.tensor([0.0, -INF]), 1.0, (2,), dtype=torch.int64)

    def test_bounded_bound_overflowing_float32(self):
        with pytest.raises(ValueError, match="finite low and high"):
            Bounded(0.0, 1e39, dtype=torch.float32)

    @pytest.mark.parametrize(
        ("low", "high", "dtype"),
        [(0, 300, torch.uint8), (-1, 3, torch.uint8), (-200, 0, torch.int8)],
    )
    def test_bounded_int_bound_outside_dtype(self, low, high, dtype):
        with pytest.raises(ValueError, match="does not fit in dtype"):
            Bounded(low, high, dtype=dtype)
        with pytest.raises(ValueError, match="does not fit in dtype"):
            Bounded(torch.tensor(low), torch.tensor(high), dtype=dtype)

    def test_bounded_bool_dtype(self):
        with pytest.raises(TypeError, match="does not take dtype bool"):
            Bounded(0, 1, dtype=torch.bool)

    def test_bounded_bound_not_broadcastable(self):
        with pytest.raises(ValueError, match=r"low of shape \[3\] does not broadcast .* \[2\]"):
            Bounded(torch.zeros(3), 1.0, (2,))

    @pytest.mark.parametrize("cls", [Categorical, OneHot, Binary])
    @pytest.mark.parametrize(
        ("n", "error", "got"),
        [
            (0, ValueError, "0"),
            (-1, ValueError, "-1"),
            (2.0, TypeError, "float: 2.0"),
            (True, TypeError, "bool: True"),
            ("3", TypeError, "str: '3'"),
        ],
    )
    def test_bad_n(self, cls, n, error, got):
        shape = (2,) if cls is Categorical else (1,)
        expected = f"{cls.__name__}: n must be an int >= 1, got {got}"
        with pytest.raises(error, match=f"^{re.escape(expected)}$"):
            cls(n, shape)

    def test_categorical_float_dtype(self):
        with pytest.raises(TypeError, match="integer or bool dtype"):
            Categorical(3, dtype=torch.float32)

    @pytest.mark.parametrize("n", [1, 3])
    def test_bool_categorical_needs_two_classes(self, n):
        with pytest.raises(ValueError, match=rf"bool Categorical has n == 2, got n={n}"):
            Categorical(n, (2,), dtype=torch.bool)
        assert Categorical(2, (2,), dtype=torch.bool).n == 2

    def test_categorical_n_must_fit_dtype(self):
        with pytest.raises(ValueError, match=r"classes up to 199.*int8 \(max 127\)"):
            Categorical(200, dtype=torch.int8)
        assert Categorical(256, dtype=torch.uint8).n == 256
        with pytest.raises(ValueError, match="do not fit in dtype uint8"):
            Categorical(257, dtype=torch.uint8)

    @pytest.mark.parametrize("cls", [Categorical, OneHot])
    def test_mask_must_be_bool(self, cls):
        shape = (2,) if cls is Categorical else (2, 3)
        with pytest.raises(TypeError, match="mask must be a bool tensor"):
            cls(3, shape, mask=torch.ones(2, 3, dtype=torch.int64))
        with pytest.raises(TypeError, match="mask must be a bool tensor"):
            cls(3, shape, mask=[[True] * 3] * 2)

    @pytest.mark.parametrize("cls", [Categorical, OneHot])
    def test_mask_bad_shape(self, cls):
        shape = (2,) if cls is Categorical else (2, 3)
        with pytest.raises(
            ValueError, match=r"mask of shape \[2, 4\] does not broadcast to \[2, 3\]"
        ):
            cls(3, shape, mask=torch.ones(2, 4, dtype=torch.bool))

    @pytest.mark.parametrize("cls", [OneHot, Binary])
    @pytest.mark.parametrize("shape", [(), (3,), (4, 2)])
    def test_shape_must_end_with_n(self, cls, shape):
        with pytest.raises(ValueError, match=r"shape must end with n=4"):
            cls(4, shape)

    def test_multicategorical_shape_must_end_with_len_nvec(self):
        with pytest.raises(ValueError, match=r"must end with len\(nvec\)=2, got \[3\]"):
            MultiCategorical([2, 3], (3,))
        with pytest.raises(ValueError, match=r"must end with len\(nvec\)=2, got \[\]"):
            MultiCategorical([2, 3], ())

    @pytest.mark.parametrize("nvec", [[], [0, 2], [3, -1]])
    def test_multicategorical_bad_nvec(self, nvec):
        with pytest.raises(ValueError, match="nvec entries >= 1"):
            MultiCategorical(nvec, (len(nvec),))

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.complex64])
    def test_multicategorical_bad_dtype(self, dtype):
        with pytest.raises(TypeError, match="MultiCategorical needs an integer dtype"):
            MultiCategorical([2, 3], dtype=dtype)

    def test_multicategorical_nvec_must_fit_dtype(self):
        with pytest.raises(ValueError, match=r"classes up to 299.*int8"):
            MultiCategorical([3, 300], dtype=torch.int8)

    def test_abstract_base(self):
        with pytest.raises(TypeError):
            TensorSpec((2,), torch.float32)  # type: ignore[abstract]


# ====================================================================== per class behaviour
class TestUnbounded:
    def test_defaults(self):
        spec = Unbounded()
        assert spec.shape == torch.Size([])
        assert spec.dtype == torch.float32
        assert spec.device == torch.device("cpu")
        assert spec.ndim == 0

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.bool])
    def test_rand_zero(self, dtype):
        spec = Unbounded((3, 2), dtype=dtype)
        sample = spec.rand((5,))
        assert sample.shape == (5, 3, 2)
        assert sample.dtype == dtype
        assert spec.expand(5, 3, 2).is_in(sample)
        zero = spec.zero()
        assert zero.shape == (3, 2) and not zero.any()
        assert spec.is_in(zero)

    def test_rand_is_not_constant(self):
        sample = Unbounded((1000,)).rand()
        assert sample.std() > 0.5

    def test_non_finite_is_not_in(self):
        spec = Unbounded((3,))
        assert spec.is_in(torch.tensor([0.0, 1e30, -5.0]))
        assert not spec.is_in(torch.tensor([0.0, NAN, 1.0]))
        assert spec.explain(torch.tensor([0.0, NAN, 1.0])) == "non-finite value nan at index [1]"
        assert spec.explain(torch.tensor([INF, 0.0, 1.0])) == "non-finite value inf at index [0]"
        assert not spec.is_in(torch.tensor([0.0, 1.0, -INF]))

    def test_project_makes_finite(self):
        spec = Unbounded((4,))
        out = spec.project(torch.tensor([NAN, INF, -INF, 2.5]))
        assert torch.isfinite(out).all()
        assert out[0] == 0 and out[3] == 2.5
        assert out[1] > 1e38 and out[2] < -1e38

    def test_project_float64_extremes_onto_float32(self):
        spec = Unbounded((3,))
        out = spec.project(torch.tensor([INF, 1e300, -1e300], dtype=torch.float64))
        assert out.dtype == torch.float32
        assert spec.is_in(out)

    @pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
    def test_project_onto_integers_saturates(self, dtype):
        info = torch.iinfo(dtype)
        spec = Unbounded((5,), dtype=dtype)
        floats = torch.tensor([math.inf, -math.inf, math.nan, 1e30, 2.6], dtype=torch.float64)
        assert spec.project(floats).tolist() == [info.max, info.min, 0, info.max, 3]
        if dtype != torch.int64:  # int64 holds every int64
            wide = torch.tensor([info.max + 1, info.min - 1, 300, -300, 7])
            assert spec.project(wide).tolist() == [
                info.max,
                info.min,
                *[max(info.min, min(info.max, v)) for v in (300, -300)],
                7,
            ]

    def test_project_casts(self):
        spec = Unbounded((2,), dtype=torch.float64)
        out = spec.project(torch.tensor([1, 2]))
        assert out.dtype == torch.float64
        assert out.tolist() == [1.0, 2.0]


class TestExplain:
    """Each reason names the problem; ``None`` means the value is in."""

    def test_not_a_tensor(self):
        spec = Unbounded((2,))
        assert spec.explain([1.0, 2.0]) == "expected a torch.Tensor, got list"
        assert not spec.is_in(None)

    def test_shape(self):
        spec = Unbounded((2, 3))
        assert spec.explain(torch.zeros(3, 2)) == "shape [3, 2] != spec shape [2, 3]"
        assert spec.explain(torch.zeros(4, 2, 3)) == "shape [4, 2, 3] != spec shape [2, 3]"

    def test_dtype(self):
        spec = Unbounded((2,))
        assert spec.explain(torch.zeros(2, dtype=torch.float64)) == (
            "dtype float64 != spec dtype float32"
        )
        assert "dtype int64 != spec dtype int8" in Categorical(3, (2,), dtype=torch.int8).explain(
            torch.zeros(2, dtype=torch.int64)
        )

    def test_device(self):
        spec = Unbounded((2,))
        assert spec.explain(torch.zeros(2, device="meta")) == "device meta != spec device cpu"

    def test_bounds(self):
        spec = Bounded(-1.0, 1.0, (3,))
        assert spec.explain(torch.tensor([0.0, 2.0, 0.5])) == (
            "value 2.0 at index [1] is outside [-1.0, 1.0]"
        )
        assert spec.explain(torch.tensor([0.0, 1.0, -1.0])) is None

    def test_nan_is_reported_before_bounds(self):
        spec = Bounded(-1.0, 1.0, (2, 2))
        value = torch.tensor([[0.0, 0.0], [NAN, 5.0]])
        assert spec.explain(value) == "non-finite value nan at index [1, 0]"

    def test_categorical_range_and_mask(self):
        spec = Categorical(3, (2,), mask=torch.tensor([[True, True, True], [True, False, True]]))
        assert spec.explain(torch.tensor([3, 0])) == "class 3 at index [0] is outside [0, 3)"
        assert spec.explain(torch.tensor([-1, 0])) == "class -1 at index [0] is outside [0, 3)"
        assert spec.explain(torch.tensor([1, 1])) == "class 1 at index [1] is masked out"
        assert spec.explain(torch.tensor([1, 2])) is None

    def test_one_hot(self):
        spec = OneHot(3, (2, 3), dtype=torch.int64)
        ok = torch.tensor([[0, 1, 0], [1, 0, 0]])
        assert spec.explain(ok) is None
        assert spec.explain(torch.tensor([[0, 2, 0], [1, 0, 0]])) == (
            "value 2 at index [0, 1] is not 0 or 1"
        )
        assert spec.explain(torch.tensor([[0, 1, 0], [1, 1, 0]])) == (
            "the vector at index [1] has 2 ones, expected 1"
        )
        assert "has 0 ones" in spec.explain(torch.tensor([[0, 0, 0], [1, 0, 0]]))

    def test_one_hot_mask(self):
        spec = OneHot(3, mask=torch.tensor([True, False, True]))
        assert "masked-out class" in spec.explain(torch.tensor([False, True, False]))
        assert spec.is_in(torch.tensor([False, False, True]))

    def test_multicategorical(self):
        spec = MultiCategorical([2, 4])
        assert spec.explain(torch.tensor([1, 4])) == "value 4 at index [1] is outside [0, 4)"
        assert spec.explain(torch.tensor([2, 0])) == "value 2 at index [0] is outside [0, 2)"
        assert spec.explain(torch.tensor([-1, 0])) == "value -1 at index [0] is outside [0, 2)"
        assert spec.explain(torch.tensor([1, 3])) is None

    def test_binary(self):
        spec = Binary(3)
        assert spec.explain(torch.tensor([0, 2, 1], dtype=torch.int8)) == (
            "value 2 at index [1] is not 0 or 1"
        )
        assert spec.explain(torch.tensor([0, 1, 1], dtype=torch.int8)) is None

    @pytest.mark.parametrize(
        "spec",
        [
            Unbounded((2, 3)),
            Bounded(-1.0, 1.0, (2, 3)),
            Categorical(4, (2, 3)),
            OneHot(3, (2, 3)),
            MultiCategorical([2, 3, 4], (2, 3)),
            Binary(3, (2, 3)),
        ],
        ids=lambda s: type(s).__name__,
    )
    def test_leading_dims(self, spec):
        value = spec.rand((5, 7))
        assert spec.explain(value, leading_dims=True) is None
        assert spec.explain(value) is not None  # without the flag the shape is wrong
        assert spec.explain(spec.rand(), leading_dims=True) is None
        # the trailing dims still have to match
        assert "!= spec shape" in spec.explain(value[..., :1, :], leading_dims=True)
        assert "!= spec shape" in spec.explain(spec.rand()[0], leading_dims=True)

    def test_leading_dims_still_checks_domain(self):
        spec = Bounded(0.0, 1.0, (2,))
        value = torch.zeros(4, 2)
        value[3, 1] = 2.0
        assert spec.explain(value, leading_dims=True) == (
            "value 2.0 at index [3, 1] is outside [0.0, 1.0]"
        )
        mask_spec = Categorical(3, (2,), mask=torch.tensor([True, False, True]))
        assert "masked out" in mask_spec.explain(
            torch.ones(4, 2, dtype=torch.long), leading_dims=True
        )


class TestBounded:
    def test_rand_inside_and_spread(self):
        spec = Bounded(-2.0, 3.0, (10_000,))
        sample = spec.rand()
        assert spec.is_in(sample)
        assert sample.min() < -1.5 and sample.max() > 2.5

    def test_per_element_bounds(self):
        low, high = torch.tensor([0.0, 10.0, -5.0]), torch.tensor([1.0, 10.0, -4.0])
        spec = Bounded(low, high, (3,))
        sample = spec.rand((1000,))
        assert (sample >= low).all() and (sample <= high).all()
        assert (sample[:, 1] == 10.0).all()

    def test_wide_float_range(self):
        """``high - low`` overflows float32 here; samples must still be finite and spread."""
        spec = Bounded(-3e38, 3e38, (10_000,))
        sample = spec.rand()
        assert spec.is_in(sample)
        assert (sample < 0).any() and (sample > 0).any()
        assert sample.unique().numel() > 1000

    @pytest.mark.parametrize(
        ("low", "high", "dtype"),
        [
            (-100, 100, torch.int8),
            (-128, 127, torch.int8),
            (0, 255, torch.uint8),
            (-5, 5, torch.int64),
        ],
    )
    def test_int_rand_covers_range(self, low, high, dtype):
        spec = Bounded(low, high, (20_000,), dtype=dtype)
        sample = spec.rand(generator=_gen())
        assert spec.is_in(sample)
        assert set(sample.tolist()) == set(range(low, high + 1))

    def test_int_rand_uniform(self):
        sample = Bounded(0, 3, (40_000,), dtype=torch.int32).rand(generator=_gen())
        counts = torch.bincount(sample.long(), minlength=4).float() / sample.numel()
        assert torch.allclose(counts, torch.full((4,), 0.25), atol=0.02)

    @pytest.mark.parametrize(
        ("low", "high"),
        [(-(2**63), 2**63 - 1), (0, 2**63 - 1), (-(2**62), 2**62), (-(2**60), 2**60 + 7)],
    )
    def test_int64_rand_spanning_2_53_or_more_spreads_over_the_range(self, low, high):
        # high - low does not fit in int64 offsets (a Gymnasium int Box with the int64 limits):
        # the samples used to be the upper bound every time; now spread over [low, high], in
        # both halves, and inside
        spec = Bounded(low, high, (4_000,), dtype=torch.int64)
        sample = spec.rand(generator=_gen())
        assert spec.is_in(sample)
        assert sample.unique().numel() > 3_900
        mid = low // 2 + high // 2
        below = float((sample < mid).double().mean())
        assert 0.45 < below < 0.55, below
        edge = Bounded(2**63 - 3, 2**63 - 1, (300,), dtype=torch.int64).rand(generator=_gen())
        assert set(edge.tolist()) == {2**63 - 3, 2**63 - 2, 2**63 - 1}  # narrow: still exact

    def test_zero_is_clamped(self):
        assert Bounded(1.0, 2.0, (2,)).zero().tolist() == [1.0, 1.0]
        assert Bounded(-2.0, -1.0).zero().item() == -1.0
        assert Bounded(-1.0, 1.0, (2,)).zero().tolist() == [0.0, 0.0]
        assert Bounded(3, 5, dtype=torch.int8).zero().item() == 3

    def test_project_clamps(self):
        spec = Bounded(torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 5.0]), (2,))
        out = spec.project(torch.tensor([[-3.0, 7.0], [NAN, INF], [0.5, 2.0]]))
        assert out.tolist() == [[-1.0, 5.0], [0.0, 5.0], [0.5, 2.0]]

    def test_project_nan_goes_to_zero_element(self):
        assert Bounded(1.0, 2.0).project(torch.tensor(NAN)).item() == 1.0

    def test_project_float_onto_int(self):
        spec = Bounded(0, 10, (5,), dtype=torch.int32)
        out = spec.project(torch.tensor([INF, -INF, 1e12, 2.7, NAN]))
        assert out.dtype == torch.int32
        assert out.tolist() == [10, 0, 10, 3, 0]

    @pytest.mark.parametrize(
        ("low", "high", "inside"), [(-2.5, -0.5, [-2, -1]), (0.5, 2.5, [1, 2]), (-0.5, 0.5, [0])]
    )
    def test_integer_boxes_hold_the_integers_inside_fractional_bounds(self, low, high, inside):
        spec = Bounded(low, high, (1000,), dtype=torch.int64)
        assert sorted(spec.rand().unique().tolist()) == inside
        assert spec.is_in(spec.zero())
        for outside in (inside[0] - 1, inside[-1] + 1):
            assert not spec.is_in(torch.full((1000,), outside))

    def test_an_integer_box_without_an_integer_is_refused(self):
        with pytest.raises(ValueError, match=r"low <= high .*\(integers: low rounded up"):
            Bounded(0.2, 0.8, (2,), dtype=torch.int64)

    def test_project_does_not_wrap_narrow_ints(self):
        spec = Bounded(0, 100, (3,), dtype=torch.int8)
        out = spec.project(torch.tensor([300, -300, 50]))
        assert out.tolist() == [100, 0, 50]

    def test_expand_keeps_per_element_bounds(self):
        spec = Bounded(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 2.0]), (2,))
        wide = spec.expand(3, 2)
        assert wide.shape == (3, 2)
        assert wide.low.tolist() == [[0.0, 1.0]] * 3
        assert wide.high.tolist() == [[1.0, 2.0]] * 3
        assert wide.is_in(wide.rand())

    def test_repr(self):
        assert repr(Bounded(-1.0, 1.0, (2,))) == (
            "Bounded(shape=[2], dtype=float32, device=cpu, low=-1.0, high=1.0)"
        )
        spec = Bounded(torch.tensor([0.0, 1.0]), 2.0, (2,))
        assert repr(spec) == (
            "Bounded(shape=[2], dtype=float32, device=cpu, low=tensor(shape=[2]), high=2.0)"
        )


class TestCategorical:
    def test_rand_range(self):
        spec = Categorical(4, (3, 2))
        sample = spec.rand((1000,))
        assert sample.shape == (1000, 3, 2) and sample.dtype == torch.int64
        assert set(sample.unique().tolist()) == {0, 1, 2, 3}

    def test_bool(self):
        spec = Categorical(2, (2, 1), dtype=torch.bool)
        sample = spec.rand((500,))
        assert sample.dtype == torch.bool
        assert sample.any() and not sample.all()
        assert spec.is_in(torch.ones(2, 1, dtype=torch.bool))
        assert spec.zero().dtype == torch.bool and not spec.zero().any()

    def test_mask_honoured_by_rand(self):
        mask = torch.tensor([[True, False, True, False, False], [False, False, False, False, True]])
        spec = Categorical(5, (2,), mask=mask)
        sample = spec.rand((10_000,))
        assert set(sample[:, 0].unique().tolist()) == {0, 2}
        assert (sample[:, 1] == 4).all()
        # every sample is allowed by the mask
        assert mask.expand(10_000, 2, 5).gather(-1, sample.unsqueeze(-1)).all()
        assert spec.expand(10_000, 2).is_in(sample)

    @pytest.mark.parametrize(("n", "dtype"), [(256, torch.uint8), (128, torch.int8)])
    def test_classes_that_fill_their_dtype(self, n, dtype):
        spec = Categorical(n, (64,), dtype=dtype)  # n itself does not fit the dtype
        assert spec.is_in(spec.rand()) and spec.is_in(spec.zero())
        assert spec.is_in(torch.full((64,), n - 1, dtype=dtype))

    @pytest.mark.parametrize("cls", [Categorical, OneHot])
    def test_a_mask_row_that_allows_nothing_is_refused_by_zero_and_project(self, cls):
        mask = torch.tensor([[True, False, True], [False, False, False]])
        spec = cls(3, (2, 3) if cls is OneHot else (2,), mask=mask)
        value = torch.zeros(spec.shape, dtype=spec.dtype)  # [0, 0], or all-zero scores
        for call in (spec.zero, lambda: spec.project(value)):
            with pytest.raises(ValueError, match="allows no action at flat index 1"):
                call()

    def test_mask_is_copied(self):
        mask = torch.tensor([True, True, False])
        spec = Categorical(3, mask=mask)
        mask[2] = True
        assert spec.mask.tolist() == [True, True, False]

    def test_mask_honoured_by_zero_is_in_project(self):
        spec = Categorical(4, (3,), mask=torch.tensor([False, False, True, True]))
        assert spec.zero().tolist() == [2, 2, 2]
        assert not spec.is_in(torch.tensor([0, 2, 3]))
        out = spec.project(torch.tensor([0, 1, 3]))
        assert out.tolist() == [2, 2, 3]
        assert spec.is_in(out)

    def test_project(self):
        spec = Categorical(3, (6,))
        out = spec.project(torch.tensor([-2.0, 0.4, 1.6, 9.0, NAN, INF]))
        assert out.dtype == torch.int64
        assert out.tolist() == [0, 0, 2, 2, 0, 2]

    def test_project_bool_and_ints(self):
        assert Categorical(3, (2,)).project(torch.tensor([True, False])).tolist() == [1, 0]
        bool_spec = Categorical(2, (3,), dtype=torch.bool)
        out = bool_spec.project(torch.tensor([0, 5, -1]))
        assert out.dtype == torch.bool and out.tolist() == [False, True, False]

    def test_rand_with_per_call_mask(self):
        spec = Categorical(4, (2,), mask=torch.tensor([True, False, False, False]))
        call_mask = torch.tensor([False, False, False, True])
        assert (spec.rand((1000,), mask=call_mask) == 3).all()
        full = torch.zeros(1000, 2, 4, dtype=torch.bool)
        full[:, 0, 1] = True
        full[:, 1, 2] = True
        sample = spec.rand((1000,), mask=full)
        assert (sample[:, 0] == 1).all() and (sample[:, 1] == 2).all()
        assert (spec.rand((100,)) == 0).all()  # the spec's own mask is untouched

    def test_rand_all_false_mask_row(self):
        spec = Categorical(3, (2,))
        mask = torch.tensor([[True, True, False], [False, False, False]])
        with pytest.raises(ValueError, match="allows no action at flat index 1"):
            spec.rand(mask=mask)
        with pytest.raises(ValueError, match="allows no action"):
            Categorical(3, (2,), mask=mask).rand()

    def test_rand_per_call_mask_errors(self):
        spec = Categorical(3, (2,))
        with pytest.raises(ValueError, match=r"mask of shape \[4\] does not broadcast to \[2, 3\]"):
            spec.rand(mask=torch.ones(4, dtype=torch.bool))
        with pytest.raises(TypeError, match="mask must be a bool tensor"):
            spec.rand(mask=torch.ones(3))

    def test_update_mask(self):
        spec = Categorical(3, (2,))
        spec.update_mask(torch.tensor([False, True, False]))
        assert spec.mask.shape == (2, 3)
        assert (spec.rand((100,)) == 1).all()
        spec.update_mask(None)
        assert spec.mask is None
        with pytest.raises(ValueError, match="does not broadcast"):
            spec.update_mask(torch.ones(4, dtype=torch.bool))

    def test_expand_with_mask(self):
        spec = Categorical(3, (2,), mask=torch.tensor([[True, False, False], [False, False, True]]))
        wide = spec.expand(5, 2)
        assert wide.mask.shape == (5, 2, 3)
        sample = wide.rand()
        assert (sample[:, 0] == 0).all() and (sample[:, 1] == 2).all()

    def test_generator_reproducible(self):
        spec = Categorical(5, (4,), mask=torch.tensor([True, True, False, True, True]))
        assert torch.equal(spec.rand((50,), generator=_gen(3)), spec.rand((50,), generator=_gen(3)))

    def test_repr(self):
        assert repr(Categorical(3, (2,))) == "Categorical(shape=[2], dtype=int64, device=cpu, n=3)"
        masked = Categorical(3, (2,), mask=torch.tensor([True, False, True]))
        assert repr(masked) == (
            "Categorical(shape=[2], dtype=int64, device=cpu, n=3, mask=tensor(shape=[2, 3]))"
        )


class TestOneHot:
    def test_default_shape_and_rand(self):
        spec = OneHot(4)
        assert spec.shape == (4,) and spec.dtype == torch.bool
        sample = spec.rand((1000,))
        assert sample.shape == (1000, 4)
        assert (sample.sum(-1) == 1).all()
        assert sample.any(0).all()  # every class is drawn

    def test_mask_honoured_by_rand(self):
        mask = torch.tensor([[False, True, False], [True, False, True]])
        spec = OneHot(3, (2, 3), mask=mask)
        sample = spec.rand((10_000,))
        assert not (sample & ~mask).any()
        assert sample[:, 1, 0].any() and sample[:, 1, 2].any()
        assert spec.zero().tolist() == [[False, True, False], [True, False, False]]

    def test_project_argmax(self):
        spec = OneHot(3, dtype=torch.float32)
        assert spec.project(torch.tensor([0.1, 2.0, -1.0])).tolist() == [0.0, 1.0, 0.0]
        assert spec.project(torch.tensor([NAN, NAN, NAN])).tolist() == [1.0, 0.0, 0.0]

    def test_project_respects_mask(self):
        spec = OneHot(3, mask=torch.tensor([False, True, True]))
        assert spec.project(torch.tensor([5.0, 1.0, 2.0])).tolist() == [False, False, True]
        out = spec.project(torch.tensor([0.0, -INF, -INF]))
        assert spec.is_in(out)
        assert out.tolist() == [False, True, False]

    def test_float_and_int_dtypes(self):
        for dtype in (torch.float32, torch.int64, torch.uint8):
            spec = OneHot(3, (2, 3), dtype=dtype)
            sample = spec.rand()
            assert sample.dtype == dtype and spec.is_in(sample)


class TestMultiCategorical:
    def test_rand_per_column(self):
        spec = MultiCategorical([2, 5, 1], (4, 3))
        sample = spec.rand((2000,))
        assert sample.shape == (2000, 4, 3)
        assert set(sample[..., 0].unique().tolist()) == {0, 1}
        assert set(sample[..., 1].unique().tolist()) == {0, 1, 2, 3, 4}
        assert (sample[..., 2] == 0).all()

    def test_nvec_as_tensor(self):
        assert MultiCategorical(torch.tensor([2, 3])) == MultiCategorical([2, 3])

    def test_project(self):
        spec = MultiCategorical([3, 4])
        assert spec.project(torch.tensor([INF, 1e20])).tolist() == [2, 3]
        assert spec.project(torch.tensor([-INF, NAN])).tolist() == [0, 0]
        assert spec.project(torch.tensor([7, -2])).tolist() == [2, 0]
        assert spec.project(torch.tensor([1.4, 2.6])).tolist() == [1, 3]

    def test_repr(self):
        assert repr(MultiCategorical([3, 3])) == (
            "MultiCategorical(shape=[2], dtype=int64, device=cpu, nvec=3)"
        )
        assert "nvec=tensor(shape=[2])" in repr(MultiCategorical([2, 3]))


class TestBinary:
    @pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.float32, torch.int64])
    def test_rand_zero(self, dtype):
        spec = Binary(3, (5, 3), dtype=dtype)
        sample = spec.rand((200,))
        assert sample.dtype == dtype
        assert set(sample.to(torch.int64).unique().tolist()) == {0, 1}
        assert spec.is_in(spec.zero())

    def test_project(self):
        spec = Binary(4)
        out = spec.project(torch.tensor([0.2, 0.7, NAN, INF]))
        assert out.dtype == torch.int8 and out.tolist() == [0, 1, 0, 1]
        assert Binary(2, dtype=torch.bool).project(torch.tensor([3, 0])).tolist() == [True, False]

    def test_repr(self):
        assert repr(Binary(3)) == "Binary(shape=[3], dtype=int8, device=cpu, n=3)"


# ====================================================================== shared behaviour
ALL_SPECS = [
    Unbounded((2, 3)),
    Bounded(-1.0, torch.tensor([1.0, 2.0, 3.0]), (2, 3)),
    Bounded(0, 9, (2, 3), dtype=torch.int16),
    Categorical(4, (2, 3), mask=torch.tensor([True, False, True, True])),
    OneHot(3, (2, 3), mask=torch.tensor([True, True, False])),
    MultiCategorical([2, 3, 4], (2, 3)),
    Binary(3, (2, 3)),
]


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: type(s).__name__)
class TestShared:
    def test_rand_zero_in(self, spec):
        assert spec.is_in(spec.rand())
        assert spec.is_in(spec.zero())
        assert spec.rand((4, 5)).shape == (4, 5, 2, 3)
        assert spec.zero(4).shape == (4, 2, 3)

    def test_expand_forms(self, spec):
        by_ints = spec.expand(4, 2, 3)
        assert by_ints.shape == (4, 2, 3)
        assert by_ints == spec.expand((4, 2, 3)) == spec.expand(torch.Size([4, 2, 3]))
        assert by_ints.is_in(by_ints.rand()) and by_ints.is_in(by_ints.zero())
        assert spec.expand(2, 3) == spec

    def test_expand_errors(self, spec):
        with pytest.raises(ValueError, match=r"cannot expand a spec of shape \[2, 3\] to \[4, 3\]"):
            spec.expand(4, 3)
        with pytest.raises(ValueError, match="must end with the old one"):
            spec.expand(3)

    def test_clone_equal_and_independent(self, spec):
        reference = spec.clone()
        copy = spec.clone()
        assert copy == spec and copy is not spec
        tensors = [v for v in copy._params().values() if isinstance(v, torch.Tensor)]
        for value in tensors:  # mutating the copy's parameters leaves the original alone
            value.logical_not_() if value.dtype == torch.bool else value.add_(1)
        assert spec == reference
        assert (copy != spec) == bool(tensors)

    def test_to_cpu(self, spec):
        moved = spec.to("cpu")
        assert moved == spec and moved is not spec
        assert spec.to(torch.device("cpu")) == spec

    def test_eq(self, spec):
        assert spec == spec.clone()
        assert spec != Unbounded((2, 3), dtype=torch.float64)
        assert spec != 3
        assert spec != spec.expand(1, 2, 3)

    def test_unhashable(self, spec):
        with pytest.raises(TypeError):
            hash(spec)

    def test_repr(self, spec):
        text = repr(spec)
        assert text.startswith(f"{type(spec).__name__}(shape=[2, 3], dtype=")
        assert "device=cpu" in text

    def test_project_shape_errors(self, spec):
        with pytest.raises(ValueError, match=r"cannot project a value of shape \[3, 2\]"):
            spec.project(torch.zeros(3, 2))
        with pytest.raises(TypeError, match=r"project expects a torch\.Tensor, got list"):
            spec.project([[0.0] * 3] * 2)

    def test_project_leading_dims(self, spec):
        value = torch.randn(4, 2, 3, generator=_gen()) * 10
        out = spec.project(value)
        assert out.shape == (4, 2, 3)
        assert spec.explain(out, leading_dims=True) is None

    def test_generator_reproducible(self, spec):
        first = spec.rand((8,), generator=_gen(7))
        assert torch.equal(first, spec.rand((8,), generator=_gen(7)))


@pytest.mark.parametrize(
    "spec",
    [Unbounded((2, 3)), ALL_SPECS[3], ALL_SPECS[4], Binary(3, (2, 3))],
    ids=lambda s: type(s).__name__,
)
def test_to_moves_parameters(spec):
    """Without a GPU, ``meta`` is the other device (specs whose constructor reads no values)."""
    meta = spec.to("meta")
    assert meta.device == torch.device("meta")
    assert meta != spec
    for value in meta._params().values():
        if isinstance(value, torch.Tensor):
            assert value.device.type == "meta"
    assert meta.zero().device.type == "meta"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: type(s).__name__)
def test_to_cuda(spec):
    gpu = spec.to("cuda")
    assert gpu.device == torch.device("cuda", torch.cuda.current_device())
    assert gpu != spec
    for value in gpu._params().values():
        if isinstance(value, torch.Tensor):
            assert value.device == gpu.device
    sample = gpu.rand((4,))
    assert sample.device == gpu.device
    assert gpu.explain(sample, leading_dims=True) is None
    assert gpu.is_in(gpu.zero())
    assert gpu.is_in(gpu.project(torch.randn(2, 3) * 10))
    assert gpu.explain(spec.rand()) == f"device cpu != spec device {gpu.device}"
    assert gpu.to("cpu") == spec


def test_eq_details():
    assert Categorical(3, (2,)) != Categorical(4, (2,))
    assert Categorical(3, (2,)) != Categorical(3, (2,), dtype=torch.int32)
    assert Categorical(3, (2,)) != Categorical(3, (2,), mask=torch.ones(3, dtype=torch.bool))
    assert Bounded(0.0, 1.0) != Bounded(0.0, 2.0)
    assert Bounded(0.0, 1.0) != Unbounded()
    assert MultiCategorical([2, 3]) != MultiCategorical([3, 2])
    assert OneHot(3) != OneHot(3, mask=torch.tensor([True, True, False]))
    assert OneHot(3) == OneHot(3, (3,), dtype=torch.bool)


# ====================================================================== hypothesis properties
SHAPES = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
NONEMPTY_SHAPES = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)
FLOAT_DTYPES = st.sampled_from([torch.float32, torch.float64])
#: Spec families; each property runs once per family so that every one gets its examples.
KINDS = ("unbounded", "bounded_f", "bounded_i", "cat", "onehot", "multi", "binary")
by_kind = pytest.mark.parametrize("kind", KINDS)


def _random_mask(seed: int, shape: tuple[int, ...], n: int) -> torch.Tensor:
    """A bool ``[*shape, n]`` mask with at least one allowed class per row."""
    gen = _gen(seed)
    mask = torch.rand(*shape, n, generator=gen) < 0.5
    forced = torch.randint(0, n, shape, generator=gen)
    return mask.scatter(-1, forced.unsqueeze(-1), True)


@st.composite
def _floats_tensor(draw, shape: tuple[int, ...], dtype: torch.dtype, **kwargs) -> torch.Tensor:
    width = 32 if dtype == torch.float32 else 64
    numel = math.prod(shape)
    values = draw(st.lists(st.floats(width=width, **kwargs), min_size=numel, max_size=numel))
    return torch.tensor(values, dtype=dtype).reshape(shape)


@st.composite
def _int_bounds(draw, shape: tuple[int, ...], dtype: torch.dtype):
    info = torch.iinfo(dtype)
    lo, hi = info.min, info.max
    if dtype == torch.int64:  # spans of 2**63 and more are a documented limitation
        lo, hi = -(2**61), 2**61
    numel = math.prod(shape) if draw(st.booleans()) else 1
    pairs = draw(
        st.lists(
            st.tuples(st.integers(lo, hi), st.integers(lo, hi)), min_size=numel, max_size=numel
        )
    )
    low = torch.tensor([min(p) for p in pairs], dtype=torch.int64)
    high = torch.tensor([max(p) for p in pairs], dtype=torch.int64)
    if numel == 1:
        return low.reshape(()), high.reshape(())
    return low.reshape(shape), high.reshape(shape)


@st.composite
def leaf_specs(draw, prefix: tuple[int, ...] = (), kinds: tuple[str, ...] = KINDS) -> TensorSpec:
    """A leaf spec of one of ``kinds`` whose shape starts with ``prefix`` (small shapes)."""
    shape = prefix + draw(SHAPES)
    kind = draw(st.sampled_from(kinds))
    if kind == "unbounded":
        return Unbounded(
            shape, dtype=draw(st.sampled_from([torch.float32, torch.float64, torch.int32]))
        )
    if kind == "bounded_f":
        dtype = draw(FLOAT_DTYPES)
        bound_shape = shape if draw(st.booleans()) else ()
        a = draw(_floats_tensor(bound_shape, dtype, allow_nan=False, allow_infinity=False))
        b = draw(_floats_tensor(bound_shape, dtype, allow_nan=False, allow_infinity=False))
        return Bounded(torch.minimum(a, b), torch.maximum(a, b), shape, dtype=dtype)
    if kind == "bounded_i":
        dtype = draw(st.sampled_from(INT_DTYPES))
        low, high = draw(_int_bounds(shape, dtype))
        return Bounded(low, high, shape, dtype=dtype)
    if kind == "cat":
        dtype = draw(st.sampled_from((*INT_DTYPES, torch.bool)))
        n = 2 if dtype == torch.bool else draw(st.integers(1, 6))
        mask = _random_mask(draw(st.integers(0, 2**16)), shape, n) if draw(st.booleans()) else None
        return Categorical(n, shape, dtype=dtype, mask=mask)
    if kind == "onehot":
        n = draw(st.integers(1, 5))
        dtype = draw(
            st.sampled_from([torch.bool, torch.int8, torch.uint8, torch.int64, torch.float32])
        )
        mask = _random_mask(draw(st.integers(0, 2**16)), shape, n) if draw(st.booleans()) else None
        return OneHot(n, (*shape, n), dtype=dtype, mask=mask)
    if kind == "multi":
        nvec = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
        return MultiCategorical(nvec, (*shape, len(nvec)), dtype=draw(st.sampled_from(INT_DTYPES)))
    n = draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([torch.int8, torch.uint8, torch.bool, torch.float32, torch.int64]))
    return Binary(n, (*shape, n), dtype=dtype)


@st.composite
def _arbitrary_value(draw, shape: tuple[int, ...]) -> torch.Tensor:
    """Anything of ``shape``: floats with NaN/inf (float32 or float64), ints, or bools."""
    kind = draw(st.sampled_from(["f32", "f64", "int", "bool"]))
    if kind in ("f32", "f64"):
        dtype = torch.float32 if kind == "f32" else torch.float64
        return draw(_floats_tensor(shape, dtype, allow_nan=True, allow_infinity=True))
    numel = math.prod(shape)
    if kind == "int":
        values = draw(st.lists(st.integers(-(2**40), 2**40), min_size=numel, max_size=numel))
        return torch.tensor(values, dtype=torch.int64).reshape(shape)
    values = draw(st.lists(st.booleans(), min_size=numel, max_size=numel))
    return torch.tensor(values, dtype=torch.bool).reshape(shape)


@by_kind
@PROPERTY
@given(data=st.data(), lead=NONEMPTY_SHAPES, seed=st.integers(0, 2**16))
def test_rand_and_zero_always_in(kind, data, lead, seed):
    spec = data.draw(leaf_specs(kinds=(kind,)))
    sample = spec.rand(generator=_gen(seed))
    assert spec.explain(sample) is None
    assert spec.explain(spec.zero()) is None
    batch = spec.rand(lead, generator=_gen(seed))
    assert batch.shape == torch.Size(lead) + spec.shape
    assert spec.explain(batch, leading_dims=True) is None


@by_kind
@PROPERTY
@given(data=st.data())
def test_project_always_lands_inside(kind, data):
    spec = data.draw(leaf_specs(kinds=(kind,)))
    value = data.draw(_arbitrary_value(tuple(spec.shape)))
    out = spec.project(value)
    assert spec.explain(out) is None, (value, out)


@by_kind
@PROPERTY
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_project_is_identity_inside(kind, data, seed):
    spec = data.draw(leaf_specs(kinds=(kind,)))
    sample = spec.rand((3,), generator=_gen(seed))
    assert torch.equal(spec.project(sample), sample)


@by_kind
@PROPERTY
@given(data=st.data(), lead=SHAPES, seed=st.integers(0, 2**16))
def test_expand_keeps_properties(kind, data, lead, seed):
    spec = data.draw(leaf_specs(kinds=(kind,)))
    wide = spec.expand(torch.Size(lead) + spec.shape)
    assert wide.shape == torch.Size(lead) + spec.shape
    assert wide.explain(wide.rand(generator=_gen(seed))) is None
    assert wide.explain(wide.zero()) is None
    value = data.draw(_arbitrary_value(tuple(wide.shape)))
    assert wide.explain(wide.project(value)) is None
    assert wide.clone() == wide
    assert wide == spec.expand(*lead, *spec.shape)


@by_kind
@PROPERTY
@given(data=st.data())
def test_clone_and_to_equal(kind, data):
    spec = data.draw(leaf_specs(kinds=(kind,)))
    assert spec == spec
    assert spec.clone() == spec
    assert spec.to("cpu") == spec
    assert type(spec).__name__ in repr(spec)
