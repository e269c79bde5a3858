"""Target-network updaters: :class:`SoftUpdate` (Polyak averaging) and :class:`HardUpdate`
(a copy every ``value_network_update_interval`` steps), for losses built with
``delay_value=True`` or for any ``(online, target)`` module pairs (a PPO critic's target copy,
read by :class:`~marlkit.objectives.NStepTD` as EPyMARL's MAPPO reads it)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from marlkit._checks import check_int, check_real
from marlkit.objectives._common import ValueLoss

__all__ = ["HardUpdate", "SoftUpdate", "TargetNetUpdater"]


class TargetNetUpdater:
    """The common part: the ``(online, target)`` tensor pairs of a loss.

    The updater holds the parameters themselves (not their ``.data``) and looks the buffers
    up at every step, so converting the loss after building it (``loss.to(device)``,
    ``loss.double()``) keeps the targets moving.

    Args:
        loss: a value loss with target networks (``delay_value=True``), or a sequence of
            ``(online, target)`` module pairs of the same structure (a target made with
            ``copy.deepcopy(online)``).

    Raises:
        TypeError: ``loss`` is neither a value loss nor a sequence of module pairs.
        ValueError: the loss has no target networks; a pair whose modules differ in
            structure.
    """

    def __init__(self, loss: ValueLoss | Sequence[tuple[nn.Module, nn.Module]]):
        name = type(self).__name__
        if isinstance(loss, ValueLoss):
            pairs = list(loss.target_pairs())
        elif isinstance(loss, Sequence) and all(
            isinstance(pair, tuple)
            and len(pair) == 2
            and all(isinstance(m, nn.Module) for m in pair)
            for pair in loss
        ):
            pairs = list(loss)
            for o_net, t_net in pairs:
                shapes = [[tuple(p.shape) for p in net.parameters()] for net in (o_net, t_net)]
                if shapes[0] != shapes[1]:
                    raise ValueError(
                        f"{name}: the target {type(t_net).__name__} does not have the online "
                        f"{type(o_net).__name__}'s parameters (shapes {shapes[1]} against "
                        f"{shapes[0]}); make it with copy.deepcopy(online)"
                    )
        else:
            raise TypeError(
                f"{name} needs a value loss (QMixerLoss, DQNLoss) or a sequence of (online, "
                f"target) module pairs, got {type(loss).__name__}"
            )
        self.loss = loss
        params: list[tuple[torch.Tensor, torch.Tensor]] = []
        buffers: list[tuple[nn.Module, nn.Module, str]] = []
        for o_net, t_net in pairs:
            for o_mod, t_mod in zip(o_net.modules(), t_net.modules()):
                for key, o in o_mod._parameters.items():
                    t = t_mod._parameters[key]
                    if o is not None and t is not None and o.dtype.is_floating_point:
                        params.append((o, t))
                for key, buffer in o_mod._buffers.items():
                    if buffer is not None and buffer.dtype.is_floating_point:
                        buffers.append((o_mod, t_mod, key))
        if not params and not buffers:
            raise ValueError(
                f"{name}: {type(loss).__name__} has no target networks; build it "
                "with delay_value=True"
                if isinstance(loss, ValueLoss)
                else f"{name}: the (online, target) pairs hold no floating-point tensors"
            )
        self._online = [o for o, _ in params]
        self._target = [t for _, t in params]
        self._buffers = buffers

    def _tensors(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The online and target tensors as they are now."""
        if not self._buffers:
            return self._online, self._target
        online, target = list(self._online), list(self._target)
        for o_mod, t_mod, key in self._buffers:
            o, t = o_mod._buffers[key], t_mod._buffers[key]
            if o is None or t is None:  # the module dropped the buffer since
                raise RuntimeError(f"{type(self).__name__}: the buffer {key!r} is gone")
            online.append(o)
            target.append(t)
        return online, target

    @torch.no_grad()
    def init_(self) -> None:
        """Copy the online networks into the targets."""
        online, target = self._tensors()
        torch._foreach_copy_(target, online)

    def step(self) -> None:  # pragma: no cover - subclasses
        raise NotImplementedError


class SoftUpdate(TargetNetUpdater):
    """``target <- (1 - tau) target + tau online`` at every :meth:`step`.

    Args:
        loss: a value loss with target networks, or ``(online, target)`` module pairs.
        tau: the step size, in ``(0, 1]``.

    Raises:
        TypeError: ``tau`` is not a number.
        ValueError: ``tau`` outside ``(0, 1]``; a loss without target networks.
    """

    def __init__(self, loss: ValueLoss | Sequence[tuple[nn.Module, nn.Module]], tau: float = 0.005):
        tau = check_real("tau", tau, high=1.0, owner="SoftUpdate")
        super().__init__(loss)
        self.tau = tau

    @torch.no_grad()
    def step(self) -> None:
        """Move every target tensor a fraction ``tau`` towards its online tensor."""
        online, target = self._tensors()
        torch._foreach_lerp_(target, online, self.tau)


class HardUpdate(TargetNetUpdater):
    """Copy the online networks into the targets every ``value_network_update_interval`` calls
    of :meth:`step`.

    Args:
        loss: a value loss with target networks, or ``(online, target)`` module pairs.
        value_network_update_interval: steps between copies (>= 1).

    Raises:
        ValueError: an interval < 1; a loss without target networks.
    """

    def __init__(
        self,
        loss: ValueLoss | Sequence[tuple[nn.Module, nn.Module]],
        value_network_update_interval: int = 1000,
    ):
        interval = check_int(
            "value_network_update_interval",
            value_network_update_interval,
            low=1,
            owner="HardUpdate",
        )
        super().__init__(loss)
        self.value_network_update_interval = interval
        self.counter = 0

    @torch.no_grad()
    def step(self) -> None:
        """Count a step; copy on every ``value_network_update_interval``-th."""
        self.counter += 1
        if self.counter % self.value_network_update_interval == 0:
            self.init_()
