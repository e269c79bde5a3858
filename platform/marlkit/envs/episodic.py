"""``make_episodic``: a registered env ready for training, its episodes cut and summed."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Literal

from marlkit._checks import check_int
from marlkit.data import Binary, Bounded, Categorical, MultiCategorical, OneHot
from marlkit.envs.common import EnvBase
from marlkit.envs.registry import accepted_kwargs, make
from marlkit.envs.transforms import Compose, RewardSum, StepCounter, Transform, TransformedEnv

ActionKind = Literal["discrete", "continuous"]
#: The kwarg of the envs that offer both kinds of actions (native scenarios, VMAS, MPE).
_OPTION = "continuous_actions"

__all__ = ["make_episodic"]


def make_episodic(
    name: str,
    *,
    num_envs: int,
    max_steps: int,
    seed: int | None = None,
    imports: Sequence[str] = (),
    actions: ActionKind | None = None,
    transforms: Sequence[Transform] = (),
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
        actions: the kind of actions the caller needs (``"discrete"`` or ``"continuous"``;
            ``None``: either). An env with a ``continuous_actions`` option (native scenarios,
            VMAS, MPE) is asked for that kind unless ``kwargs`` set the option; every group's
            action spec is then checked (discrete: ``Categorical``, ``OneHot``,
            ``MultiCategorical`` or ``Binary``; continuous: ``Bounded``, actions with bounds).
        transforms: transforms on the env's outputs before the step counter and the episode
            sums (a reward transform such as :class:`~marlkit.envs.transforms.CommonReward`,
            so that ``episode_reward`` sums the rewards it gives).
        **kwargs: the env's own keyword arguments.

    Raises:
        ModuleNotFoundError: a module of ``imports`` is not importable.
        UnknownEnvError: ``name`` is not registered.
        ValueError: ``actions`` is not a kind of actions, or a group's actions are of the other
            kind (the message says whether the env has the option).

    Examples:
        >>> from marlkit.envs import make_episodic
        >>> env = make_episodic("navigation", num_envs=2, max_steps=10, actions="discrete")
        >>> type(env.action_spec["agents", "action"]).__name__
        'Categorical'
    """
    check_int("max_steps", max_steps, low=1)
    if actions is not None and actions not in ("discrete", "continuous"):
        raise ValueError(f"actions must be 'discrete', 'continuous' or None, got {actions!r}")
    if isinstance(imports, str):
        raise TypeError(f"imports must be a sequence of module names, got the str {imports!r}")
    for module in imports:
        importlib.import_module(module)
    option = actions is not None and _OPTION in (accepted_kwargs(name) or ())
    if option and _OPTION not in kwargs:
        kwargs[_OPTION] = actions == "continuous"
    env = make(name, num_envs=num_envs, seed=seed, **kwargs)
    if actions is not None:
        _check_actions(env, name, actions, kwargs.get(_OPTION) if option else None)
    return TransformedEnv(env, Compose(*transforms, StepCounter(max_steps), RewardSum()))


def _check_actions(env: EnvBase, name: str, actions: ActionKind, option: bool | None) -> None:
    """Raise unless every group of ``env`` has ``actions`` (``option``: the env's
    ``continuous_actions`` setting, ``None`` when it has no such option)."""
    kinds = (
        (Bounded,) if actions == "continuous" else (Categorical, OneHot, MultiCategorical, Binary)
    )
    for group in env.groups:
        spec = env.action_spec[group, "action"]
        if isinstance(spec, kinds):
            continue
        env.close()
        message = (
            f"{actions} actions are needed, but group {group!r} of env {name!r} has "
            f"{type(spec).__name__} actions"
        )
        if option is None:
            other = "continuous" if actions == "discrete" else "discrete"
            raise ValueError(
                f"{message}, and the env has no {_OPTION} option: train it with an algorithm "
                f"for {other} actions, or pick an env with {actions} ones"
            )
        raise ValueError(
            f"{message} ({_OPTION}={option} in its keyword arguments): set "
            f"{_OPTION}={actions == 'continuous'} or leave it out"
        )
