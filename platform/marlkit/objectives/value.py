"""Value estimators: functional ``gae``, ``td_lambda``, ``td0``, ``nstep_td`` and the modules
``GAE``, ``TDLambda``, ``TD0``, ``NStepTD`` that read a collected batch ``[*B, T]`` and write
``(group, "advantage")`` and ``(group, "value_target")`` ``[*B, T, n_agents, 1]``.

Conventions (as TorchRL's): the episode is over at a step where ``done`` is True, so the
recursion does not look past it; the next value is bootstrapped unless the step
``terminated`` (a truncated step bootstraps from the value of its final observation, which the
critic computes from ``"next"``). Rewards and flags may live per group (``[*B, T, n, 1]``) or
at the root (a team reward or root flags ``[*B, T, 1]``): the modules broadcast them to the
agents. Steps of absent agents (``(group, "mask")`` False) get a zero advantage, a target equal
to their value, and do not feed the steps before them.

A critic with memory (a :class:`~marlkit.modules.MultiAgentGRU` or ``MultiAgentLSTM`` inside)
runs over the batch's sequences in recurrent mode (the last batch dim is time, its state
zeroed at each episode start, a row's first state read from ``rnn_state_in``), and the next
values come from one step on ``"next"`` from the state each step reached
(:func:`~marlkit.modules.rnn.carry_states`): the values a critic stepping with the rollout
would give.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from marlkit._checks import check_int, check_real
from marlkit.data.keys import (
    ADVANTAGE,
    DEFAULT_GROUP,
    DONE,
    MASK,
    NEXT,
    REWARD,
    STATE_VALUE,
    TERMINATED,
    VALUE_TARGET,
    NestedKey,
)
from marlkit.data.trajectories import check_time_order
from marlkit.modules.critics import ValueNorm
from marlkit.modules.rnn import carry_states, recurrent_modules, set_recurrent_mode
from marlkit.objectives._keys import replace_keys

__all__ = [
    "GAE",
    "TD0",
    "EstimatorKeys",
    "NStepTD",
    "TDLambda",
    "ValueEstimator",
    "gae",
    "nstep_td",
    "td0",
    "td_lambda",
]


def _prepare(
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    mask: torch.Tensor | None,
    time_dim: int,
) -> tuple[Any, ...]:
    """Broadcast everything to one shape, time first: ``[T, ...]``."""
    check_int("time_dim", time_dim, owner="value estimator")
    for name, flag in (("done", done), ("terminated", terminated), ("mask", mask)):
        if flag is not None and flag.dtype != torch.bool:
            raise ValueError(
                f"value estimator: {name} must be a bool tensor, got {flag.dtype} (convert it "
                "with .bool())"
            )
    shapes = [t.shape for t in (state_value, next_state_value, reward, done, terminated)]
    if mask is not None:
        shapes.append(mask.shape)
    try:
        shape = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise ValueError(
            "value estimator: state_value, next_state_value, reward, done, terminated (and mask) "
            f"must broadcast to one shape [*B, T, *F], got {[list(s) for s in shapes]}"
        ) from None
    if not -len(shape) <= time_dim < len(shape):
        raise ValueError(
            f"value estimator: time_dim={time_dim} is not a dim of the broadcast shape "
            f"{list(shape)} (time_dim must be in [{-len(shape)}, {len(shape) - 1}])"
        )
    dtype = state_value.dtype

    def norm(t: torch.Tensor, as_float: bool = True) -> torch.Tensor:
        t = t.expand(shape).movedim(time_dim, 0)
        return t.to(dtype) if as_float else t.to(torch.bool)

    present = norm(mask, False) if mask is not None else None
    return (
        norm(state_value),
        norm(next_state_value),
        norm(reward),
        norm(done, False),
        norm(terminated, False),
        present,
    )


def gae(
    gamma: float,
    lmbda: float,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) on plain tensors: what
    :class:`GAE` computes once it has read a batch's keys and run the critic.

    ``delta_t = r_t + gamma * (1 - terminated_t) * V'_t - V_t``,
    ``A_t = delta_t + gamma * lmbda * (1 - done_t) * A_{t+1}``, target ``A_t + V_t``. The
    recursion runs backwards along ``time_dim`` and never looks past a step where ``done`` is
    True; the last step of the tensors is cut there too (no trace beyond it).

    Shapes: every tensor broadcasts to one shape ``[*B, T, *F]`` (PyTorch's right-aligned
    broadcasting) and ``time_dim`` indexes that shape. The default ``-2`` fits ``[*B, T, 1]``
    (one value per env step); per-agent tensors ``[*B, T, n_agents, 1]`` need ``time_dim=-3``
    (with ``-2`` the recursion would run over the agents, silently). A root entry broadcasts
    over the agents once its agent dim is there: a team reward or root flag ``[*B, T, 1]`` goes
    in as ``x.unsqueeze(-2)`` (``[*B, T, 1, 1]``), a mask ``[*B, T, n_agents]`` as
    ``mask.unsqueeze(-1)``.

    Flags: ``done`` and ``terminated`` (and ``mask``) are bool tensors. There is no
    ``truncated`` argument: a step that is ``done`` without being ``terminated`` was truncated,
    and bootstraps from ``next_state_value`` (the value of its final observation).

    Args:
        gamma, lmbda: discount and trace decay.
        state_value: ``V(s_t)`` ``[*B, T, *F]``.
        next_state_value: ``V(s_{t+1})`` (of the final observation at a done step), same shape.
        reward: ``r_t`` ``[*B, T, *F]`` (or broadcastable to it).
        done: the episode is over after the step, bool, broadcastable.
        terminated: over by termination (no bootstrap), bool, broadcastable.
        mask: True where the agent is present, bool, broadcastable (absent steps: zero
            advantage, a target equal to the value, and nothing fed to the steps before).
        time_dim: the time dim of the broadcast shape (negative: counted from its end).

    Returns:
        ``(advantage, value_target)``, each of the broadcast shape, in ``state_value``'s dtype.

    Raises:
        TypeError: ``time_dim`` not an int.
        ValueError: tensors that do not broadcast together; flags that are not bool tensors;
            ``time_dim`` outside the broadcast shape.

    Examples:
        >>> import torch
        >>> from marlkit.objectives import gae
        >>> v = torch.zeros(1, 3, 1)  # [*B, T, 1]: one env, 3 steps
        >>> done = torch.tensor([False, True, False]).reshape(1, 3, 1)  # step 1 ends an episode
        >>> adv, target = gae(0.9, 1.0, v, v, torch.ones(1, 3, 1), done, done)
        >>> [round(x, 4) for x in target.flatten().tolist()]  # the recursion stops at step 1
        [1.9, 1.0, 1.0]
    """
    v, nv, r, d, term, present = _prepare(
        state_value, next_state_value, reward, done, terminated, mask, time_dim
    )
    not_done = (~d).to(v.dtype)
    delta = r + gamma * (~term).to(v.dtype) * nv - v
    if present is not None:
        delta = delta.masked_fill(~present, 0.0)
    adv = torch.empty_like(v)
    running = torch.zeros_like(v[0])
    for t in range(v.shape[0] - 1, -1, -1):
        running = delta[t] + gamma * lmbda * not_done[t] * running
        if present is not None:
            running = running.masked_fill(~present[t], 0.0)
        adv[t] = running
    advantage = adv.movedim(0, time_dim)
    return advantage, advantage + state_value.expand_as(advantage)


