"""Gradient steps of a loss module on samples of a replay buffer: the inner loop every training
script shares (PPO's epochs of minibatches, the off-policy scripts' updates with a target
network moved after each step), and the per-group optimisers and target updates around it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from tensordict import TensorDictBase

from marlkit._checks import check_int, check_real
from marlkit.objectives import HardUpdate, SoftUpdate, TargetNetUpdater
from marlkit.replay import GroupReplayBuffers
from marlkit.train.precision import autocast_scope

__all__ = [
    "adam_per_group",
    "gradient_step_terms",
    "gradient_steps",
    "resume_target_updates",
    "soft_updates",
    "target_updates",
    "update_groups",
]

#: Per-group loss modules: a dict or a ``torch.nn.ModuleDict`` (what a checkpoint tracks).
Losses = Mapping[str, torch.nn.Module] | torch.nn.ModuleDict


def _total(terms: TensorDictBase) -> torch.Tensor:
    return terms["loss"]


def gradient_step_terms(
    loss: Callable[[TensorDictBase], TensorDictBase],
    optim: torch.optim.Optimizer,
    sample: Callable[[], TensorDictBase],
    steps: int,
    *,
    clip: Callable[[list[torch.Tensor]], torch.Tensor],
    objective: Callable[[TensorDictBase], torch.Tensor] = _total,
    after_step: Callable[[], Any] | None = None,
    report: Literal["last", "mean"] = "last",
) -> dict[str, torch.Tensor]:
    """The loop of :func:`gradient_steps` and of a stack of seeds'
    (:func:`~marlkit.train.seeds.seed_gradient_steps`): ``steps`` times, ``loss(sample())``,
    back-propagate the sum of ``objective`` of its terms (a scalar; or one per seed, whose sum
    gives each seed the gradient of its own), ``clip(params)`` the gradients (it returns their
    norm before clipping: a scalar, or one per seed), step ``optim``, call ``after_step``.

    Returns:
        the terms shaped as the norm (a per-sample ``td_error`` left out) and ``"grad_norm"``,
        as float64 tensors: the last step's, or their ``"mean"`` over the steps.

    Raises:
        ValueError: ``steps`` below 1, an unknown ``report``.
    """
    steps = check_int("steps", steps, low=1)
    if report not in ("last", "mean"):
        raise ValueError(f"report must be 'last' or 'mean', got {report!r}")
    params = [p for group in optim.param_groups for p in group["params"]]
    sums: dict[str, torch.Tensor] = {}
    for _ in range(steps):
        with autocast_scope():  # the networks set_precision hooked run in bf16 here, only here
            terms = loss(sample())
        optim.zero_grad()
        objective(terms).sum().backward()  # the sum: a scalar's own, or over the seeds
        grad_norm = clip(params)
        optim.step()
        if after_step is not None:
            after_step()
        if report == "mean":
            for name, value in _reported(terms, grad_norm).items():
                sums[name] = sums[name] + value if name in sums else value
    if report == "mean":
        return {name: total / steps for name, total in sums.items()}
    return _reported(terms, grad_norm)


def gradient_steps(
    loss: Callable[[TensorDictBase], TensorDictBase],
    optim: torch.optim.Optimizer,
    sample: Callable[[], TensorDictBase],
    steps: int,
    *,
    max_grad_norm: float,
    objective: Callable[[TensorDictBase], torch.Tensor] = _total,
    after_step: Callable[[], Any] | None = None,
    report: Literal["last", "mean"] = "last",
    clip_per_param_group: bool = False,
) -> dict[str, float]:
    """``steps`` optimiser steps: each computes ``loss(sample())``, back-propagates
    ``objective`` of its terms (default: the ``"loss"`` entry), clips the gradient norm of the
    optimiser's parameters to ``max_grad_norm``, steps ``optim`` and calls ``after_step`` (a
    target update, say). The loop is :func:`gradient_step_terms`.

    Args:
        loss: a loss module (or ``torch.compile`` of one) returning its terms as a TensorDict.
        optim: the optimiser of the loss's trainable parameters.
        sample: the next minibatch (``buffer.sample``).
        steps: how many steps.
        max_grad_norm: the clipping norm.
        objective: what is minimised, from the terms (PPO: the objective, critic and entropy
            losses summed).
        after_step: called after every optimiser step.
        report: the terms of the ``"last"`` step, or their ``"mean"`` over the steps.
        clip_per_param_group: clip each of ``optim``'s parameter groups to ``max_grad_norm``
            on its own (an actor's and a critic's, as separate optimisers with their own
            clipping do: JaxMARL's and EPyMARL's PPO), not all of them together.

    Returns:
        the scalar terms (a ``td_error`` or other per-sample entry left out) and
        ``"grad_norm"`` (the norm of every gradient before clipping), as floats.

    Raises:
        ValueError: ``steps`` below 1, ``max_grad_norm`` not positive, an unknown ``report``.
    """
    max_grad_norm = check_real("max_grad_norm", max_grad_norm, low=0.0)

    def clip(params: list[torch.Tensor]) -> torch.Tensor:
        if not clip_per_param_group:
            return torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        norms = [
            torch.nn.utils.clip_grad_norm_(group["params"], max_grad_norm)
            for group in optim.param_groups
        ]
        return torch.stack(norms).square().sum().sqrt()  # the norm of them all, unclipped

    terms = gradient_step_terms(
        loss,
        optim,
        sample,
        steps,
        clip=clip,
        objective=objective,
        after_step=after_step,
        report=report,
    )
    return {name: value.item() for name, value in terms.items()}


def _reported(terms: TensorDictBase, grad_norm: torch.Tensor) -> dict[str, torch.Tensor]:
    """The terms of one value each (one per seed in a stack: shaped as ``grad_norm``) and
    ``grad_norm``, detached, in float64."""
    out = {
        name: value.detach().double()
        for name, value in terms.items()
        # a per-sample td_error is left out, even of a sample of one
        if isinstance(value, torch.Tensor)
        and name != "td_error"
        and (value.shape == grad_norm.shape or (grad_norm.dim() == 0 and value.numel() == 1))
    }
    out["grad_norm"] = grad_norm.detach().double()
    return out


def adam_per_group(losses: Losses, lr: float, eps: float = 1e-8) -> dict[str, torch.optim.Adam]:
    """One (fused) Adam per group, over what its loss trains: ``online_parameters()`` where the
    loss has target networks (an updater moves those, not the optimiser), else all of its
    parameters; ``eps`` is Adam's (``train.adam_eps``)."""
    return {
        group: torch.optim.Adam(
            getattr(loss, "online_parameters", loss.parameters)(), lr=lr, eps=eps, fused=True
        )
        for group, loss in losses.items()
    }


