"""MAgent2 grid battles as marlkit envs, through the PettingZoo parallel adapter.

``marlkit.make("magent2/battle_v4", map_size=16, num_envs=4, seed=0)`` builds ``num_envs``
instances of MAgent2's ``battle_v4.parallel_env`` (``pip install 'marlkit[magent2]'``) and
wraps them in :class:`~marlkit.adapters.pettingzoo.PettingZooEnv`: keys, masks of agents that
die, partial resets and output checks are the PettingZoo adapter's. What this module adds is
what MAgent2 needs:

* Groups by team (``group_map="by_type"``, the name before the last ``_``): ``red``/``blue``
  (battle), ``predator``/``prey`` (adversarial_pursuit), ``deer``/``tiger`` (tiger_deer),
  ``omnivore`` (gather), ``redmelee``/``redranged``/``bluemelee``/``blueranged``
  (combined_arms, whose melee and ranged units act differently).
* ``map_size``, the side of the square grid, which sets the number of agents (battle places
  ``0.04 * map_size**2`` per team): the knob a scaling sweep turns. MAgent2's own ``gather_v5``
  fixes it at 200; here ``map_size`` builds its env class with another size.
* Every keyword MAgent2 takes, reward and env arguments included (``attack_opponent_reward``,
  ``tiger_step_recover``), checked by name before any env is built.
* Seeds that differ per instance: MAgent2's engine draws from ``std::minstd_rand0``, for which
  seeds 0 and 1 are the same seed, so ``seed + i`` alone would make instances 0 and 1 of a batch
  seeded 0 play the same game. Instance ``i`` is reset with MAgent2 seed ``seed + i + 1``.

Observations are MAgent2's images ``[*B, n, view, view, channels]`` float32 (battle
``[13, 13, 5]``), as MAgent2 gives them; ``"state"`` is the whole map ``[*B, map_size,
map_size, channels]`` (``state=False`` skips it: MAgent2 observes every agent again to make it).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import types
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from marlkit._checks import check_int, check_kwargs, did_you_mean, keyword_names
from marlkit._utils import has_module, import_optional
from marlkit.adapters._dict_env import IllegalActions
from marlkit.adapters.pettingzoo import PettingZooEnv
from marlkit.data.group_map import GroupMapLike
from marlkit.envs.registry import UnknownEnvError

if TYPE_CHECKING:
    from marlkit.adapters._dict_writer import StepView

__all__ = ["MAgent2Env", "accepted_kwargs", "list_scenarios", "make_env"]

#: The registered tasks and the smallest ``map_size`` of each: MAgent2's own (its asserts), or
#: where every team has an agent (MAgent2 lets adversarial_pursuit have no predator below 9).
#: ``gather_v5``'s food pattern is 53 cells wide: smaller maps cut it at the edges.
TASKS: dict[str, int] = {
    "battle_v4": 12,
    "adversarial_pursuit_v4": 9,
    "gather_v5": 16,
    "tiger_deer_v4": 10,
    "combined_arms_v6": 16,
}
#: Constructor keywords that marlkit sets itself (``seed`` goes to every reset instead).
_OWN = ("render_mode", "seed")


def list_scenarios() -> list[str]:
    """The registered MAgent2 tasks, e.g. ``battle_v4`` (all of them when magent2 imports)."""
    return sorted(TASKS) if has_module("magent2") else []


def _module(scenario: str) -> ModuleType:
    """MAgent2's env module for ``scenario`` (``magent2.environments.battle_v4``)."""
    if scenario not in TASKS:
        hint = did_you_mean(scenario, TASKS, n=3, cutoff=0.6)
        raise UnknownEnvError(
            f"no MAgent2 task {scenario!r}.{hint} Registered: {', '.join(sorted(TASKS))}"
        )
    import_optional("magent2", extra="magent2", purpose="the MAgent2 adapter")
    return importlib.import_module(f"magent2.environments.{scenario}")


def _implementation(module: ModuleType) -> ModuleType:
    """The module that defines ``module.parallel_env`` (``magent2.environments.battle.battle``)."""
    return sys.modules[module.parallel_env.__module__]


def _constructor_kwargs(module: ModuleType) -> list[str]:
    """The keywords MAgent2's ``parallel_env`` takes, its reward and env arguments (passed as
    ``**reward_args``, named by the module's ``default_*_args``) included; ``map_size`` for
    every task."""
    names = keyword_names(module.parallel_env, skip=_OWN, partial=True) or []
    extra = [
        key
        for attr, value in vars(_implementation(module)).items()
        if attr.startswith("default_") and attr.endswith("_args") and isinstance(value, dict)
        for key in value
    ]
    return list(dict.fromkeys(["map_size", *names, *extra]))


def _options() -> list[str]:
    """The keywords :func:`make_env` takes itself."""
    return keyword_names(make_env, skip=("scenario", "map_size"), partial=True) or []


def accepted_kwargs(scenario: str) -> list[str]:
    """The keywords ``marlkit.make(f"magent2/{scenario}")`` takes: MAgent2's constructor's
    (``map_size``, ``max_cycles``, ``minimap_mode``, ``extra_features``, its reward
    arguments), then :func:`make_env`'s own.

    Raises:
        UnknownEnvError: not a registered task (a ``KeyError``).
    """
    return [*_constructor_kwargs(_module(scenario)), *_options()]


