"""The one set of argument checks and close-match ("did you mean") helpers. Standard library only.

Every layer checks a user's scalar arguments here, so that the same mistake gets the same
message everywhere: the message names the argument (and, through ``owner``, who takes it),
says what was expected and shows what came. A bad type is a ``TypeError``, a bad value a
``ValueError``. Tensor and key checks live next to the tensors (``modules/_checks.py``).

Example:
    >>> check_int("num_envs", 4, low=1)
    4
    >>> check_real("dt", 0.1, owner="step")
    0.1
    >>> check_int("num_envs", 0, low=1)
    Traceback (most recent call last):
    ...
    ValueError: num_envs must be an int >= 1, got 0
"""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Literal, TypeVar, overload

__all__ = [
    "check_flag",
    "check_int",
    "check_ints",
    "check_kwargs",
    "check_one_of",
    "check_real",
    "close_matches",
    "did_you_mean",
    "keyword_names",
    "unexpected_kwargs_message",
]

_T = TypeVar("_T")


def _label(name: str, owner: str | None) -> str:
    """``"owner: name"``, or ``name`` alone when there is no owner."""
    return f"{owner}: {name}" if owner else name


def _is_int(value: object) -> bool:
    """An integer (Python's or NumPy's), never a bool."""
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _is_bool(value: object) -> bool:
    """A Python bool or a NumPy bool (whose type is ``numpy.bool_``; ``numpy.bool`` in 2.x)."""
    kind = type(value)
    return isinstance(value, bool) or (
        kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool")
    )


# ---------------------------------------------------------------------------- integers
def _int_expected(low: int | None, high: int | None, allow_none: bool) -> str:
    """``"an int >= 1"``, ``"an int in [0, 3] or None"``, ...: what :func:`check_int` expects."""
    if low is not None and high is not None:
        bounds = f" in [{low}, {high}]"
    elif low is not None:
        bounds = f" >= {low}"
    elif high is not None:
        bounds = f" <= {high}"
    else:
        bounds = ""
    return f"an int{bounds}{' or None' if allow_none else ''}"


@overload
def check_int(
    name: str,
    value: object,
    *,
    low: int | None = ...,
    high: int | None = ...,
    allow_none: Literal[False] = ...,
    owner: str | None = ...,
) -> int: ...


@overload
def check_int(
    name: str,
    value: object,
    *,
    low: int | None = ...,
    high: int | None = ...,
    allow_none: bool,
    owner: str | None = ...,
) -> int | None: ...


def check_int(
    name: str,
    value: object,
    *,
    low: int | None = None,
    high: int | None = None,
    allow_none: bool = False,
    owner: str | None = None,
) -> int | None:
    """``value`` as an ``int`` in ``[low, high]`` (either bound optional; NumPy integers too,
    never a bool), or ``None`` when it is ``None`` and ``allow_none``.

    Args:
        name: the argument, as the user wrote it.
        value: what came.
        low: the smallest value accepted (none when ``None``).
        high: the largest value accepted (none when ``None``).
        allow_none: accept ``None`` (and return it).
        owner: who takes the argument; the message then starts ``"<owner>: <name>"``.

    Raises:
        TypeError: not an integer, e.g. ``"num_envs must be an int >= 1, got float: 2.0"``.
        ValueError: out of range, e.g. ``"num_envs must be an int >= 1, got 0"``.

    Example:
        >>> check_int("max_steps", None, low=1, allow_none=True) is None
        True
        >>> check_int("substeps", 2.0, low=1, owner="step")
        Traceback (most recent call last):
        ...
        TypeError: step: substeps must be an int >= 1, got float: 2.0
        >>> check_int("k", 5, low=0, high=3)
        Traceback (most recent call last):
        ...
        ValueError: k must be an int in [0, 3], got 5
    """
    if type(value) is int:  # the common case first: no message built
        number = value
    elif value is None and allow_none:
        return None
    elif _is_int(value):
        number = int(value)  # type: ignore[call-overload]  # numbers.Integral
    else:
        raise TypeError(
            f"{_label(name, owner)} must be {_int_expected(low, high, allow_none)}, got "
            f"{type(value).__name__}: {value!r}"
        )
    if (low is not None and number < low) or (high is not None and number > high):
        expected = _int_expected(low, high, allow_none)
        raise ValueError(f"{_label(name, owner)} must be {expected}, got {number!r}")
    return number


