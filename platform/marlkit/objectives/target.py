"""Target-network updaters: :class:`SoftUpdate` (Polyak averaging) and :class:`HardUpdate`
(a copy every ``value_network_update_interval`` steps), for losses built with
``delay_value=True``."""

from __future__ import annotations

import math

import torch

from marlkit.objectives._common import ValueLoss

__all__ = ["HardUpdate", "SoftUpdate", "TargetNetUpdater"]


class TargetNetUpdater:
    """The common part: the ``(online, target)`` tensor pairs of a loss.

    Args:
        loss: a value loss with target networks (``delay_value=True``).

    Raises:
        TypeError: ``loss`` is not a value loss.
        ValueError: the loss has no target networks.
    """

    def __init__(self, loss: ValueLoss):
        if not isinstance(loss, ValueLoss):
            raise TypeError(
                f"{type(self).__name__} needs a value loss (QMixerLoss, DQNLoss), got "
                f"{type(loss).__name__}"
            )
        self.loss = loss
        online: list[torch.Tensor] = []
        target: list[torch.Tensor] = []
        for o_net, t_net in loss.target_pairs():
            for (name, o), (_, t) in zip(
                o_net.state_dict(keep_vars=True).items(), t_net.state_dict(keep_vars=True).items()
            ):
                if o.shape != t.shape:  # pragma: no cover - the target is a deep copy
                    raise ValueError(f"target tensor {name!r} has shape {tuple(t.shape)}")
                if o.dtype.is_floating_point:
                    online.append(o.data)
                    target.append(t.data)
        if not online:
            raise ValueError(
                f"{type(self).__name__}: {type(loss).__name__} has no target networks; build it "
                "with delay_value=True"
            )
        self._online, self._target = online, target

    def init_(self) -> None:
        """Copy the online networks into the targets."""
        torch._foreach_copy_(self._target, self._online)

    def step(self) -> None:  # pragma: no cover - subclasses
        raise NotImplementedError


class SoftUpdate(TargetNetUpdater):
    """``target <- (1 - tau) target + tau online`` at every :meth:`step`.

    Args:
        loss: a value loss with target networks.
        tau: the step size, in ``(0, 1]``.

    Raises:
        ValueError: ``tau`` outside ``(0, 1]``; a loss without target networks.
    """

    def __init__(self, loss: ValueLoss, tau: float = 0.005):
        if not (math.isfinite(tau) and 0.0 < tau <= 1.0):
            raise ValueError(f"SoftUpdate: tau must lie in (0, 1], got {tau!r}")
        super().__init__(loss)
        self.tau = float(tau)

    @torch.no_grad()
    def step(self) -> None:
        """Move every target tensor a fraction ``tau`` towards its online tensor."""
        torch._foreach_lerp_(self._target, self._online, self.tau)


class HardUpdate(TargetNetUpdater):
    """Copy the online networks into the targets every ``value_network_update_interval`` calls
    of :meth:`step`.

    Args:
        loss: a value loss with target networks.
        value_network_update_interval: steps between copies (>= 1).

    Raises:
        ValueError: an interval < 1; a loss without target networks.
    """

    def __init__(self, loss: ValueLoss, value_network_update_interval: int = 1000):
        interval = value_network_update_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(
                f"HardUpdate: value_network_update_interval must be an int >= 1, got {interval!r}"
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
