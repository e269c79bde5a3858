"""``marlkit.data._fast`` against tensordict's private API: the names it relies on, pinned to
the tensordict version they were checked against, and what each fast path must return (the
same as the public method it replaces)."""

from __future__ import annotations

import inspect

import tensordict
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from marlkit.data import _fast
from marlkit.data._fast import any_true, get_entry, own_items, set_leaf, unchecked_tensordict


def test_tensordict_is_the_version_its_private_api_was_checked_against() -> None:
    installed = tensordict.__version__.split("+")[0]
    assert installed == _fast._CHECKED_TENSORDICT, (
        f"marlkit.data._fast relies on tensordict's private API, checked against tensordict "
        f"{_fast._CHECKED_TENSORDICT}; tensordict {installed} is installed. Private names: "
        f"{'; '.join(_fast._PRIVATE_API)}. Run the other tests of tests/data/test_fast.py: if "
        f"they pass, set _CHECKED_TENSORDICT to {installed!r}; if one fails, fix _fast.py (or "
        "use the public methods there, and measure what it costs)."
    )


def test_the_private_names_exist_with_the_arguments_used() -> None:
    missing = [
        name
        for name in ("_new_unsafe", "_get_str", "_get_tuple", "_set_str")
        if not hasattr(TensorDict, name)
    ]
    assert not missing, f"tensordict {tensordict.__version__} lacks TensorDict.{missing}"
    assert _fast._NEW_UNSAFE is not None and _fast._FAST_ACCESS and _fast._OWN_ENTRIES, (
        "a fast path of marlkit.data._fast is off: it falls back to the public methods"
    )
    expected = {
        "_new_unsafe": {"source", "batch_size", "device", "nested"},
        "_get_str": {"key", "default"},
        "_get_tuple": {"key", "default"},
        "_set_str": {"key", "value", "inplace", "validated"},
    }
    for name, arguments in expected.items():
        taken = set(inspect.signature(getattr(TensorDict, name)).parameters)
        assert arguments <= taken, f"TensorDict.{name} no longer takes {arguments - taken}"


def test_unchecked_tensordict_is_the_checked_constructor() -> None:
    entries = {"a": torch.arange(6.0).reshape(2, 3), "g": {"x": torch.ones(2, 4, 1)}}
    fast = unchecked_tensordict(entries, (2,), None)
    public = TensorDict(entries, batch_size=[2])
    assert type(fast) is TensorDict and type(fast.batch_size) is torch.Size
    assert fast.batch_size == public.batch_size and fast.device is None
    assert isinstance(fast["g"], TensorDict) and fast["g"].batch_size == (2,)
    assert set(fast.keys(True, True)) == set(public.keys(True, True))
    assert (fast == public).all()
    assert fast["a"] is entries["a"]  # not copied
    assert fast.numel() == 2  # a tuple batch size broke numel() before it became a torch.Size
    flat = unchecked_tensordict({"a": entries["a"]}, torch.Size([2]), "cpu", nested=False)
    assert flat.device == torch.device("cpu") and flat["a"] is entries["a"]


def test_get_entry_is_get() -> None:
    td = TensorDict({"a": torch.zeros(2, 1), "g": {"x": torch.ones(2, 3)}}, [2])
    for key in ("a", "g", ("g", "x"), "missing", ("g", "missing"), ("missing", "x")):
        got, want = get_entry(td, key, "default"), td.get(key, "default")
        assert got is want or (isinstance(got, TensorDict) and got is td["g"]), key
    assert get_entry(td, "missing") is None


def test_set_leaf_is_set() -> None:
    td = TensorDict({"a": torch.zeros(2, 1)}, [2])
    value = torch.ones(2, 5)
    set_leaf(td, "b", value)
    assert td.get("b") is value and set(td.keys()) == {"a", "b"}
    replaced = torch.full((2, 1), 3.0)
    set_leaf(td, "a", replaced)  # not in place: the entry is the new tensor
    assert td.get("a") is replaced


