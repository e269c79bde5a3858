"""The env registry: ``make``, ``register``, ``list_envs``, close-match hints, plug-ins."""

from __future__ import annotations

import logging
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

import marlkit
import marlkit.scenarios
from marlkit.envs import (
    EnvBase,
    UnknownEnvError,
    accepted_kwargs,
    agent_count_kwarg,
    list_envs,
    make,
    register,
    registered,
)
from marlkit.envs import registry as registry_module
from marlkit.scenarios import NavigationEnv


@pytest.fixture(autouse=True)
def restore_registry():
    """Whatever a test registers or overrides is removed again afterwards."""
    registered()  # built-ins and plug-ins loaded before the snapshot
    saved = dict(registry_module._REGISTRY)
    yield
    registry_module._REGISTRY.clear()
    registry_module._REGISTRY.update(saved)


def test_top_level_names_are_the_registry():
    assert marlkit.make is make and marlkit.register is register
    assert marlkit.list_envs is list_envs


def test_list_envs_has_the_builtin_scenarios_sorted():
    names = list_envs()
    assert "navigation" in names
    assert names == sorted(names)
    entry = registered()["navigation"]
    assert entry.factory is NavigationEnv
    assert entry.source == "marlkit.scenarios.navigation"
    assert "agents" in entry.description


def test_every_exported_scenario_is_registered():
    factories = {entry.factory for entry in registered().values()}
    for name in marlkit.scenarios.__all__:
        obj = getattr(marlkit.scenarios, name)
        if isinstance(obj, type) and issubclass(obj, EnvBase):
            assert obj in factories, name


def test_make_passes_kwargs():
    env = make("navigation", num_envs=2, n_agents=5, continuous_actions=False, seed=1)
    assert isinstance(env, NavigationEnv)
    assert env.batch_size == (2,) and env.n_agents == 5 and not env.continuous_actions
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        make("navigation", bogus=1)
    with pytest.raises(ValueError, match="num_envs must be an int >= 1, got 0"):
        make("navigation", num_envs=0)


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        (
            "navigation",
            {"n_agent": 3},
            "unexpected keyword argument 'n_agent' (did you mean 'n_agents'?)",
        ),
        ("swarm", {"k_neighbours": 3}, "'k_neighbours'; it accepts: num_envs, n_agents"),
        ("predator_prey", {"n_predator": 1}, "'n_predator' (did you mean 'n_predators'?)"),
    ],
)
def test_make_refuses_unknown_kwargs_with_close_matches(name, kwargs, expected):
    with pytest.raises(TypeError) as info:
        make(name, num_envs=2, **kwargs)
    message = str(info.value)
    assert message.startswith(f"env {name!r} got an") and expected in message
    # ... and lists every keyword the env accepts, from its signature
    assert message.endswith(", ".join(accepted_kwargs(name)))
    assert "render_size" in message


