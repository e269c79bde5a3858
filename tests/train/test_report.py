"""marlkit.train.report: a grid's results read from its index and run folders, rliable's
statistics checked against numbers computed by hand, marl-eval's JSON and the report files."""

from __future__ import annotations

import json
import math
import os
import pathlib

import numpy as np
import pytest

import marlkit
from marlkit.collectors import Collector
from marlkit.envs import Compose, RewardSum, StepCounter, TransformedEnv
from marlkit.record import CSVLogger, read_metrics
from marlkit.train import TrainingRun
from marlkit.train import report as rp

REPS = 300  # bootstrap resamples: enough for the intervals' properties tested here


# ---------------------------------------------------------------------------- grid folders
def write_run(folder: pathlib.Path, evals: list[tuple[int, float]], final: float | None) -> None:
    """A run folder in TrainingRun's format: metrics.csv by the real CSVLogger (training rows
    without evaluation between the evaluated ones), summary.json as summarise_run writes it."""
    folder.mkdir(parents=True)
    with CSVLogger(folder / "metrics.csv") as log:
        for step, (frames, reward) in enumerate(evals, start=1):
            log.log({"frames": float(frames), "agents/episode_reward": 0.0}, step=2 * step - 1)
            log.log(
                {"frames": float(frames), "eval/agents/episode_reward": reward},
                step=2 * step,
            )
    if final is not None:
        summary = {
            "trained": {"agents/episode_reward": final, "episode_length": 5.0},
            "random": {"agents/episode_reward": 0.0, "episode_length": 5.0},
        }
        (folder / "summary.json").write_text(json.dumps(summary))


def write_grid(
    grid: pathlib.Path,
    finals: dict[tuple[str, str, int], float | None],
    references: dict[str, tuple[float, float]] | None = None,
    overrides: str = "default",
) -> pathlib.Path:
    """A grid folder as marlkit.train.experiment leaves it: index.json (absolute paths) and
    grid.json; a final of None is a failed run (its folder without a summary)."""
    entries = []
    for (task, algo, seed), final in finals.items():
        name = f"{task.replace('/', '-')}_{algo}_s{seed}"
        run_dir = grid / "runs" / name
        value = final if final is not None else 0.0
        write_run(run_dir, [(100, value / 2), (200, value)], final)
        entries.append(
            {
                "name": name,
                "task": task,
                "algorithm": algo,
                "overrides": overrides,
                "seed": seed,
                "run_dir": str(run_dir),
                "status": "done" if final is not None else "failed",
                "log": str(grid / "logs" / f"{name}.log"),
                "returncode": 0 if final is not None else 1,
                "wall_s": 1.5,
            }
        )
    (grid / "index.json").write_text(json.dumps(entries))
    tasks = {t for t, _, _ in finals}
    refs = references or {}
    spec = {
        t: {
            "env": t,
            "random": refs[t][0] if t in refs else None,
            "reference": refs[t][1] if t in refs else None,
            "metric": "agents/episode_reward",
            "overrides": [],
        }
        for t in sorted(tasks)
    }
    (grid / "grid.json").write_text(json.dumps({"name": grid.name, "tasks": spec}))
    return grid


# Normalised scores chosen so that the statistics are easy to work out by hand. Task "t1" is
# normalised by random 0, reference 10; task "vmas/t2" by random -1, reference 1.
REFS = {"t1": (0.0, 10.0), "vmas/t2": (-1.0, 1.0)}
NORMALISED = {
    "A": {"t1": [0.1, 0.2, 0.3, 0.4], "vmas/t2": [0.5, 0.6, 0.7, 1.6]},
    "B": {"t1": [0.0, 0.0, 0.2, 0.2], "vmas/t2": [0.1, 0.3, 0.5, 0.5]},
}


def raw(task: str, normalised: float) -> float:
    low, high = REFS[task]
    return low + normalised * (high - low)


@pytest.fixture
def grid(tmp_path: pathlib.Path) -> pathlib.Path:
    finals: dict[tuple[str, str, int], float | None] = {
        (task, algo, seed): raw(task, scores[seed])
        for algo, tasks in NORMALISED.items()
        for task, scores in tasks.items()
        for seed in range(4)
    }
    return write_grid(tmp_path / "grid", finals, REFS)


