"""``Composite``: nested keys, mapping API, TensorDict generation and checking, transforms."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from marlkit.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
    TensorSpec,
    Unbounded,
)

B, N = 4, 3  # env batch, agents in the group


def _layout() -> Composite:
    """The DESIGN.md layout in small: a root of batch [B] with a group of batch [B, N]."""
    return Composite(
        state=Unbounded((B, 7)),
        agents=Composite(
            observation=Unbounded((B, N, 5)),
            action=Categorical(4, (B, N), mask=torch.tensor([True, True, False, True])),
            info=Composite(speed=Bounded(0.0, 1.0, (B, N, 1)), shape=(B, N)),
            shape=(B, N),
        ),
        done=Categorical(2, (B, 1), dtype=torch.bool),
        shape=(B,),
    )


# ====================================================================== construction / mapping
class TestConstruction:
    def test_kwargs_and_mapping(self):
        by_kwargs = Composite(a=Unbounded((2, 3)), shape=(2,))
        by_mapping = Composite({"a": Unbounded((2, 3))}, shape=(2,))
        assert by_kwargs == by_mapping
        assert Composite({"a": Unbounded((2,))}, b=Unbounded((2,)), shape=(2,)).keys() == ["a", "b"]

    def test_defaults(self):
        comp = Composite()
        assert comp.shape == torch.Size([]) and comp.ndim == 0
        assert comp.device is None
        assert len(comp) == 0 and comp.is_empty()

    def test_dtype_is_the_leaves_common_one(self):
        same = Composite({"agents": {"obs": Unbounded((B, 5))}}, r=Unbounded((B, 1)), shape=(B,))
        assert same.dtype == torch.float32 and same["agents"].dtype == torch.float32
        mixed = same.clone()
        mixed["agents", "action"] = Categorical(3, (B,))
        assert mixed.dtype is None and mixed["agents"].dtype is None
        assert Composite().dtype is None

    def test_plain_mapping_becomes_composite(self):
        comp = Composite({"agents": {"obs": Unbounded((B, 5))}}, shape=(B,))
        assert isinstance(comp["agents"], Composite)
        assert comp["agents"].shape == (B,)
        assert comp["agents", "obs"] == Unbounded((B, 5))

    def test_tuple_keys_in_mapping(self):
        comp = Composite({("agents", "obs"): Unbounded((B, 5))}, shape=(B,))
        assert comp.keys(include_nested=True) == ["agents", ("agents", "obs")]

    def test_child_shape_must_start_with_batch(self):
        with pytest.raises(ValueError, match=r"spec for 'obs' has shape \[3, 5\].*shape \[4\]"):
            Composite(obs=Unbounded((3, 5)), shape=(B,))
        comp = Composite(agents=Composite(shape=(B, N)), shape=(B,))
        with pytest.raises(ValueError, match=r"spec for \('agents', 'obs'\) has shape \[4, 2\]"):
            comp["agents", "obs"] = Unbounded((B, 2))
        with pytest.raises(ValueError, match="spec for 'agents'"):
            comp["agents"] = Composite(shape=(N,))

    def test_not_a_spec(self):
        with pytest.raises(TypeError, match=r"spec for 'a' must be a spec, got Tensor"):
            Composite(a=torch.zeros(2))
        with pytest.raises(TypeError, match=r"spec for \('a', 'b'\) must be a spec, got int"):
            Composite()["a", "b"] = 3

    def test_bad_key(self):
        comp = Composite()
        with pytest.raises(TypeError, match="a key must be a str or a tuple of str"):
            comp[1] = Unbounded()
        with pytest.raises(ValueError, match="cannot be an empty tuple"):
            comp[()] = Unbounded()

    def test_device_moves_children(self):
        comp = Composite(a=Unbounded((2,)), shape=(2,), device="cpu")
        assert comp.device == torch.device("cpu")
        assert comp["a"].device == torch.device("cpu")
        comp["b", "c"] = Unbounded((2,))
        assert comp["b"].device == torch.device("cpu")


class TestNestedKeys:
    def test_set_get_auto_creates_intermediates(self):
        comp = Composite(shape=(B,))
        leaf = Unbounded((B, N, 2))
        comp["next", "agents", "reward"] = leaf
        assert comp["next", "agents", "reward"] is leaf
        assert comp[("next", ("agents", "reward"))] is leaf  # nested tuples are flattened
        assert isinstance(comp["next"], Composite) and isinstance(comp["next", "agents"], Composite)
        # an intermediate takes its parent's shape
        assert comp["next"].shape == (B,) and comp["next", "agents"].shape == (B,)
        assert comp[("next",)] is comp["next"]

    def test_intermediate_inside_group_takes_group_shape(self):
        comp = Composite(agents=Composite(shape=(B, N)), shape=(B,))
        comp["agents", "info", "speed"] = Unbounded((B, N, 1))
        assert comp["agents", "info"].shape == (B, N)

    def test_set_replaces(self):
        comp = _layout()
        comp["agents", "observation"] = Unbounded((B, N, 9))
        assert comp["agents", "observation"].shape == (B, N, 9)

    def test_missing_key(self):
        comp = _layout()
        with pytest.raises(KeyError, match=r"no spec under key 'obs'; keys here: \['action'"):
            comp["agents", "obs"]
        with pytest.raises(KeyError, match="no spec under key 'nope'"):
            comp["nope"]

    def test_through_a_leaf(self):
        comp = _layout()
        with pytest.raises(KeyError, match=r"'state' is a leaf spec, so \('state', 'x'\)"):
            comp["state", "x"]
        with pytest.raises(KeyError, match=r"cannot set \('state', 'x'\): 'state' holds a leaf"):
            comp["state", "x"] = Unbounded((B,))

    def test_failed_set_leaves_no_intermediate(self):
        comp = Composite(shape=(B,))
        with pytest.raises(ValueError, match="does not start with"):
            comp["agents", "obs"] = Unbounded((N,))
        with pytest.raises(TypeError, match="must be a spec"):
            comp["other", "deeper", "obs"] = "nope"
        assert "agents" not in comp and "other" not in comp
        assert comp.is_empty() and len(comp) == 0

    def test_get(self):
        comp = _layout()
        assert comp.get(("agents", "action")) is comp["agents", "action"]
        assert comp.get(("agents", "missing")) is None
        assert comp.get("missing", 5) == 5
        assert comp.get(("state", "below_a_leaf"), "d") == "d"

    def test_contains(self):
        comp = _layout()
        assert "state" in comp
        assert ("agents",) in comp
        assert ("agents", "info", "speed") in comp
        assert ("agents", ("info", "speed")) in comp
        assert ("agents", "missing") not in comp
        assert ("state", "x") not in comp
        assert "observation" not in comp  # nested keys are not visible at the root
        assert 1 not in comp
        assert () not in comp
        assert ["agents"] not in comp

    def test_iter_len(self):
        comp = _layout()
        assert list(comp) == ["state", "agents", "done"]
        assert len(comp) == 3
        assert len(comp["agents"]) == 3

    def test_is_empty(self):
        assert Composite(a=Composite(b=Composite())).is_empty()
        assert not Composite(a=Composite(b=Unbounded())).is_empty()


class TestKeysItemsValues:
    def test_top_level(self):
        comp = _layout()
        assert comp.keys() == ["state", "agents", "done"]
        assert comp.values()[1] is comp["agents"]
        assert [k for k, _ in comp.items()] == comp.keys()

    def test_leaves_only_top_level(self):
        assert _layout().keys(leaves_only=True) == ["state", "done"]

    def test_include_nested(self):
        assert _layout().keys(include_nested=True) == [
            "state",
            "agents",
            ("agents", "observation"),
            ("agents", "action"),
            ("agents", "info"),
            ("agents", "info", "speed"),
            "done",
        ]

    def test_include_nested_leaves_only(self):
        comp = _layout()
        keys = comp.keys(include_nested=True, leaves_only=True)
        assert keys == [
            "state",
            ("agents", "observation"),
            ("agents", "action"),
            ("agents", "info", "speed"),
            "done",
        ]
        values = comp.values(include_nested=True, leaves_only=True)
        assert all(isinstance(v, TensorSpec) for v in values)
        assert values == [comp[k] for k in keys]
        items = comp.items(include_nested=True, leaves_only=True)
        assert items == list(zip(keys, values))

    def test_values_match_items(self):
        comp = _layout()
        for nested in (False, True):
            for leaves in (False, True):
                items = comp.items(nested, leaves)
                assert comp.keys(nested, leaves) == [k for k, _ in items]
                assert all(
                    a is b for a, b in zip(comp.values(nested, leaves), [v for _, v in items])
                )


class TestMutation:
    def test_del(self):
        comp = _layout()
        del comp["agents", "info", "speed"]
        assert ("agents", "info") in comp and ("agents", "info", "speed") not in comp
        del comp["state"]
        assert comp.keys() == ["agents", "done"]

    def test_del_errors(self):
        comp = _layout()
        with pytest.raises(KeyError, match=r"no spec under key \('agents', 'nope'\)"):
            del comp["agents", "nope"]
        with pytest.raises(KeyError, match="no spec under key 'nope'"):
            del comp["nope"]
        with pytest.raises(KeyError):
            del comp["state", "x"]
        with pytest.raises(KeyError):
            del comp["missing", "x"]

    def test_pop(self):
        comp = _layout()
        action = comp["agents", "action"]
        assert comp.pop(("agents", "action")) is action
        assert ("agents", "action") not in comp
        assert comp.pop(("agents", "action"), None) is None
        assert comp.pop("nope", 3) == 3
        with pytest.raises(KeyError, match=r"no spec under key \('agents', 'action'\)"):
            comp.pop(("agents", "action"))

    def test_select(self):
        comp = _layout()
        sub = comp.select(("agents", "observation"), "done")
        assert sub.keys(include_nested=True, leaves_only=True) == [
            ("agents", "observation"),
            "done",
        ]
        assert sub["agents"].shape == (B, N)  # the group keeps its batch shape
        assert sub.shape == comp.shape
        assert sub["done"] == comp["done"] and sub["done"] is not comp["done"]
        assert sub.is_in(comp.rand().select(("agents", "observation"), "done"))

    def test_select_deep_keeps_intermediate_shapes(self):
        sub = _layout().select(("agents", "info", "speed"))
        assert sub["agents"].shape == (B, N) and sub["agents", "info"].shape == (B, N)

    def test_select_whole_subtree_and_missing(self):
        comp = _layout()
        assert comp.select("agents")["agents"] == comp["agents"]
        with pytest.raises(KeyError, match="no spec under key 'nope'"):
            comp.select("agents", ("agents", "nope"))

    def test_select_is_a_copy(self):
        comp = _layout()
        sub = comp.select(("agents", "action"))
        sub["agents", "action"].mask[...] = False
        assert comp["agents", "action"].mask[..., 0].all()

    def test_exclude(self):
        comp = _layout()
        out = comp.exclude(("agents", "info"), "state", "absent", ("absent", "deeper"))
        assert out.keys(include_nested=True, leaves_only=True) == [
            ("agents", "observation"),
            ("agents", "action"),
            "done",
        ]
        assert comp == _layout()  # the original is untouched

    def test_update_composite_merges_nested(self):
        comp = _layout()
        other = Composite(
            agents=Composite(
                observation=Unbounded((B, N, 9)),
                hidden=Unbounded((B, N, 16)),
                shape=(B, N),
            ),
            state2=Unbounded((B,)),
            shape=(B,),
        )
        assert comp.update(other) is comp
        assert comp["agents", "observation"].shape == (B, N, 9)  # replaced
        assert comp["agents", "hidden"].shape == (B, N, 16)  # added
        assert ("agents", "action") in comp and ("agents", "info", "speed") in comp  # kept
        assert comp["state2"] == Unbounded((B,))

    def test_update_keeps_group_shapes(self):
        """A group that only ``other`` has keeps its [B, N] batch shape."""
        target = Composite(state=Unbounded((B, 2)), shape=(B,))
        target.update(_layout())
        assert target["agents"].shape == (B, N)
        assert target["agents", "info"].shape == (B, N)
        assert target == _layout()
        assert target.rand()["agents"].batch_size == (B, N)

    def test_update_copies_empty_subcomposites(self):
        target = Composite(shape=(B,))
        target.update(Composite(empty=Composite(shape=(B, N)), shape=(B,)))
        assert target["empty"] == Composite(shape=(B, N))

    def test_update_mapping(self):
        comp = Composite(shape=(B,))
        comp.update({"a": Unbounded((B, 1)), "b": {"c": Unbounded((B,))}})
        assert comp.keys(include_nested=True) == ["a", "b", ("b", "c")]

    def test_update_shape_mismatch(self):
        comp = Composite(agents=Composite(shape=(B, N)), shape=(B,))
        other = Composite(agents=Composite(x=Unbounded((B, 2, 1)), shape=(B, 2)), shape=(B,))
        with pytest.raises(ValueError, match=r"\('agents', 'x'\)"):
            comp.update(other)


# ====================================================================== data
class TestRandZero:
    def test_batch_sizes(self):
        comp = _layout()
        for td in (comp.rand(), comp.zero()):
            assert td.batch_size == (B,)
            assert td["agents"].batch_size == (B, N)
            assert td["agents", "info"].batch_size == (B, N)
            assert td["agents", "observation"].shape == (B, N, 5)
            assert td["done"].dtype == torch.bool
            assert comp.is_in(td)

    def test_leading_shape(self):
        comp = _layout()
        td = comp.rand((2, 6))
        assert td.batch_size == (2, 6, B)
        assert td["agents"].batch_size == (2, 6, B, N)
        assert td["agents", "action"].shape == (2, 6, B, N)
        assert comp.zero(2).batch_size == (2, B)
        assert comp.explain(td, leading_dims=True) == []
        assert comp.expand(2, 6, B).is_in(td)

    def test_zero_values(self):
        td = _layout().zero()
        assert not td["state"].any()
        assert not td["agents", "action"].any()  # class 0 is allowed by the mask

    def test_rand_honours_masks(self):
        td = _layout().rand((1000,))
        assert not (td["agents", "action"] == 2).any()

    def test_generator(self):
        comp = _layout()
        first = comp.rand(generator=torch.Generator().manual_seed(1))
        second = comp.rand(generator=torch.Generator().manual_seed(1))
        assert (first == second).all()

    def test_empty(self):
        td = Composite(shape=(B,)).rand()
        assert td.batch_size == (B,) and len(td.keys()) == 0

    def test_device(self):
        assert _layout().rand().device is None
        assert Composite(a=Unbounded((2,)), shape=(2,), device="cpu").rand().device == (
            torch.device("cpu")
        )


class TestExplain:
    def test_in_spec(self):
        comp = _layout()
        assert comp.explain(comp.rand()) == []
        assert comp.is_in(comp.rand())

    def test_lists_every_missing_key(self):
        comp = _layout()
        td = comp.rand().exclude("state", ("agents", "observation"), ("agents", "info", "speed"))
        problems = comp.explain(td)
        assert [key for key, _ in problems] == [
            "state",
            ("agents", "observation"),
            ("agents", "info", "speed"),
        ]
        reason = dict(problems)["state"]
        assert reason == "missing (expected Unbounded(shape=[4, 7], dtype=float32, device=cpu))"
        assert not comp.is_in(td)

    def test_lists_every_bad_key(self):
        comp = _layout()
        td = comp.rand()
        td["state"] = torch.zeros(B, 6)
        td["agents", "observation"] = td["agents", "observation"].double()
        td["agents", "action"] = torch.full((B, N), 2)  # masked class
        td["agents", "info", "speed"] = torch.full((B, N, 1), math.nan)
        td["done"] = torch.zeros(B, 1, dtype=torch.bool)  # fine
        problems = dict(comp.explain(td))
        assert problems == {
            "state": "shape [4, 6] != spec shape [4, 7]",
            ("agents", "observation"): "dtype float64 != spec dtype float32",
            ("agents", "action"): "class 2 at index [0, 0] is masked out",
            ("agents", "info", "speed"): "non-finite value nan at index [0, 0, 0]",
        }

    def test_tensor_where_a_group_is_expected(self):
        comp = _layout()
        td = TensorDict(state=torch.zeros(B, 7), agents=torch.zeros(B), batch_size=[B])
        keys = [key for key, _ in comp.explain(td)]
        assert ("agents", "observation") in keys and "done" in keys

    def test_strict_reports_extra_keys(self):
        comp = _layout()
        td = comp.rand()
        td["extra"] = torch.zeros(B)
        td["agents", "hidden"] = torch.zeros(B, N, 2)
        assert comp.explain(td) == []
        assert set(comp.explain(td, strict=True)) == {
            ("extra", "present in the data but absent from the spec"),
            (("agents", "hidden"), "present in the data but absent from the spec"),
        }

    def test_leading_dims(self):
        comp = _layout()
        td = comp.rand((5,))
        assert comp.explain(td) != []
        assert comp.explain(td, leading_dims=True) == []

    def test_not_a_tensordict(self):
        comp = _layout()
        assert comp.explain({"state": torch.zeros(B, 7)}) == [
            ((), "expected a TensorDict, got dict")
        ]
        assert not comp.is_in(torch.zeros(B))


class TestProject:
    def test_project_lands_inside_and_copies(self):
        comp = _layout()
        td = comp.zero()
        td["state"] = torch.full((B, 7), math.nan)
        td["agents", "action"] = torch.full((B, N), 9)
        td["agents", "info", "speed"] = torch.full((B, N, 1), 5.0)
        td["extra"] = torch.ones(B)
        out = comp.project(td)
        assert comp.is_in(out)
        assert (out["agents", "action"] == 3).all()  # clamped to 3, which the mask allows
        assert (out["agents", "info", "speed"] == 1.0).all()
        assert (out["extra"] == 1).all()  # undescribed entries are kept
        # the input is untouched
        assert td["state"].isnan().all()
        assert td["agents", "action"].eq(9).all()
        assert td["agents", "info", "speed"].eq(5.0).all()

    def test_project_skips_missing(self):
        comp = _layout()
        td = comp.rand().exclude("state")
        out = comp.project(td)
        assert "state" not in out
        assert [key for key, _ in comp.explain(out)] == ["state"]


# ====================================================================== transforms
class TestTransforms:
    def test_expand(self):
        comp = _layout()
        wide = comp.expand(2, B)
        assert wide.shape == (2, B)
        assert wide["agents"].shape == (2, B, N)
        assert wide["agents", "info", "speed"].shape == (2, B, N, 1)
        assert wide["agents", "action"].mask.shape == (2, B, N, 4)
        assert wide.is_in(wide.rand())
        assert wide == comp.expand((2, B)) == comp.expand(torch.Size([2, B]))
        assert comp.expand(B) == comp

    def test_expand_error(self):
        with pytest.raises(ValueError, match=r"cannot expand a Composite of shape \[4\] to \[3\]"):
            _layout().expand(3)
        with pytest.raises(ValueError, match="must end with the old one"):
            _layout().expand(B, 2)

    def test_to(self):
        comp = _layout()
        moved = comp.to("cpu")
        assert moved.device == torch.device("cpu")
        assert moved.values(True, True) == comp.values(True, True)
        assert moved["agents"].device == torch.device("cpu")
        assert moved.rand().device == torch.device("cpu")

    def test_clone(self):
        comp = _layout()
        copy = comp.clone()
        assert copy == comp and copy is not comp
        assert copy["agents"] is not comp["agents"]
        copy["agents", "action"].mask[...] = False
        copy["agents", "extra"] = Unbounded((B, N))
        assert comp == _layout()
        assert copy != comp

    def test_eq(self):
        comp = _layout()
        assert comp == _layout()
        assert comp != _layout().exclude("state")
        assert comp != Composite(comp.clone()._specs, shape=(B,), device="cpu")
        other = _layout()
        other["agents", "observation"] = Unbounded((B, N, 5), dtype=torch.float64)
        assert comp != other
        assert comp != Unbounded((B,))
        assert Composite(shape=(2,)) != Composite(shape=(3,))
        assert Composite(a=Unbounded(), b=Unbounded()) == Composite(b=Unbounded(), a=Unbounded())
        with pytest.raises(TypeError):
            hash(comp)

    def test_repr(self):
        text = repr(_layout())
        assert text.startswith("Composite(\n")
        for fragment in (
            "    state: Unbounded(shape=[4, 7], dtype=float32, device=cpu),",
            "    agents: Composite(\n        observation: Unbounded(shape=[4, 3, 5]",
            "        info: Composite(\n            speed: Bounded(shape=[4, 3, 1]",
            "            shape=[4, 3]),",
            "    shape=[4])",
        ):
            assert fragment in text
        assert repr(Composite(shape=(2,), device="cpu")) == "Composite(\n    shape=[2], device=cpu)"


# ====================================================================== hypothesis
SUFFIX = st.lists(st.integers(0, 3), max_size=2).map(tuple)


@st.composite
def _leaves(draw, prefix: tuple[int, ...]) -> TensorSpec:
    shape = prefix + draw(SUFFIX)
    kind = draw(st.sampled_from(["unbounded", "bounded", "cat", "onehot", "multi", "binary"]))
    if kind == "unbounded":
        return Unbounded(shape, dtype=draw(st.sampled_from([torch.float32, torch.float64])))
    if kind == "bounded":
        low = draw(st.floats(-1e6, 1e6))
        high = low + draw(st.floats(0, 1e6))
        dtype = draw(st.sampled_from([torch.float32, torch.int32]))
        if dtype == torch.int32:  # an integer box holds the integers inside: at least one
            low, high = math.floor(low), math.ceil(high)
        return Bounded(low, high, shape, dtype=dtype)
    if kind == "cat":
        n = draw(st.integers(1, 5))
        allowed = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        allowed[draw(st.integers(0, n - 1))] = True
        mask = torch.tensor(allowed) if draw(st.booleans()) else None
        return Categorical(n, shape, mask=mask)
    if kind == "onehot":
        n = draw(st.integers(1, 4))
        return OneHot(n, (*shape, n))
    if kind == "multi":
        nvec = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
        return MultiCategorical(nvec, (*shape, len(nvec)), dtype=torch.int16)
    n = draw(st.integers(1, 3))
    return Binary(n, (*shape, n))


@st.composite
def composites(draw, shape: tuple[int, ...] = (), depth: int = 0) -> Composite:
    """A random nested Composite: sub-Composites may add a group dim to the batch shape."""
    comp = Composite(shape=shape)
    names = draw(
        st.lists(st.sampled_from(["a", "b", "obs", "agents", "next"]), max_size=3, unique=True)
    )
    for name in names:
        if depth < 2 and draw(st.booleans()):
            comp[name] = draw(
                composites(
                    shape + draw(st.lists(st.integers(1, 3), max_size=1).map(tuple)), depth + 1
                )
            )
        else:
            comp[name] = draw(_leaves(shape))
    return comp


ROOTS = st.lists(st.integers(1, 3), max_size=2).map(tuple).flatmap(composites)
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _garbage(spec: TensorSpec, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    value = torch.randn(spec.shape, generator=gen, dtype=torch.float64) * 1e3
    value[torch.rand(spec.shape, generator=gen) < 0.1] = math.nan
    value[torch.rand(spec.shape, generator=gen) < 0.1] = math.inf
    return value


def _check_batch_sizes(comp: Composite, td, lead: tuple[int, ...]) -> None:
    assert td.batch_size == torch.Size(lead) + comp.shape
    for key, spec in comp.items():
        if isinstance(spec, Composite):
            _check_batch_sizes(spec, td[key], lead)
        else:
            assert td[key].shape == torch.Size(lead) + spec.shape


@PROPERTY
@given(comp=ROOTS, lead=st.lists(st.integers(1, 3), max_size=2).map(tuple))
def test_rand_zero_of_random_composite_is_in(comp, lead):
    for td in (comp.rand(), comp.zero()):
        assert comp.explain(td, strict=True) == []
        _check_batch_sizes(comp, td, ())
    batch = comp.rand(lead)
    _check_batch_sizes(comp, batch, lead)
    assert comp.explain(batch, leading_dims=True) == []
    wide = comp.expand(torch.Size(lead) + comp.shape)
    assert wide.explain(batch, strict=True) == []
    assert wide.is_in(wide.rand())


@PROPERTY
@given(comp=ROOTS, seed=st.integers(0, 2**16))
def test_project_of_random_composite_is_in(comp, seed):
    td = comp.zero()
    for i, (key, spec) in enumerate(comp.items(include_nested=True, leaves_only=True)):
        td.set(key, _garbage(spec, seed + i))
    assert comp.is_in(comp.project(td))


@PROPERTY
@given(comp=ROOTS)
def test_copies_of_random_composite_are_equal(comp):
    assert comp.clone() == comp
    assert comp.select(*comp.keys()) == comp
    assert comp.exclude() == comp
    assert Composite(shape=comp.shape).update(comp) == comp
    assert comp.to("cpu").values(True, True) == comp.values(True, True)
    assert comp.keys(True, True) == [k for k in comp.keys(True) if k in comp.keys(True, True)]
