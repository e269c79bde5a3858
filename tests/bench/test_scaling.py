"""The scaling harness (marlkit.bench) on tiny cells: its Python API and `marlkit bench scaling`.

Real simulators (native navigation, VMAS navigation) at a few agents; every measurement is one
or two steps, so the figures mean nothing: the tests check the harness, not the speed.
"""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import imageio.v3 as iio
import pytest

import _forked
from marlkit.bench import (
    CellResult,
    CellSpec,
    ScalingConfig,
    ScalingReport,
    TimingSettings,
    measure_cell,
    plot_scaling,
    run_cell,
    run_scaling,
)
from marlkit.bench._worker import main as worker_main
from marlkit.bench.env_scaling import (
    EnvCellSpec,
    EnvScalingConfig,
    EnvSweep,
    measure_env_cell,
    run_env_cell,
    run_env_scaling,
)
from marlkit.bench.plot import plot_env_scaling
from marlkit.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = {"min_seconds": 0.0, "min_steps": 1}
CELL_KEYS = {
    "backend",
    "scenario",
    "envs",
    "agents",
    "status",
    "reason",
    "setup_s",
    "first_step_s",
    "steps",
    "seconds",
    "steps_per_s",
    "env_steps_per_s",
    "agent_steps_per_s",
    "estimated_agent_steps_per_s",
    "info",
}
TOP_KEYS = {
    "benchmark",
    "schema",
    "scenario",
    "mode",
    "total_agents",
    "envs",
    "agents",
    "backends",
    "settings",
    "environment",
    "cells",
    "ratios",
    "targets",
}


