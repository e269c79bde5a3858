"""Transforms by name, as a config lists them: ``env.transforms: [flatten_observation]`` or
``[{name: pixels, layout: HWC}]``.

An entry is a name, or a mapping with ``name`` and the transform's keyword arguments (keys as
lists of strings or lists of lists for nested keys, as YAML writes them: ``in_keys: [[red,
observation]]``). :func:`make_transforms` builds new transforms from the entries each time (a
transform belongs to one env), so the entries themselves are what a picklable env factory
carries to worker processes.

Examples:
    >>> from marlkit.envs.transforms.named import make_transforms
    >>> make_transforms(["flatten_observation", {"name": "pixels", "layout": "HWC"}])
    [FlattenObservation(in_keys=None), ToTensorImage(in_keys=None, layout='HWC', \
dtype=torch.float32)]
    >>> make_transforms(["flaten_observation"])
    Traceback (most recent call last):
    ...
    ValueError: transforms[0]: unknown transform 'flaten_observation'; known: \
agent_id, common_reward, concat_observation, double_to_float, flatten_observation, pixels, \
truncation_as_termination. Did you mean: flatten_observation, concat_observation?
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from marlkit._checks import check_kwargs, did_you_mean, keyword_names
from marlkit.envs.transforms.base import Transform
from marlkit.envs.transforms.common import CommonReward, DoubleToFloat, TruncationAsTermination
from marlkit.envs.transforms.observation import (
    AgentIdObservation,
    ConcatObservation,
    FlattenObservation,
    ToTensorImage,
)

__all__ = ["TRANSFORMS", "make_transform", "make_transforms"]

#: The transforms a config can name, by name.
TRANSFORMS: dict[str, type[Transform]] = {
    "agent_id": AgentIdObservation,
    "common_reward": CommonReward,
    "concat_observation": ConcatObservation,
    "double_to_float": DoubleToFloat,
    "flatten_observation": FlattenObservation,
    "pixels": ToTensorImage,
    "truncation_as_termination": TruncationAsTermination,
}


def _as_key(key: Any) -> Any:
    """A key as YAML writes it (a list for a nested key) as marlkit reads it (a tuple)."""
    if isinstance(key, (list, tuple)) and not isinstance(key, str):
        return tuple(key)
    return key


def make_transform(entry: str | Mapping[str, Any]) -> Transform:
    """A new transform from a config entry: its name, or ``{"name": name, **kwargs}``.

    Raises:
        ValueError: an unknown name (with the known ones and the closest), a mapping without
            ``name``.
        TypeError: an entry of another type, a keyword the transform does not take (with the
            closest), or a bad argument (the transform's own message).
    """
    if isinstance(entry, str):
        name, kwargs = entry, {}
    elif isinstance(entry, Mapping):
        if "name" not in entry:
            raise ValueError(
                f"a transform entry needs a 'name' (one of {', '.join(sorted(TRANSFORMS))}), "
                f"got the keys {sorted(map(str, entry))}"
            )
        name, kwargs = entry["name"], {str(k): v for k, v in entry.items() if k != "name"}
    else:
        raise TypeError(
            "a transform entry is a name or a mapping with 'name' and its arguments, got "
            f"{type(entry).__name__}: {entry!r}"
        )
    if name not in TRANSFORMS:
        known = sorted(TRANSFORMS)
        hint = did_you_mean(name, known)
        raise ValueError(f"unknown transform {name!r}; known: {', '.join(known)}.{hint}")
    cls = TRANSFORMS[name]
    accepted = keyword_names(cls.__init__, skip=("self",)) or []
    check_kwargs(f"transform {name!r}", kwargs, accepted)
    if kwargs.get("in_keys") is not None:
        keys = kwargs["in_keys"]
        if isinstance(keys, Sequence) and not isinstance(keys, str):
            kwargs["in_keys"] = [_as_key(k) for k in keys]
    return cls(**kwargs)


def make_transforms(entries: Sequence[str | Mapping[str, Any]]) -> list[Transform]:
    """New transforms from a config's list of entries (see :func:`make_transform`); an error
    names the entry: ``transforms[1]: unknown transform ...``."""
    if isinstance(entries, (str, Mapping)) or not isinstance(entries, Sequence):
        raise TypeError(
            f"transforms takes a list of entries (names or mappings), got "
            f"{type(entries).__name__}: {entries!r}"
        )
    out = []
    for i, entry in enumerate(entries):
        try:
            out.append(make_transform(entry))
        except (TypeError, ValueError, KeyError) as err:
            message = str(err.args[0]) if err.args else str(err)
            raise type(err)(f"transforms[{i}]: {message}") from None
    return out
