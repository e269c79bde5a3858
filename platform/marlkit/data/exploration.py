"""The exploration mode: whether policies sample (``"random"``) or act greedily
(``"deterministic"``), read by policies and set by collectors and evaluation loops.

A policy asks :func:`exploration_mode`; a collector runs its policy inside
``set_exploration("random")`` (its default), an evaluation loop inside
``set_exploration("deterministic")``. Outside any block the mode is ``"random"``.

The block also sets tensordict's interaction type (``tensordict.nn.set_interaction_type``), so
``tensordict.nn.ProbabilisticTensorDictModule`` samples in ``"random"`` mode and takes its
distribution's deterministic sample in ``"deterministic"`` mode, with no marlkit code in the
module. The mode is per thread and per asyncio task (a :class:`contextvars.ContextVar`).

Examples:
    >>> from marlkit.data.exploration import exploration_mode, set_exploration
    >>> exploration_mode()
    'random'
    >>> with set_exploration("deterministic"):
    ...     exploration_mode()
    'deterministic'
    >>> @set_exploration("deterministic")
    ... def evaluate():
    ...     return exploration_mode()
    >>> evaluate()
    'deterministic'
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

from tensordict.nn import set_interaction_type

from marlkit._checks import check_one_of

__all__ = ["EXPLORATION_MODES", "Exploration", "exploration_mode", "set_exploration"]

Exploration = Literal["random", "deterministic"]
#: The modes, in the order documented above.
EXPLORATION_MODES: tuple[Exploration, ...] = ("random", "deterministic")

_MODE: contextvars.ContextVar[Exploration] = contextvars.ContextVar(
    "marlkit_exploration", default="random"
)
F = TypeVar("F", bound=Callable[..., Any])


def exploration_mode() -> Exploration:
    """The current mode: ``"random"`` (sample) or ``"deterministic"`` (act greedily)."""
    return _MODE.get()


def _check(mode: object) -> Exploration:
    return cast(Exploration, check_one_of("exploration", mode, list(EXPLORATION_MODES)))


def _interaction(mode: Exploration) -> Any:
    """tensordict's interaction-type block for ``mode`` (this thread only where supported)."""
    try:
        return set_interaction_type(mode, thread_local=True)
    except TypeError:  # a tensordict without per-thread interaction types
        return set_interaction_type(mode)


class set_exploration:
    """Set the exploration mode inside a ``with`` block or a decorated function.

    Blocks nest: the previous mode comes back when a block ends, also when it raises.

    Args:
        mode: ``"random"`` or ``"deterministic"``.

    Raises:
        ValueError: another mode.
    """

    def __init__(self, mode: Exploration):
        self.mode = _check(mode)
        self._entered: list[tuple[contextvars.Token[Exploration], Any]] = []

    def __enter__(self) -> set_exploration:
        token = _MODE.set(self.mode)
        inner = _interaction(self.mode)
        inner.__enter__()
        self._entered.append((token, inner))
        return self

    def __exit__(self, *exc: object) -> None:
        token, inner = self._entered.pop()
        try:
            inner.__exit__(*exc)
        finally:
            _MODE.reset(token)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with set_exploration(self.mode):
                return fn(*args, **kwargs)

        return cast(F, wrapped)

    def __repr__(self) -> str:
        return f"set_exploration({self.mode!r})"