# ---------------------------------------------------------------------------- reading
def _nav(num_envs: int = 2) -> TransformedEnv:
    env = marlkit.make("navigation", num_envs=num_envs, n_agents=2, seed=0)
    return TransformedEnv(env, Compose(StepCounter(5), RewardSum()))


def test_load_results_reads_real_training_runs(tmp_path):
    grid = tmp_path / "grid"
    entries = []
    for seed, status in ((0, "done"), (1, "running")):
        run_dir = grid / "runs" / f"nav_s{seed}"
        collector = Collector(_nav(), None, frames_per_batch=10, total_frames=40)
        run = TrainingRun(
            run_dir, eval_env=_nav(), eval_steps=5, eval_every=2, video=False, backends=["csv"]
        )
        for batch in run.batches(collector):
            run.end_iteration(batch, {}, policy=None, state=dict, frames=collector.frames)
        if status == "done":
            run.finish(None)
        else:
            run.close()
        entries.append(
            {
                "name": f"nav_s{seed}",
                "task": "navigation",
                "algorithm": "random",
                "overrides": "default",
                "seed": seed,
                "run_dir": str(run_dir),
                "status": status,
                "log": str(grid / "logs" / f"nav_s{seed}.log"),
                "returncode": None,
                "wall_s": None,
            }
        )
    (grid / "index.json").write_text(json.dumps(entries))
    results = rp.load_results(grid)
    assert [r.name for r in results.runs] == ["nav_s0", "nav_s1"]
    done, running = results.runs
    summary = json.loads((grid / "runs" / "nav_s0" / "summary.json").read_text())
    assert {k: v for k, v in done.final.items() if k != "return"} == summary["trained"]
    assert done.score() == done.final["return"] == summary["trained"]["agents/episode_reward"]
    rows = read_metrics(grid / "runs" / "nav_s0" / "metrics.csv")
    evaluated = [r for r in rows if "eval/agents/episode_reward" in r]
    assert [(s, f) for s, f, _ in done.evaluations] == [(2, 20), (4, 40)]
    assert [m["agents/episode_reward"] for _, _, m in done.evaluations] == [
        r["eval/agents/episode_reward"] for r in evaluated
    ]
    # a run not done is listed, with its curve so far and no score
    assert results.not_done == [running] and running.final == {}
    assert len(running.evaluations) == 2
    with pytest.raises(KeyError, match=r"run 'nav_s1' \(running\) has no final 'return'"):
        running.score()
    assert results.metric_of("navigation") == rp.RETURN  # no grid.json: the groups' mean


def test_load_results_labels_override_sets_and_reads_grid_json(grid):
    results = rp.load_results(grid)
    assert results.tasks == ["t1", "vmas/t2"] and results.algorithms == ["A", "B"]
    assert results.references == REFS
    assert results.metrics == {"t1": "agents/episode_reward", "vmas/t2": "agents/episode_reward"}
    assert rp.load_results(grid, references={"t1": {"random": 1, "reference": 2}}).references == {
        "t1": (1.0, 2.0)
    }
    index = json.loads((grid / "index.json").read_text())
    index[0]["overrides"] = "small"  # two override sets: the method is algorithm+set
    (grid / "index.json").write_text(json.dumps(index))
    labels = {r.algorithm for r in rp.load_results(grid).runs}
    assert labels == {"A+small", "A+default", "B+default"}


# ---------------------------------------------------------------------------- statistics
def test_score_matrices_normalise_per_task(grid):
    results = rp.load_results(grid)
    matrices, left_out = results.score_matrices()
    for algo in "AB":
        expected = np.array([NORMALISED[algo]["t1"], NORMALISED[algo]["vmas/t2"]]).T
        np.testing.assert_allclose(matrices[algo], expected, atol=1e-12)
    assert left_out == {"A": [], "B": []}
    rawm, _ = results.score_matrices(normalised=False)
    np.testing.assert_allclose(rawm["B"][:, 1], [-0.8, -0.4, 0.0, 0.0])