def test_factories_are_checked_by_their_signature(point_mass_cls):
    def explicit(num_envs: int = 2, *, bound: float = 1.0):
        return point_mass_cls(num_envs=num_envs, bound=bound)

    def open_ended(**kwargs):  # checks (here: hands on) its own keywords
        return point_mass_cls(**kwargs)

    register("test-explicit", explicit)
    register("test-open", open_ended)
    assert accepted_kwargs("test-explicit") == ["num_envs", "bound"]
    assert accepted_kwargs("test-open") is None
    with pytest.raises(
        TypeError, match=r"^env 'test-explicit' got an unexpected keyword argument "
    ):
        make("test-explicit", bond=2.0)  # refused before the factory runs
    with pytest.raises(TypeError, match=r"'bond' \(did you mean 'bound'\?\)"):
        make("test-explicit", bond=2.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bond'"):
        make("test-open", bond=2.0)  # the class's own check, from Python
    assert make("test-explicit", bound=2.0).bound == 2.0


def test_agent_count_kwarg_of_registered_envs(point_mass_cls):
    assert agent_count_kwarg("navigation") == "n_agents"
    assert agent_count_kwarg("swarm") == "n_agents"
    expected = (
        "env 'predator_prey' takes no agent-count argument (n_agents, num_agents, N, "
        "num_players, n_pistons, n_walkers); its counts are: n_predators, n_prey, n_landmarks"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        agent_count_kwarg("predator_prey")
    register("test-point-mass", point_mass_cls)  # PointMassEnv counts groups, not agents
    with pytest.raises(ValueError, match=r"takes no agent-count argument .*; it accepts: num_envs"):
        agent_count_kwarg("test-point-mass")

    def open_ended(**kwargs):
        return point_mass_cls(**kwargs)

    register("test-open", open_ended)
    assert agent_count_kwarg("test-open") == "n_agents"  # cannot tell: marlkit's own name

    def rps_like(num_actions: int = 3, max_cycles: int = 15):  # PettingZoo's rps_v2
        return point_mass_cls()

    register("test-rps", rps_like)  # a count of actions is not a count of agents
    with pytest.raises(ValueError, match=r"; it accepts: num_actions, max_cycles$"):
        agent_count_kwarg("test-rps")
    with pytest.raises(UnknownEnvError, match="Did you mean: navigation"):
        agent_count_kwarg("navigaton")


def test_unknown_name_suggests_close_matches():
    with pytest.raises(UnknownEnvError) as info:
        make("navigaton")
    message = str(info.value)
    assert message.startswith("no env registered as 'navigaton'. Did you mean: navigation?")
    assert "`marlkit list` shows them all" in message
    assert isinstance(info.value, KeyError)


def test_unknown_name_lists_every_close_match(point_mass_cls):
    register("navigation-v2", point_mass_cls)
    with pytest.raises(
        UnknownEnvError, match=re.escape("Did you mean: navigation, navigation-v2?")
    ):
        make("navigaton")


def test_unknown_name_without_close_match_gives_no_hint():
    with pytest.raises(UnknownEnvError, match="no env registered as 'qqqqqq'") as info:
        make("qqqqqq")
    assert "Did you mean" not in str(info.value)


def test_register_and_make(point_mass_cls):
    calls = []

    def factory(**kwargs):
        calls.append(kwargs)
        return point_mass_cls(**kwargs)

    register("test-point-mass", factory, description="1-D point masses")
    assert "test-point-mass" in list_envs()
    assert registered()["test-point-mass"].description == "1-D point masses"
    env = marlkit.make("test-point-mass", num_envs=2, bound=3.0)
    assert isinstance(env, point_mass_cls) and env.batch_size == (2,) and env.bound == 3.0
    assert calls == [{"num_envs": 2, "bound": 3.0}]


def test_duplicate_registration_needs_override(point_mass_cls, masked_env_cls):
    register("test-dup", point_mass_cls)
    with pytest.raises(ValueError, match=r"'test-dup' is already registered .*override=True"):
        register("test-dup", masked_env_cls)
    assert isinstance(make("test-dup"), point_mass_cls)
    register("test-dup", masked_env_cls, override=True)
    assert isinstance(make("test-dup"), masked_env_cls)


def test_builtin_names_are_protected_too(point_mass_cls):
    builtin = "'navigation' is already registered (by marlkit.scenarios.navigation)"
    with pytest.raises(ValueError, match=re.escape(builtin)):
        register("navigation", point_mass_cls)
    register("navigation", point_mass_cls, override=True)
    assert isinstance(make("navigation"), point_mass_cls)


def test_the_cleanup_fixture_restored_the_builtin():
    # runs after test_builtin_names_are_protected_too overrode "navigation"
    assert registered()["navigation"].factory is NavigationEnv
    assert not [name for name in list_envs() if name.startswith("test-")]


@pytest.mark.parametrize("name", ["", "   ", None, 3])
def test_register_rejects_bad_names(point_mass_cls, name):
    with pytest.raises(ValueError, match="an env name must be a non-empty str, got"):
        register(name, point_mass_cls)  # type: ignore[arg-type]


def test_register_rejects_a_non_callable_factory():
    with pytest.raises(TypeError, match="the factory for 'test-x' must be callable, got str"):
        register("test-x", "NavigationEnv")  # type: ignore[arg-type]


def test_registering_before_the_first_make_catches_builtin_names():
    # In a fresh interpreter the built-ins load lazily; registering one of their names first
    # must fail at once, not break a later make("navigation").
    code = textwrap.dedent(
        """
        import marlkit
        try:
            marlkit.register("navigation", lambda **kwargs: None)
        except ValueError as err:
            print("refused:", err)
        print(type(marlkit.make("navigation", num_envs=1)).__name__)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "refused: an env named 'navigation' is already registered" in out
    assert out.strip().endswith("NavigationEnv")


class _EntryPoint:
    def __init__(self, name: str, target: object):
        self.name, self.value, self._target = name, f"fake:{name}", target

    def load(self) -> object:
        if isinstance(self._target, Exception):
            raise self._target
        return self._target


def test_plugins_register_and_a_broken_one_is_only_logged(monkeypatch, caplog, point_mass_cls):
    def plugin() -> None:
        register("test-plugin-env", point_mass_cls, description="from a plug-in")

    points = [
        _EntryPoint("good", plugin),
        _EntryPoint("broken", ImportError("no module named 'missing_dep'")),
        _EntryPoint("module-like", object()),  # a module to import: not called
    ]
    seen = []

    def entry_points(*, group):
        seen.append(group)
        return points if group == "marlkit.envs" else []

    monkeypatch.setattr(registry_module.importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(registry_module, "_loaded", False)
    with caplog.at_level(logging.WARNING, logger="marlkit.registry"):
        names = list_envs()
    assert seen == ["marlkit.adapters", "marlkit.envs"]
    assert "test-plugin-env" in names and "navigation" in names
    assert isinstance(make("test-plugin-env"), point_mass_cls)
    broken = [r for r in caplog.records if "'broken'" in r.getMessage()]
    assert len(broken) == 1 and "missing_dep" in broken[0].getMessage()
    list_envs()
    assert seen == ["marlkit.adapters", "marlkit.envs"]  # loaded once


PLUGIN_PYPROJECT = """
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "marlkit-demo-plugin"
version = "0.1.0"

[project.entry-points."marlkit.envs"]
demo-module = "marlkit_demo_plugin"
demo-callable = "marlkit_demo_plugin.extra:register_all"
broken = "marlkit_demo_plugin.missing"

[tool.setuptools]
packages = ["marlkit_demo_plugin"]
"""

PLUGIN_INIT = """
import marlkit
from marlkit.scenarios import NavigationEnv


def make_demo(num_envs: int = 1):
    return NavigationEnv(num_envs=num_envs, n_agents=2)


marlkit.register("demo-plugin", make_demo, description="registered when imported")
"""

PLUGIN_EXTRA = """
import marlkit
from marlkit.scenarios import NavigationEnv


def register_all():
    marlkit.register("demo-plugin-called", NavigationEnv, description="registered when called")
"""

USE_PLUGIN = """
import logging
import sys

import marlkit

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
print("imported at import marlkit:", "marlkit_demo_plugin" in sys.modules)
env = marlkit.make("demo-plugin", num_envs=2)
print("made:", type(env).__name__, tuple(env.batch_size))
print("made:", type(marlkit.make("demo-plugin-called")).__name__)
print("listed:", [n for n in marlkit.list_envs() if n.startswith("demo-plugin")])
"""


@pytest.mark.slow
def test_a_package_registers_its_envs_through_the_entry_point_group(tmp_path):
    # What docs/adapters.md tells a third party: a real package, built and installed by pip,
    # declaring [project.entry-points."marlkit.envs"]: a module imported, a callable called, on
    # the first use of the registry (not at `import marlkit`); a broken one only logged.
    source = tmp_path / "plugin"
    (source / "marlkit_demo_plugin").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    (source / "marlkit_demo_plugin" / "__init__.py").write_text(PLUGIN_INIT)
    (source / "marlkit_demo_plugin" / "extra.py").write_text(PLUGIN_EXTRA)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--no-index", "--target", str(site), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = subprocess.run(
        [sys.executable, "-c", USE_PLUGIN],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == [
        "imported at import marlkit: False",
        "made: NavigationEnv (2,)",
        "made: NavigationEnv",
        "listed: ['demo-plugin', 'demo-plugin-called']",
    ]
    assert (
        "marlkit.registry: could not load marlkit plug-in 'broken' (marlkit_demo_plugin.missing)"
        in out.stderr
    )


def test_the_entry_point_groups_are_documented():
    guide = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "adapters.md").read_text()
    for group in registry_module.ENTRY_POINT_GROUPS:
        assert f'[project.entry-points."{group}"]' in guide, group
