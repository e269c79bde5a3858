"""Group maps: the three named strategies, explicit maps, and every validation error."""

from __future__ import annotations

import re

import pytest

from marlkit.data import agent_type, keys, make_group_map

MPE = ["adversary_0", "adversary_1", "agent_0"]


# ====================================================================== agent_type
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("adversary_0", "adversary"),
        ("agent_12", "agent"),
        ("red_team_3", "red_team"),  # the part before the *last* underscore
        ("alice", "alice"),  # no underscore: the name itself
        ("_0", "_0"),  # nothing before the underscore: the name itself
    ],
)
def test_agent_type(name, expected):
    assert agent_type(name) == expected


# ====================================================================== strategies
def test_default_is_one_agents_group():
    assert make_group_map(MPE) == {"agents": MPE}
    assert make_group_map(MPE, "agents") == {keys.DEFAULT_GROUP: MPE}


def test_per_agent():
    assert make_group_map(MPE, "per_agent") == {
        "adversary_0": ["adversary_0"],
        "adversary_1": ["adversary_1"],
        "agent_0": ["agent_0"],
    }


def test_by_type():
    group_map = make_group_map(MPE, "by_type")
    assert group_map == {"adversary": ["adversary_0", "adversary_1"], "agent": ["agent_0"]}
    assert list(group_map) == ["adversary", "agent"]  # first appearance order


def test_by_type_keeps_agent_order_inside_groups():
    names = ["agent_1", "adversary_1", "agent_0", "adversary_0"]
    assert make_group_map(names, "by_type") == {
        "agent": ["agent_1", "agent_0"],
        "adversary": ["adversary_1", "adversary_0"],
    }


def test_by_type_without_underscores():
    assert make_group_map(["alice", "bob", "carol"], "by_type") == {
        "alice": ["alice"],
        "bob": ["bob"],
        "carol": ["carol"],
    }
    assert make_group_map(["alice", "alice_1", "bob"], "by_type") == {
        "alice": ["alice", "alice_1"],
        "bob": ["bob"],
    }


def test_accepts_any_sequence_and_copies():
    names = ["a", "b"]
    group_map = make_group_map(names)
    group_map["agents"].append("c")
    assert names == ["a", "b"]
    assert make_group_map(("a", "b"), "per_agent") == {"a": ["a"], "b": ["b"]}
    assert make_group_map(iter(["a", "b"])) == {"agents": ["a", "b"]}


# ====================================================================== explicit maps
def test_explicit_map():
    group_map = {"red": ["agent_0", "adversary_1"], "blue": ("adversary_0",)}
    out = make_group_map(MPE, group_map)
    assert out == {"red": ["agent_0", "adversary_1"], "blue": ["adversary_0"]}
    assert list(out) == ["red", "blue"]  # its own order is kept
    assert all(isinstance(members, list) for members in out.values())
    out["red"].append("x")
    assert group_map["red"] == ["agent_0", "adversary_1"]  # the input is not aliased


def test_explicit_agent_in_two_groups():
    with pytest.raises(ValueError, match="agent 'agent_0' is in two groups: 'red' and 'blue'"):
        make_group_map(MPE, {"red": ["agent_0", "adversary_0"], "blue": ["agent_0", "adversary_1"]})


def test_explicit_agent_listed_twice_in_one_group():
    with pytest.raises(ValueError, match="group 'red' lists agent 'agent_0' twice"):
        make_group_map(MPE, {"red": ["agent_0", "agent_0", "adversary_0", "adversary_1"]})


def test_explicit_unknown_agent():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "group 'red' names unknown agent 'agent_9'; the agents are "
            "['adversary_0', 'adversary_1', 'agent_0']"
        ),
    ):
        make_group_map(MPE, {"red": ["agent_9", "agent_0", "adversary_0", "adversary_1"]})


def test_explicit_empty_group():
    with pytest.raises(ValueError, match="group 'blue' is empty; every group needs at least one"):
        make_group_map(MPE, {"red": MPE, "blue": []})


def test_explicit_missing_agent():
    with pytest.raises(
        ValueError,
        match=re.escape("agents ['adversary_1', 'agent_0'] are in no group; every agent needs"),
    ):
        make_group_map(MPE, {"red": ["adversary_0"]})
    with pytest.raises(ValueError, match="are in no group"):
        make_group_map(MPE, {})


@pytest.mark.parametrize("name", sorted(keys.RESERVED_GROUP_NAMES))
def test_reserved_group_names(name):
    pattern = f"'{name}' cannot name a group: it is a reserved root key"
    with pytest.raises(ValueError, match=pattern):
        make_group_map(["a"], {name: ["a"]})
    with pytest.raises(ValueError, match=pattern):
        make_group_map([name, "b"], "per_agent")
    with pytest.raises(ValueError, match=pattern):
        make_group_map([f"{name}_0", "b"], "by_type")
    # the single "agents" group never uses agent names as group names
    assert make_group_map([name, "b"]) == {"agents": [name, "b"]}


def test_reserved_names_cover_the_root_layout():
    assert {"next", "state", "_reset", "done", "terminated", "truncated", "reward"} <= (
        keys.RESERVED_GROUP_NAMES
    )


def test_empty_group_name():
    with pytest.raises(ValueError, match="a group name must be a non-empty str, got ''"):
        make_group_map(["a"], {"": ["a"]})


# ====================================================================== bad input
def test_duplicate_agent_names():
    with pytest.raises(
        ValueError, match=re.escape("agent names must be unique, these repeat: ['a', 'b']")
    ):
        make_group_map(["b", "a", "c", "a", "b"])


def test_zero_agents():
    with pytest.raises(ValueError, match="cannot build a group map over zero agents"):
        make_group_map([])


def test_unknown_strategy():
    with pytest.raises(ValueError, match="unknown group map 'by_team'; expected 'agents'"):
        make_group_map(MPE, "by_team")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("agent_names", "pattern"),
    [
        ("agent_0", "agent_names must be a sequence of str, got str: 'agent_0'"),
        (None, "agent_names must be a sequence of str, got NoneType"),
        (3, "agent_names must be a sequence of str, got int"),
        (["a", 1], re.escape("agent names must be str, got [1]")),
        ([b"a"], re.escape("agent names must be str, got [b'a']")),
    ],
)
def test_agent_names_wrong_type(agent_names, pattern):
    with pytest.raises(TypeError, match=pattern):
        make_group_map(agent_names)  # type: ignore[arg-type]


@pytest.mark.parametrize("group_map", [3, ["agents"], None, ("a", "b")])
def test_group_map_wrong_type(group_map):
    with pytest.raises(
        TypeError,
        match=r"group_map must be 'agents', 'per_agent', 'by_type' or a mapping, got \w+",
    ):
        make_group_map(MPE, group_map)  # type: ignore[arg-type]


def test_group_name_wrong_type():
    with pytest.raises(TypeError, match="a group name must be a str, got int: 1"):
        make_group_map(["a"], {1: ["a"]})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("members", "pattern"),
    [
        ("agent_0", "group 'red' must list agent names, got str: 'agent_0'"),
        ({"agent_0"}, "group 'red' must list agent names, got set"),
        (None, "group 'red' must list agent names, got NoneType"),
    ],
)
def test_group_members_wrong_type(members, pattern):
    with pytest.raises(TypeError, match=pattern):
        make_group_map(["agent_0"], {"red": members})  # type: ignore[dict-item]