def test_aggregates_match_hand_computed_values(grid):
    results = rp.load_results(grid)
    agg = rp.aggregate_scores(results, reps=REPS)
    # A's eight scores sorted: 0.1 0.2 0.3 0.4 0.5 0.6 0.7 1.6. IQM drops the lowest and the
    # highest quarter (two each): mean(0.3, 0.4, 0.5, 0.6) = 0.45. Mean: 4.4 / 8 = 0.55.
    # Median (rliable's: of the per-task mean scores): the task means are 0.25 and 0.85, their
    # median 0.55. Optimality gap (gamma 1): mean(1 - min(x, 1)) = 1 - (0.1+...+0.7 + 1) / 8
    # = 1 - 3.8 / 8 = 0.525.
    a = agg["A"]
    assert a["IQM"].point == pytest.approx(0.45)
    assert a["Mean"].point == pytest.approx(0.55)
    assert a["Median"].point == pytest.approx(0.55)
    assert a["Optimality gap"].point == pytest.approx(0.525)
    # B: 0 0 0.1 0.2 0.2 0.3 0.5 0.5: IQM mean(0.1, 0.2, 0.2, 0.3) = 0.2; mean 1.8 / 8 = 0.225;
    # task means 0.1 and 0.35: median 0.225.
    assert agg["B"]["IQM"].point == pytest.approx(0.2)
    assert agg["B"]["Mean"].point == pytest.approx(0.225)
    assert agg["B"]["Median"].point == pytest.approx(0.225)
    assert agg["B"]["Optimality gap"].point == pytest.approx(0.775)
    for algo in agg.values():
        for name in rp.AGGREGATES:
            est = algo[name]
            assert est.low <= est.point <= est.high and est.low < est.high
    # the stratified bootstrap keeps each task's runs in their task: the mean's interval is
    # within the means of A's resamples that are possible (each task's lowest / highest run)
    assert a["Mean"].low >= (0.1 + 0.5) / 2 and a["Mean"].high <= (0.4 + 1.6) / 2


def test_bootstrap_is_seeded_and_leaves_numpys_generator_alone(grid):
    results = rp.load_results(grid)
    np.random.seed(123)
    expected = np.random.rand(3)
    np.random.seed(123)
    first = rp.aggregate_scores(results, reps=REPS, seed=4)
    np.testing.assert_array_equal(np.random.rand(3), expected)
    assert rp.aggregate_scores(results, reps=REPS, seed=4) == first
    assert rp.aggregate_scores(results, reps=REPS, seed=5) != first
    narrow = rp.aggregate_scores(results, reps=REPS, seed=4, confidence=0.5)["A"]["Mean"]
    wide = first["A"]["Mean"]
    assert wide.low <= narrow.low <= narrow.high <= wide.high


def test_identical_runs_give_an_interval_of_zero_width(tmp_path):
    finals = {(t, "A", s): 5.0 for t in ("t1", "t2") for s in range(3)}
    grid = write_grid(tmp_path / "g", finals, {"t1": (0.0, 10.0), "t2": (0.0, 10.0)})
    est = rp.aggregate_scores(rp.load_results(grid), reps=REPS)["A"]["IQM"]
    assert est == (0.5, 0.5, 0.5)


def test_probability_of_improvement_by_hand(grid):
    results = rp.load_results(grid)
    poi = rp.probability_of_improvement(results, reps=REPS)
    # P(A > B) per task: each of A's 4 runs against each of B's 4, ties counting one half.
    # t1: A 0.1 beats B's two 0.0 (2); 0.2 beats 0.0, 0.0 and ties 0.2, 0.2 (2 + 1); 0.3 and
    # 0.4 beat all 4 (8): 13 / 16. vmas/t2: 0.5 beats 0.1, 0.3, ties 0.5, 0.5 (3); 0.6, 0.7,
    # 1.6 beat all (12): 15 / 16. Mean over tasks: 28 / 32 = 0.875.
    est = poi[("A", "B")]
    assert est.point == pytest.approx(0.875)
    assert est.low <= est.point <= est.high <= 1.0
    reverse = rp.probability_of_improvement(results, [("B", "A")], reps=REPS)[("B", "A")]
    assert reverse.point == pytest.approx(1 - 0.875)
    with pytest.raises(KeyError, match=r"no algorithm 'C'; the grid has \['A', 'B'\]"):
        rp.probability_of_improvement(results, [("A", "C")], reps=REPS)


