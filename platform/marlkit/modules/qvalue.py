"""Value-based actors: :class:`QValueActor` (greedy over Q-values, masks honoured) and
:class:`EGreedy` (epsilon-greedy exploration with linear annealing)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn

from marlkit._checks import check_int, check_real
from marlkit.data.exploration import exploration_mode
from marlkit.data.keys import (
    ACTION,
    ACTION_MASK,
    ACTION_VALUE,
    CHOSEN_ACTION_VALUE,
    DEFAULT_GROUP,
    OBSERVATION,
    NestedKey,
    join_key,
)
from marlkit.data.specs import TensorSpec
from marlkit.modules._checks import (
    ActionSpace,
    action_space_of,
    check_some_allowed,
    check_trailing,
    encode_action,
    get_tensor,
    masked_greedy,
)

__all__ = ["EGreedy", "QValueActor", "annealing_steps"]


class QValueActor(TensorDictModuleBase):
    """A Q-network and the greedy action it implies, for every agent of one group.

    Reads ``(group, "observation")`` ``[*B, n, obs_dim]`` and ``(group, "action_mask")``
    ``[*B, n, A]`` bool when the input has it (masked actions are never chosen); writes
    ``(group, "action_value")`` ``[*B, n, A]``, the greedy ``(group, "action")`` (int64
    ``[*B, n]``, or one-hot ``[*B, n, A]``) and ``(group, "chosen_action_value")``
    ``[*B, n, 1]``. Any leading batch dims ``B`` work.

    Args:
        module: the Q-network. A plain ``nn.Module`` maps the observation ``[*B, n, obs_dim]``
            to ``[*B, n, A]`` (one network shared by the agents, or anything that keeps the
            agent dim); a ``TensorDictModule`` must write ``action_value_key`` itself.
        group: the agent group.
        n_actions: the number of actions ``A`` (checked against the Q-network's output).
        spec: the action spec (``Categorical`` or ``OneHot``), instead of ``n_actions``.
        action_space: ``"categorical"`` (default) or ``"one_hot"``, when no spec is given.
        observation_key, action_key, action_value_key, chosen_action_value_key,
        action_mask_key: the keys (default: the group's ``observation``, ``action``,
            ``action_value``, ``chosen_action_value``, ``action_mask``). ``action_mask_key=None``
            ignores masks.

    Raises:
        TypeError: a module that is not an ``nn.Module``.
        KeyError, ValueError (when called): a missing key, or action values / masks of the
            wrong shape; the message names the key and the expected shape.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from marlkit.modules import QValueActor
        >>> actor = QValueActor(torch.nn.Linear(4, 5), n_actions=5)
        >>> td = TensorDict({"agents": TensorDict({"observation": torch.randn(8, 3, 4)}, [8, 3])},
        ...                 [8])
        >>> actor(td)["agents", "action"].shape
        torch.Size([8, 3])
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        group: str = DEFAULT_GROUP,
        n_actions: int | None = None,
        spec: TensorSpec | None = None,
        action_space: ActionSpace | None = None,
        observation_key: NestedKey | None = None,
        action_key: NestedKey | None = None,
        action_value_key: NestedKey | None = None,
        chosen_action_value_key: NestedKey | None = None,
        action_mask_key: NestedKey | None = (),
    ):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"QValueActor: module must be an nn.Module, got {type(module).__name__}"
            )
        self.group = group
        self.n_actions, self.action_space = action_space_of(
            spec, n_actions, action_space, "QValueActor"
        )
        self.action_dtype = spec.dtype if spec is not None else None
        self.observation_key = observation_key or join_key(group, OBSERVATION)
        self.action_key = action_key or join_key(group, ACTION)
        self.action_value_key = action_value_key or join_key(group, ACTION_VALUE)
        self.chosen_action_value_key = chosen_action_value_key or join_key(
            group, CHOSEN_ACTION_VALUE
        )
        self.action_mask_key = (
            join_key(group, ACTION_MASK) if action_mask_key == () else action_mask_key
        )
        if isinstance(module, TensorDictModuleBase):
            self.module = module
        else:
            self.module = TensorDictModule(
                module, in_keys=[self.observation_key], out_keys=[self.action_value_key]
            )
        in_keys: list[Any] = list(self.module.in_keys)
        if self.action_mask_key is not None:
            in_keys.append(self.action_mask_key)
        out_keys: list[Any] = [self.action_value_key, self.action_key, self.chosen_action_value_key]
        self.in_keys, self.out_keys = in_keys, out_keys

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write the action values, the greedy action and its value into ``tensordict``."""
        self.module(tensordict)
        values = get_tensor(tensordict, self.action_value_key, "QValueActor", "[*B, n, A]")
        n = values.shape[-1]
        if self.n_actions is not None and n != self.n_actions:
            raise ValueError(
                f"QValueActor: {self.action_value_key!r} must have shape [*B, n, "
                f"{self.n_actions}] (n_actions), got {tuple(values.shape)}"
            )
        mask = None
        if self.action_mask_key is not None:
            mask = tensordict.get(self.action_mask_key, None)
            if mask is not None:
                check_trailing(
                    mask,
                    self.action_mask_key,
                    (n,),
                    "QValueActor",
                    f"[*B, n, {n}] bool",
                    boolean=True,
                )
                check_some_allowed(mask, self.action_mask_key, "QValueActor")
        index, value = masked_greedy(values, mask)
        tensordict.set(
            self.action_key, encode_action(index, n, self.action_space, self.action_dtype)
        )
        tensordict.set(self.chosen_action_value_key, value)
        return tensordict


def annealing_steps(total_frames: int, fraction: float) -> int:
    """How many frames an exploration schedule (:class:`EGreedy`,
    :class:`~marlkit.modules.AdditiveGaussian`) anneals over: ``fraction`` of a run's
    ``total_frames``, at least 1 (a fraction of 0 reaches the end value at once; above 1, the
    schedule outlasts the run).

    Raises:
        ValueError: ``fraction`` negative or not finite, ``total_frames < 1``.
        TypeError: ``total_frames`` not an int, ``fraction`` not a number.
    """
    total = check_int("total_frames", total_frames, low=1)
    share = check_real("the annealing fraction", fraction, strict=False)
    return max(1, int(total * share))


class EGreedy(TensorDictModuleBase):
    """Epsilon-greedy exploration around a greedy actor.

    In exploration mode ``"random"`` (collectors, see :mod:`marlkit.data.exploration`) each
    agent's action is replaced, with probability ``eps``, by an action drawn uniformly among
    its allowed ones (``action_mask_key`` ``[*B, n, A]`` bool, when the input has it). In
    ``"deterministic"`` mode the actor's greedy action is kept. ``eps`` goes linearly from
    ``eps_init`` to ``eps_end`` over ``annealing_num_steps`` counted by :meth:`step`.
    ``chosen_action_value`` keeps the greedy action's value (losses recompute the taken one).

    Args:
        module: the greedy actor (a :class:`QValueActor`, or anything writing ``action_key``).
        eps_init, eps_end: the first and the last epsilon, in ``[0, 1]``.
        annealing_num_steps: steps (frames, say) from ``eps_init`` to ``eps_end``.
        action_key, action_mask_key: default: the actor's (``(group, "action")``,
            ``(group, "action_mask")``); ``action_mask_key=None`` ignores masks.
        spec: the action spec (``Categorical`` or ``OneHot``), or ``n_actions`` and
            ``action_space``; default: the actor's.

    Raises:
        ValueError: epsilons outside ``[0, 1]``, ``annealing_num_steps < 1``, no way to know the
            number of actions.
    """

    eps: torch.Tensor
    steps_done: torch.Tensor
    module: TensorDictModuleBase

    def __init__(
        self,
        module: TensorDictModuleBase,
        eps_init: float = 1.0,
        eps_end: float = 0.1,
        annealing_num_steps: int = 1000,
        *,
        action_key: NestedKey | None = None,
        action_mask_key: NestedKey | None = (),
        spec: TensorSpec | None = None,
        n_actions: int | None = None,
        action_space: ActionSpace | None = None,
    ):
        super().__init__()
        for name, eps in (("eps_init", eps_init), ("eps_end", eps_end)):
            check_real(name, eps, strict=False, high=1.0, owner="EGreedy")
        check_int("annealing_num_steps", annealing_num_steps, low=1, owner="EGreedy")
        self.module = module
        if spec is None and n_actions is None and isinstance(module, QValueActor):
            n_actions, action_space = module.n_actions, module.action_space
        self.n_actions, self.action_space = action_space_of(
            spec, n_actions, action_space, "EGreedy"
        )
        if self.n_actions is None:
            raise ValueError("EGreedy needs the number of actions: a spec, n_actions, or an actor")
        self.action_dtype = spec.dtype if spec is not None else None
        actor_key = getattr(module, "action_key", None)
        actor_mask = getattr(module, "action_mask_key", join_key(DEFAULT_GROUP, ACTION_MASK))
        self.action_key = action_key or actor_key or join_key(DEFAULT_GROUP, ACTION)
        self.action_mask_key = actor_mask if action_mask_key == () else action_mask_key
        # A QValueActor reading the same mask refuses rows with no allowed action already.
        self._mask_checked = (
            isinstance(module, QValueActor) and module.action_mask_key == self.action_mask_key
        )
        self.eps_init, self.eps_end = float(eps_init), float(eps_end)
        self.annealing_num_steps = int(annealing_num_steps)
        self.register_buffer("eps", torch.tensor(self.eps_init))
        #: Steps counted by :meth:`step` (saved with the state, so a resumed run goes on).
        self.register_buffer("steps_done", torch.tensor(0, dtype=torch.int64))
        self.in_keys = list(module.in_keys)
        self.out_keys = list(module.out_keys)

    def step(self, frames: int = 1) -> None:
        """Anneal epsilon by ``frames`` steps (linearly, exactly ``eps_end`` once
        ``annealing_num_steps`` are done). Epsilon is computed from the step count, not
        accumulated, so it lands on ``eps_end`` without float drift.

        Raises:
            TypeError, ValueError: ``frames`` that is not an int ``>= 0``.
        """
        self.steps_done += check_int(f"{type(self).__name__}.step frames", frames, low=0)
        done = min(int(self.steps_done) / self.annealing_num_steps, 1.0)
        self.eps.fill_(self.eps_init + (self.eps_end - self.eps_init) * done)

    def _draws(
        self, lead: tuple[int, ...], n: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The random numbers of one call: scores ``[*lead, n]`` (the random action: the
        allowed one of the highest score) and uniforms ``[*lead]`` (explore where below eps),
        drawn in that order."""
        return torch.rand((*lead, n), device=device), torch.rand(lead, device=device)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Run the actor, then (exploration mode ``"random"``) replace actions at random."""
        tensordict = self.module(tensordict)
        if exploration_mode() != "random" or float(self.eps) == 0.0:
            return tensordict
        action = get_tensor(tensordict, self.action_key, "EGreedy", "[*B, n] or [*B, n, A]")
        n = int(self.n_actions)  # type: ignore[arg-type]
        lead = action.shape if self.action_space == "categorical" else action.shape[:-1]
        mask = None
        if self.action_mask_key is not None:
            mask = tensordict.get(self.action_mask_key, None)
        scores, uniform = self._draws(tuple(lead), n, action.device)
        if mask is not None:
            check_trailing(
                mask, self.action_mask_key, (n,), "EGreedy", f"[*B, n, {n}] bool", boolean=True
            )
            if not self._mask_checked:
                check_some_allowed(mask, self.action_mask_key, "EGreedy")
            scores = scores.masked_fill(~mask, -1.0)  # uniform among the allowed actions
        random_action = encode_action(
            scores.argmax(-1), n, self.action_space, self.action_dtype or action.dtype
        )
        explore = uniform < self.eps
        if self.action_space == "one_hot":
            explore = explore.unsqueeze(-1)
        tensordict.set(self.action_key, torch.where(explore, random_action, action))
        return tensordict
