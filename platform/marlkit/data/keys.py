"""Default key names, in one place (TorchRL's names where they exist).

The layout they build (see DESIGN.md)::

    td[group]                              batch [*B, n_agents_in_group]
      (group, OBSERVATION)                 [*B, n, ...]
      (group, ACTION)                      [*B, n, act_dim] or [*B, n]
      (group, ACTION_MASK)                 [*B, n, n_actions] bool
      (group, MASK)                        [*B, n] bool
    (group, ACTING)                      [*B, n] bool, turn-based (AEC) envs: whose turn it is
      (NEXT, group, REWARD)                [*B, n, 1]
      (NEXT, group, DONE | TERMINATED | TRUNCATED)   [*B, n, 1] bool
    STATE                                  [*B, ...]
    (NEXT, DONE | TERMINATED | TRUNCATED)  [*B, 1] bool
    RESET, (group, RESET)                  partial-reset masks
    (group, ACTION_VALUE)                  [*B, n, n_actions] Q-values of every action
    (group, CHOSEN_ACTION_VALUE)           [*B, n, 1] Q-value of the action taken
    CHOSEN_ACTION_VALUE                    [*B, 1] the mixed team value (mixers)
    (group, STATE_ACTION_VALUE)            [*B, n, 1] Q(o, a) of a continuous-action critic
    TD_ERROR, PRIORITY_WEIGHT              [*B] written by value losses / prioritized samplers
    TRAJ_IDS = ("collector", "traj_ids")   [*B] trajectory id, written by collectors
    WORKER = ("collector", "worker")       [*B] the worker that collected it (multi-worker)
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ACTING",
    "ACTION",
    "ACTION_LOG_PROB",
    "ACTION_MASK",
    "ACTION_PREACT",
    "ACTION_VALUE",
    "ADVANTAGE",
    "CHOSEN_ACTION_VALUE",
    "COLLECTOR",
    "COLLECTOR_MASK",
    "DEFAULT_GROUP",
    "DONE",
    "DONE_KEYS",
    "EPISODE_REWARD",
    "IS_INIT",
    "LOC",
    "LOGITS",
    "MASK",
    "NEXT",
    "OBSERVATION",
    "PRIORITY_WEIGHT",
    "RESERVED_GROUP_NAMES",
    "RESET",
    "REWARD",
    "RNN_STATE",
    "RNN_STATE_IN",
    "SCALE",
    "STATE",
    "STATE_ACTION_VALUE",
    "STATE_VALUE",
    "STEP_COUNT",
    "TD_ERROR",
    "TERMINATED",
    "TRAJ_IDS",
    "TRUNCATED",
    "VALUE_TARGET",
    "WORKER",
    "NestedKey",
    "check_group_name",
    "check_key",
    "check_keys",
    "is_key",
    "join_key",
    "key_path",
    "unravel_key",
]

NestedKey = str | tuple[str, ...]

OBSERVATION = "observation"
ACTION = "action"
ACTION_MASK = "action_mask"
MASK = "mask"
#: Turn-based (AEC) envs: ``(group, ACTING)`` ``[*B, n]`` bool, the agent whose turn it is.
ACTING = "acting"
REWARD = "reward"
DONE = "done"
TERMINATED = "terminated"
TRUNCATED = "truncated"
NEXT = "next"
STATE = "state"
RESET = "_reset"
STEP_COUNT = "step_count"
EPISODE_REWARD = "episode_reward"
IS_INIT = "is_init"
DEFAULT_GROUP = "agents"
#: Value-based policies and losses (TorchRL's names): every action's Q-value ``[*B, n, A]``,
#: the taken action's ``[*B, n, 1]`` (and the mixed team value, at the root, ``[*B, 1]``).
ACTION_VALUE = "action_value"
CHOSEN_ACTION_VALUE = "chosen_action_value"
#: A critic's value of an observation and a (continuous) action, ``[*B, n, 1]``.
STATE_ACTION_VALUE = "state_action_value"
#: Per-sample absolute TD error ``[*B]`` (priorities) and the prioritized sampler's importance
#: weights ``[*B]``.
TD_ERROR = "td_error"
PRIORITY_WEIGHT = "priority_weight"
#: What collectors add to a batch: trajectory ids ``[*B, T]`` int64, unique across batches and
#: resets, and (with ``split_trajs``) the mask of the real steps of each padded trajectory.
COLLECTOR = "collector"
TRAJ_IDS = (COLLECTOR, "traj_ids")
COLLECTOR_MASK = (COLLECTOR, "mask")
#: Multi-worker collectors: the worker that collected each step ``[*B, T]`` int64.
WORKER = (COLLECTOR, "worker")

#: Probabilistic actors: the distribution's parameters and the sampled action's log-prob
#: ``(group, ACTION_LOG_PROB)`` ``[*B, n]`` (one per agent, summed over action dims).
LOC = "loc"
SCALE = "scale"
LOGITS = "logits"
ACTION_LOG_PROB = "action_log_prob"
#: Deterministic tanh actors (:class:`~marlkit.modules.TanhBounds` with ``preact=True``): the
#: pre-tanh output ``(group, ACTION_PREACT)`` ``[*B, n, act_dim]``.
ACTION_PREACT = "action_preact"
#: Critics and value estimators: ``(group, STATE_VALUE | ADVANTAGE | VALUE_TARGET)`` ``[*B, n, 1]``.
STATE_VALUE = "state_value"
ADVANTAGE = "advantage"
VALUE_TARGET = "value_target"
#: Recurrent modules: ``(group, RNN_STATE)`` ``[*B, n, hidden]`` is the state after the step (a
#: root entry, so ``step_mdp`` carries it to the next step's input); ``(group, RNN_STATE_IN)``
#: the state the step started from (zeroed at episode starts), what training sequences begin with.
RNN_STATE = "rnn_state"
RNN_STATE_IN = "rnn_state_in"

#: The done-like keys every done level carries.
DONE_KEYS = (DONE, TERMINATED, TRUNCATED)

#: Names that cannot be used as group names: they are root keys of the layout.
RESERVED_GROUP_NAMES = frozenset({NEXT, STATE, RESET, DONE, TERMINATED, TRUNCATED, REWARD})


def unravel_key(key: NestedKey) -> NestedKey:
    """Normalise a nested key: ``("a",)`` -> ``"a"``, ``("a", ("b", "c"))`` -> ``("a", "b", "c")``.

    Raises:
        TypeError: ``key`` is not a str or a (nested) tuple of str.
        ValueError: ``key`` is an empty tuple.
    """
    if isinstance(key, str):
        return key
    if not isinstance(key, tuple):
        raise TypeError(f"a key must be a str or a tuple of str, got {type(key).__name__}: {key!r}")
    flat: list[str] = []
    for part in key:
        sub = unravel_key(part)
        if isinstance(sub, str):
            flat.append(sub)
        else:
            flat.extend(sub)
    if not flat:
        raise ValueError("a key cannot be an empty tuple")
    return flat[0] if len(flat) == 1 else tuple(flat)


def key_path(key: NestedKey) -> tuple[str, ...]:
    """A key as the tuple of its parts: ``"a"`` -> ``("a",)``, ``("a", ("b", "c"))`` ->
    ``("a", "b", "c")``.

    Raises:
        TypeError, ValueError: as :func:`unravel_key`.
    """
    key = unravel_key(key)
    return (key,) if isinstance(key, str) else key


def join_key(*parts: NestedKey) -> NestedKey:
    """One key from ``parts`` (strs or tuples, possibly empty ones): ``join_key((), "done")`` is
    ``"done"``, ``join_key(("agents",), "done")`` is ``("agents", "done")``.

    Raises:
        ValueError: nothing to join (every part empty).
    """
    flat: list[str] = []
    for part in parts:
        if isinstance(part, str):
            flat.append(part)
        elif part:
            flat.extend(key_path(part))
    if not flat:
        raise ValueError("join_key: every part is empty")
    return flat[0] if len(flat) == 1 else tuple(flat)


def is_key(key: object) -> bool:
    """Whether ``key`` is a nested key: a str, or a non-empty tuple of strs."""
    return isinstance(key, str) or (
        isinstance(key, tuple) and bool(key) and all(isinstance(k, str) for k in key)
    )


def check_key(owner: str, name: str, key: object) -> NestedKey:
    """``key`` (the argument ``name`` of ``owner``) unravelled.

    Raises:
        TypeError: ``key`` is not a str or a non-empty tuple of strs.
    """
    if not is_key(key):
        raise TypeError(f"{owner}: {name} must be a str or a tuple of strs, got {key!r}")
    return unravel_key(key)  # type: ignore[arg-type]


def check_keys(owner: str, name: str, keys: object) -> list[NestedKey]:
    """``keys`` (the argument ``name`` of ``owner``, a list of keys) unravelled.

    Raises:
        TypeError: ``keys`` is a lone key (a str or a tuple of strs would otherwise be read as a
            list of one-letter or root keys: the message says how to write it), not a sequence,
            or holds something that is not a key.
    """
    if isinstance(keys, str) or (isinstance(keys, tuple) and all(isinstance(k, str) for k in keys)):
        raise TypeError(
            f"{owner}: {name} takes a list of keys, got the single key {keys!r}; write "
            f"{name}=[{keys!r}]"
        )
    if not isinstance(keys, Sequence):
        raise TypeError(f"{owner}: {name} takes a list of keys, got {type(keys).__name__}")
    out = []
    for key in keys:
        if not is_key(key):
            raise TypeError(
                f"{owner}: each of {name} must be a str or a tuple of strs, got {key!r}"
            )
        out.append(unravel_key(key))
    return out


def check_group_name(group: object) -> str:
    """``group``, a name a group can take.

    Raises:
        TypeError: not a str.
        ValueError: an empty str, or one of :data:`RESERVED_GROUP_NAMES`.
    """
    if not isinstance(group, str):
        raise TypeError(f"a group name must be a str, got {type(group).__name__}: {group!r}")
    if not group:
        raise ValueError(f"a group name must be a non-empty str, got {group!r}")
    if group in RESERVED_GROUP_NAMES:
        raise ValueError(
            f"{group!r} cannot name a group: it is a reserved root key "
            f"({sorted(RESERVED_GROUP_NAMES)})"
        )
    return group