def test_performance_profiles_by_hand(grid):
    results = rp.load_results(grid)
    _, profiles = rp.performance_profiles(results, [0.0, 0.25, 0.55, 1.0], reps=REPS)
    # the fraction of A's 8 scores above each tau: 8, 6 (0.3 ... 1.6), 3 (0.6, 0.7, 1.6), 1
    np.testing.assert_allclose(profiles["A"].point, [1.0, 0.75, 0.375, 0.125])
    # B: 0 0 0.1 0.2 0.2 0.3 0.5 0.5 -> above 0: 6; above 0.25: 3; above 0.55 and 1: 0
    np.testing.assert_allclose(profiles["B"].point, [0.75, 0.375, 0.0, 0.0])
    assert np.all(profiles["A"].low <= profiles["A"].point)
    assert np.all(profiles["A"].point <= profiles["A"].high)
    default_taus, _ = rp.performance_profiles(results, reps=20)
    assert default_taus[0] == 0.0 and default_taus[-1] == pytest.approx(1.6)
    with pytest.raises(ValueError, match="taus must be a 1-D sequence of finite numbers"):
        rp.performance_profiles(results, [0.0, math.nan], reps=REPS)


def test_task_curves_mean_over_seeds(grid):
    results = rp.load_results(grid)
    curves = rp.task_curves(results, "t1", reps=REPS)
    frames, est = curves["A"]
    np.testing.assert_array_equal(frames, [100, 200])
    finals = [raw("t1", s) for s in NORMALISED["A"]["t1"]]  # 1 2 3 4: the curve ends at them
    np.testing.assert_allclose(est.point, [np.mean(finals) / 2, np.mean(finals)])
    assert np.all(est.low < est.point) and np.all(est.point < est.high)
    assert est.low[1] >= min(finals) and est.high[1] <= max(finals)
    with pytest.raises(KeyError, match=r"no task 't3'; the grid has \['t1', 'vmas/t2'\]"):
        rp.task_curves(results, "t3")


def test_runs_not_done_are_left_out_of_the_statistics_and_listed(tmp_path):
    finals: dict[tuple[str, str, int], float | None] = {
        (t, "A", s): float(s) for t in ("t1", "t2") for s in range(3)
    }
    finals[("t2", "A", 1)] = None  # failed: seed 1 is not done on every task
    grid = write_grid(tmp_path / "g", finals, {"t1": (0.0, 1.0), "t2": (0.0, 1.0)})
    results = rp.load_results(grid)
    assert [r.name for r in results.not_done] == ["t2_A_s1"]
    matrices, left_out = results.score_matrices()
    np.testing.assert_array_equal(matrices["A"], [[0.0, 0.0], [2.0, 2.0]])
    assert left_out == {"A": [1]}
    paths = rp.write_report(grid, reps=REPS)
    text = paths["markdown"].read_text()
    assert "| t2_A_s1 | t2 | A | 1 | failed | 1 | logs/t2_A_s1.log |" in text
    assert "A: seeds [1] left out of the statistics across tasks" in text


# ---------------------------------------------------------------------------- export
def test_marl_eval_json_layout(grid):
    data = rp.marl_eval_json(rp.load_results(grid))
    assert set(data) == {"marlkit", "vmas"}  # "vmas/t2" is env vmas, task t2
    runs = data["vmas"]["t2"]["B"]
    assert set(runs) == {"seed_0", "seed_1", "seed_2", "seed_3"}
    run = runs["seed_1"]
    assert list(run) == ["step_2", "step_4", "absolute_metrics"]
    final = raw("vmas/t2", NORMALISED["B"]["vmas/t2"][1])
    assert run["step_4"] == {"step_count": 200, "agents_return": [final], "return": [final]}
    assert run["absolute_metrics"] == {
        "agents_return": [final],
        "episode_length": [5.0],
        "return": [final],
    }
    assert set(data["marlkit"]["t1"]) == {"A", "B"}
    json.dumps(data)  # plain JSON


