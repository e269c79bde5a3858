"""``step_mdp``: move a transition's ``"next"`` entries to the root for the following step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tensordict import TensorDictBase

from marlkit.data._fast import get_entry, is_tensordict, own_items, unchecked_tensordict
from marlkit.data.keys import ACTION, DONE_KEYS, NEXT, REWARD, NestedKey

__all__ = ["step_mdp", "step_mdp_fn"]


def _leaves_named(td: TensorDictBase, names: Sequence[str]) -> list[NestedKey]:
    out: list[NestedKey] = []
    for key in td.keys(include_nested=True, leaves_only=True):
        last = key if isinstance(key, str) else key[-1]
        if last in names:
            out.append(key)
    return out


def step_mdp(
    tensordict: TensorDictBase,
    *,
    keep_other: bool = True,
    exclude_action: bool = True,
    exclude_reward: bool = True,
    exclude_done: bool = False,
    action_keys: Sequence[NestedKey] | None = None,
    reward_keys: Sequence[NestedKey] | None = None,
    done_keys: Sequence[NestedKey] | None = None,
) -> TensorDictBase:
    """Return a new TensorDict for the next step: the ``"next"`` entries moved to the root.

    Tensors are shared, not copied. Without explicit key lists, actions, rewards and done flags
    are recognised by their last key name (``"action"``, ``"reward"``, ``"done"``/
    ``"terminated"``/``"truncated"``).

    Args:
        tensordict: a transition, with a ``"next"`` sub-TensorDict.
        keep_other: keep root entries that ``"next"`` does not overwrite (e.g. a policy's
            recurrent state), except the excluded ones.
        exclude_action: drop action entries from the result.
        exclude_reward: drop reward entries from the result.
        exclude_done: drop done entries from the result.
        action_keys, reward_keys, done_keys: the exact keys (relative to the root and to
            ``"next"``); envs pass theirs.

    Raises:
        KeyError: ``tensordict`` has no ``"next"`` entry.
    """
    nxt = tensordict.get(NEXT, None)
    if nxt is None:
        raise KeyError(
            "step_mdp needs a transition with a 'next' entry; call env.step(td) first "
            f"(keys present: {list(tensordict.keys())})"
        )
    drop_next: set[tuple[str, ...]] = set()
    if exclude_reward:
        found = reward_keys if reward_keys is not None else _leaves_named(nxt, (REWARD,))
        drop_next.update(_paths(found))
    if exclude_done:
        found = done_keys if done_keys is not None else _leaves_named(nxt, DONE_KEYS)
        drop_next.update(_paths(found))
    if not keep_other:
        return _merge(nxt, None, drop_next, set(), ())
    skip: set[tuple[str, ...]] = {(NEXT,)}
    for wanted, keys, names in (
        (exclude_action, action_keys, (ACTION,)),
        (exclude_reward, reward_keys, (REWARD,)),
        (exclude_done, done_keys, DONE_KEYS),
    ):
        if wanted:
            skip.update(_paths(keys if keys is not None else _leaves_named(tensordict, names)))
    return _merge(nxt, tensordict, drop_next, skip, ())


def step_mdp_fn(
    *,
    action_keys: Sequence[NestedKey],
    reward_keys: Sequence[NestedKey],
) -> Callable[[TensorDictBase], TensorDictBase]:
    """``step_mdp`` with its defaults (keep other entries, drop actions and rewards) for fixed
    key lists, resolved once: what an env calls every step."""
    drop = _tree(_paths(reward_keys))
    skip = _tree([(NEXT,), *_paths(reward_keys), *_paths(action_keys)])

    def fn(tensordict: TensorDictBase) -> TensorDictBase:
        nxt = get_entry(tensordict, NEXT)
        if not is_tensordict(nxt):
            return step_mdp(tensordict)  # raises the explanatory KeyError (or looks further)
        return _merge_tree(nxt, tensordict, drop, skip)

    return fn


#: A tree of key paths: ``{key: subtree}``, where ``None`` marks a path's last key (that
#: entry, whatever it holds) and an empty dict no path below.
_Tree = dict[str, Any]
_NO_PATH: _Tree = {}


def _tree(paths: Sequence[tuple[str, ...]]) -> _Tree:
    tree: _Tree = {}
    for path in paths:
        node = tree
        for key in path[:-1]:
            below = node.get(key, _NO_PATH)
            if below is None:  # a shorter path already takes the whole entry
                break
            node = node.setdefault(key, {})
        else:
            node[path[-1]] = None
    return tree


def _merge_tree(
    nxt: TensorDictBase | None, root: TensorDictBase | None, drop: _Tree, skip: _Tree
) -> TensorDictBase:
    """:func:`_merge` with the paths as trees (what :func:`step_mdp_fn` resolves once): no key
    tuples built per entry, each TensorDict's own entries read directly."""
    entries: dict[str, Any] = {}
    if nxt is not None:
        for key, value in own_items(nxt):
            dropped = drop.get(key, _NO_PATH)
            if dropped is None:
                continue
            if is_tensordict(value):
                sub = get_entry(root, key) if root is not None else None
                skipped = skip.get(key, _NO_PATH)
                value = _merge_tree(
                    value,
                    sub if is_tensordict(sub) else None,
                    dropped,
                    _NO_PATH if skipped is None else skipped,
                )
            entries[key] = value
    if root is not None:
        for key, value in own_items(root):
            if key in entries:
                continue
            skipped = skip.get(key, _NO_PATH)
            if skipped is None:
                continue
            if is_tensordict(value):
                value = _merge_tree(None, value, drop.get(key) or _NO_PATH, skipped)
            entries[key] = value
    like = nxt if nxt is not None else root
    assert like is not None  # one of them is always given
    return _new_td(entries, like)


def _paths(keys: Sequence[NestedKey]) -> list[tuple[str, ...]]:
    return [(k,) if isinstance(k, str) else tuple(k) for k in keys]


def _new_td(entries: dict[str, Any], like: TensorDictBase) -> TensorDictBase:
    # Every entry already has ``like``'s batch dims: nothing to check again; the entries are
    # tensors and TensorDicts (a TensorDict's own entries), never plain dicts.
    return unchecked_tensordict(entries, like.batch_size, like.device, nested=False)


def _merge(
    nxt: TensorDictBase | None,
    root: TensorDictBase | None,
    drop: set[tuple[str, ...]],
    skip: set[tuple[str, ...]],
    prefix: tuple[str, ...],
) -> TensorDictBase:
    """A new TensorDict (new containers at every level, shared tensors): ``nxt``'s entries
    except ``drop``, then ``root``'s entries that ``nxt`` lacks except ``skip``."""
    entries: dict[str, Any] = {}
    if nxt is not None:
        for key, value in own_items(nxt):
            path = (*prefix, key)
            if path in drop:
                continue
            if isinstance(value, TensorDictBase):
                sub = get_entry(root, key) if root is not None else None
                value = _merge(
                    value, sub if isinstance(sub, TensorDictBase) else None, drop, skip, path
                )
            entries[key] = value
    if root is not None:
        for key, value in own_items(root):
            path = (*prefix, key)
            if key in entries or path in skip:
                continue
            if isinstance(value, TensorDictBase):
                value = _merge(None, value, drop, skip, path)
            entries[key] = value
    like = nxt if nxt is not None else root
    assert like is not None  # one of them is always given
    return _new_td(entries, like)
