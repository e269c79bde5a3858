"""Experiment grids (marlkit.train.experiment): a YAML grid checked and expanded into runs of the
training scripts, run for real (tiny MAPPO runs on native navigation) on local processes and on
a local Ray cluster of two nodes, skipped when done, resumed when killed, a failure isolated."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from marlkit._files import lock_folder
from marlkit.cli import main
from marlkit.record import read_metrics
from marlkit.train import Experiment, Grid
from marlkit.train.experiment import (
    INDEX_KEYS,
    GridFolderInUse,
    Progress,
    format_progress,
    read_index,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "sota-implementations"

#: Two iterations of 8 envs x 25 steps, small networks, no videos, CSV logs (tests/sota's budget).
TINY = [
    "env.num_envs=8",
    "env.max_steps=25",
    "collector.frames_per_batch=400",
    "collector.total_frames=800",
    "train.epochs=2",
    "train.minibatch_size=200",
    "policy.num_cells=32",
    "critic.num_cells=32",
    "eval.every=0",
    "eval.num_envs=2",
    "eval.video=false",
    "logger.backends=[csv]",
]


def grid(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "tiny",
        "tasks": {"navigation": {"random": -0.25, "reference": 1.0}},
        "algorithms": {"mappo": "mappo_ippo"},
        "seeds": [0],
        "common": TINY,
        "threads": 1,
    }
    data.update(changes)
    return data


def write(path: pathlib.Path, data: dict[str, Any]) -> pathlib.Path:
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


# ---------------------------------------------------------------------------- the grid
def test_a_grid_expands_into_runs_of_the_scripts() -> None:
    g = Grid.from_dict(
        grid(
            tasks={"navigation": None, "vmas/balance": {"overrides": ["env.num_envs=4"]}},
            algorithms={
                "mappo": "mappo_ippo",
                "ippo": {"config": "mappo_ippo", "overrides": ["critic.centralised=false"]},
                "fast": "mappo_fast",  # a top config built on mappo_ippo.yaml
                "qmix": {"config": "qmix_vdn", "tasks": ["navigation"]},
            },
            seeds=2,
            overrides={"default": [], "small": ["policy.num_cells=16"]},
        )
    )
    runs = g.runs()
    assert len(runs) == (4 + 3) * 2 * 2  # qmix on navigation only
    by_name = {r.name: r for r in runs}
    assert len(by_name) == len(runs)
    run = by_name["vmas-balance_fast_small_s1"]
    assert (run.task, run.algorithm, run.overrides, run.seed) == (
        "vmas/balance",
        "fast",
        "small",
        1,
    )
    assert run.script == SCRIPTS / "mappo_ippo" / "mappo_ippo.py" and run.config == "mappo_fast"
    argv = run.argv(pathlib.Path("/g/runs/x"), 3, resume=False)
    assert argv[1:4] == [str(run.script), "--config-name", "mappo_fast"]
    assert argv[4:6] == ["env=vmas/balance", "algorithm=fast"]
    assert argv[-3:] == ["seed=1", "threads=3", "run_dir=/g/runs/x"]
    assert [a for a in argv if a in ("env.num_envs=4", "policy.num_cells=16")] == [
        "env.num_envs=4",
        "policy.num_cells=16",
    ]
    resumed = run.argv(pathlib.Path("/g/runs/x"), 1, resume=True)
    assert resumed[-2:] == ["run_dir=/g/runs/x", "resume=/g/runs/x"]
    assert by_name["navigation_qmix_default_s0"].script.name == "qmix_vdn.py"
    assert not any(r.algorithm == "qmix" and r.task != "navigation" for r in runs)
    spec = g.to_dict()
    assert spec["references"] == {}  # none declared
    assert spec["algorithms"]["fast"]["script"] == "mappo_ippo"


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"task": {}}, ValueError, r"unknown key 'task'\. Did you mean: tasks\?"),
        (
            {"tasks": {"navigaton": None}},
            ValueError,
            r"tasks\.navigaton: no env config .*"
            r"Did you mean: navigation, vmas/navigation\?",
        ),
        ({"tasks": {"vmas/balanse": None}}, ValueError, r"Did you mean: vmas/balance\?"),
        (
            {"algorithms": {"x": "mapo_ippo"}},
            ValueError,
            r"algorithms\.x: no top config "
            r"'mapo_ippo'.*Did you mean: mappo_ippo\?",
        ),
        ({"algorithms": {"qmix_vd": None}}, TypeError, r"algorithms\.qmix_vd must be a mapping"),
        (
            {"algorithms": {"m": {"config": "mappo_ippo", "overide": []}}},
            ValueError,
            r"algorithms\.m: unknown key 'overide'\. Did you mean: overrides\?",
        ),
        (
            {"algorithms": {"m": {"config": "mappo_ippo", "tasks": ["navigatio"]}}},
            ValueError,
            r"algorithms\.m\.tasks must be one of \['navigation'\].*Did you mean: navigation\?",
        ),
        ({"tasks": {}}, ValueError, r"tasks: at least one is needed"),
        ({"seeds": "0,1"}, TypeError, r"seeds must be a count .* or a list of ints"),
        ({"seeds": [0, 0]}, ValueError, r"seeds lists a seed twice"),
        ({"seeds": [0, -1]}, ValueError, r"seeds\[1\] must be an int >= 0, got -1"),
        ({"seeds": 0}, ValueError, r"seeds must be an int >= 1, got 0"),
        ({"common": ["train.lr"]}, ValueError, r"common: 'train.lr' is not a Hydra override"),
        ({"common": ["seed=3"]}, ValueError, r"common: 'seed=3' sets 'seed', which the grid"),
        ({"overrides": {"a": ["+env=x"]}}, ValueError, r"overrides\.a: '\+env=x' sets 'env'"),
        (
            {"tasks": {"navigation": {"random": 0.0}}},
            ValueError,
            r"tasks\.navigation: random and reference go together",
        ),
        (
            {"tasks": {"navigation": {"random": 1.0, "reference": 1.0}}},
            ValueError,
            r"reference equals random",
        ),
        (
            {"tasks": {"navigation": {"random": "low", "reference": 1.0}}},
            TypeError,
            r"tasks\.navigation\.random must be a finite number",
        ),
        (
            {"tasks": {"navigation": {"random": float("nan"), "reference": 1.0}}},
            TypeError,
            r"tasks\.navigation\.random must be a finite number",
        ),
        ({"threads": 0}, ValueError, r"grid tiny: threads must be an int >= 1 or None, got 0"),
    ],
)
def test_bad_grids_are_refused_naming_the_key(changes: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Grid.from_dict(grid(**changes))


def test_bad_files_and_launcher_arguments(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        Grid.from_yaml(tmp_path / "none.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(TypeError, match=r"grid .*list\.yaml must be a mapping"):
        Grid.from_yaml(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("tasks: [\n")
    with pytest.raises(ValueError, match="not YAML"):
        Grid.from_yaml(tmp_path / "bad.yaml")
    g = Grid.from_dict(grid())
    with pytest.raises(
        ValueError,
        match=r"launcher must be one of \['local', 'ray'\], got "
        r"'rey'\. Did you mean: ray\?",
    ):
        Experiment(g, tmp_path, launcher="rey")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="parallel must be an int >= 1 or None, got 0"):
        Experiment(g, tmp_path, parallel=0)
    with pytest.raises(TypeError, match="threads must be an int >= 1 or None, got float"):
        Experiment(g, tmp_path, threads=1.5)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="holds no experiment grid"):
        read_index(tmp_path)


def test_parallel_and_threads_fit_the_cores() -> None:
    g = Grid.from_dict(grid(threads=None))
    cores = os.cpu_count() or 1
    exp = Experiment(g, parallel=1)
    assert (exp.parallel, exp.threads) == (1, cores)
    exp = Experiment(g, threads=1)
    assert (exp.parallel, exp.threads) == (cores, 1)
    assert Experiment(g).parallel * Experiment(g).threads <= cores


def test_progress_reads_as_counts_and_eta() -> None:
    p = Progress(total=8, done=3, running=2, failed=1, pending=2, elapsed_s=65.2, eta_s=130)
    assert format_progress(p) == "3/8 done, 2 running, 1 failed, 2 pending | 1m05s, ETA 2m10s"
    assert format_progress(Progress(1, 0, 1, 0, 0)).endswith("| 0s, ETA ?")


def test_one_launcher_at_a_time(tmp_path: pathlib.Path) -> None:
    held = lock_folder(tmp_path, ".marlkit-grid.lock", what="x", advice="y")
    try:
        with pytest.raises(GridFolderInUse, match=r"in use by another experiment launcher"):
            Experiment(Grid.from_dict(grid()), tmp_path).run()
    finally:
        assert held is not None
        held.close()
    assert not (tmp_path / "index.json").exists()  # refused before writing anything


# ---------------------------------------------------------------------------- real runs
@pytest.mark.slow  # two script processes: ~10 s alone, ~30 s on a loaded machine
def test_a_grid_runs_skips_what_is_done_and_isolates_a_failure(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One good run and one whose config the script refuses, two at a time: the good one ends
    ``done`` whatever the other does; a second start skips it and tries the failed one again."""
    path = write(
        tmp_path / "g.yaml",
        grid(
            algorithms={
                "mappo": "mappo_ippo",
                "broken": {"config": "mappo_ippo", "overrides": ["train.epochs=0"]},
            }
        ),
    )
    out = tmp_path / "grid"
    seen: list[Progress] = []
    entries = Experiment(path, out, parallel=2, threads=1).run(progress=seen.append)
    assert [tuple(e) for e in entries] == [INDEX_KEYS] * 2
    assert read_index(out) == entries
    good, bad = entries
    assert good["name"] == "navigation_mappo_s0" and good["status"] == "done"
    assert (good["returncode"], good["overrides"], good["seed"]) == (0, "default", 0)
    assert good["run_dir"] == "runs/navigation_mappo_s0" and good["wall_s"] > 0
    summary = json.loads((out / good["run_dir"] / "summary.json").read_text())
    assert summary["algorithm"] == "mappo" and summary["env"] == "navigation"
    assert [r["step"] for r in read_metrics(out / good["run_dir"] / "metrics.csv")] == [1, 2]
    assert bad["status"] == "failed" and bad["returncode"] != 0
    assert "train.epochs must be an int >= 1, got 0" in (out / bad["log"]).read_text()
    assert seen[-1] == Progress(2, 1, 0, 1, 0, seen[-1].elapsed_s, seen[-1].eta_s)
    assert any(p.running == 2 for p in seen)
    spec = json.loads((out / "grid.json").read_text())
    assert spec["references"] == {"navigation": {"random": -0.25, "reference": 1.0}}
    assert (out / "grid.yaml").read_text() == path.read_text()

    # `marlkit experiment status` reads the index; the failed run's log is named
    assert main(["experiment", "status", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "done     navigation_mappo_s0" in printed and "failed   navigation_broken_s0" in printed
    assert f"log: {out / bad['log']}" in printed

    # started again: the finished run is skipped, the failed one tried again (and logged again)
    metrics = out / good["run_dir"] / "metrics.csv"
    stamp = metrics.stat().st_mtime_ns
    again = Experiment(path, out, parallel=2, threads=1).run()
    assert metrics.stat().st_mtime_ns == stamp
    assert again[0] == good
    assert again[1]["status"] == "failed"
    assert (out / bad["log"]).read_text().count("# marlkit experiment ") == 2


def test_cli_mistakes_are_one_line_and_status_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path / "bad.yaml", grid(algorithms={"mapo": None}))
    cases = [
        (["run", str(bad)], "algorithms.mapo must be a mapping"),
        (["run", str(tmp_path / "none.yaml")], "no such file"),
        (["run", str(write(tmp_path / "g.yaml", grid())), "--parallel", "0"], "parallel must be"),
        (["status", str(tmp_path)], "holds no experiment grid"),
    ]
    for argv, message in cases:
        assert main(["experiment", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("marlkit: error: ") and message in err, (argv, err)
        assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_killed_launcher_started_again_counts_every_run_once(tmp_path: pathlib.Path) -> None:
    """``marlkit experiment run`` killed (SIGKILL) while its two runs are half-way: its runs die
    with it, and the grid started again resumes both from their checkpoints; each run's
    metrics.csv then holds each iteration once. Twenty iterations: with five, one run could
    finish before the other had checkpointed (their starts differ by a second or two, an
    iteration took a fifth of one), and the kill found it done."""
    n = 20
    budget = [*TINY, f"collector.total_frames={400 * n}", "checkpoint.every=1"]
    path = write(tmp_path / "g.yaml", grid(seeds=[0, 1], common=budget))
    out = tmp_path / "grid"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "marlkit.cli",
            "experiment",
            "run",
            str(path),
            "--out",
            str(out),
            "--parallel",
            "2",
            "--threads",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runs = [out / "runs" / f"navigation_mappo_s{seed}" for seed in (0, 1)]
    deadline = time.monotonic() + 240
    while not all(len(list((r / "checkpoints").glob("*"))) >= 2 for r in runs):
        assert launcher.poll() is None and time.monotonic() < deadline, "no checkpoints came"
        time.sleep(0.1)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    pids = [int((r / ".marlkit-run.lock").read_text()) for r in runs]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids):  # the runs die with their launcher
        assert time.monotonic() < deadline, "a run outlived its launcher"
        time.sleep(0.05)
    assert {e["status"] for e in read_index(out)} == {"running"}
    rows_before = [len(read_metrics(r / "metrics.csv")) for r in runs]
    assert all(rows < n for rows in rows_before), rows_before

    entries = Experiment(path, out, parallel=2, threads=1).run()
    assert [e["status"] for e in entries] == ["done", "done"]
    assert [e["name"] for e in entries] == [r.name for r in runs]
    for entry, run in zip(entries, runs):
        assert [r["step"] for r in read_metrics(run / "metrics.csv")] == list(range(1, n + 1))
        log = (out / entry["log"]).read_text()
        assert f"resume={run}" in log.split("# marlkit experiment ")[-1].splitlines()[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead: its parent (gone) never reaped it
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["ray"])  # ``[ray]``: with the tests that start a Ray
def test_a_grid_on_a_ray_cluster_of_two_nodes(tmp_path: pathlib.Path, launcher: str) -> None:
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    ray = pytest.importorskip("ray")
    args = {"include_dashboard": False, "object_store_memory": 80 * 1024**2}
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, **args})
    try:
        cluster.add_node(num_cpus=1, object_store_memory=80 * 1024**2)
        cluster.wait_for_nodes()
        path = write(tmp_path / "g.yaml", grid(seeds=[0, 1]))
        out = tmp_path / "grid"
        exp = Experiment(path, out, launcher=launcher, ray_address=cluster.address)  # type: ignore[arg-type]
        entries = exp.run()
        assert [e["status"] for e in entries] == ["done", "done"], [
            (out / e["log"]).read_text()[-2000:] for e in entries
        ]
        for e in entries:
            assert json.loads((out / e["run_dir"] / "summary.json").read_text())["frames"] == 800
        assert not ray.is_initialized()  # the launcher let go of the cluster it joined
    finally:
        cluster.shutdown()


