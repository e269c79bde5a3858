"""The env registry: ``make(name, **kwargs)``, ``register(name, factory)``, ``list_envs()``,
and adapter families: ``register_adapter("vmas", factory)`` makes ``make("vmas/balance")`` call
``factory("balance", **kwargs)``.

Built-in scenarios and adapters register themselves when their package is imported; the
registry imports them lazily on first use, then loads third-party packages that declare the
entry-point groups ``marlkit.adapters`` or ``marlkit.envs`` (each entry point is a module to
import, or a callable that is called with no arguments and registers what it provides), once
per process, at the first use of the registry (not at ``import marlkit``); a plug-in that fails
to load is logged as a warning, never raised. docs/adapters.md ("Registering a simulator from
your own package") shows a package's ``[project.entry-points."marlkit.envs"]``.
An adapter whose simulator is not installed stays listed, as unavailable, with the pip command
that fixes it; registering one never imports its simulator.

Keyword arguments an env does not take are refused with a ``TypeError`` that names the env,
suggests the closest accepted names and lists them all: ``make`` reads a registered factory's
signature (a factory taking ``**kwargs`` checks its own), and each adapter family checks the
options of its scenarios. :func:`accepted_kwargs` tells which keywords an env takes, and
:func:`agent_count_kwarg` which of them sets its number of agents (``marlkit run --agents``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from marlkit._checks import check_kwargs, did_you_mean, keyword_names
from marlkit._utils import get_logger, has_module
from marlkit.envs.common import EnvBase

__all__ = [
    "AGENT_COUNT_KWARGS",
    "AdapterEntry",
    "AdapterUnavailableError",
    "EnvEntry",
    "UnknownEnvError",
    "accepted_kwargs",
    "agent_count_kwarg",
    "list_envs",
    "make",
    "register",
    "register_adapter",
    "registered",
    "registered_adapters",
]

ENTRY_POINT_GROUPS = ("marlkit.adapters", "marlkit.envs")
# Imported by name (not statically), so the core never depends on the packages above it.
_BUILTIN_MODULES = ("marlkit.scenarios", "marlkit.adapters")

_log = get_logger("registry")

#: Keyword arguments that set an env's number of agents, in the order they are looked for: marlkit's
#: and VMAS's ``n_agents``, ``num_agents``, MPE's ``N`` (simple_spread; simple_adversary's ``N``
#: counts the good agents, its adversary comes on top), PettingZoo's ``num_players`` (card games),
#: ``n_pistons`` (pistonball) and ``n_walkers`` (multiwalker).
AGENT_COUNT_KWARGS = ("n_agents", "num_agents", "N", "num_players", "n_pistons", "n_walkers")
_COUNT_LIKE = re.compile(r"^(n|num)_\w+$")
#: Counts that are marlkit's options, not the env's agents.
_NOT_AGENT_COUNTS = (
    "num_envs",
    "num_threads",
    "num_actions",  # PettingZoo's rps_v2
    "n_actions",
    "num_steps",
    "n_steps",
)


@dataclass(frozen=True)
class EnvEntry:
    """A registered env: its factory, a one-line description and who registered it."""

    name: str
    factory: Callable[..., EnvBase]
    description: str = ""
    source: str = ""


@dataclass(frozen=True)
class AdapterEntry:
    """A family of envs behind one simulator: ``make(f"{name}/{scenario}", **kwargs)`` calls
    ``factory(scenario, **kwargs)``."""

    name: str
    factory: Callable[..., EnvBase]
    description: str = ""
    requires: tuple[str, ...] = ()
    extra: str | None = None
    scenarios: Callable[[], Iterable[str]] | None = field(default=None, compare=False)
    source: str = ""
    accepted_kwargs: Callable[[str], Sequence[str] | None] | None = field(
        default=None, compare=False
    )

    @property
    def missing(self) -> list[str]:
        """Required modules that cannot be imported."""
        return [m for m in self.requires if not has_module(m)]

    @property
    def available(self) -> bool:
        return not self.missing

    @property
    def install_hint(self) -> str:
        """The pip command that makes this adapter available."""
        if self.extra:
            return f"pip install 'marlkit[{self.extra}]'"
        return "pip install " + " ".join(self.missing or self.requires)

    def list_scenarios(self) -> list[str]:
        """Scenario names this adapter knows (empty when unavailable or not enumerable)."""
        if self.scenarios is None or not self.available:
            return []
        try:
            return sorted(self.scenarios())
        except Exception as err:  # listing is informative; a broken lister must not break list
            _log.warning("adapter %r could not list its scenarios: %s", self.name, err)
            return []


class UnknownEnvError(KeyError):
    """No env is registered under the requested name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class AdapterUnavailableError(ImportError):
    """The adapter's simulator package is not installed; the message says what to install."""


