"""One benchmark cell: build a backend's env, time its steps, within a wall-clock budget.

A *cell* is one ``(backend, envs, agents)`` point of a sweep. Backends:

- ``"native"``: the marlkit scenario on its C++ kernels, through the whole env API as a rollout
  does (``EnvBase.step`` with action validation off, then ``step_mdp``);
- ``"torch"``: the same scenario on its torch twin (same path, ``backend="torch"``);
- ``"vmas"``: the peer, VMAS's scenario of the same name with its defaults, stepped raw
  (``vmas.make_env`` and a list of per-agent action tensors ``[envs, act_dim]``).

What the native and torch sides compute is the cell's *work* (:mod:`marlkit.bench.work`):
``"lidar"`` (the default) is VMAS's work, its 12-ray LiDAR included; ``"knn"`` is native
navigation's own defaults, different work. Every cell's ``info["work"]`` describes what its side
computed (sensor and rays, radius, substeps, world bounds, observation size, ...).

Every step draws fresh uniform actions in ``[-1, 1]``. :func:`measure_cell` times the
construction (``make`` + ``reset``) and a first *probe* step, estimates what the whole cell
would cost and skips it, with the reason, when that exceeds the budget; otherwise it runs the
remaining warm-up steps and times steps until both ``min_steps`` and ``min_seconds`` are reached
(never running past the budget once ``min_steps`` are done).

Examples:
    >>> from marlkit.bench.cells import CellSpec, TimingSettings, measure_cell
    >>> result = measure_cell(CellSpec("native", "navigation", envs=8, agents=4),
    ...                       TimingSettings(min_seconds=0.0, min_steps=2, warmup=1))
    >>> result.status, result.steps
    ('ok', 2)
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

import marlkit
from marlkit._checks import check_int, check_one_of, check_real
from marlkit._utils import import_optional
from marlkit.bench.rounds import time_steps
from marlkit.bench.work import (
    DEFAULT_WORK,
    WORKS,
    native_kwargs,
    native_work,
    vmas_spawning,
    vmas_work,
)
from marlkit.data import step_mdp

__all__ = [
    "BACKENDS",
    "SCENARIOS",
    "Backend",
    "CellResult",
    "CellSpec",
    "Stepper",
    "TimingSettings",
    "make_stepper",
    "measure_cell",
    "probe_and_time",
    "vmas_spawning",
]

Backend = Literal["native", "torch", "vmas"]
#: Every backend a cell can run, in the order tables and plots list them.
BACKENDS: tuple[str, ...] = ("native", "torch", "vmas")
#: Scenarios the harness knows: marlkit's registered name -> VMAS's scenario of the same task.
SCENARIOS: dict[str, str] = {"navigation": "navigation"}

#: Called with a phase name and its figures (the subprocess worker reports them as it goes).
PhaseCallback = Callable[..., None]


@dataclass(frozen=True)
class CellSpec:
    """Which cell to measure.

    Attributes:
        backend: ``"native"``, ``"torch"`` or ``"vmas"``.
        scenario: a key of :data:`SCENARIOS`.
        envs: environments stepped together (the batch).
        agents: agents per environment.
        seed: seed of the env and of the random actions.
        work: what the native and torch sides compute, one of
            :data:`~marlkit.bench.work.WORKS` (VMAS always runs its defaults).
    """

    backend: str
    scenario: str
    envs: int
    agents: int
    seed: int = 0
    work: str = DEFAULT_WORK

    def __post_init__(self) -> None:
        check_one_of("backend", self.backend, list(BACKENDS))
        check_one_of("scenario", self.scenario, sorted(SCENARIOS))
        for name in ("envs", "agents"):
            check_int(name, getattr(self, name), low=1)
        check_one_of("work", self.work, list(WORKS))


@dataclass(frozen=True)
class TimingSettings:
    """How long to time a cell.

    Attributes:
        min_seconds: time steps for at least this long (seconds).
        min_steps: and at least this many steps.
        warmup: untimed steps first, the probe step included (at least 1).
        budget_s: wall-clock budget of the whole cell (construction, warm-up and timed steps);
            a cell whose estimate exceeds it is skipped. ``math.inf``: no budget.
    """

    min_seconds: float = 2.0
    min_steps: int = 3
    warmup: int = 1
    budget_s: float = 60.0

    def __post_init__(self) -> None:
        check_real("min_seconds", self.min_seconds, strict=False)
        check_int("min_steps", self.min_steps, low=1)
        check_int("warmup", self.warmup, low=1)  # the probe step at least
        check_real("budget_s", self.budget_s, finite=False)


@dataclass
class CellResult:
    """What one cell measured, or why it was skipped.

    Attributes:
        backend, scenario, envs, agents: the cell.
        status: ``"ok"`` (measured), ``"skipped"`` (over the budget, killed, or not run because a
            smaller cell of the same backend was already over it) or ``"failed"`` (an error).
        reason: why it was skipped or failed; ``None`` when ``"ok"``.
        setup_s: construction and reset, in seconds (``None`` when never completed).
        first_step_s: the probe step, in seconds (``None`` when never completed).
        steps, seconds: timed steps and their wall time.
        steps_per_s, env_steps_per_s, agent_steps_per_s: throughput (``None`` unless ``"ok"``).
        estimated_agent_steps_per_s: for a skipped cell whose probe step ran, the throughput that
            one step suggests (an upper bound: first steps are the slowest); else ``None``.
        info: backend facts (the kernel backend used, VMAS's spawning half-width, ...) and
            ``"work"``: what this side computed (see :mod:`marlkit.bench.work`).
    """

    backend: str
    scenario: str
    envs: int
    agents: int
    status: Literal["ok", "skipped", "failed"] = "ok"
    reason: str | None = None
    setup_s: float | None = None
    first_step_s: float | None = None
    steps: int = 0
    seconds: float = 0.0
    steps_per_s: float | None = None
    env_steps_per_s: float | None = None
    agent_steps_per_s: float | None = None
    estimated_agent_steps_per_s: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_spec(cls, spec: CellSpec, **fields: Any) -> CellResult:
        """A result for ``spec`` with the given fields set."""
        return cls(spec.backend, spec.scenario, spec.envs, spec.agents, **fields)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CellResult:
        """Inverse of :meth:`to_dict`; unknown keys raise ``KeyError`` naming them."""
        unknown = set(data) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise KeyError(f"unknown CellResult fields {sorted(unknown)}")
        return cls(**data)


@dataclass
class Stepper:
    """A built env, ready to step: ``step()`` draws fresh actions and advances the batch."""

    step: Callable[[], None]
    close: Callable[[], None]
    info: dict[str, Any] = field(default_factory=dict)
    env: Any = None  # the env stepped (marlkit's EnvBase or VMAS's Environment), for diagnostics


def _native_stepper(spec: CellSpec) -> Stepper:
    env = marlkit.make(
        spec.scenario,
        num_envs=spec.envs,
        n_agents=spec.agents,
        seed=spec.seed,
        backend=spec.backend,
        **native_kwargs(spec.work, spec.agents),
    )
    env.validate_actions = False
    group_actions = [(key, env.action_spec[key].shape) for key in env.action_keys]
    keys: dict[str, Any] = {
        "action_keys": env.action_keys,
        "reward_keys": env.reward_keys,
        "done_keys": env.done_keys,
    }
    gen = torch.Generator().manual_seed(spec.seed)
    state = {"td": env.reset()}

    def step() -> None:
        td = state["td"]
        for key, shape in group_actions:
            td.set(key, torch.rand(shape, generator=gen) * 2 - 1)
        state["td"] = step_mdp(env.step(td), **keys)

    info = {"kernel": getattr(env, "backend", spec.backend), "work": native_work(env, spec.work)}
    return Stepper(step=step, close=env.close, info=info, env=env)


def _vmas_stepper(spec: CellSpec) -> Stepper:
    with warnings.catch_warnings():  # VMAS imports the retired gym, which warns
        warnings.simplefilter("ignore")
        vmas = import_optional("vmas", extra="bench", purpose="the VMAS side of the benchmark")
        spawn = vmas_spawning(spec.agents)
        env = vmas.make_env(
            SCENARIOS[spec.scenario],
            num_envs=spec.envs,
            device="cpu",
            continuous_actions=True,
            n_agents=spec.agents,
            seed=spec.seed,
            world_spawning_x=spawn,
            world_spawning_y=spawn,
        )
        env.reset()
    gen = torch.Generator().manual_seed(spec.seed)
    envs, agents = spec.envs, spec.agents

    def step() -> None:
        env.step([torch.rand(envs, 2, generator=gen) * 2 - 1 for _ in range(agents)])

    info = {
        "world_spawning": spawn,
        "vmas": getattr(vmas, "__version__", "unknown"),
        "work": vmas_work(env, spawn),
    }
    return Stepper(step=step, close=lambda: None, info=info, env=env)


def make_stepper(spec: CellSpec) -> Stepper:
    """Build (and reset) the env of ``spec``; see the module docstring for what a step does."""
    if spec.backend == "vmas":
        return _vmas_stepper(spec)
    return _native_stepper(spec)


def measure_cell(
    spec: CellSpec, settings: TimingSettings, on_phase: PhaseCallback | None = None
) -> CellResult:
    """Measure one cell in this process (see the module docstring).

    Args:
        spec: the cell.
        settings: timing and budget.
        on_phase: called as ``on_phase("constructing")``, ``on_phase("constructed",
            setup_s=...)``, ``on_phase("probed", first_step_s=...)`` and ``on_phase("timing")``,
            so that a supervising process knows where a killed cell was.

    Returns:
        A :class:`CellResult` with status ``"ok"`` or ``"skipped"`` (errors propagate).
    """
    report = on_phase or (lambda phase, **_: None)
    start = time.perf_counter()
    report("constructing")
    stepper = make_stepper(spec)
    try:
        setup_s = time.perf_counter() - start
        report("constructed", setup_s=setup_s)
        result = CellResult.for_spec(spec, setup_s=setup_s, info=dict(stepper.info))
        return probe_and_time(
            result,
            stepper.step,
            envs=spec.envs,
            agents=spec.agents,
            setup_s=setup_s,
            start=start,
            settings=settings,
            report=report,
        )
    finally:
        stepper.close()


def probe_and_time(
    result: Any,
    step: Callable[[], None],
    *,
    envs: int,
    agents: int,
    setup_s: float,
    start: float,
    settings: TimingSettings,
    report: PhaseCallback,
) -> Any:
    """The part of a cell after construction, shared by the navigation and any-env sweeps.

    Skips the cell (``result.status = "skipped"`` with the reason) when construction already
    took the budget or the first step's time says the timed steps would exceed it; otherwise times
    ``step`` with :func:`~marlkit.bench.rounds.time_steps` up to the budget's deadline and fills
    ``result``'s rates (``envs`` environments of ``agents`` agents each call). Returns ``result``.
    """
    budget = settings.budget_s
    if setup_s > budget:
        result.status = "skipped"
        result.reason = f"construction took {setup_s:.2g} s, over the {budget:g} s budget"
        return result
    probe = time.perf_counter()
    step()
    first = time.perf_counter() - probe
    result.first_step_s = first
    report("probed", first_step_s=first)
    estimate = setup_s + first * (settings.warmup + settings.min_steps)
    if estimate > budget:
        result.status = "skipped"
        result.estimated_agent_steps_per_s = envs * agents / first
        result.reason = (
            f"estimated {estimate:.1f} s (construction {setup_s:.1f} s + "
            f"{settings.warmup + settings.min_steps - 1} more steps of ~{first:.2f} s) "
            f"exceeds the {budget:g} s budget"
        )
        return result
    report("timing")
    timing = time_steps(
        step,
        min_seconds=settings.min_seconds,
        min_steps=settings.min_steps,
        warmup=settings.warmup - 1,
        deadline=start + budget,
    )
    result.steps = int(timing["steps"])
    result.seconds = timing["seconds"]
    result.steps_per_s = timing["steps_per_s"]
    result.env_steps_per_s = timing["steps_per_s"] * envs
    result.agent_steps_per_s = timing["steps_per_s"] * envs * agents
    return result
