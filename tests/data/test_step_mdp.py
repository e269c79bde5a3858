"""``step_mdp``: the ``"next"`` entries move to the root; actions/rewards dropped, done kept."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from marlkit.data import keys, step_mdp

B, N, M = 4, 3, 2  # env batch, agents, adversaries


def _group(n: int, **entries: torch.Tensor) -> TensorDict:
    return TensorDict(entries, batch_size=[B, n])


def _transition() -> TensorDict:
    """A two-group transition in the DESIGN.md layout; observations hold their time step."""
    return TensorDict(
        {
            "agents": _group(
                N,
                observation=torch.zeros(B, N, 5),
                action=torch.ones(B, N, 2),
                action_mask=torch.ones(B, N, 4, dtype=torch.bool),
                hidden=torch.full((B, N, 8), 7.0),
            ),
            # a scripted group: no action of its own
            "adversaries": _group(M, observation=torch.zeros(B, M, 6)),
            "state": torch.zeros(B, 7),
            "done": torch.zeros(B, 1, dtype=torch.bool),
            "policy_state": torch.full((B, 16), 3.0),
            "next": TensorDict(
                {
                    "agents": _group(
                        N,
                        observation=torch.ones(B, N, 5),
                        action_mask=torch.zeros(B, N, 4, dtype=torch.bool),
                        reward=torch.ones(B, N, 1),
                        done=torch.ones(B, N, 1, dtype=torch.bool),
                        terminated=torch.ones(B, N, 1, dtype=torch.bool),
                    ),
                    "adversaries": _group(
                        M,
                        observation=torch.ones(B, M, 6),
                        reward=torch.ones(B, M, 1),
                    ),
                    "state": torch.ones(B, 7),
                    "reward": torch.ones(B, 1),
                    "done": torch.ones(B, 1, dtype=torch.bool),
                    "terminated": torch.ones(B, 1, dtype=torch.bool),
                    "truncated": torch.zeros(B, 1, dtype=torch.bool),
                },
                batch_size=[B],
            ),
        },
        batch_size=[B],
    )


def _leaf_keys(td: TensorDictBase) -> set:
    return set(td.keys(include_nested=True, leaves_only=True))


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape


def test_next_entries_move_to_the_root():
    td = _transition()
    out = step_mdp(td)
    assert "next" not in out
    assert out.batch_size == (B,)
    assert out["agents"].batch_size == (B, N)
    assert out["adversaries"].batch_size == (B, M)
    assert (out["agents", "observation"] == 1).all()
    assert (out["adversaries", "observation"] == 1).all()
    assert (out["state"] == 1).all()
    assert not out["agents", "action_mask"].any()  # the next step's mask replaces the old one


def test_default_result_keys():
    out = step_mdp(_transition())
    assert _leaf_keys(out) == {
        ("agents", "observation"),
        ("agents", "action_mask"),
        ("agents", "hidden"),
        ("agents", "done"),
        ("agents", "terminated"),
        ("adversaries", "observation"),
        "state",
        "done",
        "terminated",
        "truncated",
        "policy_state",
    }


def test_actions_and_rewards_excluded_by_default():
    out = step_mdp(_transition())
    assert ("agents", "action") not in out
    assert ("agents", "reward") not in out
    assert ("adversaries", "reward") not in out
    assert "reward" not in out


def test_done_kept_from_next():
    td = _transition()
    out = step_mdp(td)
    assert out["done"].all()  # the next done, not the old root one
    assert out["agents", "done"].all() and out["agents", "terminated"].all()
    assert _same_storage(out["truncated"], td["next", "truncated"])


def test_keep_other():
    td = _transition()
    out = step_mdp(td)
    assert _same_storage(out["policy_state"], td["policy_state"])
    assert _same_storage(out["agents", "hidden"], td["agents", "hidden"])
    only_next = step_mdp(td, keep_other=False)
    assert "policy_state" not in only_next
    assert ("agents", "hidden") not in only_next
    assert _leaf_keys(only_next) == {
        key
        for key in _leaf_keys(td["next"])
        if not (isinstance(key, tuple) and key[-1] == "reward")
    } - {"reward"}


def test_keep_action_and_reward():
    td = _transition()
    out = step_mdp(td, exclude_action=False, exclude_reward=False)
    assert _same_storage(out["agents", "action"], td["agents", "action"])
    assert _same_storage(out["agents", "reward"], td["next", "agents", "reward"])
    assert _same_storage(out["reward"], td["next", "reward"])


def test_exclude_done():
    td = _transition()
    out = step_mdp(td, exclude_done=True)
    for key in _leaf_keys(out):
        last = key if isinstance(key, str) else key[-1]
        assert last not in keys.DONE_KEYS, key
    assert ("agents", "observation") in out


def test_reward_at_root_of_transition_is_dropped():
    td = _transition()
    td["reward"] = torch.zeros(B, 1)
    td["agents", "reward"] = torch.zeros(B, N, 1)
    out = step_mdp(td)
    assert "reward" not in out and ("agents", "reward") not in out
    kept = step_mdp(td, exclude_reward=False)
    assert (kept["reward"] == 1).all()  # next's reward overwrites the old one


def test_explicit_action_keys():
    td = _transition()
    td["adversaries", "action"] = torch.zeros(B, M, 1)
    out = step_mdp(td, action_keys=[("agents", "action")])
    assert ("agents", "action") not in out
    assert ("adversaries", "action") in out  # not listed, so kept
    default = step_mdp(td)
    assert ("adversaries", "action") not in default  # found by its name without a list


def test_explicit_reward_keys():
    td = _transition()
    out = step_mdp(td, reward_keys=[("agents", "reward")])
    assert ("agents", "reward") not in out
    assert ("adversaries", "reward") in out and "reward" in out


def test_explicit_done_keys():
    td = _transition()
    out = step_mdp(td, exclude_done=True, done_keys=["done", ("agents", "done")])
    assert "done" not in out and ("agents", "done") not in out
    assert "terminated" in out and ("agents", "terminated") in out
    ignored = step_mdp(td, done_keys=["done"])  # without exclude_done the list is unused
    assert "done" in ignored


def test_explicit_keys_that_are_absent():
    out = step_mdp(_transition(), action_keys=[("nobody", "action")], reward_keys=["nope"])
    assert ("agents", "action") in out and ("agents", "reward") in out


def test_missing_next():
    td = _transition().exclude("next")
    with pytest.raises(KeyError, match="step_mdp needs a transition with a 'next' entry") as info:
        step_mdp(td)
    message = str(info.value)
    assert "env.step(td)" in message
    assert "'agents'" in message and "'policy_state'" in message  # the keys that are there


def test_tensors_are_shared_not_copied():
    td = _transition()
    out = step_mdp(td, exclude_action=False)
    assert _same_storage(out["agents", "observation"], td["next", "agents", "observation"])
    assert _same_storage(out["state"], td["next", "state"])
    assert _same_storage(out["agents", "action"], td["agents", "action"])
    out["state"].add_(5)
    assert (td["next", "state"] == 6).all()


def test_input_is_not_changed():
    td = _transition()
    before = {key: td.get(key).clone() for key in _leaf_keys(td)}
    for kwargs in ({}, {"keep_other": False}, {"exclude_action": False, "exclude_reward": False}):
        step_mdp(td, **kwargs)
        assert _leaf_keys(td) == set(before)
        for key, value in before.items():
            assert torch.equal(td.get(key), value), (kwargs, key)


@pytest.mark.parametrize("keep_other", [True, False])
def test_writing_into_the_result_leaves_the_transition_alone(keep_other):
    """The next step's policy writes into the result; the stored transition must not change."""
    td = _transition()
    out = step_mdp(td, keep_other=keep_other)
    for group, n in (("agents", N), ("adversaries", M)):
        out[group, "action"] = torch.full((B, n, 2), 9.0)
        out[group, "observation"] = torch.full(out[group, "observation"].shape, 5.0)
    out["new_root_entry"] = torch.zeros(B)
    assert (td["agents", "action"] == 1).all()
    assert "action" not in td["adversaries"]
    assert "action" not in td["next", "agents"]
    assert "action" not in td["next", "adversaries"]
    assert (td["next", "agents", "observation"] == 1).all()
    assert (td["adversaries", "observation"] == 0).all()
    assert "new_root_entry" not in td and "new_root_entry" not in td["next"]