_REGISTRY: dict[str, EnvEntry] = {}
_ADAPTERS: dict[str, AdapterEntry] = {}
_loaded = False


def register(
    name: str,
    factory: Callable[..., EnvBase],
    *,
    description: str = "",
    override: bool = False,
) -> None:
    """Register ``factory`` under ``name`` so that ``marlkit.make(name, **kwargs)`` builds it.

    Raises:
        ValueError: ``name`` is empty or already registered (and ``override`` is False).
        TypeError: ``factory`` is not callable.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"an env name must be a non-empty str, got {name!r}")
    if "/" in name:
        raise ValueError(
            f"env names cannot contain '/', which separates an adapter from its scenario "
            f"({name!r}); use register_adapter for a family of envs"
        )
    if not callable(factory):
        raise TypeError(f"the factory for {name!r} must be callable, got {type(factory).__name__}")
    # Load the built-ins and plug-ins first: a name taken by one of them is caught now, not by
    # a later make() whose lazy load would then fail (or silently replace this entry).
    _load_plugins()
    if name in _REGISTRY and not override:
        raise ValueError(
            f"an env named {name!r} is already registered (by {_REGISTRY[name].source}); pass "
            "override=True to replace it"
        )
    source = getattr(factory, "__module__", "") or ""
    _REGISTRY[name] = EnvEntry(name, factory, description, source)


def register_adapter(
    name: str,
    factory: Callable[..., EnvBase],
    *,
    description: str = "",
    requires: Sequence[str] = (),
    extra: str | None = None,
    scenarios: Callable[[], Iterable[str]] | None = None,
    accepted_kwargs: Callable[[str], Sequence[str] | None] | None = None,
    override: bool = False,
) -> None:
    """Register a family of envs: ``marlkit.make(f"{name}/{scenario}", **kw)`` then calls
    ``factory(scenario, **kw)``, which refuses keywords it does not take.

    Args:
        name: the family, e.g. ``"vmas"`` (no ``/``).
        factory: ``factory(scenario: str, **kwargs) -> EnvBase``; it may import the simulator.
        description: one line for ``marlkit list``.
        requires: modules the simulator needs; when one is missing the adapter is listed as
            unavailable and ``make`` raises :class:`AdapterUnavailableError`.
        extra: the marlkit pip extra that installs ``requires`` (for the message).
        scenarios: a callable listing known scenario names (called lazily, by ``marlkit list``).
        accepted_kwargs: ``accepted_kwargs(scenario)`` lists the keywords ``factory(scenario,
            ...)`` takes (``None`` when it cannot tell); read by :func:`accepted_kwargs`.
        override: replace an existing registration.
    """
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise ValueError(f"an adapter name must be a non-empty str without '/', got {name!r}")
    if not callable(factory):
        raise TypeError(f"the factory for {name!r} must be callable, got {type(factory).__name__}")
    _load_plugins()
    if name in _ADAPTERS and not override:
        raise ValueError(
            f"an adapter named {name!r} is already registered (by {_ADAPTERS[name].source}); "
            "pass override=True to replace it"
        )
    source = getattr(factory, "__module__", "") or ""
    _ADAPTERS[name] = AdapterEntry(
        name, factory, description, tuple(requires), extra, scenarios, source, accepted_kwargs
    )


def _load_plugins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    for group in ENTRY_POINT_GROUPS:
        for ep in importlib.metadata.entry_points(group=group):
            try:
                target: Any = ep.load()
                if callable(target):
                    target()
            except Exception as err:  # a broken plug-in must not break the built-in envs
                _log.warning("could not load marlkit plug-in %r (%s): %s", ep.name, ep.value, err)


def registered() -> dict[str, EnvEntry]:
    """Every registered env, by name (plug-ins loaded)."""
    _load_plugins()
    return dict(sorted(_REGISTRY.items()))


def registered_adapters() -> dict[str, AdapterEntry]:
    """Every registered adapter family, by name (plug-ins loaded)."""
    _load_plugins()
    return dict(sorted(_ADAPTERS.items()))


def list_envs() -> list[str]:
    """Names of every registered env, sorted (adapter families as ``"family/"``)."""
    return sorted([*registered(), *(f"{name}/" for name in registered_adapters())])


def _adapter_for(name: str) -> tuple[AdapterEntry, str]:
    """The available adapter and the scenario named by ``"family/scenario"``."""
    family, _, scenario = name.partition("/")
    adapters = registered_adapters()
    entry = adapters.get(family)
    if entry is None:
        hint = did_you_mean(f"{family}/", [f"{a}/" for a in adapters], n=3, cutoff=0.5)
        raise UnknownEnvError(
            f"no adapter registered as {family!r} (from {name!r}).{hint} Adapters: "
            f"{', '.join(adapters) or 'none'}."
        )
    if not scenario:
        raise ValueError(f"{name!r} names no scenario: use '{family}/<scenario>'")
    if not entry.available:
        raise AdapterUnavailableError(
            f"the {family!r} adapter needs {', '.join(entry.missing)}, which is not installed. "
            f"Install it with: {entry.install_hint}"
        )
    return entry, scenario


def _entry_for(name: str) -> EnvEntry:
    entries = registered()
    entry = entries.get(name)
    if entry is None:
        hint = did_you_mean(name, entries, n=5, cutoff=0.5)
        raise UnknownEnvError(
            f"no env registered as {name!r}.{hint} `marlkit list` shows them all "
            f"({len(entries)} registered). An env of your own is known only in a process that "
            "ran its marlkit.register(...): import the module that registers it first (`marlkit "
            "--import MODULE`, a training script's env.imports); a worker process starts fresh, "
            "so registering under `if __name__ == '__main__':` does not reach it."
        )
    return entry


def make(name: str, **kwargs: Any) -> EnvBase:
    """Build the env registered under ``name`` with ``kwargs``.

    ``"family/scenario"`` names go to the adapter registered as ``family``.

    Raises:
        UnknownEnvError: no such name; the message lists the closest matches.
        AdapterUnavailableError: the adapter's simulator is not installed (an ``ImportError``
            whose message gives the pip command).
        TypeError: a keyword the env does not take; the message suggests the closest accepted
            ones and lists them all.
    """
    if isinstance(name, str) and "/" in name:
        adapter, scenario = _adapter_for(name)
        env: Any = adapter.factory(scenario, **kwargs)
        source = adapter.name
    else:
        entry = _entry_for(name)
        accepted = keyword_names(entry.factory)
        if accepted is not None:  # None: the factory takes **kwargs and checks them itself
            check_kwargs(f"env {name!r}", kwargs, accepted)
        env, source = entry.factory(**kwargs), entry.source
    if not isinstance(env, EnvBase):
        raise TypeError(
            f"the factory behind {name!r} ({source}) returned {type(env).__name__}, not an EnvBase"
        )
    return env


def accepted_kwargs(name: str) -> list[str] | None:
    """The keyword arguments ``make(name, ...)`` takes, or ``None`` when that cannot be told (a
    factory taking ``**kwargs``, an adapter that does not say).

    Raises:
        UnknownEnvError, AdapterUnavailableError: as :func:`make`.
    """
    if isinstance(name, str) and "/" in name:
        adapter, scenario = _adapter_for(name)
        if adapter.accepted_kwargs is None:
            return None
        names = adapter.accepted_kwargs(scenario)
        return None if names is None else list(dict.fromkeys(names))
    return keyword_names(_entry_for(name).factory)


def agent_count_kwarg(name: str) -> str:
    """The keyword argument that sets the number of agents of env ``name``: the first of
    :data:`AGENT_COUNT_KWARGS` it takes, or ``"n_agents"`` when its keywords cannot be told
    (the env then refuses it if it does not take it).

    Raises:
        ValueError: the env takes none of them (the message names the counts it does take, e.g.
            predator_prey's ``n_predators``, ``n_prey`` and ``n_landmarks``).
        UnknownEnvError, AdapterUnavailableError: as :func:`make`.
    """
    accepted = accepted_kwargs(name)
    if accepted is None:
        return AGENT_COUNT_KWARGS[0]
    for key in AGENT_COUNT_KWARGS:
        if key in accepted:
            return key
    counts = [k for k in accepted if _COUNT_LIKE.match(k) and k not in _NOT_AGENT_COUNTS]
    if counts:
        what = f"its counts are: {', '.join(counts)}"
    else:
        what = f"it accepts: {', '.join(accepted) or 'no keyword arguments'}"
    raise ValueError(
        f"env {name!r} takes no agent-count argument ({', '.join(AGENT_COUNT_KWARGS)}); {what}"
    )