def check_ints(
    name: str,
    value: object,
    *,
    low: int | None = None,
    length: int | None = None,
    owner: str | None = None,
) -> tuple[int, ...]:
    """``value``, an int or a sequence of ints (a shape, sizes of layers), as a tuple of ints,
    each ``>= low``; of ``length`` items when given (a lone int then fills every item).

    Raises:
        TypeError: neither an int nor a sequence of ints (a str is not one), e.g.
            ``"size must be an int or a sequence of 2 ints >= 1, got str: '3'"``.
        ValueError: an item below ``low`` or the wrong number of items, e.g.
            ``"size must be an int or a sequence of 2 ints >= 1, got (3, 0)"``.

    Example:
        >>> check_ints("batch_shape", 4, low=1)
        (4,)
        >>> check_ints("size", 3, low=1, length=2)
        (3, 3)
        >>> check_ints("size", [3, 0], low=1, length=2)
        Traceback (most recent call last):
        ...
        ValueError: size must be an int or a sequence of 2 ints >= 1, got [3, 0]
    """

    def refused(got: str) -> str:
        count = "" if length is None else f"{length} "
        bound = "" if low is None else f" >= {low}"
        return (
            f"{_label(name, owner)} must be an int or a sequence of {count}ints{bound}, got {got}"
        )

    if _is_int(value):
        items: tuple[object, ...] = (value,) * (1 if length is None else length)
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        items = tuple(value)
        if not all(_is_int(item) for item in items):
            raise TypeError(refused(repr(value)))
    else:
        raise TypeError(refused(f"{type(value).__name__}: {value!r}"))
    numbers_ = tuple(int(item) for item in items)  # type: ignore[call-overload]
    if (length is not None and len(numbers_) != length) or (
        low is not None and any(item < low for item in numbers_)
    ):
        raise ValueError(refused(repr(value)))
    return numbers_


# ---------------------------------------------------------------------------- real numbers
def _real_range(low: float | None, strict: bool, below: float | None, high: float | None) -> str:
    top, closing = (below, ")") if below is not None else (high, "]")
    if low is not None and top is not None:
        return f" in {'(' if strict else '['}{low:g}, {top:g}{closing}"
    if low is not None:
        return f" {'>' if strict else '>='} {low:g}"
    if below is not None:
        return f" < {below:g}"
    if high is not None:
        return f" <= {high:g}"
    return ""


def check_real(
    name: str,
    value: object,
    *,
    low: float | None = 0.0,
    strict: bool = True,
    below: float | None = None,
    high: float | None = None,
    finite: bool = True,
    owner: str | None = None,
) -> float:
    """``value`` as a ``float > low`` (``>= low`` when not ``strict``; no lower bound when
    ``low`` is ``None``), ``< below`` or ``<= high`` when given, and finite when ``finite``
    (NaN is always refused). NumPy numbers too, never a bool.

    Args:
        name: the argument, as the user wrote it.
        value: what came.
        low: the lower bound (``0.0`` by default: a positive number).
        strict: refuse ``low`` itself.
        below: the upper bound, refused itself.
        high: the upper bound, accepted itself (give ``below`` or ``high``, not both).
        finite: refuse infinities.
        owner: who takes the argument; the message then starts ``"<owner>: <name>"``.

    Raises:
        TypeError: not a real number, e.g. ``"mass must be a number, got str: 'x'"``.
        ValueError: out of range or not finite, e.g. ``"mass must be a finite number > 0, got
            0.0"`` or ``"drag must be a finite number in [0, 1), got 1.5"``.

    Example:
        >>> check_real("gamma", 0.99, low=0.0, strict=False, high=1.0)
        0.99
        >>> check_real("drag", 1.5, low=0.0, strict=False, below=1.0)
        Traceback (most recent call last):
        ...
        ValueError: drag must be a finite number in [0, 1), got 1.5
        >>> check_real("radius", float("inf"), finite=False)
        inf
    """
    if below is not None and high is not None:
        raise TypeError("check_real takes below or high, not both")
    kind = type(value)
    # float and int first (no ABC check); bools are Real but refused
    if not (
        kind is float or kind is int or (isinstance(value, numbers.Real) and not _is_bool(value))
    ):
        raise TypeError(f"{_label(name, owner)} must be a number, got {kind.__name__}: {value!r}")
    number = float(value)  # type: ignore[arg-type]  # numbers.Real
    above = low is None or (number > low if strict else number >= low)
    under = (below is None or number < below) and (high is None or number <= high)
    if not (above and under) or math.isnan(number) or (finite and math.isinf(number)):
        what = "a finite number" if finite else "a number"
        expected = f"{what}{_real_range(low, strict, below, high)}"
        raise ValueError(f"{_label(name, owner)} must be {expected}, got {number!r}")
    return number