def test_rollout_keeps_every_stored_transition():
    """A small rollout loop: each stored transition keeps its own observations."""
    td = _transition().exclude("next")
    stored = []
    for t in range(3):
        td["agents", "action"] = torch.full((B, N, 2), float(t))
        td["next"] = TensorDict(
            {
                "agents": _group(N, observation=torch.full((B, N, 5), t + 1.0)),
                "adversaries": _group(M, observation=torch.full((B, M, 6), t + 1.0)),
                "done": torch.zeros(B, 1, dtype=torch.bool),
            },
            batch_size=[B],
        )
        stored.append(td)
        td = step_mdp(td)
    for t, transition in enumerate(stored):
        for group in ("agents", "adversaries"):
            assert (transition[group, "observation"] == t).all(), (t, group)
            assert (transition["next", group, "observation"] == t + 1).all(), (t, group)
        assert (transition["agents", "action"] == t).all()
        assert "action" not in transition["next", "agents"]


def test_ungrouped_single_agent_layout():
    td = TensorDict(
        {
            "observation": torch.zeros(B, 3),
            "action": torch.zeros(B, 1),
            "next": {"observation": torch.ones(B, 3), "reward": torch.ones(B, 1)},
        },
        batch_size=[B],
    )
    out = step_mdp(td)
    assert _leaf_keys(out) == {"observation"}
    assert (out["observation"] == 1).all()