def marlkit_cmd(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    exe = pathlib.Path(sys.executable).parent / "marlkit"
    cmd = [sys.executable, str(exe)] if exe.exists() else [sys.executable, "-m", "marlkit.cli"]
    return _forked.run([*cmd, *args], timeout=timeout)


def check_schema(data: dict, *, backends: list[str], agents: list[int]) -> None:
    assert set(data) == TOP_KEYS
    assert data["benchmark"] == "scaling" and data["schema"] == 1
    assert data["backends"] == backends and data["agents"] == agents
    assert len(data["cells"]) == len(backends) * len(agents)
    for cell in data["cells"]:
        assert set(cell) == CELL_KEYS
        if cell["status"] == "ok":
            assert cell["reason"] is None and cell["steps"] >= 1
            rate = cell["steps"] / cell["seconds"] * cell["envs"] * cell["agents"]
            assert math.isclose(cell["agent_steps_per_s"], rate, rel_tol=1e-9)
        else:
            assert cell["reason"] and cell["agent_steps_per_s"] is None
    env = data["environment"]
    for key in ("date", "torch", "torch_threads", "native_threads", "cpus", "machine", "vmas"):
        assert key in env
    assert [r["agents"] for r in data["ratios"]] == agents
    assert {t["id"] for t in data["targets"]} == {
        "native_over_vmas_4",
        "native_1024_over_native_16",
        "native_over_vmas_1024",
    }


def check_png(path: pathlib.Path) -> None:
    image = iio.imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400
    assert image.std() > 10  # something was drawn


# ------------------------------------------------------------------ the Python API
def test_tiny_sweep_in_process(tmp_path: pathlib.Path) -> None:
    config = ScalingConfig(
        agents=(8, 4), total_agents=64, backends=("native", "vmas"), isolate="none", **TINY
    )
    report = run_scaling(config, progress=False)
    assert [(c.backend, c.envs, c.agents, c.status) for c in report.cells] == [
        ("native", 16, 4, "ok"),
        ("vmas", 16, 4, "ok"),
        ("native", 8, 8, "ok"),
        ("vmas", 8, 8, "ok"),
    ]
    assert report.cell("vmas", 4).info["world_spawning"] == 1.0
    assert report.cell("native", 4).info["kernel"] == "native"
    data = report.to_dict()
    check_schema(data, backends=["native", "vmas"], agents=[4, 8])
    assert data["mode"] == "total_agents" and data["envs"] is None
    native, vmas = report.cell("native", 4), report.cell("vmas", 4)
    ratio = data["ratios"][0]["native_over_vmas"]
    assert ratio == native.agent_steps_per_s / vmas.agent_steps_per_s
    first, retention, at_1024 = data["targets"]
    assert first["value"] == ratio and first["met"] == (ratio >= 10)
    assert retention["met"] is None and "no native cell at 1024 agents" in retention["note"]
    assert at_1024["value"] is None and at_1024["numerator"] == ["native", 1024]
    table = report.table()
    assert "native agent-steps/s" in table and "native/vmas" in table and "targets:" in table
    paths = report.write(tmp_path)
    assert json.loads(paths["json"].read_text()) == json.loads(json.dumps(data))
    check_png(paths["png"])


def test_fixed_envs_variant_and_torch_backend() -> None:
    config = ScalingConfig(agents=(2, 3), envs=5, backends=("torch",), isolate="none", **TINY)
    report = run_scaling(config, progress=False)
    assert [(c.envs, c.agents, c.status) for c in report.cells] == [(5, 2, "ok"), (5, 3, "ok")]
    assert report.cells[0].info["kernel"] == "torch"
    data = report.to_dict()
    assert data["mode"] == "fixed_envs" and data["envs"] == 5 and data["total_agents"] is None
    assert data["ratios"] == [{"agents": 2, "envs": 5}, {"agents": 3, "envs": 5}]  # no native


def test_budget_skips_a_vmas_cell_and_its_larger_cells(tmp_path: pathlib.Path) -> None:
    config = ScalingConfig(
        agents=(2, 4, 8),
        total_agents=16,
        backends=("native", "vmas"),
        isolate="none",
        cell_budget_s=1e-4,  # nothing fits, not even the construction
        **TINY,
    )
    report = run_scaling(config, progress=False)
    assert [c.status for c in report.cells] == ["skipped"] * 6  # the budget binds native too
    vmas = [c for c in report.cells if c.backend == "vmas"]
    assert vmas[0].reason.startswith("construction took") and "0.0001 s budget" in vmas[0].reason
    assert vmas[0].setup_s > 1e-4
    for c in vmas[1:]:
        assert c.reason.startswith("not run: the 2-agent cell was already over the 0.0001 s budget")
        assert c.setup_s is None
    table = report.table()
    assert "skipped [1]" in table and "skipped [2]" in table
    assert "[2] vmas 8x2: construction took" in table
    assert "[4] vmas 4x4: not run: the 2-agent cell" in table
    assert "native >= 10x VMAS at 4 agents: not measured (native 4x4 skipped: not run" in table
    assert all(r["native_over_vmas"] is None for r in report.ratios())
    # nothing measured: the plot still draws (no log axis without a positive point)
    check_png(plot_scaling(report.to_dict(), tmp_path / "none.png"))


def test_estimate_over_budget_skips_with_a_one_step_estimate(tmp_path: pathlib.Path) -> None:
    spec = CellSpec("native", "navigation", envs=4, agents=3)
    result = measure_cell(spec, TimingSettings(min_seconds=0.0, min_steps=10**9, budget_s=60.0))
    assert result.status == "skipped"
    assert result.reason.startswith("estimated ") and "exceeds the 60 s budget" in result.reason
    assert result.first_step_s > 0 and result.steps == 0
    assert result.estimated_agent_steps_per_s == pytest.approx(12 / result.first_step_s)
    # A skipped cell with an estimate is drawn (hollow marker) without breaking the plot.
    config = ScalingConfig(agents=(3,), envs=4, backends=("native",), isolate="none")
    data = ScalingReport(config, {"date": "d"}, [result]).to_dict()
    check_png(plot_scaling(data, tmp_path / "skipped.png"))


def test_isolated_cell_is_killed_past_its_timeout() -> None:
    spec = CellSpec("vmas", "navigation", envs=2, agents=2)
    settings = TimingSettings(budget_s=0.05, **TINY)
    result = run_cell(spec, settings, isolate=True, startup_allowance_s=0.0)
    assert result.status == "skipped"
    assert result.reason == "killed after 0.05 s before the env was constructed (process start-up)"


def test_isolated_cell_over_budget_reports_its_reason() -> None:
    spec = CellSpec("vmas", "navigation", envs=2, agents=2)
    result = run_cell(spec, TimingSettings(budget_s=1e-4, **TINY), isolate=True)
    assert result.status == "skipped" and result.reason.startswith("construction took")
    assert result.info["world_spawning"] == 1.0  # came back from the worker


def test_isolated_cell_error_is_a_failed_cell() -> None:
    spec = CellSpec("native", "navigation", envs=2, agents=2)
    result = run_cell(spec, TimingSettings(**TINY), isolate=True, threads=0)
    assert result.status == "failed"
    assert result.reason == "ValueError: threads must be an int >= 1 or None, got 0"


def test_worker_reports_bad_input() -> None:
    assert worker_main(["{not json"]) == 1
    assert worker_main([]) == 1
    bad = json.dumps({"spec": {"backend": "nope"}, "settings": {}, "threads": None})
    assert worker_main([bad]) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"envs": 4, "total_agents": 64}, "give envs or total_agents, not both"),
        ({"backends": ("native", "nope")}, r"unknown backends \['nope'\]"),
        ({"backends": ()}, "backends must name at least one"),
        ({"agents": (4, 0)}, "agents per env must be an int >= 1, got 0"),
        ({"agents": ()}, "agents must name at least one"),
        ({"envs": 0}, "envs must be an int >= 1, got 0"),
        ({"scenario": "balance"}, "scenario must be one of"),
        ({"isolate": "some"}, r"isolate must be one of \['peers', 'all', 'none'\], got 'some'"),
        ({"min_steps": 0}, "min_steps must be an int >= 1, got 0"),
        ({"min_seconds": math.nan}, "min_seconds must be a finite number"),
        ({"warmup": 0}, "warmup must be an int >= 1, got 0"),
        ({"cell_budget_s": 0.0}, "budget_s must be a number > 0, got 0.0"),
        ({"threads": 0}, "threads must be an int >= 1"),
    ],
)
def test_bad_config_is_rejected(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ScalingConfig(**kwargs)


def test_bad_cell_spec_and_result_fields() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        CellSpec("jax", "navigation", 1, 1)
    with pytest.raises(TypeError, match="agents must be an int >= 1, got bool: True"):
        CellSpec("native", "navigation", 1, True)
    with pytest.raises(KeyError, match=r"unknown CellResult fields \['speed'\]"):
        CellResult.from_dict({"backend": "native", "speed": 1})


def test_default_config_is_the_issue_sweep() -> None:
    config = ScalingConfig()
    assert config.agents == (4, 16, 64, 256, 1024, 4096)
    assert config.total_agents == 65_536 and config.mode == "total_agents"
    assert [config.envs_for(a) for a in config.agents] == [16384, 4096, 1024, 256, 64, 16]
    assert config.isolates("vmas") and not config.isolates("native")
    assert ScalingConfig(total_agents=100, agents=(1000,)).envs_for(1000) == 1


# ------------------------------------------------------------------ the command
def test_bench_scaling_command(tmp_path: pathlib.Path) -> None:
    out = marlkit_cmd(
        "bench",
        "scaling",
        "--agents",
        "4,8",
        "--total-agents",
        "64",
        "--backends",
        "native,vmas",
        "--min-seconds",
        "0",
        "--min-steps",
        "1",
        "--out",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert "agents  envs  native agent-steps/s  vmas agent-steps/s  native/vmas" in out.stdout
    assert "native >= 10x VMAS at 4 agents:" in out.stdout
    assert "4/4" in out.stderr  # the progress bar over cells ran to the end
    data = json.loads((tmp_path / "scaling.json").read_text())
    check_schema(data, backends=["native", "vmas"], agents=[4, 8])
    assert [c["status"] for c in data["cells"]] == ["ok"] * 4
    assert data["settings"]["isolate"] == "peers"
    check_png(tmp_path / "scaling.png")


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--agents", "0"], "argument --agents: agents per env must be >= 1, got 0 in '0'"),
        (["--agents", "4,x"], "argument --agents: expected a comma list of ints"),
        (["--backends", "nope"], "argument --backends: unknown backend(s) ['nope']"),
        (["--envs", "4", "--total-agents", "64"], "argument --total-agents: not allowed with"),
        (["--envs", "0"], "argument --envs: must be a finite number > 0, got 0"),
        (["--envs", "nan"], "argument --envs: expected an int, got 'nan'"),
        (["--scenario", "balance"], "argument --scenario: invalid choice: 'balance'"),
        # named min_seconds and startup_allowance_s, the config's fields, before
        (["--min-seconds", "-1"], "argument --min-seconds: must be a finite number >= 0, got -1"),
        (["--startup-allowance", "nan"], "argument --startup-allowance: must be a finite number"),
        (["--cell-budget", "-5"], "argument --cell-budget: must be a number > 0, got -5"),
    ],
)
def test_bad_arguments_exit_2(
    argv: list[str], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "scaling", *argv])
    assert exc.value.code == 2
    assert match in capsys.readouterr().err


