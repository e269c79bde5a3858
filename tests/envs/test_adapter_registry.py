"""Adapter families: make("family/scenario"), unavailable simulators, and `marlkit list`."""

from __future__ import annotations

import pytest

import marlkit
from marlkit.cli import main
from marlkit.envs import (
    AdapterUnavailableError,
    UnknownEnvError,
    accepted_kwargs,
    agent_count_kwarg,
    register,
    register_adapter,
    registered_adapters,
)
from marlkit.envs import registry as registry_module


@pytest.fixture(autouse=True)
def _restore_adapters():
    before = dict(registered_adapters())  # built-ins and plug-ins loaded first
    yield
    registry_module._ADAPTERS.clear()
    registry_module._ADAPTERS.update(before)


def _navigation_family(scenario: str, **kwargs):  # type: ignore[no-untyped-def]
    if scenario != "small":
        raise ValueError(f"the test family has only 'small', got {scenario!r}")
    return marlkit.make("navigation", num_envs=2, **kwargs)


def test_family_name_reaches_the_factory() -> None:
    register_adapter(
        "testfam", _navigation_family, description="a test family", scenarios=lambda: ["small"]
    )
    env = marlkit.make("testfam/small", n_agents=3)
    assert env.batch_size == (2,) and env.group_map["agents"] == ["agent_0", "agent_1", "agent_2"]
    assert "testfam/" in marlkit.list_envs()
    assert registered_adapters()["testfam"].list_scenarios() == ["small"]


def test_missing_simulator_is_listed_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    register_adapter(
        "ghostsim",
        _navigation_family,
        description="needs a package that is not installed",
        requires=("ghostsim_package_that_does_not_exist",),
        extra="ghostsim",
    )
    entry = registered_adapters()["ghostsim"]
    assert not entry.available
    assert entry.missing == ["ghostsim_package_that_does_not_exist"]
    assert entry.install_hint == "pip install 'marlkit[ghostsim]'"
    with pytest.raises(AdapterUnavailableError, match=r"pip install 'marlkit\[ghostsim\]'"):
        marlkit.make("ghostsim/small")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "ghostsim/" in out and "unavailable: pip install 'marlkit[ghostsim]'" in out


def test_without_extra_the_hint_names_the_packages() -> None:
    register_adapter("ghost2", _navigation_family, requires=("ghost2_missing_pkg",))
    assert registered_adapters()["ghost2"].install_hint == "pip install ghost2_missing_pkg"


def test_builtin_adapters_are_available_here_and_list_scenarios() -> None:
    adapters = registered_adapters()
    for name in ("vmas", "pettingzoo", "gymnasium", "mujoco"):
        assert adapters[name].available, name
        assert adapters[name].list_scenarios(), name
    assert "navigation" in adapters["vmas"].list_scenarios()
    assert "ant_2x4" in adapters["mujoco"].list_scenarios()


def test_bad_family_names_and_lookups() -> None:
    with pytest.raises(UnknownEnvError, match="Did you mean: vmas/"):
        marlkit.make("vmass/navigation")
    with pytest.raises(ValueError, match="names no scenario"):
        marlkit.make("vmas/")
    with pytest.raises(ValueError, match="without '/'"):
        register_adapter("a/b", _navigation_family)
    with pytest.raises(ValueError, match="already registered"):
        register_adapter("vmas", _navigation_family)
    with pytest.raises(TypeError, match="callable"):
        register_adapter("notcallable", "nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot contain '/'"):
        register("x/y", _navigation_family)


def test_families_say_which_keywords_their_scenarios_take() -> None:
    def kwargs_of(scenario: str) -> list[str] | None:
        return ["n_agents", "seed", "seed"] if scenario == "small" else None

    register_adapter("testfam", _navigation_family, accepted_kwargs=kwargs_of)
    register_adapter("quietfam", _navigation_family)  # says nothing
    assert accepted_kwargs("testfam/small") == ["n_agents", "seed"]
    assert agent_count_kwarg("testfam/small") == "n_agents"
    assert accepted_kwargs("testfam/other") is None
    assert accepted_kwargs("quietfam/small") is None
    assert agent_count_kwarg("quietfam/small") == "n_agents"  # cannot tell: marlkit's name
    with pytest.raises(UnknownEnvError, match="Did you mean: testfam/"):
        accepted_kwargs("testfan/small")
    register_adapter(
        "ghostsim2", _navigation_family, requires=("ghostsim_package_that_does_not_exist",)
    )
    with pytest.raises(AdapterUnavailableError, match="pip install"):
        agent_count_kwarg("ghostsim2/small")


def test_a_broken_scenario_lister_does_not_break_list(caplog: pytest.LogCaptureFixture) -> None:
    def lister() -> list[str]:
        raise RuntimeError("lister exploded")

    register_adapter("brokenlist", _navigation_family, scenarios=lister)
    assert registered_adapters()["brokenlist"].list_scenarios() == []
    assert any("lister exploded" in r.getMessage() for r in caplog.records)


def test_third_party_entry_point_is_discovered(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A package that declares the entry-point group ``marlkit.adapters`` (a real dist-info on
    the path, as pip would install it) shows up in a fresh interpreter, lazily."""
    import subprocess
    import sys
    import textwrap

    (tmp_path / "thirdparty_sim.py").write_text(
        textwrap.dedent(
            """
            import marlkit

            def make(scenario, **kwargs):
                return marlkit.make("navigation", num_envs=2, n_agents=2, **kwargs)

            def register():
                marlkit.register_adapter(
                    "thirdparty", make, description="from an entry point",
                    scenarios=lambda: ["only"],
                )
            """
        )
    )
    dist = tmp_path / "thirdparty_sim-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-sim\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[marlkit.adapters]\nthirdparty = thirdparty_sim:register\n"
    )
    code = (
        "import sys, marlkit\n"
        "assert 'thirdparty_sim' not in sys.modules\n"  # nothing loaded before first use
        "env = marlkit.make('thirdparty/only')\n"
        "print(type(env).__name__, 'thirdparty/' in marlkit.list_envs())\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "NavigationEnv True"