def test_env_outputs_have_torch_size_batch_sizes() -> None:
    # TensorDicts built on the fast path kept a tuple batch_size: td.numel() in a policy failed.
    import marlkit

    env = marlkit.make("navigation", num_envs=2, n_agents=2, seed=0)
    td = env.reset()
    out, nxt = env.step_and_maybe_reset(env.rand_action(td))
    for root in (td, out, nxt):
        tds = [root, *(v for _, v in root.items(True) if isinstance(v, TensorDictBase))]
        for sub in tds:
            assert type(sub.batch_size) is torch.Size
        assert root.numel() == 2


@pytest.mark.parametrize(
    ("action_keys", "reward_keys"),
    [
        ([("agents", "action")], [("agents", "reward"), ("adversaries", "reward"), "reward"]),
        ([("agents", "action"), "policy_state"], ["reward"]),  # a whole root entry skipped
        (["agents"], [("agents", "reward"), "agents"]),  # a group taken whole, twice
    ],
)
def test_step_mdp_fn_is_step_mdp_with_its_keys(action_keys, reward_keys) -> None:
    # What envs call each step: the key lists resolved once into trees, the same result.
    from marlkit.data.mdp import step_mdp_fn

    td = _transition()
    fast = step_mdp_fn(action_keys=action_keys, reward_keys=reward_keys)(td)
    want = step_mdp(td, action_keys=action_keys, reward_keys=reward_keys)
    assert _leaf_keys(fast) == _leaf_keys(want)
    for key in _leaf_keys(want):
        assert fast.get(key) is want.get(key), key  # the same tensors, not copies
    assert fast.batch_size == want.batch_size
    assert [fast[g].batch_size for g in ("agents", "adversaries") if g in want] == [
        want[g].batch_size for g in ("agents", "adversaries") if g in want
    ]
    with pytest.raises(KeyError, match="step_mdp needs a transition with a 'next' entry"):
        step_mdp_fn(action_keys=action_keys, reward_keys=reward_keys)(td.exclude("next"))
