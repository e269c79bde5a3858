"""``set_keys`` shared by value estimators and losses: keys declared in one dataclass."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from marlkit.data.keys import NestedKey, unravel_key

__all__ = ["replace_keys"]


def replace_keys(tensor_keys: Any, owner: str, keys: dict[str, NestedKey]) -> None:
    """Set the fields ``keys`` names on the dataclass instance ``tensor_keys``.

    Raises:
        ValueError: a name that is not a field (the message lists the known ones).
        TypeError: a key that is not a str or a tuple of str.
    """
    names = {f.name for f in fields(tensor_keys)}
    for name in keys:
        if name not in names:
            raise ValueError(f"{owner}: unknown key name {name!r}; known: {sorted(names)}")
    for name, key in keys.items():
        setattr(tensor_keys, name, unravel_key(key))
