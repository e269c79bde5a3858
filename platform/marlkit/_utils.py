"""Logging and optional-dependency helpers. Standard library only."""

from __future__ import annotations

import importlib
import importlib.util
import logging
from types import ModuleType

__all__ = ["get_logger", "has_module", "import_optional"]

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
