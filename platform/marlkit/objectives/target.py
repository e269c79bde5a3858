"""Target-network updaters: :class:`SoftUpdate` (Polyak averaging) and :class:`HardUpdate`
(a copy every ``value_network_update_interval`` steps), for losses built with
``delay_value=True``."""

from __future__ import annotations

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
        params: list[tuple[torch.Tensor, torch.Tensor]] = []
        buffers: list[tuple[nn.Module, nn.Module, str]] = []
        for o_net, t_net in loss.target_pairs():
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
                f"{type(self).__name__}: {type(loss).__name__} has no target networks; build it "
                "with delay_value=True"
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
        loss: a value loss with target networks.
        tau: the step size, in ``(0, 1]``.

    Raises:
        TypeError: ``tau`` is not a number.
        ValueError: ``tau`` outside ``(0, 1]``; a loss without target networks.
    """

    def __init__(self, loss: ValueLoss, tau: float = 0.005):
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
        loss: a value loss with target networks.
        value_network_update_interval: steps between copies (>= 1).

    Raises:
        ValueError: an interval < 1; a loss without target networks.
    """

    def __init__(self, loss: ValueLoss, value_network_update_interval: int = 1000):
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