# ---------------------------------------------------------------------------- the report
def test_write_report_writes_markdown_pngs_html_and_json(grid):
    paths = rp.write_report(grid, reps=REPS)
    assert paths["markdown"] == grid / "report.md"
    text = paths["markdown"].read_text()
    assert "| A | 0.450 [" in text  # the IQM column first
    assert "P(A > B) | 0.875 [" in text
    images = [line[line.index("(") + 1 : -1] for line in text.splitlines() if line.startswith("![")]
    assert len(images) == 5  # two tasks' curves, aggregates, profiles, improvement
    for name in images:
        assert (grid / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = paths["html"].read_text()
    assert page.count('src="data:image/png;base64,') == 5 and "report/" not in page
    exported = json.loads(paths["marl_eval"].read_text())
    assert exported == rp.marl_eval_json(rp.load_results(grid))

    # written again for one algorithm: the figure of a comparison no longer made is gone
    def only_a(entries):
        entries[:] = [e for e in entries if e["algorithm"] == "A"]

    _index(grid, only_a)
    rp.write_report(grid, reps=REPS)
    assert not (grid / "report" / "improvement.png").exists()
    assert (grid / "report" / "profiles.png").exists()


def test_report_without_references_has_no_statistics_across_tasks(tmp_path):
    finals = {(t, a, s): float(s) for t in ("t1", "t2") for a in ("A", "<b>B</b>") for s in (0, 1)}
    grid = write_grid(tmp_path / "g", finals, {"t1": (0.0, 1.0)})
    paths = rp.write_report(grid, reps=REPS)
    text = paths["markdown"].read_text()
    assert "no statistics across tasks: not every task has references" in text
    assert "Normalised scores" not in text and not (grid / "report" / "aggregates.png").exists()
    page = paths["html"].read_text()
    assert "&lt;b&gt;B&lt;/b&gt;" in page and "<b>B</b>" not in page  # names are escaped
    with pytest.raises(KeyError, match=r"task 't2' has no normalisation references.*\['t2'\]"):
        rp.write_report(grid, normalised=True, reps=REPS)
    with pytest.raises(KeyError, match="task 't2' has no normalisation references"):
        rp.aggregate_scores(rp.load_results(grid), reps=REPS)


# ---------------------------------------------------------------------------- bad input
def _index(grid: pathlib.Path, change) -> None:
    entries = json.loads((grid / "index.json").read_text())
    change(entries)
    (grid / "index.json").write_text(json.dumps(entries))


def test_missing_and_damaged_index(tmp_path, grid):
    with pytest.raises(FileNotFoundError, match="is not a grid folder"):
        rp.load_results(tmp_path / "nothing")
    (grid / "index.json").write_text("[{")
    with pytest.raises(ValueError, match=r"index\.json' is not valid JSON"):
        rp.load_results(grid)
    (grid / "index.json").write_text('{"runs": []}')
    with pytest.raises(ValueError, match="must hold a list of runs, got dict"):
        rp.load_results(grid)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda e: e[0].pop("seed"), ValueError, r"entry 0 has no 'seed'"),
        (lambda e: e[1].update(seed=True), ValueError, r"entry 1: 'seed' must be an int, got True"),
        (lambda e: e[0].update(task=""), ValueError, r"'task' must be a non-empty string"),
        (lambda e: e[0].update(status="won"), ValueError, r"'status' must be one of"),
        (lambda e: e[0].update(overrides=["x=1"]), ValueError, r"override set's name"),
        (lambda e: e[0].update(returncode="0"), ValueError, r"'returncode' must be an int"),
        (lambda e: e.append(7), ValueError, r"entry 16 must be an object, got int"),
        (lambda e: e[1].update(name=e[0]["name"]), ValueError, r"lists run 't1_A_s0' .* twice"),
        (lambda e: e[0].update(run_dir="../../etc"), ValueError, r"leads outside the grid"),
        (lambda e: e[0].update(run_dir="/etc"), ValueError, r"'run_dir' '/etc' leads outside"),
        (lambda e: e[0].update(log="logs/../../x.log"), ValueError, r"'log' .* leads outside"),
    ],
)
def test_crafted_index_entries_are_refused(grid, change, error, match):
    _index(grid, change)
    with pytest.raises(error, match=match):
        rp.load_results(grid)


