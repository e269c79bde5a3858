"""Level-Based Foraging (``lbforaging``) as marlkit envs: ``marlkit.make("lbforaging/<id>")``.

The ids are LBF's Gymnasium ids (``Foraging-8x8-2p-2f-coop-v3``, ``Foraging-2s-10x10-3p-3f-v3``,
...); the env is :class:`~marlkit.adapters.gymma.GymmaEnv`, where the format, the reward options
and the time-limit rule (``done`` with food left is ``truncated``) are described.
"""

from __future__ import annotations

from typing import Any

from marlkit.adapters.gymma import GymmaEnv, build, kwargs_of, scenarios

__all__ = ["accepted_kwargs", "list_scenarios", "make_env"]

FAMILY = "lbforaging"


def make_env(scenario: str, **kwargs: Any) -> GymmaEnv:
    """``marlkit.make("lbforaging/<id>", ...)``; see :func:`marlkit.adapters.gymma.build`."""
    return build(FAMILY, scenario, **kwargs)


def list_scenarios() -> list[str]:
    """LBF's registered ids."""
    return scenarios(FAMILY)


def accepted_kwargs(scenario: str) -> list[str] | None:
    """The keywords ``marlkit.make(f"lbforaging/{scenario}")`` takes."""
    return kwargs_of(FAMILY, scenario)
