"""``marlkit._utils``: the suggestion, keyword and integer checks every layer shares."""

from __future__ import annotations

import numpy as np
import pytest

from marlkit._utils import (
    check_int,
    check_kwargs,
    close_matches,
    did_you_mean,
    keyword_names,
    unexpected_kwargs_message,
)


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
