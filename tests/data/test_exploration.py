"""The exploration mode: default, nesting, decorators, errors inside a block, threads, and the
tensordict interaction type it sets."""

from __future__ import annotations

import threading

import pytest
from tensordict.nn import InteractionType, interaction_type

from marlkit.data.exploration import exploration_mode, set_exploration


def test_default_nesting_and_restoring_after_an_error() -> None:
    assert exploration_mode() == "random"
    with set_exploration("deterministic"):
        assert exploration_mode() == "deterministic"
        assert interaction_type() == InteractionType.DETERMINISTIC
        with set_exploration("random"):
            assert exploration_mode() == "random"
            assert interaction_type() == InteractionType.RANDOM
        assert exploration_mode() == "deterministic"
        with pytest.raises(ZeroDivisionError), set_exploration("random"):
            _ = 1 / 0
        assert exploration_mode() == "deterministic"
    assert exploration_mode() == "random"


def test_as_a_decorator_and_reentrant() -> None:
    block = set_exploration("deterministic")

    @block
    def depth(n: int) -> list[str]:
        return [exploration_mode()] + (depth(n - 1) if n else [])

    assert depth(2) == ["deterministic"] * 3
    with block, block:  # the same object entered twice
        assert exploration_mode() == "deterministic"
    assert exploration_mode() == "random"


def test_the_mode_is_per_thread() -> None:
    seen: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait(5)
        seen.append(exploration_mode())
        release.set()

    thread = threading.Thread(target=other)
    thread.start()
    with set_exploration("deterministic"):
        inside.set()
        release.wait(5)
    thread.join(5)
    assert seen == ["random"]


def test_unknown_modes_are_refused() -> None:
    with pytest.raises(
        ValueError, match=r"exploration must be one of \['random', 'deterministic'\], got 'greedy'"
    ):
        set_exploration("greedy")  # type: ignore[arg-type]