def soft_updates(losses: Losses, tau: float) -> dict[str, SoftUpdate]:
    """Per group, the :class:`~marlkit.objectives.SoftUpdate` of its loss's target networks
    (``target <- (1 - tau) target + tau online``, at each ``.step()``)."""
    return {group: SoftUpdate(loss, tau=tau) for group, loss in losses.items()}  # type: ignore[arg-type]


def target_updates(
    losses: Losses, tau: float, hard_interval: int = 0
) -> dict[str, TargetNetUpdater]:
    """Per group, its loss's target-network update at each ``.step()`` (one per gradient
    step): :func:`soft_updates` with ``tau`` where ``hard_interval`` is 0, else a
    :class:`~marlkit.objectives.HardUpdate` copying the online networks every
    ``hard_interval`` gradient steps (PyMARL's and EPyMARL's ``target_update_interval``).

    Raises:
        ValueError: ``hard_interval`` below 0.
    """
    interval = check_int("loss.hard_update_interval", hard_interval, low=0)
    if interval == 0:
        return dict(soft_updates(losses, tau))
    return {
        group: HardUpdate(loss, value_network_update_interval=interval)  # type: ignore[arg-type]
        for group, loss in losses.items()
    }


def resume_target_updates(updaters: Mapping[str, TargetNetUpdater], steps_done: int) -> None:
    """Set each hard update's step count to ``steps_done``, the gradient steps a resumed run
    has taken (its iterations times the steps of one), so that its copies fall on the steps
    where the run alone would have made them; soft updates keep no count."""
    for updater in updaters.values():
        if isinstance(updater, HardUpdate):
            updater.counter = steps_done


def update_groups(
    losses: Losses,
    optims: Mapping[str, torch.optim.Optimizer],
    buffers: GroupReplayBuffers,
    steps: int,
    *,
    max_grad_norm: float,
    objective: Callable[[TensorDictBase], torch.Tensor] = _total,
    updaters: Mapping[str, TargetNetUpdater] | None = None,
    report: Literal["last", "mean"] = "last",
    clip_per_param_group: bool = False,
) -> dict[str, float]:
    """:func:`gradient_steps` of each group's loss on samples of its own buffer, the group's
    target update (``updaters[group].step``) after each of its steps (``clip_per_param_group``:
    each of an optimiser's parameter groups clipped on its own).

    Returns:
        ``{"train/<group>/<term>": value}`` for every group, in the groups' order.
    """
    metrics: dict[str, float] = {}
    for group, loss in losses.items():
        terms = gradient_steps(
            loss,
            optims[group],
            buffers[group].sample,
            steps,
            max_grad_norm=max_grad_norm,
            objective=objective,
            after_step=None if updaters is None else updaters[group].step,
            report=report,
            clip_per_param_group=clip_per_param_group,
        )
        metrics.update({f"train/{group}/{name}": value for name, value in terms.items()})
    return metrics