def test_a_symbolic_link_out_of_the_grid_is_refused(tmp_path, grid):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (grid / "runs" / "link").symlink_to(outside)
    _index(grid, lambda e: e[0].update(run_dir=str(grid / "runs" / "link")))
    with pytest.raises(ValueError, match="leads outside the grid folder"):
        rp.load_results(grid)


def test_bad_scores_and_run_folders(grid):
    summary = grid / "runs" / "t1_A_s0" / "summary.json"
    data = json.loads(summary.read_text())
    data["trained"]["agents/episode_reward"] = math.nan
    summary.write_text(json.dumps(data))  # NaN, as Python's json writes it
    with pytest.raises(ValueError, match=r"run 't1_A_s0': summary.json: 'agents/episode_reward'"):
        rp.load_results(grid)
    data["trained"] = {"episode_length": 5.0}
    summary.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="has no '<group>/episode_reward'"):
        rp.load_results(grid)
    summary.write_text('{"trained": ')
    with pytest.raises(ValueError, match=r"t1_A_s0/summary\.json' is not valid JSON"):
        rp.load_results(grid)
    os.remove(summary)
    with pytest.raises(FileNotFoundError, match=r"'t1_A_s0' is marked done .* does not exist"):
        rp.load_results(grid)


@pytest.mark.parametrize(
    ("references", "error", "match"),
    [
        ({"t1": {"random": 1.0, "reference": 1.0}}, ValueError, "they must differ"),
        ({"t1": {"random": 0.0}}, ValueError, r"must be \{random: <score>, reference: <score>\}"),
        ({"t1": {"random": math.nan, "reference": 1.0}}, ValueError, "random"),
        ([1.0, 2.0], TypeError, "references must be a mapping"),
    ],
)
def test_bad_references(grid, references, error, match):
    with pytest.raises(error, match=match):
        rp.load_results(grid, references=references)


def test_bad_statistics_arguments(grid, tmp_path):
    results = rp.load_results(grid)
    with pytest.raises(ValueError, match="reps must be"):
        rp.aggregate_scores(results, reps=0)
    with pytest.raises(ValueError, match="confidence must be"):
        rp.aggregate_scores(results, confidence=1.0)
    with pytest.raises(KeyError, match="has no final 'agents/won'"):
        rp.aggregate_scores(results, metric="agents/won", reps=REPS)
    pending = write_grid(tmp_path / "p", {("t1", "A", 0): None}, {"t1": (0.0, 1.0)})
    with pytest.raises(ValueError, match=r"no run of the grid .* is done yet"):
        rp.aggregate_scores(rp.load_results(pending))
    with pytest.raises(ValueError, match=r"no run of the grid .* is done yet"):
        rp.write_report(pending)


def test_an_algorithm_failing_on_a_task_still_gets_its_per_task_report(tmp_path):
    finals: dict[tuple[str, str, int], float | None] = {
        (t, a, s): 0.5 for t in ("t1", "t2") for a in ("A", "B") for s in (0, 1)
    }
    finals[("t2", "B", 0)] = finals[("t2", "B", 1)] = None  # B failed on t2 with every seed
    grid = write_grid(tmp_path / "g", finals, {"t1": (0.0, 1.0), "t2": (0.0, 1.0)})
    with pytest.raises(ValueError, match=r"algorithm 'B' has no seed done on every task"):
        rp.aggregate_scores(rp.load_results(grid), reps=REPS)
    text = rp.write_report(grid, reps=REPS)["markdown"].read_text()
    assert "no statistics across tasks: algorithm 'B' has no seed done on every task" in text
    assert "| t1 | agents/episode_reward | 0.500 [0.500, 0.500] (2) | 0.500 [" in text
    assert "| t2 | agents/episode_reward | 0.500 [0.500, 0.500] (2) | - |" in text
