"""Logging, optional dependencies, argument checks and fsync helpers. Standard library only."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import logging
import math
import numbers
import os
import pathlib
import secrets
from collections.abc import Callable, Collection, Iterable, Sequence
from types import ModuleType
from typing import Any, Literal, overload

import numpy as np

__all__ = [
    "check_flag",
    "check_int",
    "check_kwargs",
    "close_matches",
    "create_temp",
    "did_you_mean",
    "fsync_dir",
    "fsync_tree",
    "get_logger",
    "has_module",
    "import_optional",
    "keyword_names",
    "unexpected_kwargs_message",
    "write_text_atomic",
]

_LOGGER_NAME = "marlkit"


def get_logger(name: str | None = None) -> logging.Logger:
    """Return the ``marlkit`` logger, or one of its children (``marlkit.<name>``)."""
    return logging.getLogger(_LOGGER_NAME if name is None else f"{_LOGGER_NAME}.{name}")


def has_module(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_optional(name: str, *, extra: str, purpose: str = "") -> ModuleType:
    """Import an optional dependency, or raise an ``ImportError`` naming the extra that fixes it.

    Args:
        name: module to import, e.g. ``"vmas"``.
        extra: the marlkit extra that installs it, e.g. ``"vmas"``.
        purpose: what needs it, for the message.
    """
    try:
        return importlib.import_module(name)
    except ImportError as err:
        what = f" for {purpose}" if purpose else ""
        raise ImportError(
            f"The optional dependency {name!r} is needed{what} but could not be imported ({err}). "
            f"Install it with: pip install 'marlkit[{extra}]'"
        ) from err


# ---------------------------------------------------------------------------- suggestions
def close_matches(
    name: object, candidates: Iterable[str], *, n: int = 3, cutoff: float = 0.6
) -> list[str]:
    """The (at most ``n``) ``candidates`` closest to ``name``, best first, compared without
    regard to case (so ``"n"`` finds ``"N"``); ``cutoff`` is :mod:`difflib`'s ratio in [0, 1]."""
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
        partial: list the names ``fn`` declares even when it also takes ``**kwargs`` (its own
            options, when the rest go elsewhere).
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
    two) accepted names closest to it, then what ``owner`` accepts: for ``("env 'navigation'",
    ["n_agent"], ["num_envs", "n_agents"])``, ``env 'navigation' got an unexpected keyword
    argument 'n_agent' (did you mean 'n_agents'?); it accepts: num_envs, n_agents``.

    Args:
        owner: who refuses them, e.g. ``"env 'navigation'"``.
        unknown: the keywords refused.
        accepted: the keywords ``owner`` takes (the suggestions are drawn from them).
        accepts: what to say instead of ``"it accepts: <accepted>"``.
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
    keyword not in ``accepted``."""
    allowed = set(accepted)
    unknown = [k for k in kwargs if k not in allowed]
    if unknown:
        raise TypeError(unexpected_kwargs_message(owner, unknown, accepted))


# ---------------------------------------------------------------------------- values
@overload
def check_int(name: str, value: object, *, low: int, allow_none: Literal[False] = ...) -> int: ...


@overload
def check_int(name: str, value: object, *, low: int, allow_none: bool) -> int | None: ...


def check_int(name: str, value: object, *, low: int, allow_none: bool = False) -> int | None:
    """``value`` as an ``int >= low`` (NumPy integers too, never a bool), or ``None`` when it is
    ``None`` and ``allow_none``.

    Raises:
        TypeError: not an integer, e.g. ``"num_envs must be an int >= 1, got float: 2.0"``.
        ValueError: below ``low``, e.g. ``"num_envs must be an int >= 1, got 0"``.
    """
    if value is None and allow_none:
        return None
    expected = f"an int >= {low}{' or None' if allow_none else ''}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}: {value!r}")
    if value < low:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def check_real(
    name: str, value: object, *, low: float = 0.0, strict: bool = True, below: float | None = None
) -> float:
    """``value`` as a finite ``float > low`` (``>= low`` when not ``strict``, and ``< below``
    when given); NumPy numbers too, never a bool.

    Raises:
        TypeError: not a real number, e.g. ``"mass must be a number, got str: 'x'"``.
        ValueError: out of range or not finite, e.g. ``"mass must be a finite number > 0, got
            0.0"`` or ``"drag must be a finite number in [0, 1), got 1.5"``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r}")
    number = float(value)
    above = number > low if strict else number >= low
    if not (math.isfinite(number) and above and (below is None or number < below)):
        low_text = f"{low:g}"
        if below is None:
            expected = f"{'>' if strict else '>='} {low_text}"
        else:
            expected = f"in {'(' if strict else '['}{low_text}, {below:g})"
        raise ValueError(f"{name} must be a finite number {expected}, got {number!r}")
    return number


def check_flag(name: str, value: object) -> bool:
    """``value`` when it is a bool (NumPy's too).

    Raises:
        TypeError: anything else, e.g. the string ``"false"`` (which ``bool()`` reads as True).
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}: {value!r}")
    return bool(value)


def make_out_folder(path: str | os.PathLike[str], flag: str = "--out") -> pathlib.Path:
    """Make the output folder ``path`` (and its parents) now, so that an unusable one fails
    before a long run, not after it.

    Raises:
        ValueError: ``path`` is an existing file (``flag`` names a folder).
        OSError: the folder cannot be made (no permission, ...).
    """
    folder = pathlib.Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(
            f"{flag} {str(path)!r} is a file; {flag} names a folder (its files are written in it)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def fsync_tree(folder: str | os.PathLike[str]) -> None:
    """Flush every file under ``folder``, then the folders themselves, to the disk."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for name in (*dirs, "."):
            fsync_dir(os.path.join(root, name))


def create_temp(folder: str | os.PathLike[str], prefix: str) -> tuple[int, str]:
    """A new file in ``folder`` for an atomic replace: ``(fd, path)``, opened for writing, with
    the mode a plain ``open`` gives (``0o666`` less the umask; ``tempfile.mkstemp``'s ``0o600``
    would pass to the file it replaces)."""
    for _ in range(100):
        path = os.path.join(folder, f"{prefix}{os.getpid()}-{secrets.token_hex(6)}.tmp")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name {prefix}*.tmp in {folder}")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so that a kill at any moment leaves the old content or the new
    (a temporary file in the same folder, ``fsync``, ``os.replace``, the folder ``fsync``-ed)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = create_temp(folder, f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (names created, renamed or removed in it) to the disk; a no-op
    where folders cannot be opened for it (Windows)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