def _gather(kwargs: dict[str, Any]) -> Any:
    """``gather_v5`` at another ``map_size`` than its fixed 200: its env class built as its
    ``parallel_env`` builds it (MAgent2 0.3)."""
    gather = importlib.import_module("magent2.environments.gather.gather")
    kwargs = dict(kwargs)
    map_size = kwargs.pop("map_size")
    names = ("max_cycles", "minimap_mode", "extra_features", "render_mode", "seed")
    defaults = {
        name: p.default
        for name, p in inspect.signature(gather.parallel_env).parameters.items()
        if name in names
    }
    options = {name: kwargs.pop(name, defaults[name]) for name in names}
    return gather._parallel_env(
        map_size,
        options["minimap_mode"],
        {**gather.default_reward_args, **kwargs},
        options["max_cycles"],
        options["extra_features"],
        options["render_mode"],
        options["seed"],
    )


def _state(sim: Any) -> np.ndarray:
    """MAgent2's ``state()`` (the map ``[map_size, map_size, channels]``), also when a team has
    no agent left, where MAgent2's own fails (``zip(*[])`` of the team's empty positions)."""
    state = np.copy(sim.base_state)
    teams = len(sim.team_sizes)
    minimap = sim._minimap_features
    for handle in sim._all_handles:
        pos = sim.env.get_pos(handle)
        if len(pos) == 0:
            continue
        view, features = sim.env.get_observation(handle)
        pos_x, pos_y = pos[:, 0], pos[:, 1]
        state[pos_x, pos_y, 1 + handle.value * 2] = 1
        state[pos_x, pos_y, 2 + handle.value * 2] = view[
            :, view.shape[1] // 2, view.shape[2] // 2, 2
        ]
        if sim.extra_features:
            pad = state.shape[2] - (1 + teams * 2 + features.shape[1] - minimap)
            rewards = features[:, -1 - minimap].reshape(-1, 1)
            actions = features[:, : -1 - minimap]
            actions = np.concatenate((actions, np.zeros((features.shape[0], pad))), axis=1)
            state[pos_x, pos_y, 1 + teams * 2 :] = np.hstack((actions, rewards))
    return state


def _construct(build: Callable[..., Any], name: str, kwargs: dict[str, Any]) -> Any:
    try:
        sim = build(**kwargs)
    except AssertionError as err:  # MAgent2 checks map_size with assert
        raise ValueError(f"{name}: {err}") from err
    sim.state = types.MethodType(_state, sim)  # an instance attribute shadows the method
    return sim


class MAgent2Env(PettingZooEnv):
    """A batch of MAgent2 parallel envs: :class:`~marlkit.adapters.pettingzoo.PettingZooEnv`
    with instance ``i`` reset with MAgent2 seed ``seed + i + 1`` (MAgent2's generator,
    ``std::minstd_rand0``, takes 0 and 1 as the same seed)."""

    def _set_seed(self, seed: int) -> int:
        if seed + self.num_envs >= 2**31:  # MAgent2 takes a C int (it would wrap silently)
            raise ValueError(
                f"MAgent2 takes seeds below 2**31 - {self.num_envs} here (instance i gets "
                f"seed + i + 1, a C int), got {seed}"
            )
        return super()._set_seed(seed)

    def _reset_instance(self, index: int, seed: int | None) -> StepView:
        return super()._reset_instance(index, None if seed is None else seed + 1)


def make_env(
    scenario: str,
    *,
    map_size: int | None = None,
    num_envs: int = 1,
    group_map: GroupMapLike = "by_type",
    seed: int | None = None,
    state: bool = True,
    render_mode: str | None = None,
    illegal_actions: IllegalActions = "raise",
    device: str | torch.device = "cpu",
    validate_actions: bool = True,
    **env_kwargs: Any,
) -> MAgent2Env:
    """Build ``magent2/<scenario>``, one of :data:`TASKS`; ``env_kwargs`` go to MAgent2
    (``max_cycles``, ``minimap_mode``, ``extra_features``, reward arguments).

    Args:
        map_size: the side of the grid (MAgent2's default when ``None``: 45, gather 200); at
            least :data:`TASKS` ``[scenario]``.
        group_map: ``"by_type"`` (default: one group per team), or any group map.
        render_mode: ``"rgb_array"`` for ``env.render(i)`` frames (headless: SDL's dummy video
            driver is selected when ``SDL_VIDEODRIVER`` is unset).
        others: see :class:`~marlkit.adapters.pettingzoo.PettingZooEnv`.

    Raises:
        UnknownEnvError: not a registered task (a ``KeyError``).
        ValueError: ``map_size`` below the task's smallest.
        TypeError: a keyword neither this function nor MAgent2 takes (the message suggests the
            closest ones and lists them all).
    """
    module = _module(scenario)
    check_kwargs(f"env 'magent2/{scenario}'", env_kwargs, accepted_kwargs(scenario))
    if map_size is not None:
        smallest = TASKS[scenario]
        check_int("map_size", map_size, low=smallest)
        env_kwargs["map_size"] = map_size
    if render_mode is not None:
        if render_mode != "rgb_array":
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame draws without a display
        env_kwargs["render_mode"] = render_mode
    if scenario == "gather_v5" and "map_size" in env_kwargs:
        build: Callable[..., Any] = functools.partial(_gather, env_kwargs)
        factory = functools.partial(_construct, build, f"magent2/{scenario}", {})
    else:
        factory = functools.partial(
            _construct, module.parallel_env, f"magent2/{scenario}", env_kwargs
        )
    return MAgent2Env(
        factory,
        num_envs=num_envs,
        api="parallel",
        group_map=group_map,
        illegal_actions=illegal_actions,
        seed=seed,
        state=state,
        device=device,
        validate_actions=validate_actions,
    )
