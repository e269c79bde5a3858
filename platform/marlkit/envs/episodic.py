"""``make_episodic``: a registered env ready for training, its episodes cut and summed."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from marlkit._utils import check_int
from marlkit.envs.registry import make
from marlkit.envs.transforms import Compose, RewardSum, StepCounter, TransformedEnv

__all__ = ["make_episodic"]


def make_episodic(
    name: str,
    *,
    num_envs: int,
    max_steps: int,
    seed: int | None = None,
    imports: Sequence[str] = (),
    **kwargs: Any,
) -> TransformedEnv:
    """``marlkit.make(name, num_envs=, seed=, **kwargs)`` with episodes cut at ``max_steps``
    (:class:`StepCounter`) and each group's rewards summed over the episode
    (:class:`RewardSum`, ``("next", group, "episode_reward")``), as training loops and
    :func:`marlkit.record.episode_metrics` want it.

    A ``functools.partial`` of it pickles by reference, so it is the env factory to hand to
    multiprocess and Ray collectors.

    Args:
        name: a registered env (``marlkit list``).
        num_envs: the env batch.
        max_steps: episode length limit.
        seed: the env's seed.
        imports: modules to import first: modules that register envs (your own adapter), so
            that a worker process that builds the env knows its name.
        **kwargs: the env's own keyword arguments.

    Raises:
        ModuleNotFoundError: a module of ``imports`` is not importable.
        UnknownEnvError: ``name`` is not registered.
    """
    check_int("max_steps", max_steps, low=1)
    if isinstance(imports, str):
        raise TypeError(f"imports must be a sequence of module names, got the str {imports!r}")
    for module in imports:
        importlib.import_module(module)
    env = make(name, num_envs=num_envs, seed=seed, **kwargs)
    return TransformedEnv(env, Compose(StepCounter(max_steps), RewardSum()))