# ---------------------------------------------------------------------------- flags, choices
def check_flag(name: str, value: object, *, owner: str | None = None) -> bool:
    """``value`` when it is a bool (NumPy's too).

    Raises:
        TypeError: anything else, e.g. the string ``"false"`` (which ``bool()`` reads as True).

    Example:
        >>> check_flag("tile", True)
        True
        >>> check_flag("tile", "false")
        Traceback (most recent call last):
        ...
        TypeError: tile must be a bool, got str: 'false'
    """
    if not _is_bool(value):
        label = _label(name, owner)
        raise TypeError(f"{label} must be a bool, got {type(value).__name__}: {value!r}")
    return bool(value)


def check_one_of(name: str, value: _T, choices: Iterable[_T], *, owner: str | None = None) -> _T:
    """``value`` when it is one of ``choices``; a string close to one of them is suggested.

    Raises:
        ValueError: anything else, e.g. ``"work must be one of ['lidar', 'knn'], got 'rays'"``.

    Example:
        >>> check_one_of("backend", "native", ("auto", "native"))
        'native'
        >>> check_one_of("obs_mode", "lidr", ["knn", "lidar"])
        Traceback (most recent call last):
        ...
        ValueError: obs_mode must be one of ['knn', 'lidar'], got 'lidr'. Did you mean: lidar?
    """
    options = list(choices)
    try:
        if value in options:
            return value
    except TypeError:  # an unhashable or uncomparable value is not one of them
        pass
    hint = ""
    if isinstance(value, str):
        hint = did_you_mean(value, [c for c in options if isinstance(c, str)])
        hint = f".{hint}" if hint else ""
    raise ValueError(f"{_label(name, owner)} must be one of {options!r}, got {value!r}{hint}")


# ---------------------------------------------------------------------------- suggestions
def close_matches(
    name: object, candidates: Iterable[str], *, n: int = 3, cutoff: float = 0.6
) -> list[str]:
    """The (at most ``n``) ``candidates`` closest to ``name``, best first, compared without
    regard to case (so ``"n"`` finds ``"N"``); ``cutoff`` is :mod:`difflib`'s ratio in [0, 1].

    Example:
        >>> close_matches("n", ["N", "M", "num_envs"])
        ['N']
    """
    by_lower: dict[str, list[str]] = {}
    for candidate in dict.fromkeys(candidates):
        by_lower.setdefault(candidate.lower(), []).append(candidate)
    found = difflib.get_close_matches(str(name).lower(), list(by_lower), n=n, cutoff=cutoff)
    return [c for lower in found for c in by_lower[lower]][:n]