def test_bad_timing_value_is_refused_by_the_config() -> None:
    with pytest.raises(ValueError, match=r"min_seconds must be a finite number >= 0, got -1\.0"):
        ScalingConfig(min_seconds=-1.0)


def test_bad_arguments_exit_2_from_the_real_command() -> None:
    out = marlkit_cmd("bench", "scaling", "--agents", "0", "--backends", "native")
    assert out.returncode == 2
    assert "agents per env must be >= 1, got 0" in out.stderr


# ------------------------------------------------------------------ any env (--env, --param)
ENV_CELL_KEYS = {
    "env",
    "param",
    "value",
    "envs",
    "agents",
    "groups",
    "status",
    "reason",
    "setup_s",
    "first_step_s",
    "steps",
    "seconds",
    "steps_per_s",
    "env_steps_per_s",
    "agent_steps_per_s",
    "estimated_agent_steps_per_s",
    "rss_before_mb",
    "peak_rss_mb",
}


def test_an_env_cell_counts_the_agents_of_the_built_env() -> None:
    pytest.importorskip("magent2")
    spec = EnvCellSpec("magent2/battle_v4", "map_size", 12, envs=2, kwargs={"state": False})
    result = measure_env_cell(spec, TimingSettings(min_seconds=0.0, min_steps=2))
    assert (result.status, result.agents, result.groups) == ("ok", 4, {"red": 2, "blue": 2})
    assert result.steps == 2
    rate = result.steps / result.seconds * 2 * 4  # steps/s x envs x agents
    assert math.isclose(result.agent_steps_per_s, rate, rel_tol=1e-9)


