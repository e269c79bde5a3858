"""``marlkit._checks``: the argument checks and "did you mean" helpers every layer shares.

Each check is tested on what it accepts (and returns) and on the exact message of what it
refuses: these messages are what a user reads."""

from __future__ import annotations

import ast
import doctest
import math
import pathlib
import sys

import numpy as np
import pytest

import marlkit._checks
from marlkit._checks import (
    check_flag,
    check_int,
    check_ints,
    check_kwargs,
    check_one_of,
    check_real,
    close_matches,
    did_you_mean,
    keyword_names,
    unexpected_kwargs_message,
)


def test_the_module_imports_only_the_standard_library() -> None:
    tree = ast.parse(pathlib.Path(marlkit._checks.__file__).read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    tops = {name.split(".")[0] for name in imported}
    assert tops and tops <= set(sys.stdlib_module_names) | {"__future__"}, tops


def test_the_examples_in_the_docstrings_hold() -> None:
    failed, tried = doctest.testmod(marlkit._checks, optionflags=doctest.ELLIPSIS)
    assert tried > 20 and failed == 0


def test_close_matches_ignore_case_and_keep_the_candidates_spelling() -> None:
    assert close_matches("n", ["local_ratio", "N", "max_cycles"]) == ["N"]
    assert close_matches("cartpole-v1", ["CartPole-v1", "Acrobot-v1"]) == ["CartPole-v1"]
    assert close_matches("navigaton", ["swarm", "navigation", "navigation"]) == ["navigation"]
    assert close_matches("x", ["A", "a"], cutoff=0.0) == ["A", "a"]  # same lower case: both
    best_first = close_matches("navigation", ["nav", "navigator", "navigation-v2"], n=2)
    assert best_first == ["navigation-v2", "navigator"]


def test_did_you_mean_is_a_hint_or_nothing() -> None:
    assert did_you_mean("navigaton", ["navigation", "swarm"]) == " Did you mean: navigation?"
    assert did_you_mean("qqqqqq", ["navigation", "swarm"]) == ""
    assert did_you_mean(3, ["navigation"]) == ""  # whatever the user gave, no crash
    hint = did_you_mean("nav", ["navigation", "navigation-v2"], n=5, cutoff=0.3)
    assert hint == " Did you mean: navigation, navigation-v2?"


def test_keyword_names_read_signatures() -> None:
    def explicit(a: int, /, b: int, *, c: int = 0) -> None: ...

    def open_ended(b: int, **kwargs: int) -> None: ...

    class Env:
        def __init__(self, num_envs: int = 1, *args: int, n_agents: int = 2) -> None: ...

    assert keyword_names(explicit) == ["b", "c"]  # not the positional-only one
    assert keyword_names(explicit, skip=("b",)) == ["c"]
    assert keyword_names(Env) == ["num_envs", "n_agents"]
    assert keyword_names(open_ended) is None  # it checks (or hands on) its own
    assert keyword_names(open_ended, partial=True) == ["b"]
    assert keyword_names(int) is None  # no signature to read


def test_unexpected_kwargs_message_suggests_per_keyword() -> None:
    accepted = ["num_envs", "n_agents", "seed", "n_agents"]
    one = unexpected_kwargs_message("env 'navigation'", ["n_agent"], accepted)
    assert one == (
        "env 'navigation' got an unexpected keyword argument 'n_agent' (did you mean "
        "'n_agents'?); it accepts: num_envs, n_agents, seed"
    )
    two = unexpected_kwargs_message("env 'x'", ["seeds", "zzz", "seeds"], accepted)
    assert two.startswith("env 'x' got unexpected keyword arguments 'seeds' (did you mean 'seed'?)")
    assert ", 'zzz'; it accepts" in two
    # Only close names are offered: n_agents is not a misspelt num_envs.
    assert "did you mean" not in unexpected_kwargs_message("e", ["n_agents"], ["num_envs"])
    none = unexpected_kwargs_message("e", ["a"], [])
    assert none.endswith("it accepts: no keyword arguments")
    custom = unexpected_kwargs_message("e", ["a"], ["b"], accepts="see the docs")
    assert custom == "e got an unexpected keyword argument 'a'; see the docs"


def test_check_kwargs_raises_only_for_unknown_names() -> None:
    check_kwargs("env 'e'", {"a": 1, "b": 2}, ["a", "b", "c"])
    check_kwargs("env 'e'", {}, [])
    expected = r"^env 'e' got an unexpected keyword argument 'bb'; it accepts: a, b, c$"
    with pytest.raises(TypeError, match=expected):
        check_kwargs("env 'e'", {"a": 1, "bb": 2}, ["a", "b", "c"])


def test_check_int() -> None:
    assert check_int("num_envs", 3, low=1) == 3
    assert type(check_int("num_envs", np.int64(3), low=1)) is int
    assert check_int("k", 0, low=0) == 0
    assert check_int("max_steps", None, low=1, allow_none=True) is None
    with pytest.raises(ValueError, match=r"^num_envs must be an int >= 1, got 0$"):
        check_int("num_envs", 0, low=1)
    with pytest.raises(TypeError, match=r"^num_envs must be an int >= 1, got float: 2\.0$"):
        check_int("num_envs", 2.0, low=1)
    with pytest.raises(TypeError, match=r"^num_envs must be an int >= 1, got bool: True$"):
        check_int("num_envs", True, low=1)
    with pytest.raises(TypeError, match=r"got NoneType: None$"):
        check_int("num_envs", None, low=1)
    with pytest.raises(ValueError, match=r"^max_steps must be an int >= 1 or None, got -2$"):
        check_int("max_steps", -2, low=1, allow_none=True)
    with pytest.raises(TypeError, match=r"^max_steps must be an int >= 1 or None, got str: '3'$"):
        check_int("max_steps", "3", low=1, allow_none=True)


def test_check_int_bounds_and_owner() -> None:
    assert check_int("k", 3, low=0, high=3) == 3
    assert check_int("offset", -5) == -5  # no bound given: any int
    with pytest.raises(ValueError, match=r"^k must be an int in \[0, 3\], got 4$"):
        check_int("k", 4, low=0, high=3)
    with pytest.raises(ValueError, match=r"^k must be an int <= 3, got 4$"):
        check_int("k", 4, high=3)
    with pytest.raises(TypeError, match=r"^seed must be an int, got float: 1\.5$"):
        check_int("seed", 1.5)
    with pytest.raises(TypeError, match=r"^lidar: n_rays must be an int >= 1, got bool: False$"):
        check_int("n_rays", False, low=1, owner="lidar")
    with pytest.raises(TypeError, match=r"^n must be an int, got bool: np\.True_$"):
        check_int("n", np.bool_(True))


def test_check_ints() -> None:
    assert check_ints("batch_shape", 4, low=0) == (4,)
    assert check_ints("batch_shape", (2, np.int64(3)), low=0) == (2, 3)
    assert check_ints("batch_shape", [], low=0) == ()
    assert check_ints("size", 8, low=1, length=2) == (8, 8)
    assert check_ints("size", (8, 6), low=1, length=2) == (8, 6)
    expected = "size must be an int or a sequence of 2 ints >= 1"
    with pytest.raises(ValueError, match=rf"^{expected}, got \(8, 0\)$"):
        check_ints("size", (8, 0), low=1, length=2)
    with pytest.raises(ValueError, match=rf"^{expected}, got \[1, 2, 3\]$"):
        check_ints("size", [1, 2, 3], low=1, length=2)
    with pytest.raises(ValueError, match=rf"^{expected}, got 0$"):
        check_ints("size", 0, low=1, length=2)
    with pytest.raises(TypeError, match=rf"^{expected}, got \(8, 2\.5\)$"):
        check_ints("size", (8, 2.5), low=1, length=2)
    with pytest.raises(TypeError, match=rf"^{expected}, got str: '88'$"):
        check_ints("size", "88", low=1, length=2)
    with pytest.raises(TypeError, match=r"^render: shape must be an int or a sequence of ints, "):
        check_ints("shape", (True,), owner="render")


def test_check_real() -> None:
    assert check_real("mass", 2) == 2.0 and type(check_real("mass", 2)) is float
    assert check_real("mass", np.float32(0.5)) == 0.5
    assert check_real("stiffness", 0.0, strict=False) == 0.0
    assert check_real("offset", -3.0, low=None) == -3.0
    assert check_real("gamma", 1.0, strict=False, high=1.0) == 1.0
    assert check_real("radius", math.inf, finite=False) == math.inf
    with pytest.raises(TypeError, match=r"^mass must be a number, got str: 'x'$"):
        check_real("mass", "x")
    with pytest.raises(TypeError, match=r"^mass must be a number, got bool: True$"):
        check_real("mass", True)
    with pytest.raises(ValueError, match=r"^mass must be a finite number > 0, got 0\.0$"):
        check_real("mass", 0)
    with pytest.raises(ValueError, match=r"^mass must be a finite number > 0, got inf$"):
        check_real("mass", math.inf)
    with pytest.raises(ValueError, match=r"^eps must be a finite number >= 0, got nan$"):
        check_real("eps", math.nan, strict=False)
    with pytest.raises(ValueError, match=r"^drag must be a finite number in \[0, 1\), got 1\.0$"):
        check_real("drag", 1.0, strict=False, below=1.0)
    with pytest.raises(ValueError, match=r"^p must be a finite number in \(0, 1\], got 0\.0$"):
        check_real("p", 0.0, high=1.0)
    with pytest.raises(ValueError, match=r"^x must be a finite number < 2, got 2\.0$"):
        check_real("x", 2.0, low=None, below=2.0)
    with pytest.raises(ValueError, match=r"^x must be a finite number <= 2, got 3\.0$"):
        check_real("x", 3.0, low=None, high=2.0)
    with pytest.raises(ValueError, match=r"^knn: radius must be a number > 0, got nan$"):
        check_real("radius", math.nan, finite=False, owner="knn")
    with pytest.raises(ValueError, match=r"^x must be a finite number, got inf$"):
        check_real("x", math.inf, low=None)
    with pytest.raises(TypeError, match="below or high, not both"):
        check_real("x", 0.5, below=1.0, high=1.0)


def test_check_flag() -> None:
    assert check_flag("tile", True) is True
    assert check_flag("tile", np.bool_(False)) is False
    with pytest.raises(TypeError, match=r"^tile must be a bool, got str: 'false'$"):
        check_flag("tile", "false")
    with pytest.raises(TypeError, match=r"^tile must be a bool, got int: 1$"):
        check_flag("tile", 1)
    with pytest.raises(TypeError, match=r"^layer 0: filled must be a bool, got NoneType: None$"):
        check_flag("filled", None, owner="layer 0")


def test_check_one_of() -> None:
    assert check_one_of("backend", "auto", ("auto", "native")) == "auto"
    assert check_one_of("n", 2, [1, 2]) == 2
    with pytest.raises(ValueError, match=r"^work must be one of \['lidar', 'knn'\], got 'rays'$"):
        check_one_of("work", "rays", ["lidar", "knn"])
    hint = r"^obs_mode must be one of \['knn', 'lidar'\], got 'lidr'\. Did you mean: lidar\?$"
    with pytest.raises(ValueError, match=hint):
        check_one_of("obs_mode", "lidr", ["knn", "lidar"])
    with pytest.raises(ValueError, match=r"^QMixer: mode must be one of \['a'\], got \['a'\]$"):
        check_one_of("mode", ["a"], ["a"], owner="QMixer")  # unhashable: refused, no crash
