"""What each side of a benchmark cell computes (marlkit.bench.work): the like-for-like native
settings are VMAS navigation's defaults, and the "work" objects of both sides say so."""

from __future__ import annotations

import pytest

from marlkit.bench import CellSpec, ScalingConfig, make_stepper, run_scaling
from marlkit.bench.work import VMAS_NAVIGATION, WORK_LABELS, native_kwargs, vmas_spawning
from marlkit.cli import main

TINY = {"min_seconds": 0.0, "min_steps": 1}
#: Keys on which the like-for-like native side must match VMAS exactly.
SAME = ("observation", "observation_size", "agent_radius", "substeps", "dt", "drag", "done")


def test_like_for_like_settings_are_vmas_defaults() -> None:
    stepper = make_stepper(CellSpec("vmas", "navigation", envs=2, agents=4))
    scenario, world = stepper.env.scenario, stepper.env.world
    assert {
        "n_lidar_rays": scenario.n_lidar_rays,
        "lidar_range": scenario.lidar_range,
        "agent_radius": scenario.agent_radius,
        "substeps": world._substeps,
        "dt": world.dt,
        "drag": world._drag,
    } == VMAS_NAVIGATION


@pytest.mark.parametrize("agents", [4, 64])
def test_native_lidar_work_matches_vmas_work(agents: int) -> None:
    native = make_stepper(CellSpec("native", "navigation", envs=2, agents=agents)).info["work"]
    vmas = make_stepper(CellSpec("vmas", "navigation", envs=2, agents=agents)).info["work"]
    assert set(native) == set(vmas)
    for key in SAME:
        assert native[key] == vmas[key], key
    for key in ("kind", "rays", "range", "hits"):
        assert native["sensor"][key] == vmas["sensor"][key], key
    assert native["work"] == "lidar" and native["label"] == WORK_LABELS["lidar"]
    # The native box is VMAS's spawning square (VMAS itself is unbounded).
    assert (
        native["world_bounds"] == f"box [-{vmas_spawning(agents):g}, {vmas_spawning(agents):g}]^2"
    )
    assert vmas["world_bounds"] == "unbounded" and vmas["spawn_half_width"] == vmas_spawning(agents)
    assert native["not_done_by_the_peer"] and vmas["not_done_by_the_peer"]


def test_knn_work_is_labelled_different() -> None:
    info = make_stepper(CellSpec("native", "navigation", envs=2, agents=4, work="knn")).info
    work = info["work"]
    assert work["work"] == "knn" and work["label"].startswith("different work")
    assert work["sensor"]["kind"] == "knn" and work["observation_size"] == 6 + 2 * 3
    assert work["agent_radius"] == 0.05 and work["substeps"] == 4  # native navigation defaults
    assert native_kwargs("knn", 4) == {}


def test_a_sweep_passes_its_work_to_the_native_cells() -> None:
    config = ScalingConfig(
        agents=(3,), envs=2, backends=("native",), isolate="none", work="knn", **TINY
    )
    report = run_scaling(config, progress=False)
    assert report.cells[0].info["work"]["work"] == "knn"
    assert report.to_dict()["settings"]["work"] == "knn"
    assert "native work: knn (different work" in report.table()
    default = run_scaling(
        ScalingConfig(agents=(3,), envs=2, backends=("native",), isolate="none", **TINY),
        progress=False,
    )
    assert default.cells[0].info["work"]["sensor"]["rays"] == 12


def test_bad_work_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"work must be one of \['lidar', 'knn'\], got 'rays'"):
        native_kwargs("rays", 4)
    with pytest.raises(ValueError, match=r"work must be one of \['lidar', 'knn'\], got 'rays'"):
        CellSpec("native", "navigation", 1, 1, work="rays")
    with pytest.raises(ValueError, match=r"work must be one of \['lidar', 'knn'\], got 'x'"):
        ScalingConfig(work="x")
    with pytest.raises(SystemExit):
        main(["bench", "scaling", "--work", "rays"])
    assert "argument --work: invalid choice: 'rays'" in capsys.readouterr().err
