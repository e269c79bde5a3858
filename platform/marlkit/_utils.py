"""Logging, optional dependencies and fsync helpers. Standard library only.

The argument checks and "did you mean" helpers live in :mod:`marlkit._checks`."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import pathlib
import secrets
from types import ModuleType

__all__ = [
    "create_temp",
    "fsync_dir",
    "fsync_tree",
    "get_logger",
    "has_module",
    "import_optional",
    "make_out_folder",
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
