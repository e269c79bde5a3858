"""Multi-Robot Warehouse (``rware``) as marlkit envs: ``marlkit.make("rware/<id>")``.

The ids are RWARE's Gymnasium ids (``rware-tiny-2ag-v2``, ``rware-small-4ag-hard-v2``, ...); the
env is :class:`~marlkit.adapters.gymma.GymmaEnv`, where the format, the reward options and the
time-limit rule (``done`` is always ``truncated``) are described.
"""

from __future__ import annotations

from typing import Any

from marlkit.adapters.gymma import GymmaEnv, build, kwargs_of, scenarios

__all__ = ["accepted_kwargs", "list_scenarios", "make_env"]

FAMILY = "rware"


def make_env(scenario: str, **kwargs: Any) -> GymmaEnv:
    """``marlkit.make("rware/<id>", ...)``; see :func:`marlkit.adapters.gymma.build`."""
    return build(FAMILY, scenario, **kwargs)


def list_scenarios() -> list[str]:
    """RWARE's registered ids."""
    return scenarios(FAMILY)


def accepted_kwargs(scenario: str) -> list[str] | None:
    """The keywords ``marlkit.make(f"rware/{scenario}")`` takes."""
    return kwargs_of(FAMILY, scenario)