@pytest.mark.slow  # two cell subprocesses (the command's test runs one, unmarked)
def test_a_sweep_of_swarm_in_subprocesses(tmp_path: pathlib.Path) -> None:
    sweep = EnvSweep.parse("swarm", "n_agents=16,4", {"k_nearest": 3})
    assert sweep.values == (4, 16)
    report = run_env_scaling(EnvScalingConfig((sweep,), envs=2, **TINY), progress=False)
    assert [(c.value, c.agents, c.envs, c.status) for c in report.cells] == [
        (4, 4, 2, "ok"),
        (16, 16, 2, "ok"),
    ]
    for cell in report.cells:  # each cell's own process: its memory before and after the env
        assert 0 < cell.rss_before_mb <= cell.peak_rss_mb
    data = report.to_dict()
    assert (data["benchmark"], data["mode"], data["envs"]) == ("scaling", "env", 2)
    assert all(set(c) == ENV_CELL_KEYS for c in data["cells"])
    (swept,) = data["sweeps"]
    assert swept["kwargs"] == {"k_nearest": 3}
    kept = swept["retained"]
    assert [r["agents"] for r in kept] == [4, 16] and kept[0]["retained"] == 1.0
    fast, big = report.cells
    assert math.isclose(kept[1]["retained"], big.agent_steps_per_s / fast.agent_steps_per_s)
    table = report.table()
    assert "agent-steps/s  retained  peak RSS MiB" in table and "n_agents=16" in table
    paths = report.write(tmp_path)
    assert json.loads(paths["json"].read_text()) == json.loads(json.dumps(data))
    check_png(paths["png"])


def test_an_env_cell_over_budget_skips_its_larger_values() -> None:
    sweep = EnvSweep("swarm", "n_agents", (4, 8, 16))
    config = EnvScalingConfig((sweep,), cell_budget_s=1e-3, startup_allowance_s=60, **TINY)
    report = run_env_scaling(config, progress=False)
    first, *rest = report.cells
    assert first.status == "skipped" and "over the 0.001 s budget" in first.reason
    assert first.agents == 4 and first.setup_s is not None
    assert [c.status for c in rest] == ["skipped", "skipped"]
    assert all("not run: the n_agents=4 cell was already over" in c.reason for c in rest)