def did_you_mean(
    name: object, candidates: Iterable[str], *, n: int = 3, cutoff: float = 0.6
) -> str:
    """The hint ``" Did you mean: a, b?"`` naming the candidates closest to ``name`` (see
    :func:`close_matches`), to append to a message; ``""`` when none is close.

    Example:
        >>> did_you_mean("navigaton", ["navigation", "swarm"])
        ' Did you mean: navigation?'
        >>> did_you_mean("xyz", ["navigation", "swarm"])
        ''
    """
    close = close_matches(name, candidates, n=n, cutoff=cutoff)
    return f" Did you mean: {', '.join(close)}?" if close else ""


# ---------------------------------------------------------------------------- keyword arguments
_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
#: How close an accepted keyword must be to be suggested (0.7 keeps ``n_agent`` -> ``n_agents``
#: and drops ``n_agents`` -> ``num_envs``).
_KWARG_CUTOFF = 0.7


def keyword_names(
    fn: Callable[..., Any], *, skip: Collection[str] = (), partial: bool = False
) -> list[str] | None:
    """The names ``fn`` takes as keyword arguments, in signature order (``skip`` left out), or
    ``None`` when that cannot be told: ``fn`` takes ``**kwargs`` (it checks them itself, or hands
    them on) or has no signature that :func:`inspect.signature` can read.

    Args:
        fn: the callable.
        skip: names to leave out.
        partial: list the names ``fn`` declares even when it also takes ``**kwargs`` (its own
            options, when the rest go elsewhere).

    Example:
        >>> def make(num_envs=1, *, seed=None): ...
        >>> keyword_names(make)
        ['num_envs', 'seed']
        >>> def loose(num_envs=1, **kwargs): ...
        >>> keyword_names(loose) is None, keyword_names(loose, partial=True)
        (True, ['num_envs'])
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if not partial and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in _KEYWORD_KINDS and p.name not in skip]


def unexpected_kwargs_message(
    owner: str,
    unknown: Iterable[str],
    accepted: Sequence[str],
    *,
    accepts: str | None = None,
) -> str:
    """The message for keyword arguments that ``owner`` does not take, each with the (at most
    two) accepted names closest to it, then what ``owner`` accepts.

    Args:
        owner: who refuses them, e.g. ``"env 'navigation'"``.
        unknown: the keywords refused.
        accepted: the keywords ``owner`` takes (the suggestions are drawn from them).
        accepts: what to say instead of ``"it accepts: <accepted>"``.

    Example:
        >>> unexpected_kwargs_message("env 'navigation'", ["n_agent"], ["num_envs", "n_agents"])
        "env 'navigation' got an unexpected keyword argument 'n_agent' (did you mean \
'n_agents'?); it accepts: num_envs, n_agents"
    """
    names, accepted = list(dict.fromkeys(unknown)), list(dict.fromkeys(accepted))
    parts = []
    for key in names:
        close = close_matches(key, accepted, n=2, cutoff=_KWARG_CUTOFF)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        parts.append(f"{key!r}{hint}")
    what = "an unexpected keyword argument" if len(names) == 1 else "unexpected keyword arguments"
    if accepts is None:
        listed = ", ".join(accepted) or "no keyword arguments"
        accepts = f"it accepts: {listed}"
    return f"{owner} got {what} {', '.join(parts)}; {accepts}"


def check_kwargs(owner: str, kwargs: Iterable[str], accepted: Sequence[str]) -> None:
    """Raise a ``TypeError`` (see :func:`unexpected_kwargs_message`) when ``kwargs`` names a
    keyword not in ``accepted``.

    Example:
        >>> check_kwargs("Collector", ["frames_per_batch"], ["frames_per_batch", "total_frames"])
        >>> check_kwargs("Collector", ["frames_per_bach"], ["frames_per_batch"])
        Traceback (most recent call last):
        ...
        TypeError: Collector got an unexpected keyword argument 'frames_per_bach' (did you mean \
'frames_per_batch'?); it accepts: frames_per_batch
    """
    allowed = set(accepted)
    unknown = [k for k in kwargs if k not in allowed]
    if unknown:
        raise TypeError(unexpected_kwargs_message(owner, unknown, accepted))