def td_lambda(
    gamma: float,
    lmbda: float,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TD(lambda) returns on plain tensors (what :class:`TDLambda` computes): ``G_t = r_t +
    gamma * (1 - terminated_t) * (V'_t + lmbda * (1 - done_t) * (G_{t+1} - V'_t))``, ``G`` of
    the last step ``r + gamma (1 - terminated) V'``.

    Arguments, shapes (every tensor broadcast to ``[*B, T, *F]``; ``time_dim=-3`` for
    per-agent ``[*B, T, n_agents, 1]``), flags (bool ``done``, ``terminated``, ``mask``; no
    ``truncated``) and errors as :func:`gae`. Returns ``(advantage, value_target)`` with
    ``advantage = G - V`` (equal to GAE's when ``V'_t = V_{t+1}``); an absent agent's
    target is its value, and an absent next step cuts the trace.
    """
    v, nv, r, d, term, present = _prepare(
        state_value, next_state_value, reward, done, terminated, mask, time_dim
    )
    not_done = (~d).to(v.dtype)
    not_term = (~term).to(v.dtype)
    ret = torch.empty_like(v)
    nxt = nv[-1]  # G_{t+1}: equal to V'_t at the last step (no trace beyond the batch)
    for t in range(v.shape[0] - 1, -1, -1):
        follow = nv[t] + lmbda * not_done[t] * (nxt - nv[t])
        if present is not None and t + 1 < v.shape[0]:
            follow = torch.where(present[t + 1], follow, nv[t])  # absent next: no trace
        g = r[t] + gamma * not_term[t] * follow
        if present is not None:
            g = torch.where(present[t], g, v[t])
        ret[t] = g
        nxt = g
    target = ret.movedim(0, time_dim)
    return target - state_value.expand_as(target), target


def td0(
    gamma: float,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One-step targets on plain tensors (what :class:`TD0` computes): ``r_t + gamma *
    (1 - terminated_t) * V'_t``.

    Arguments, shapes (every tensor broadcast to ``[*B, T, *F]``; ``time_dim=-3`` for
    per-agent ``[*B, T, n_agents, 1]``) and errors as :func:`gae`; there is no ``lmbda``, and
    ``done`` is only checked and broadcast (the target never looks past one step). Returns
    ``(advantage, value_target)``; an absent agent's target is its value.
    """
    v, nv, r, _, term, present = _prepare(
        state_value, next_state_value, reward, done, terminated, mask, time_dim
    )
    target = r + gamma * (~term).to(v.dtype) * nv
    if present is not None:
        target = torch.where(present, target, v)
    target = target.movedim(0, time_dim)
    return target - state_value.expand_as(target), target