def test_an_env_cell_that_fails_names_the_error() -> None:
    spec = EnvCellSpec("swarm", "n_agents", 4, kwargs={"obs_mode": "sonar"})
    result = run_env_cell(spec, TimingSettings(min_seconds=0.0, min_steps=1))
    assert result.status == "failed" and "obs_mode" in result.reason and "sonar" in result.reason


def test_plot_of_two_sweeps_from_their_json(tmp_path: pathlib.Path) -> None:
    def cell(env: str, param: str, value: int, agents: int, rate: float | None) -> dict:
        return {
            "env": env,
            "param": param,
            "value": value,
            "agents": agents,
            "status": "ok" if rate else "skipped",
            "agent_steps_per_s": rate,
            "peak_rss_mb": 400.0 + agents / 10 if rate else None,
        }

    data = {
        "envs": 1,
        "environment": {},
        "sweeps": [
            {"env": "magent2/battle_v4", "param": "map_size", "retained": []},
            {"env": "swarm", "param": "n_agents", "retained": [{"agents": 64, "retained": 1.0}]},
        ],
        "cells": [
            cell("magent2/battle_v4", "map_size", 16, 12, 2e4),
            cell("magent2/battle_v4", "map_size", 128, 1300, None),
            cell("swarm", "n_agents", 64, 64, 1e5),
            cell("swarm", "n_agents", 4096, 4096, 4e6),
        ],
    }
    check_png(plot_env_scaling(data, tmp_path / "two.png"))


def test_bench_scaling_of_any_env_command(tmp_path: pathlib.Path) -> None:
    argv = ["--env", "swarm", "--param", "n_agents=3", "--env-arg", "swarm:k_nearest=2"]
    out = marlkit_cmd(
        "bench", "scaling", *argv, "--min-seconds", "0", "--min-steps", "1", "--json",
        "--no-plot", "--out", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["sweeps"][0]["kwargs"] == {"k_nearest": 2}
    assert [(c["agents"], c["status"]) for c in data["cells"]] == [(3, "ok")]
    assert "swarm  n_agents=3" in out.stderr  # the table
    assert not (tmp_path / "scaling.png").exists()


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (
            ["--env", "magent2/batle_v4", "--param", "map_size=16"],
            "no MAgent2 task 'batle_v4'. Did you mean: battle_v4?",
        ),
        (["--env", "swam", "--param", "n_agents=16"], "no env registered as 'swam'."),
        (
            ["--env", "swarm", "--param", "n_agent=16"],
            "swarm takes no keyword 'n_agent'. Did you mean: n_agents?",
        ),
        (
            ["--env", "swarm", "--param", "n_agents=16,big"],
            "--param n_agents: values must be integers >= 1 (e.g. n_agents=16,32,64), got 'big'",
        ),
        (["--env", "swarm", "--param", "n_agents=1.5"], "got '1.5' in 'n_agents=1.5'"),
        (["--env", "swarm", "--param", "n_agents=0"], "--param n_agents must be an int >= 1"),
        (["--env", "swarm", "--param", "16,32"], "--param takes NAME=V1,V2,..."),
        (["--env", "swarm", "--param", "num_envs=4"], "the benchmark sets num_envs itself"),
        (["--env", "swarm"], "each --env needs its --param NAME=V1,V2,..."),
        (["--param", "n_agents=4"], "--param and --env-arg go with --env NAME"),
        (
            ["--env", "swarm", "--param", "n_agents=4", "--backends", "native"],
            "--backends: options of navigation's backend sweep",
        ),
        (
            ["--env", "swarm", "--param", "n_agents=4", "--env-arg", "vmas/x:n=1"],
            "--env-arg 'vmas/x:n=1' names 'vmas/x', which is not an --env",
        ),
    ],
)
def test_bad_env_sweeps_exit_2_naming_what_is_wrong(
    argv: list[str], match: str, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    assert main(["bench", "scaling", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert match in err, err
    assert not (tmp_path / "scaling.json").exists()
