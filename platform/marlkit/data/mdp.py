"""``step_mdp``: move a transition's ``"next"`` entries to the root for the following step."""

from __future__ import annotations

from collections.abc import Sequence

from tensordict import TensorDictBase

from marlkit.data.keys import ACTION, DONE_KEYS, NEXT, REWARD, NestedKey

__all__ = ["step_mdp"]


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
    drop_next: list[NestedKey] = []
    if exclude_reward:
        drop_next += reward_keys if reward_keys is not None else _leaves_named(nxt, (REWARD,))
    if exclude_done:
        drop_next += done_keys if done_keys is not None else _leaves_named(nxt, DONE_KEYS)
    # A new structure sharing the tensors: the result never aliases a sub-TensorDict of the
    # transition, so writing into it cannot change ``tensordict``.
    out = nxt.clone(False)
    if drop_next:
        out.exclude(*drop_next, inplace=True)
    if not keep_other:
        return out
    skip: set[tuple[str, ...]] = {(NEXT,)}
    for wanted, keys, names in (
        (exclude_action, action_keys, (ACTION,)),
        (exclude_reward, reward_keys, (REWARD,)),
        (exclude_done, done_keys, DONE_KEYS),
    ):
        if wanted:
            found = keys if keys is not None else _leaves_named(tensordict, names)
            skip.update((k,) if isinstance(k, str) else tuple(k) for k in found)
    _carry(tensordict, out, skip, ())
    return out


def _carry(
    src: TensorDictBase, dst: TensorDictBase, skip: set[tuple[str, ...]], prefix: tuple[str, ...]
) -> None:
    """Copy into ``dst`` every entry of ``src`` that ``dst`` lacks, except ``skip`` (recursive)."""
    present = set(dst.keys())
    for key, value in src.items():
        path = (*prefix, key)
        if path in skip:
            continue
        is_td = isinstance(value, TensorDictBase)
        if key not in present:
            # Sub-TensorDicts get their own structure, so ``dst`` never aliases ``src``.
            dst.set(key, value.clone(False) if is_td else value)
            if is_td and any(p[: len(path)] == path for p in skip):
                dst.get(key).exclude(
                    *[p[len(path) :] for p in skip if p[: len(path)] == path], inplace=True
                )
        elif is_td:
            sub = dst.get(key)
            if isinstance(sub, TensorDictBase):
                _carry(value, sub, skip, path)