def nstep_td(
    gamma: float,
    n: int,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """n-step returns on plain tensors (what :class:`NStepTD` computes): ``G_t = r_t + gamma
    r_{t+1} + ... + gamma^(m-1) r_{t+m-1} + gamma^m (1 - terminated_{t+m-1}) V'_{t+m-1}``, with
    ``m`` the ``n`` steps or fewer where the episode ends (a ``done`` step), the tensors end
    or the next step's agent is absent first: the return then bootstraps from that step's next
    value (none at a terminated step). EPyMARL's ``q_nstep`` returns (its ``ppo_learner``,
    ``nstep_returns``, with ``add_value_last_step``); ``n=1`` is :func:`td0`.

    Arguments, shapes (every tensor broadcast to ``[*B, T, *F]``; ``time_dim=-3`` for
    per-agent ``[*B, T, n_agents, 1]``), flags (bool ``done``, ``terminated``, ``mask``; no
    ``truncated``) and errors as :func:`gae`; ``n`` an int >= 1. Returns ``(advantage,
    value_target)`` with ``advantage = G - V``; an absent agent's target is its value.

    Examples:
        >>> import torch
        >>> from marlkit.objectives import nstep_td
        >>> v = torch.zeros(1, 4, 1)  # [*B, T, 1]: one env, 4 steps, no episode end
        >>> flag = torch.zeros(1, 4, 1, dtype=torch.bool)
        >>> _, target = nstep_td(0.5, 2, v, v + 8, torch.ones(1, 4, 1), flag, flag)
        >>> target.flatten().tolist()  # 1 + 0.5 + 0.25 * 8; the last step bootstraps at once
        [3.5, 3.5, 3.5, 5.0]
    """
    n = check_int("n", n, low=1, owner="nstep_td")
    v, nv, r, d, term, present = _prepare(
        state_value, next_state_value, reward, done, terminated, mask, time_dim
    )
    steps = v.shape[0]
    # whether the chain of returns goes on past step t into t + 1: not done, not the tensors'
    # last step, the next step's agent present
    goes_on = (~d).contiguous()
    goes_on[-1] = False
    if present is not None:
        goes_on[:-1] &= present[1:]
    bootstrap = (~term).to(v.dtype) * nv
    ret = torch.zeros_like(v)
    alive = torch.ones_like(d)  # the chain from t reaches step t + k
    discount = 1.0
    for k in range(min(n, steps)):
        live = alive[: steps - k]  # the chains from t = 0 .. steps - k - 1, at step t + k
        at = slice(k, steps)
        ret[: steps - k] += discount * live * r[at]
        stop = live if k == n - 1 else live & ~goes_on[at]  # the n-th step always bootstraps
        ret[: steps - k] += discount * gamma * stop * bootstrap[at]
        alive = live & goes_on[at]
        discount *= gamma
    if present is not None:
        ret = torch.where(present, ret, v)
    target = ret.movedim(0, time_dim)
    return target - state_value.expand_as(target), target


@dataclass
class EstimatorKeys:
    """The keys a value estimator reads and writes (full nested keys; defaults under the
    group, with root fallbacks for rewards and flags).

    Attributes:
        value: ``(group, "state_value")`` ``[*B, T, n, 1]``, and the same under ``"next"``.
        reward: ``(group, "reward")`` under ``"next"`` (falls back to the root ``"reward"``).
        done, terminated: under ``"next"``, per group (falls back to the root flags).
        mask: ``(group, "mask")`` ``[*B, T, n]`` (optional).
        advantage, value_target: what is written.
    """

    value: NestedKey
    reward: NestedKey
    done: NestedKey
    terminated: NestedKey
    mask: NestedKey
    advantage: NestedKey
    value_target: NestedKey

    @classmethod
    def for_group(cls, group: str) -> EstimatorKeys:
        return cls(
            value=(group, STATE_VALUE),
            reward=(group, REWARD),
            done=(group, DONE),
            terminated=(group, TERMINATED),
            mask=(group, MASK),
            advantage=(group, ADVANTAGE),
            value_target=(group, VALUE_TARGET),
        )


def _last(key: NestedKey) -> str:
    return key if isinstance(key, str) else key[-1]


class ValueEstimator(TensorDictModuleBase):
    """Base of the estimator modules: reads a batch ``[*B, T]`` of one group and writes its
    advantages and value targets ``[*B, T, n_agents, 1]``.

    Args:
        gamma: the discount.
        value_network: a critic writing ``(group, "state_value")``; run (without gradients) on
            the batch and on its ``"next"`` entry. ``None``: the values are read from the batch.
        group: the group.
        value_norm: the critic predicts values normalised by it: they are denormalised first.
        time_dim: the batch's time dim (default: its last batch dim).

    Raises:
        KeyError: (at call time) a missing entry, naming the key.
        ValueError: (at call time) shapes that do not line up, naming the key and the shape.
    """

    #: The functional estimator a subclass runs (:func:`gae`, :func:`td_lambda`, :func:`td0`).
    _function: ClassVar[Callable[..., tuple[torch.Tensor, torch.Tensor]]]

    def __init__(
        self,
        gamma: float,
        value_network: nn.Module | None = None,
        *,
        group: str = DEFAULT_GROUP,
        value_norm: ValueNorm | None = None,
        time_dim: int | None = None,
    ):
        super().__init__()
        owner = f"{type(self).__name__}"
        self.gamma = check_real("gamma", gamma, strict=False, high=1.0, owner=owner)
        self.group = group
        self.value_network = value_network
        self.value_norm = value_norm
        self.time_dim = check_int("time_dim", time_dim, allow_none=True, owner=owner)
        self.tensor_keys = EstimatorKeys.for_group(group)
        self._refresh_keys()

    def _refresh_keys(self) -> None:
        self.in_keys = cast(Any, [self.tensor_keys.value])
        self.out_keys = cast(Any, [self.tensor_keys.advantage, self.tensor_keys.value_target])

    def set_keys(self, **keys: NestedKey) -> ValueEstimator:
        """Change keys by name (see :class:`EstimatorKeys`); returns ``self``.

        Raises:
            ValueError: an unknown name.
        """
        replace_keys(self.tensor_keys, type(self).__qualname__, keys)
        self._refresh_keys()
        return self

    def _values(self, td: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        key = self.tensor_keys.value
        if self.value_network is not None and recurrent_modules(self.value_network):
            self._sequence_values(td)
        elif self.value_network is not None:
            with torch.no_grad():
                td.set(key, self.value_network(td.select(*self._critic_keys(td))).get(key))
                nxt = td.get(NEXT)
                nxt.set(key, self.value_network(nxt.select(*self._critic_keys(nxt))).get(key))
        value = _get(td, key, "state value")
        next_value = _get(td, (NEXT, *_path(key)), "next state value")
        if self.value_norm is not None:
            value = self.value_norm.denormalize(value)
            next_value = self.value_norm.denormalize(next_value)
        return value, next_value

    @torch.no_grad()
    def _sequence_values(self, td: TensorDictBase) -> None:
        """A critic with memory: its values over the batch's sequences (the time dim last),
        then the next values from the states reached, one step on ``"next"``."""
        net, key = cast(nn.Module, self.value_network), self.tensor_keys.value
        if self.time_dim is not None and self.time_dim % td.batch_dims != td.batch_dims - 1:
            raise ValueError(
                f"{type(self).__name__}: a critic with memory reads its sequences along the "
                f"last batch dim; time_dim={self.time_dim} is another one"
            )
        with set_recurrent_mode(True):
            out = net(td.select(*self._critic_keys(td)))
        td.set(key, out.get(key))
        nxt = td.get(NEXT)
        following = carry_states(net, out, nxt.select(*self._critic_keys(nxt)))
        with set_recurrent_mode(False):
            nxt.set(key, net(following).get(key))

    def _critic_keys(self, td: TensorDictBase) -> list[NestedKey]:
        keys = getattr(self.value_network, "in_keys", None)
        if keys is None:
            return list(td.keys(include_nested=True, leaves_only=True))
        return [k for k in keys if k in td.keys(include_nested=True)]

    def _per_agent(self, td: TensorDictBase, key: NestedKey, like: torch.Tensor, what: str):
        """``("next", key)`` per group ``[*B, T, n, 1]``, else the root entry of the same
        name ``[*B, T, 1]`` broadcast over the agents."""
        nxt = td.get(NEXT)
        value = nxt.get(key, None)
        name, expected = (NEXT, *_path(key)), "[*B, T, n_agents, 1]"
        root = value is None
        if root:
            value = nxt.get(_last(key), None)
            if value is None:
                raise KeyError(
                    f"value estimator: missing {what} {name!r} (nor the root "
                    f"{(NEXT, _last(key))!r})"
                )
            name, expected = (NEXT, _last(key)), "[*B, T, 1] at the root"
        given = list(value.shape)
        if root:
            value = value.unsqueeze(-2)
        try:
            return value.expand_as(like)
        except RuntimeError:
            raise ValueError(
                f"value estimator: {what} {name!r} of shape {given} does not line up with the "
                f"values {list(like.shape)}: expected {expected}"
            ) from None

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write ``(group, "advantage")`` and ``(group, "value_target")`` into ``tensordict``
        (batch ``[*B, T]``) and return it."""
        if tensordict.batch_dims < 1:
            raise ValueError("value estimator: the batch needs a time dim ([*B, T])")
        k = self.tensor_keys
        group = _path(k.value)[0] if len(_path(k.value)) > 1 else None
        if group is not None and tensordict.get(group, None) is None:
            # before the critic runs: it would write a placeholder entry into the user's batch
            raise KeyError(
                f"value estimator: the batch has no group {group!r} (its entries: "
                f"{sorted(map(str, tensordict.keys()))}); pass group= as the env names it"
            )
        value, next_value = self._values(tensordict)
        if value.dim() != tensordict.batch_dims + 2 or value.shape[-1] != 1:
            raise ValueError(
                f"value estimator: {self.tensor_keys.value!r} must be [*B, T, n_agents, 1], "
                f"got {list(value.shape)}"
            )
        reward = self._per_agent(tensordict, k.reward, value, "reward")
        _check_finite(
            ((NEXT, *_path(k.reward)), reward),
            (k.value, value),
            ((NEXT, *_path(k.value)), next_value),
        )
        done = self._per_agent(tensordict, k.done, value, "done")
        terminated = self._per_agent(tensordict, k.terminated, value, "terminated")
        mask = tensordict.get(k.mask, None)
        if mask is not None:
            mask = mask.unsqueeze(-1)
        dims = tensordict.batch_dims
        t = dims - 1 if self.time_dim is None else self.time_dim
        if not -dims <= t < dims:
            raise ValueError(
                f"value estimator: time_dim={t} is not a batch dim of the batch "
                f"{list(tensordict.batch_size)} (time_dim must be in [{-dims}, {dims - 1}])"
            )
        check_time_order(
            tensordict,
            done.flatten(dims).any(-1),
            t % dims,
            "value estimator",
            "a done step",
            "Estimate on the collector's [*B, T] batch before reshaping it.",
        )
        time_dim = t - dims - 2 if t >= 0 else t - 2
        adv, target = self._estimate(value, next_value, reward, done, terminated, mask, time_dim)
        tensordict.set(k.advantage, adv)
        tensordict.set(k.value_target, target)
        return tensordict

    def _estimate(
        self,
        v: torch.Tensor,
        nv: torch.Tensor,
        r: torch.Tensor,
        d: torch.Tensor,
        term: torch.Tensor,
        mask: torch.Tensor | None,
        time_dim: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantage, value_target)`` from tensors ``[*B, T, n_agents, 1]``: the class's
        function of :meth:`_coefficients` and the tensors."""
        fn = type(self)._function
        return fn(*self._coefficients(), v, nv, r, d, term, mask=mask, time_dim=time_dim)

    def _coefficients(self) -> tuple[float, ...]:
        return (self.gamma,)


def _check_finite(*entries: tuple[NestedKey, torch.Tensor]) -> None:
    """Refuse NaN or inf in the estimator's inputs (once per batch): they would spread to every
    advantage and loss of the batch without a word."""
    for key, tensor in entries:
        bad = ~torch.isfinite(tensor)
        if bool(bad.any()):
            raise ValueError(
                f"value estimator: {key!r} holds NaN or inf at {int(bad.sum())} of "
                f"{tensor.numel()} entries (first at index {bad.nonzero()[0].tolist()}); every "
                "advantage and loss of the batch would be NaN"
            )


def _path(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _get(td: TensorDictBase, key: NestedKey, what: str) -> torch.Tensor:
    value = td.get(key, None)
    if value is None:
        raise KeyError(
            f"value estimator: missing {what} {key!r}; pass value_network= or run the critic first"
        )
    return value


class GAE(ValueEstimator):
    """Generalised advantage estimation over a batch (see :func:`gae`).

    Args:
        gamma: discount.
        lmbda: trace decay.
        value_network, group, value_norm, time_dim: see :class:`ValueEstimator`.

    Examples:
        >>> est = GAE(0.99, 0.95, group="agents")  # values read from the batch
    """

    def __init__(
        self,
        gamma: float,
        lmbda: float,
        value_network: nn.Module | None = None,
        *,
        group: str = DEFAULT_GROUP,
        value_norm: ValueNorm | None = None,
        time_dim: int | None = None,
    ):
        super().__init__(
            gamma, value_network, group=group, value_norm=value_norm, time_dim=time_dim
        )
        owner = f"{type(self).__name__}"
        self.lmbda = check_real("lmbda", lmbda, strict=False, high=1.0, owner=owner)

    _function = staticmethod(gae)

    def _coefficients(self) -> tuple[float, ...]:
        return (self.gamma, self.lmbda)


class TDLambda(GAE):
    """TD(lambda) targets over a batch (see :func:`td_lambda`); arguments as :class:`GAE`."""

    _function = staticmethod(td_lambda)


class TD0(ValueEstimator):
    """One-step TD targets over a batch (see :func:`td0`); arguments as
    :class:`ValueEstimator`."""

    _function = staticmethod(td0)


class NStepTD(ValueEstimator):
    """n-step TD returns over a batch (see :func:`nstep_td`), EPyMARL's MAPPO and IPPO
    estimator (``q_nstep``).

    Args:
        gamma: discount.
        n: the steps summed before the return bootstraps (EPyMARL's ``q_nstep: 5``).
        value_network, group, value_norm, time_dim: see :class:`ValueEstimator`. EPyMARL runs
            a target critic here (a copy of the critic, soft-updated after each batch):
            pass it as ``value_network`` (and train the critic itself in the loss).

    Examples:
        >>> est = NStepTD(0.99, 5, group="agents")  # values read from the batch
    """

    def __init__(
        self,
        gamma: float,
        n: int,
        value_network: nn.Module | None = None,
        *,
        group: str = DEFAULT_GROUP,
        value_norm: ValueNorm | None = None,
        time_dim: int | None = None,
    ):
        super().__init__(
            gamma, value_network, group=group, value_norm=value_norm, time_dim=time_dim
        )
        self.n = check_int("n", n, low=1, owner=f"{type(self).__name__}")

    _function = staticmethod(nstep_td)

    def _coefficients(self) -> tuple[float, ...]:
        return (self.gamma, self.n)