def test_the_public_methods_serve_other_tensordicts() -> None:
    td = TensorDict({"a": torch.zeros(2, 1), "g": {"x": torch.ones(2, 3)}}, [2])
    lazy = LazyStackedTensorDict.lazy_stack([td, td.clone()], 0)  # not a TensorDict
    assert type(lazy) is not TensorDict
    assert torch.equal(get_entry(lazy, "a"), lazy.get("a"))
    assert torch.equal(get_entry(lazy, ("g", "x")), lazy.get(("g", "x")))
    set_leaf(lazy, "b", torch.ones(2, 2, 1))
    assert lazy.get("b").shape == (2, 2, 1)


def test_own_items_is_items() -> None:
    td = TensorDict({"a": torch.zeros(2, 1), "g": {"x": torch.ones(2, 3)}}, [2])
    own, public = dict(own_items(td)), dict(td.items())
    assert own.keys() == public.keys() and own["a"] is public["a"]
    assert isinstance(own["g"], TensorDict) and own["g"] is td.get("g")
    lazy = torch.stack([td, td.clone()], 0)  # not a plain TensorDict: the public iterator
    assert dict(own_items(lazy)).keys() == {"a", "g"}


def test_a_flat_unchecked_tensordict_is_what_new_unsafe_builds() -> None:
    # nested=False sets _new_unsafe's four attributes itself (where that is all _new_unsafe
    # sets: checked at import); the result must be the same TensorDict in every respect.
    assert _fast._DIRECT, "the direct constructor is off: _new_unsafe sets other attributes"
    entries = {"a": torch.zeros(2, 3), "g": TensorDict({"x": torch.ones(2, 1)}, [2])}
    for device in (None, "cpu", torch.device("cpu")):
        fast = unchecked_tensordict(entries, (2,), device, nested=False)
        slow = TensorDict._new_unsafe(entries, batch_size=torch.Size([2]), device=device)
        assert type(fast) is TensorDict and vars(fast).keys() == vars(slow).keys()
        assert fast.device == slow.device and type(fast.device) is type(slow.device)
        assert type(fast.batch_size) is torch.Size and fast.batch_size == (2,)
        assert fast["a"] is entries["a"] and fast["g"] is entries["g"]
        assert type(fast._tensordict) is type(slow._tensordict)
        fast["b"] = torch.ones(2)  # a dict of its own: the entries given are not changed
        assert "b" not in entries
    assert (torch.stack([fast, fast.clone()]) == 1).any()


def test_has_any_and_is_tensordict_are_the_public_checks() -> None:
    td = TensorDict({"a": torch.zeros(2, 1), "g": {"x": torch.ones(2, 3)}}, [2])
    lazy = LazyStackedTensorDict.lazy_stack([td, td.clone()], 0)
    for t in (td, lazy):
        assert _fast.has_any(t, frozenset({"a", "b"})) and _fast.has_any(t, frozenset({"g"}))
        assert not _fast.has_any(t, frozenset({"b", "x"}))  # nested entries are not its own
    for value in (td, lazy, td["g"]):
        assert _fast.is_tensordict(value)
    for value in (torch.zeros(1), torch.nn.Parameter(torch.zeros(1)), {"a": 1}, None):
        assert not _fast.is_tensordict(value)


def test_any_true_agrees_with_any_on_tensors_and_arrays() -> None:
    """The byte search of bool CPU tensors and arrays (the step's done checks), strided ones
    included, and the plain ``any`` of the others."""
    import numpy as np

    flags = torch.zeros(4, 3, dtype=torch.bool)
    cases = [flags, flags.t(), flags.numpy(), torch.zeros(3), np.zeros(3, np.float32)]
    assert [any_true(c) for c in cases] == [False] * 5
    flags[2, 1] = True
    ones = [flags, flags.t(), flags[:, 1], flags.numpy(), torch.tensor([0.0, 2.0])]
    assert [any_true(c) for c in [*ones, np.array([0, 3])]] == [True] * 6
    assert not any_true(flags[:, 0])  # a strided column without the true entry
