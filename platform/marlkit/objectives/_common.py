"""What the value losses share: accepted keys with ``set_keys``, target networks, the greedy
next-step value (plain or double Q), distances and weighted means."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Literal, TypeVar

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from marlkit._checks import check_int, check_one_of, check_real, did_you_mean
from marlkit.data.keys import (
    ACTION,
    ACTION_MASK,
    ACTION_VALUE,
    COLLECTOR_MASK,
    MASK,
    NEXT,
    PRIORITY_WEIGHT,
    TD_ERROR,
    NestedKey,
    join_key,
    unravel_key,
)
from marlkit.modules import QValueActor
from marlkit.modules._checks import check_trailing, get_tensor, key_name, masked_greedy
from marlkit.modules.rnn import (
    carry_states,
    recurrent_mode,
    recurrent_modules,
    set_recurrent_mode,
)

__all__ = [
    "DiscreteKeys",
    "LossFunction",
    "ValueKeys",
    "ValueLoss",
    "distance",
    "mean_after",
    "sample_weights",
    "sum_after",
    "weighted_mean",
]

LossFunction = Literal["l2", "smooth_l1", "l1"]
_LOSS_FUNCTIONS = ("l2", "smooth_l1", "l1")


def distance(pred: torch.Tensor, target: torch.Tensor, loss_function: LossFunction) -> torch.Tensor:
    """Elementwise distance: ``"l2"`` (squared error), ``"smooth_l1"`` (Huber, delta 1),
    ``"l1"``."""
    if loss_function == "l2":
        return (pred - target).pow(2)
    if loss_function == "smooth_l1":
        return nn.functional.smooth_l1_loss(pred, target, reduction="none")
    return (pred - target).abs()


def sum_after(values: torch.Tensor, keep: int = 0) -> torch.Tensor:
    """The sum of ``values`` over every dim but the first ``keep`` (all of them: a scalar)."""
    return values.sum() if keep == 0 else values.sum(tuple(range(keep, values.dim())))


def mean_after(values: torch.Tensor, keep: int = 0) -> torch.Tensor:
    """The mean of ``values`` over every dim but the first ``keep`` (all of them: a scalar)."""
    return values.mean() if keep == 0 else values.mean(tuple(range(keep, values.dim())))


def weighted_mean(values: torch.Tensor, weight: torch.Tensor | None, keep: int = 0) -> torch.Tensor:
    """``sum(w * v) / sum(w)`` (the plain mean when ``weight`` is None), over every dim but
    the first ``keep`` (a loss's ``separate_dims``)."""
    if weight is None:
        return mean_after(values, keep)
    weight = weight.to(values.dtype)
    return sum_after(values * weight, keep) / sum_after(weight, keep).clamp_min(1e-12)


def sample_weights(
    td: TensorDictBase, key: NestedKey | None, shape: Sequence[int], owner: str
) -> torch.Tensor | None:
    """The importance weights ``td[key]`` of a prioritized sample, checked to be one per sample
    (``shape``, the ``[*B]`` of the loss's values), times the steps the loss counts
    (``("collector", "mask")`` ``[*B]`` where present: padded steps and the burn-in of
    :func:`~marlkit.train.sequences.split_sequences` windows weigh 0); ``None`` when the sample
    has neither.

    Raises:
        ValueError: weights of another shape (``[*B, 1]`` would broadcast over the samples).
    """
    weight = td.get(key, None) if key is not None else None
    if weight is not None and tuple(weight.shape) != tuple(shape):
        raise ValueError(
            f"{owner}: {key_name(key)!r} (importance weights) must have shape {tuple(shape)} "
            f"([*B], one per sample), got {tuple(weight.shape)}"
        )
    counted = td.get(COLLECTOR_MASK, None)  # the steps a loss counts (padding, burn-in out)
    if counted is not None and tuple(counted.shape) == tuple(shape):
        counted = counted.to(torch.get_default_dtype())
        weight = counted if weight is None else weight * counted
    return weight


def _runs(network: nn.Module) -> nn.Module:
    """What a loss runs of ``network``: of a :class:`~marlkit.modules.QValueActor` only its
    Q-network (the loss takes its own greedy actions)."""
    return network.module if isinstance(network, QValueActor) else network


K = TypeVar("K", bound="ValueKeys")


@dataclasses.dataclass
class ValueKeys:
    """The keys every value loss reads and writes (TorchRL's ``_AcceptedKeys``); each loss
    extends it. The fields named in ``GROUP_FIELDS`` live under the agent group.

    Attributes:
        action: the taken action: ``[*B, n]`` int64 (or one-hot ``[*B, n, A]``) for discrete
            losses, ``[*B, n, act_dim]`` for continuous ones.
        mask: ``[*B, n]`` bool, agents present.
        priority: written: the absolute TD error ``[*B]``.
        priority_weight: read where present: importance weights ``[*B]``.
    """

    GROUP_FIELDS: ClassVar[tuple[str, ...]] = ("action", "mask")

    action: NestedKey = ACTION
    mask: NestedKey | None = MASK
    priority: NestedKey = TD_ERROR
    priority_weight: NestedKey | None = PRIORITY_WEIGHT

    @classmethod
    def for_group(cls: type[K], group: str) -> K:
        """The default keys, those of ``GROUP_FIELDS`` under ``group``."""
        keys = cls()
        for name in cls.GROUP_FIELDS:
            setattr(keys, name, join_key(group, getattr(keys, name)))
        return keys


@dataclasses.dataclass
class DiscreteKeys(ValueKeys):
    """:class:`ValueKeys` and those of losses on discrete actions.

    Attributes:
        action_value: what the value network writes, ``[*B, n, A]``.
        action_mask: ``[*B, n, A]`` bool; the next step's restricts the greedy action.
    """

    GROUP_FIELDS: ClassVar[tuple[str, ...]] = (
        *ValueKeys.GROUP_FIELDS,
        "action_value",
        "action_mask",
    )

    action_value: NestedKey = ACTION_VALUE
    action_mask: NestedKey | None = ACTION_MASK


class ValueLoss(nn.Module):
    """Base of the value losses: keys, target networks and the greedy next-step value.

    Subclasses pass their :class:`ValueKeys` subclass, call :meth:`_add_network` for each
    network, and implement ``forward``.

    Attributes:
        tensor_keys: the keys in use (a dataclass), changed by :meth:`set_keys`.
        delay_value: whether target networks exist (and :class:`SoftUpdate` /
            :class:`HardUpdate` move them).
    """

    #: The keys in use: the loss's keys dataclass (set in the subclass's ``__init__``).
    tensor_keys: Any
    #: The ``tensor_keys`` fields ``forward`` reads from a sample at the step itself, and under
    #: ``"next"`` (subclasses extend them); every other field names a key the loss writes.
    STEP_READS: ClassVar[tuple[str, ...]] = ("action", "mask", "priority_weight")
    NEXT_READS: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        keys: type[ValueKeys],
        network: nn.Module,
        *,
        group: str,
        gamma: float,
        delay_value: bool,
        loss_function: LossFunction,
        action_space: Literal["categorical", "one_hot", "continuous"],
        separate_dims: int = 0,
    ):
        super().__init__()
        name = type(self).__name__
        #: The first this many batch dims index independent problems (the seeds of a stack,
        #: :mod:`marlkit.train.seeds`): the terms keep them, each its own problem's.
        self.separate_dims = check_int("separate_dims", separate_dims, low=0, owner=name)
        self.gamma = check_real("gamma", gamma, strict=False, high=1.0, owner=name)
        check_one_of("loss_function", loss_function, list(_LOSS_FUNCTIONS), owner=name)
        self.delay_value = bool(delay_value)
        self.loss_function: LossFunction = loss_function
        self._pairs: list[tuple[str, str]] = []
        self._networks: list[str] = []
        self.group = group
        self.tensor_keys = keys.for_group(group)
        #: How actions are spelled: the actor's (a QValueActor knows), else ``action_space``.
        self.action_space: Any = getattr(network, "action_space", action_space)

    # ------------------------------------------------------------------ keys
    def set_keys(self, **keys: NestedKey) -> ValueLoss:
        """Change the keys the loss reads and writes; returns ``self``.

        Raises:
            ValueError: a name that is not one of the accepted keys (the message lists them).
        """
        fields = [f.name for f in dataclasses.fields(self.tensor_keys)]
        for name, key in keys.items():
            if name not in fields:
                raise ValueError(
                    f"{type(self).__name__}.set_keys: unknown key name {name!r}"
                    f"{did_you_mean(name, fields)}; accepted: {fields}"
                )
            setattr(self.tensor_keys, name, unravel_key(key) if key is not None else None)
        return self

    @property
    def in_keys(self) -> list[NestedKey]:
        """Every key ``forward`` may read from a sample, with the keys in use (``set_keys``):
        the networks' inputs at the step and under ``"next"`` (the target networks read the
        next step), the taken action, and the keys read where present (the agents' ``mask``,
        the next ``action_mask``, importance weights, root or per-agent rewards and
        terminations: whichever the env gives). Keys the loss writes itself (values, the
        mixer's input, ``td_error``) are left out. Keep what a batch has of them with
        ``batch.select(*loss.in_keys, strict=False)`` before storing it in a replay buffer, as
        the training scripts do: the simulator's ``info``, episode statistics and the policy's
        outputs are not stored.
        """
        keys = self.tensor_keys
        reads = (*self.STEP_READS, *self.NEXT_READS)
        fields = [f.name for f in dataclasses.fields(keys)]
        written = {getattr(keys, n) for n in fields if n not in reads}
        inputs = [
            unravel_key(key)
            for name in self._networks
            for key in getattr(_runs(getattr(self, name)), "in_keys", [])
        ]
        inputs = [key for key in inputs if key not in written]
        step = [*inputs, *(getattr(keys, n) for n in self.STEP_READS)]
        nxt = [*inputs, *(getattr(keys, n) for n in self.NEXT_READS)]
        found = [*step, *(join_key(NEXT, key) for key in nxt if key is not None)]
        return list(dict.fromkeys(key for key in found if key is not None))

    # ------------------------------------------------------------------ networks
    def _add_network(self, name: str, module: nn.Module, *, target: bool = True) -> None:
        """Register ``module`` as ``name`` and, with ``delay_value`` and ``target``, a frozen
        copy of it as ``target_<name>`` (never given gradients)."""
        if not isinstance(module, TensorDictModuleBase):
            raise TypeError(
                f"{type(self).__name__}: {name} must be a TensorDict module (in_keys/out_keys), "
                f"got {type(module).__name__}"
            )
        setattr(self, name, module)
        self._networks.append(name)
        if self.delay_value and target:
            frozen = copy.deepcopy(module)
            frozen.requires_grad_(False)
            setattr(self, f"target_{name}", frozen)
            self._pairs.append((name, f"target_{name}"))

    def _target(self, name: str) -> nn.Module:
        return getattr(self, f"target_{name}" if self.delay_value else name)

    def target_pairs(self) -> Iterator[tuple[nn.Module, nn.Module]]:
        """``(online, target)`` network pairs (none without ``delay_value``)."""
        for online, target in self._pairs:
            yield getattr(self, online), getattr(self, target)

    def online_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters an optimiser trains (the target networks' excluded)."""
        targets = {id(p) for _, t in self.target_pairs() for p in t.parameters()}
        return (p for p in self.parameters() if id(p) not in targets)

    # ------------------------------------------------------------------ shared maths
    def _read(self, td: TensorDictBase, key: NestedKey, expected: str) -> torch.Tensor:
        return get_tensor(td, key, type(self).__name__, expected)

    def _read_next(self, nxt: TensorDictBase, key: NestedKey, expected: str) -> torch.Tensor:
        """:meth:`_read` of the ``"next"`` TensorDict: a missing key is named with its
        ``"next"`` prefix, as the user's batch spells it."""
        return get_tensor(nxt, key, type(self).__name__, expected, shown=(NEXT, key))

    def _check_separate(self, td: TensorDictBase) -> int:
        """``separate_dims``, checked against the input's batch dims (the samples need one
        more); returns it.

        Raises:
            ValueError: too few batch dims.
        """
        keep = self.separate_dims
        if keep and td.batch_dims <= keep:
            raise ValueError(
                f"{type(self).__name__}: separate_dims={keep} needs {keep} batch dims before the "
                f"samples' (e.g. [K, B]), got batch size {tuple(td.batch_size)}"
            )
        return keep

    def _next(self, td: TensorDictBase) -> TensorDictBase:
        nxt = td.get(NEXT, None)
        if not isinstance(nxt, TensorDictBase):
            raise KeyError(
                f"{type(self).__name__}: the input has no {NEXT!r} TensorDict (the next step of "
                "each transition, as collectors write it)"
            )
        return nxt

    def _present(self, td: TensorDictBase, n: int) -> torch.Tensor | None:
        """The agents present, ``(group, "mask")`` as ``[*B, n, 1]`` bool (None: all)."""
        key = self.tensor_keys.mask
        mask = td.get(key, None) if key is not None else None
        if mask is None:
            return None
        check_trailing(mask, key, (n,), type(self).__name__, f"[*B, {n}] bool", boolean=True)
        return mask.unsqueeze(-1)

    def _action_values(self, td: TensorDictBase, network: nn.Module) -> torch.Tensor:
        """Run ``network`` on ``td`` (in place) and return its action values ``[*B, n, A]``.

        Of a :class:`~marlkit.modules.QValueActor` only the Q-network runs: the loss takes its
        own greedy actions (the actor's would be computed and thrown away at every step)."""
        _runs(network)(td)
        keys: Any = self.tensor_keys
        return self._read(td, keys.action_value, "[*B, n_agents, n_actions]")

    def _allowed(self, td: TensorDictBase, n_actions: int) -> torch.Tensor | None:
        keys: Any = self.tensor_keys
        if keys.action_mask is None:
            return None
        mask = td.get(keys.action_mask, None)
        if mask is not None:
            check_trailing(
                mask,
                keys.action_mask,
                (n_actions,),
                type(self).__name__,
                f"[*B, n_agents, {n_actions}] bool",
                boolean=True,
            )
        return mask

    @torch.no_grad()
    def _next_value(
        self,
        next_td: TensorDictBase,
        network: str,
        double_dqn: bool,
        sequence: TensorDictBase | None = None,
    ) -> torch.Tensor:
        """The greedy value ``[*B, n, 1]`` of the next step, among its allowed actions: the
        target network's max (``double_dqn=False``), or the target network's value of the online
        network's argmax (double Q, van Hasselt et al. 2016). Agents with no allowed action get
        0. The target network writes into ``next_td`` (pass a shallow copy).

        A network with memory (PyMARL's recurrent agents): ``sequence`` is the batch of windows
        ``[N, T]`` the online network just ran over in recurrent mode; the target network is
        unrolled over it too, and each next value is one step on ``next_td`` from the state
        that network reached at that step (:func:`~marlkit.modules.rnn.carry_states`)."""
        online = getattr(self, network)
        if recurrent_modules(online):
            return self._next_value_unrolled(next_td, network, double_dqn, sequence)
        online_values = self._action_values(next_td.clone(False), online) if double_dqn else None
        target_values = self._action_values(next_td, self._target(network))
        return self._greedy_next(next_td, online_values, target_values)

    def _next_value_unrolled(
        self,
        next_td: TensorDictBase,
        network: str,
        double_dqn: bool,
        sequence: TensorDictBase | None,
    ) -> torch.Tensor:
        online, target = getattr(self, network), self._target(network)
        if sequence is None or not recurrent_mode():
            raise ValueError(
                f"{type(self).__name__}: the Q-network has memory (a GRU or LSTM): call the loss "
                "on windows [N, T] inside marlkit.modules.set_recurrent_mode(True) "
                "(marlkit.train.sequences.split_sequences cuts a collected batch into them)"
            )
        unrolled = sequence.clone(False)
        _runs(target)(unrolled)  # the target network over the windows: its states per step
        with set_recurrent_mode(False):
            online_values = (
                self._action_values(carry_states(online, sequence, next_td.clone(False)), online)
                if double_dqn
                else None
            )
            target_values = self._action_values(carry_states(target, unrolled, next_td), target)
        return self._greedy_next(next_td, online_values, target_values)

    def _greedy_next(
        self,
        next_td: TensorDictBase,
        online_values: torch.Tensor | None,
        target_values: torch.Tensor,
    ) -> torch.Tensor:
        """The target values' greedy value, or their value of the online values' argmax."""
        allowed = self._allowed(next_td, target_values.shape[-1])
        if online_values is not None:
            index, _ = masked_greedy(online_values, allowed)
            value = target_values.gather(-1, index.unsqueeze(-1))
        else:
            _, value = masked_greedy(target_values, allowed)
        if allowed is not None:
            value = value.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
        return value
