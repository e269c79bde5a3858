"""Group maps: which agents share a sub-TensorDict.

``"agents"`` puts everyone in one group named ``agents`` (the default); ``"per_agent"`` gives every
agent its own group; ``"by_type"`` groups by the name before the last ``_`` (``adversary_0`` ->
``adversary``); an explicit ``{group: [agent names]}`` is validated: every agent in exactly one
group, no unknown agent, no empty group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from marlkit.data.keys import DEFAULT_GROUP, check_group_name

__all__ = ["GroupMapLike", "agent_type", "make_group_map"]

GroupMapLike = Literal["agents", "per_agent", "by_type"] | Mapping[str, Sequence[str]]


def agent_type(name: str) -> str:
    """The type of an agent, the part of its name before the last ``_`` (the name if none)."""
    head, sep, _ = name.rpartition("_")
    return head if sep and head else name


def make_group_map(
    agent_names: Sequence[str], group_map: GroupMapLike = "agents"
) -> dict[str, list[str]]:
    """Resolve ``group_map`` over ``agent_names`` into ``{group: [agent names]}``.

    Agents keep the order of ``agent_names`` inside each group for the named strategies; an
    explicit map keeps its own order.

    Raises:
        ValueError: duplicate agent names, an unknown strategy, or an explicit map with an empty
            group, an agent in two groups, an unknown agent or an agent left out.
        TypeError: ``agent_names`` is a str or holds a non-str, ``group_map`` is neither a
            strategy name nor a mapping, or a group name is not a str.
    """
    if isinstance(agent_names, str) or not isinstance(agent_names, Iterable):
        raise TypeError(
            f"agent_names must be a sequence of str, got {type(agent_names).__name__}: "
            f"{agent_names!r}"
        )
    names = list(agent_names)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"agent names must be str, got {bad!r}")
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"agent names must be unique, these repeat: {dupes}")
    if not names:
        raise ValueError("cannot build a group map over zero agents")
    if isinstance(group_map, str):
        if group_map == "agents":
            return {DEFAULT_GROUP: names}
        if group_map == "per_agent":
            return {check_group_name(n): [n] for n in names}
        if group_map == "by_type":
            out: dict[str, list[str]] = {}
            for n in names:
                out.setdefault(check_group_name(agent_type(n)), []).append(n)
            return out
        raise ValueError(
            f"unknown group map {group_map!r}; expected 'agents', 'per_agent', 'by_type' or a "
            "mapping {group: [agent names]}"
        )
    if not isinstance(group_map, Mapping):
        raise TypeError(
            f"group_map must be 'agents', 'per_agent', 'by_type' or a mapping, got "
            f"{type(group_map).__name__}"
        )
    return _validate_explicit(names, group_map)


def _validate_explicit(
    names: list[str], group_map: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    known = set(names)
    owner: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for group, members in group_map.items():
        check_group_name(group)
        if isinstance(members, str) or not isinstance(members, Sequence):
            raise TypeError(
                f"group {group!r} must list agent names, got {type(members).__name__}: {members!r}"
            )
        if not members:
            raise ValueError(f"group {group!r} is empty; every group needs at least one agent")
        for agent in members:
            if agent not in known:
                raise ValueError(
                    f"group {group!r} names unknown agent {agent!r}; the agents are {names}"
                )
            if owner.get(agent) == group:
                raise ValueError(f"group {group!r} lists agent {agent!r} twice")
            if agent in owner:
                raise ValueError(
                    f"agent {agent!r} is in two groups: {owner[agent]!r} and {group!r}"
                )
            owner[agent] = group
        out[group] = list(members)
    missing = [n for n in names if n not in owner]
    if missing:
        raise ValueError(f"agents {missing} are in no group; every agent needs exactly one")
    return out