def test_an_algorithm_runs_its_recipe_of_a_task_where_the_grid_names_one() -> None:
    """``per_task``: QMIX with its MPE recipe (``qmix_mpe``, the same script) on MPE and the
    default elsewhere, overrides after the algorithm's; the report still sees one algorithm."""
    g = Grid.from_dict(
        grid(
            tasks={"navigation": None, "pettingzoo/mpe2.simple_spread_v3": None},
            algorithms={
                "qmix": {
                    "config": "qmix_vdn",
                    "overrides": ["train.lr=1e-3"],
                    "per_task": {
                        "pettingzoo/mpe2.simple_spread_v3": {
                            "config": "qmix_mpe",
                            "overrides": ["train.lr=5e-4"],
                        }
                    },
                }
            },
        )
    )
    nav, mpe = g.runs()
    assert (nav.config, mpe.config) == ("qmix_vdn", "qmix_mpe")
    assert nav.script == mpe.script == SCRIPTS / "qmix_vdn" / "qmix_vdn.py"
    assert [a for a in nav.args if a.startswith("train.lr")] == ["train.lr=1e-3"]
    assert [a for a in mpe.args if a.startswith("train.lr")] == ["train.lr=1e-3", "train.lr=5e-4"]
    assert {r.algorithm for r in g.runs()} == {"qmix"}
    assert g.to_dict()["algorithms"]["qmix"]["per_task"] == {
        "pettingzoo/mpe2.simple_spread_v3": {"config": "qmix_mpe", "overrides": ["train.lr=5e-4"]}
    }


@pytest.mark.parametrize(
    ("per_task", "match"),
    [
        ({"navigaton": {}}, r"algorithms\.q\.per_task must be one of .*Did you mean: navigation"),
        ({"navigation": {"config": "qmix_mp"}}, r"no top config 'qmix_mp'.*Did you mean"),
        ({"navigation": {"config": "mappo_fast"}}, r"runs mappo_ippo\.py, .* runs qmix_vdn\.py"),
        ({"navigation": {"overide": []}}, r"unknown key 'overide'\. Did you mean: overrides\?"),
        ({"navigation": {"overrides": ["seed=1"]}}, r"'seed=1' sets 'seed'"),
    ],
)
def test_bad_per_task_recipes_are_refused_naming_the_key(per_task: dict, match: str) -> None:
    algorithms = {"q": {"config": "qmix_vdn", "per_task": per_task}}
    with pytest.raises(ValueError, match=match):
        Grid.from_dict(grid(tasks={"navigation": None}, algorithms=algorithms))
