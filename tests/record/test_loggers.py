"""Metric loggers and plots on real files: CSV read back, TensorBoard event files read back with
TensorBoard's own reader, offline wandb runs, PNGs decoded, and a logging process killed with
SIGKILL and resumed."""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from marlkit.record import (
    CSVLogger,
    Logger,
    MultiLogger,
    TensorBoardLogger,
    WandbLogger,
    bootstrap_ci,
    make_logger,
    plot_curves,
    plot_with_bands,
    read_metrics,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True, scope="module")
def _stop_wandb_service():
    """wandb serves its runs from a ``wandb-core`` child process that outlives them: stopped
    after this module, so that later tests counting child processes do not see it."""
    yield
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


@pytest.fixture
def csv_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "run" / "metrics.csv"


def lines(path: pathlib.Path) -> list[str]:
    return path.read_text().splitlines()


# ---------------------------------------------------------------------------- CSV
def test_csv_round_trip_of_every_scalar_kind(csv_path: pathlib.Path) -> None:
    with CSVLogger(csv_path) as logger:  # the parent folder is created
        logger.log(
            {
                "float": 0.5,
                "int": 3,
                "bool": True,
                "tensor": torch.tensor(1.25),
                "tensor1": torch.tensor([2.5], dtype=torch.float64),
                "np32": np.float32(0.75),
                "array": np.array([[4.0]]),
                "long": torch.tensor(7),
            },
            step=10,
        )
        logger.log({"float": -1.0}, step=np.int64(20))
    assert lines(csv_path)[0] == "step,float,int,bool,tensor,tensor1,np32,array,long"
    assert lines(csv_path)[1] == "10,0.5,3.0,1.0,1.25,2.5,0.75,4.0,7.0"
    assert logger.columns == ("float", "int", "bool", "tensor", "tensor1", "np32", "array", "long")
    assert read_metrics(csv_path) == [
        {
            "step": 10,
            "float": 0.5,
            "int": 3.0,
            "bool": 1.0,
            "tensor": 1.25,
            "tensor1": 2.5,
            "np32": 0.75,
            "array": 4.0,
            "long": 7.0,
        },
        {"step": 20, "float": -1.0},
    ]
    assert all(type(row["step"]) is int for row in read_metrics(csv_path))


def test_csv_new_keys_widen_the_header_and_missing_ones_leave_empty_cells(
    csv_path: pathlib.Path,
) -> None:
    logger = CSVLogger(csv_path)
    logger.log({"loss": 1.0}, step=0)
    logger.log({"loss": 0.5, "reward": 2.0}, step=1)
    logger.log({"eval/reward": 3.0}, step=2)
    logger.log({"reward": 4.0, "loss": 0.25}, step=3)  # any order: columns keep first-seen order
    assert lines(csv_path) == [
        "step,loss,reward,eval/reward",
        "0,1.0,,",
        "1,0.5,2.0,",
        "2,,,3.0",
        "3,0.25,4.0,",
    ]
    assert logger.rows() == [
        {"step": 0, "loss": 1.0},
        {"step": 1, "loss": 0.5, "reward": 2.0},
        {"step": 2, "eval/reward": 3.0},
        {"step": 3, "loss": 0.25, "reward": 4.0},
    ]
    assert [p.name for p in csv_path.parent.iterdir()] == ["metrics.csv"]  # no temporary left
    logger.close()


def test_csv_floats_round_trip_exactly(csv_path: pathlib.Path) -> None:
    values = [0.1 + 0.2, 1 / 3, 1e-300, 5e-324, 1.7976931348623157e308, -0.0, 123456789.123456789]
    values.append(float(torch.tensor(0.1, dtype=torch.float32)))  # float32 -> float64 exactly
    with CSVLogger(csv_path) as logger:
        for step, value in enumerate(values):
            logger.log({"x": value}, step=step)
    back = [row["x"] for row in read_metrics(csv_path)]
    assert back == values
    assert math.copysign(1.0, back[5]) == -1.0  # -0.0 keeps its sign


def test_csv_logs_nan_and_infinities(csv_path: pathlib.Path) -> None:
    with CSVLogger(csv_path) as logger:
        logger.log({"loss": float("nan"), "up": math.inf, "down": torch.tensor(-math.inf)}, 0)
    assert lines(csv_path)[1] == "0,nan,inf,-inf"
    (row,) = read_metrics(csv_path)
    assert math.isnan(row["loss"]) and row["up"] == math.inf and row["down"] == -math.inf


def test_csv_logs_a_tensordict_leaf_by_leaf(csv_path: pathlib.Path) -> None:
    losses = TensorDict(
        {"loss_objective": torch.tensor(0.5), "agents": {"entropy": torch.tensor([1.5])}}, []
    )
    with CSVLogger(csv_path) as logger:
        logger.log(losses, step=4)
    assert read_metrics(csv_path) == [{"step": 4, "loss_objective": 0.5, "agents/entropy": 1.5}]


def test_csv_refuses_an_existing_file_without_resume(csv_path: pathlib.Path) -> None:
    CSVLogger(csv_path).close()
    with pytest.raises(FileExistsError, match=r"metrics.csv.*already exists; pass resume=True"):
        CSVLogger(csv_path)


def test_csv_resume_and_truncate_leave_one_unbroken_file(csv_path: pathlib.Path) -> None:
    with CSVLogger(csv_path) as logger:
        for step in range(10):
            logger.log({"loss": float(step)}, step=step * 100)
        logger.log({"eval": 1.0}, step=500)
    # Killed after step 900; the last checkpoint is at step 400.
    with CSVLogger(csv_path, resume=True) as logger:
        assert logger.columns == ("loss", "eval")
        assert logger.truncate(400) == 6
        assert [r["step"] for r in logger.rows()] == [0, 100, 200, 300, 400]
        for step in range(5, 8):
            logger.log({"loss": -float(step)}, step=step * 100)
        assert logger.truncate(10_000) == 0
    rows = read_metrics(csv_path)
    assert [r["step"] for r in rows] == [0, 100, 200, 300, 400, 500, 600, 700]
    assert [r["loss"] for r in rows[4:]] == [4.0, -5.0, -6.0, -7.0]
    assert lines(csv_path)[0] == "step,loss,eval"  # the columns are kept


def test_csv_resume_without_a_file_starts_one(csv_path: pathlib.Path) -> None:
    with CSVLogger(csv_path, resume=True) as logger:
        assert logger.truncate(0) == 0
        logger.log({"a": 1.0}, step=1)
    assert read_metrics(csv_path) == [{"step": 1, "a": 1.0}]


def test_csv_resume_checks_the_step_column(csv_path: pathlib.Path) -> None:
    CSVLogger(csv_path, step_key="frames").close()
    with pytest.raises(ValueError, match=r"starts with the column 'frames', expected .*'step'"):
        CSVLogger(csv_path, resume=True)
    CSVLogger(csv_path, resume=True, step_key="frames").close()


def test_csv_tolerates_a_torn_last_line(csv_path: pathlib.Path) -> None:
    csv_path.parent.mkdir(parents=True)
    csv_path.write_text("step,loss,reward\n0,1.0,2.0\n10,0.5,\n20,0.2")  # killed mid-row
    assert read_metrics(csv_path) == [
        {"step": 0, "loss": 1.0, "reward": 2.0},
        {"step": 10, "loss": 0.5},
    ]
    with CSVLogger(csv_path, resume=True) as logger:
        logger.log({"loss": 0.25}, step=20)
    assert lines(csv_path) == ["step,loss,reward", "0,1.0,2.0", "10,0.5,", "20,0.25,"]


def test_csv_cuts_a_torn_row_off_before_the_next_one(
    csv_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A row torn by a failed write is cut off with a warning before the next row is written,
    # never glued to it ("20,0.220,0.25,", which read_metrics and resume=True would refuse).
    with CSVLogger(csv_path) as logger:
        logger.log({"loss": 1.0, "reward": 2.0}, step=10)
        with open(csv_path, "a") as f:
            f.write("20,0.2")  # what a write that failed part-way leaves
        with caplog.at_level("WARNING", logger="marlkit.record"):
            logger.log({"loss": 0.25}, step=20)
        # a complete row without its newline is torn too (a torn row can have all its cells)
        with open(csv_path, "a") as f:
            f.write("30,0.1,1.0")
        logger.log({"loss": 0.125}, step=30)
    assert lines(csv_path) == ["step,loss,reward", "10,1.0,2.0", "20,0.25,", "30,0.125,"]
    assert read_metrics(csv_path)[1:] == [{"step": 20, "loss": 0.25}, {"step": 30, "loss": 0.125}]
    assert re.search(
        r"metrics.csv ended in a torn row \(6 bytes without a newline: a write that failed or "
        r"was killed part-way\); it is cut off",
        caplog.text,
    )
    with CSVLogger(csv_path, resume=True) as logger:  # and a resume goes on with it
        assert logger.truncate(20) == 1
        logger.log({"loss": 0.5}, step=30)
    assert lines(csv_path)[-1] == "30,0.5,"


def test_csv_on_a_full_disk_names_the_file_and_leaves_no_torn_row(small_fs) -> None:
    # A row longer than the room left is an ENOSPC naming the file; nothing of it stays to be
    # glued to the next row.
    path = small_fs(2 * 1024 * 1024) / "metrics.csv"
    wide = {f"metric_{i:03d}": i / 7 for i in range(300)}  # a row of ~5 kB, beyond the page
    logger = CSVLogger(path)
    logger.log(wide, step=0)
    before = path.read_bytes()
    filler = path.parent / "filler"
    with contextlib.suppress(OSError):  # written until the disk is full
        filler.write_bytes(bytes(3 * 1024 * 1024))
    with pytest.raises(
        OSError, match=r"no space left on the device for '.*metrics.csv': [\d,]+ by"
    ):
        logger.log(wide, step=1)
    assert path.read_bytes() == before  # no part of the row
    with pytest.raises(OSError, match=r"no space left on the device for '.*metrics.csv'"):
        logger.log({"new": 1.0}, step=1)  # a new column: the rewrite fails, atomically
    assert path.read_bytes() == before and logger.columns == tuple(wide)
    filler.unlink()
    logger.log(wide, step=2)
    logger.close()
    assert [r["step"] for r in read_metrics(path)] == [0, 2]
    assert [r["step"] for r in CSVLogger(path, resume=True).rows()] == [0, 2]
    assert sorted(p.name for p in path.parent.iterdir()) == ["metrics.csv"]  # no temporary file


def test_csv_removes_the_temporary_file_of_a_killed_rewrite(csv_path: pathlib.Path) -> None:
    CSVLogger(csv_path).close()
    stale = csv_path.parent / ".metrics.csv.abc123"
    stale.write_text("step,lo")
    CSVLogger(csv_path, resume=True).close()
    assert not stale.exists()


def test_csv_checks_the_step_key(csv_path: pathlib.Path) -> None:
    with pytest.raises(TypeError, match=r"step_key must be a str, got int"):
        CSVLogger(csv_path, step_key=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"step_key must be a non-empty str"):
        CSVLogger(csv_path, step_key="")
    assert not csv_path.exists()


def test_csv_refuses_a_metric_named_like_the_step_column(csv_path: pathlib.Path) -> None:
    with (
        CSVLogger(csv_path) as logger,
        pytest.raises(ValueError, match=r"metric 'step' is the name of the step column"),
    ):
        logger.log({"step": 1.0}, step=0)


@pytest.mark.parametrize(
    ("step", "error", "match"),
    [
        ("3", TypeError, r"step must be an int >= 0, got str: '3'"),
        (1.0, TypeError, r"step must be an int >= 0, got float: 1.0"),
        (True, TypeError, r"step must be an int >= 0, got bool"),
        (-1, ValueError, r"step must be an int >= 0, got -1"),
    ],
)
def test_log_checks_the_step(csv_path: pathlib.Path, step: object, error: type, match: str) -> None:
    with CSVLogger(csv_path) as logger, pytest.raises(error, match=match):
        logger.log({"loss": 1.0}, step=step)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("metrics", "error", "match"),
    [
        ({1: 1.0}, TypeError, r"metric names must be str, got int: 1"),
        ({"": 1.0}, ValueError, r"metric names must be non-empty strings"),
        ({"loss": "low"}, TypeError, r"metric 'loss' must be a real number.*got str: 'low'"),
        ({"loss": None}, TypeError, r"metric 'loss' must be a real number.*got NoneType"),
        ({"loss": 1j}, TypeError, r"metric 'loss' must be a real number.*got complex"),
        ({"loss": torch.zeros(3)}, ValueError, r"metric 'loss' must be a scalar.*shape \[3\]"),
        (
            {"q": np.zeros((2, 2))},
            ValueError,
            r"metric 'q' must be a scalar.*ndarray of shape \[2, 2\]",
        ),
        ({"e": torch.zeros(0)}, ValueError, r"metric 'e' must be a scalar.*shape \[0\]"),
        ({"z": torch.tensor(1j)}, TypeError, r"metric 'z' must be real, got a complex Tensor"),
        ([("loss", 1.0)], TypeError, r"metrics must be a mapping .*, got list"),
    ],
)
def test_log_checks_the_metrics(
    csv_path: pathlib.Path, metrics: object, error: type, match: str
) -> None:
    with CSVLogger(csv_path) as logger:
        logger.log({"ok": 1.0}, step=0)
        with pytest.raises(error, match=match):
            logger.log({"new": 2.0, **metrics} if isinstance(metrics, dict) else metrics, 1)  # type: ignore[arg-type]
        assert logger.columns == ("ok",)  # nothing written: checked before anything is
        assert logger.rows() == [{"step": 0, "ok": 1.0}]


def test_log_after_close_raises_and_close_is_idempotent(csv_path: pathlib.Path) -> None:
    with CSVLogger(csv_path) as logger:
        logger.log({}, step=0)  # nothing to log: no row
    assert logger.closed
    logger.close()
    with pytest.raises(RuntimeError, match=r"cannot log to a closed CSVLogger"):
        logger.log({"loss": 1.0}, step=1)
    with pytest.raises(RuntimeError, match=r"cannot truncate a closed CSVLogger"):
        logger.truncate(0)
    assert lines(csv_path) == ["step"]


_CHILD = textwrap.dedent(
    """
    import sys
    from marlkit.record import CSVLogger

    path, start = sys.argv[1], int(sys.argv[2])
    logger = CSVLogger(path, resume=True)
    logger.truncate(start - 1)
    print("ready", flush=True)
    for step in range(start, 10**9):
        metrics = {"loss": step / 7, "reward": -step / 3}
        if step % 20 == 0:
            metrics[f"eval_{step}"] = float(step)  # a new column: the file is rewritten
        logger.log(metrics, step=step)
        print(step, flush=True)
    """
)


def _run_and_kill(path: pathlib.Path, start: int, after: int) -> list[int]:
    """Log from ``start`` in a child process, SIGKILL it once it reported ``after`` more rows;
    the steps it reported as logged."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), str(start)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        assert child.stdout.readline() == "ready\n"
        reported = [int(child.stdout.readline()) for _ in range(after)]
        os.kill(child.pid, signal.SIGKILL)
        reported += [int(line) for line in child.stdout.read().split()]
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    return reported


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_csv_survives_sigkill_and_resume(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "metrics.csv"
    reported = _run_and_kill(path, start=0, after=150)
    rows = read_metrics(path)  # parses: no torn or half-rewritten file
    steps = [r["step"] for r in rows]
    # Every step reported is in the file; at most one more (logged, killed before the print).
    assert steps[: len(reported)] == reported == list(range(len(reported)))
    assert len(steps) - len(reported) in (0, 1)
    assert all(r["loss"] == r["step"] / 7 and r["reward"] == -r["step"] / 3 for r in rows)

    # Resume from a "checkpoint" 37 steps back, killed again.
    checkpoint = reported[-37]
    reported2 = _run_and_kill(path, start=checkpoint + 1, after=100)
    assert reported2[0] == checkpoint + 1
    steps = [r["step"] for r in read_metrics(path)]
    assert steps[: reported2[-1] + 1] == list(range(reported2[-1] + 1))  # one unbroken run
    assert len(steps) - (reported2[-1] + 1) in (0, 1)
    columns = CSVLogger(path, resume=True).columns
    assert columns[:2] == ("loss", "reward")
    assert [c for c in columns[2:]] == [f"eval_{s}" for s in range(0, steps[-1] + 1, 20)]
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]


# ---------------------------------------------------------------------------- TensorBoard
def test_tensorboard_event_file_reads_back(tmp_path: pathlib.Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with TensorBoardLogger(tmp_path / "tb") as logger:
        logger.log({"loss": 1.5, "eval/reward": torch.tensor(2.0)}, step=0)
        logger.log({"loss": float("nan")}, step=100)
        logger.log({"loss": 0.25}, step=200)
    (event_file,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    assert event_file.stat().st_size > 0
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["eval/reward", "loss"]
    loss = [(e.step, e.value) for e in events.Scalars("loss")]
    assert [s for s, _ in loss] == [0, 100, 200]
    assert loss[0][1] == 1.5 and math.isnan(loss[1][1]) and loss[2][1] == 0.25
    assert [(e.step, e.value) for e in events.Scalars("eval/reward")] == [(0, 2.0)]
    with pytest.raises(RuntimeError, match="closed TensorBoardLogger"):
        logger.log({"loss": 1.0}, step=300)


def test_tensorboard_resume_in_the_same_second_reads_back_in_order(tmp_path: pathlib.Path) -> None:
    # TensorBoard reads a folder's files sorted by name: second, host, pid, counter. A
    # first writer whose pid sorted after the resumed one's ("99999999" > "4321") in the
    # same second was read last: the purged steps came back after the new ones
    import socket
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with TensorBoardLogger(tmp_path) as first:
        for step in (1, 2, 3):
            first.log({"x": float(step)}, step=step)
    (written,) = tmp_path.glob("events.out.tfevents.*")
    now = int(time.time())
    written.rename(tmp_path / f"events.out.tfevents.{now:010d}.{socket.gethostname()}.99999999.9")
    with TensorBoardLogger(tmp_path, purge_step=3) as resumed:  # the checkpoint was at 2
        resumed.log({"x": 30.0}, step=3)
        resumed.log({"x": 40.0}, step=4)
    names = sorted(p.name for p in tmp_path.glob("events.out.tfevents.*"))
    assert names[0].endswith(".99999999.9") and int(names[1].split(".")[3]) > now
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("x")] == [(1, 1), (2, 2), (3, 30), (4, 40)]


# ---------------------------------------------------------------------------- wandb
def test_wandb_offline_run(tmp_path: pathlib.Path) -> None:
    import wandb

    config = {"lr": 3e-4, "net": {"cells": [64, 64]}}
    with WandbLogger(dir=tmp_path, name="test-run", config=config) as logger:
        assert logger.run.config["net"] == {"cells": [64, 64]}
        assert logger.run.name == "test-run"
        logger.log({"loss": 1.0, "reward": torch.tensor(2.0)}, step=0)
        logger.log({"loss": float("nan")}, step=10)
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    (data,) = run_dir.glob("run-*.wandb")
    assert data.stat().st_size > 0
    assert logger.run.id in data.name
    with pytest.raises(wandb.errors.UsageError, match="is finished"):  # the run was finished
        logger.run.log({"loss": 1.0}, step=20)


def test_a_resumed_run_continues_its_wandb_run(tmp_path: pathlib.Path) -> None:
    with make_logger(tmp_path, backends=["csv", "wandb"]) as logger:
        logger.log({"loss": 1.0}, step=1)
        first = logger.loggers[-1].run.id
    assert (tmp_path / "wandb" / "run-id").read_text().strip() == first
    with make_logger(tmp_path, backends=["csv", "wandb"], resume=True) as logger:
        assert logger.loggers[-1].run.id == first  # the same wandb run, not a second one
        logger.log({"loss": 0.5}, step=2)
    folders = sorted((tmp_path / "wandb").glob("offline-run-*"))  # "-1" added in one second
    assert len(folders) == 2 and all(list(f.glob(f"run-{first}.wandb")) for f in folders)
    with make_logger(tmp_path / "fresh", backends=["wandb"]) as logger:
        assert logger.loggers[-1].run.id != first  # a new run folder: a new wandb run


def test_wandb_checks_the_mode(tmp_path: pathlib.Path) -> None:
    with pytest.raises(
        ValueError, match=r"WandbLogger: mode must be one of \['offline', 'online', 'disabled'\]"
    ):
        WandbLogger(dir=tmp_path, mode="cloud")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- make_logger
def test_make_logger_auto_uses_every_installed_backend(tmp_path: pathlib.Path) -> None:
    run_dir = tmp_path / "runs" / "mappo-0"
    with make_logger(run_dir, config={"seed": 0}) as logger:
        assert [type(lg) for lg in logger.loggers] == [CSVLogger, TensorBoardLogger, WandbLogger]
        logger.log({"loss": 0.5}, step=0)
        assert logger.csv is logger.loggers[0]
        assert logger.loggers[2].run.name == "mappo-0"  # type: ignore[attr-defined]
    assert all(lg.closed for lg in logger.loggers)
    assert read_metrics(run_dir / "metrics.csv") == [{"step": 0, "loss": 0.5}]
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert list((run_dir / "wandb").glob("offline-run-*"))

    with pytest.raises(FileExistsError, match="resume=True"):
        make_logger(run_dir, backends=["csv"])
    with make_logger(run_dir, backends=["csv"], resume=True) as logger:
        assert logger.csv is not None
        logger.csv.truncate(-1)
        logger.log({"loss": 0.25}, step=0)
    assert read_metrics(run_dir / "metrics.csv") == [{"step": 0, "loss": 0.25}]


def test_make_logger_explicit_backends(tmp_path: pathlib.Path) -> None:
    with make_logger(tmp_path / "a", backends=["csv"]) as logger:
        assert [type(lg) for lg in logger.loggers] == [CSVLogger]
    with make_logger(tmp_path / "b", backends="tensorboard") as logger:
        assert [type(lg) for lg in logger.loggers] == [TensorBoardLogger]
        assert logger.csv is None
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["tensorboard"]


def test_a_refused_run_folder_gets_nothing_from_any_backend(tmp_path: pathlib.Path) -> None:
    with make_logger(tmp_path, backends=["csv"]) as logger:
        logger.log({"x": 1.0}, step=1)
    with pytest.raises(FileExistsError, match=r"metrics\.csv' already exists"):
        make_logger(tmp_path, backends=["tensorboard", "csv"])  # csv is checked first
    assert not (tmp_path / "tensorboard").exists()
    with make_logger(tmp_path, backends=["tensorboard", "csv"], resume=True) as logger:
        assert [type(lg) for lg in logger.loggers] == [TensorBoardLogger, CSVLogger]


def test_make_logger_refuses_unknown_backends(tmp_path: pathlib.Path) -> None:
    with pytest.raises(
        ValueError, match=r"unknown logger backend 'mlflow'; choose among csv, tensorboard, wandb"
    ):
        make_logger(tmp_path, backends=["csv", "mlflow"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"backends is empty"):
        make_logger(tmp_path, backends=[])
    assert not (tmp_path / "metrics.csv").exists()


def test_make_logger_without_wandb(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # wandb cannot be imported
    with make_logger(tmp_path / "auto") as logger:
        assert [type(lg) for lg in logger.loggers] == [CSVLogger, TensorBoardLogger]
    with pytest.raises(ImportError, match=r"'wandb' is needed for WandbLogger.*marlkit\[train\]"):
        make_logger(tmp_path / "explicit", backends=["csv", "wandb"])
    # The CSV logger made before the failure was closed and left its (empty) file.
    assert read_metrics(tmp_path / "explicit" / "metrics.csv") == []


# ---------------------------------------------------------------------------- MultiLogger
class _Failing(Logger):
    """A sink that fails at every call, next to real ones."""

    def __init__(self) -> None:
        self.calls = 0

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self.calls += 1
        raise OSError("disk full")

    def _close(self) -> None:
        raise OSError("cannot close")


def test_multilogger_reaches_every_logger_when_one_fails(tmp_path: pathlib.Path) -> None:
    first, last = CSVLogger(tmp_path / "a.csv"), CSVLogger(tmp_path / "b.csv")
    failing = _Failing()
    logger = MultiLogger([first, failing, last])
    with pytest.raises(OSError, match="disk full"):
        logger.log({"loss": 1.0}, step=0)
    assert first.rows() == last.rows() == [{"step": 0, "loss": 1.0}]
    with pytest.raises(OSError, match="cannot close"):
        logger.close()
    assert first.closed and failing.closed and last.closed and logger.closed
    logger.close()  # closed once
    with pytest.raises(TypeError, match="MultiLogger takes Loggers, got str"):
        MultiLogger(["csv"])  # type: ignore[list-item]


# ---------------------------------------------------------------------------- plots
def test_plot_curves_writes_a_png(tmp_path: pathlib.Path) -> None:
    pyplot_loaded = "matplotlib.pyplot" in sys.modules
    with CSVLogger(tmp_path / "metrics.csv") as logger:
        for i in range(20):
            metrics = {"frames": 1000.0 * i, "reward": math.sin(i / 3), "loss": 1 / (i + 1)}
            if i % 5 == 0:
                metrics["eval/reward"] = 0.5 * i
            logger.log(metrics, step=i)
    out = plot_curves(
        logger.rows(), tmp_path / "plots" / "curves.png", y=["reward", "eval/reward"], title="t"
    )
    assert out == tmp_path / "plots" / "curves.png"
    assert out.read_bytes()[:8] == PNG_MAGIC
    image = iio.imread(out)
    assert image.shape[:2] == (400, 640) and image.shape[2] in (3, 4)
    assert image[..., :3].std() > 0  # something is drawn
    plot_curves(logger.rows(), tmp_path / "one.png", x="step", y="loss")
    assert iio.imread(tmp_path / "one.png").shape[:2] == (400, 640)
    assert ("matplotlib.pyplot" in sys.modules) == pyplot_loaded  # pyplot left alone


def test_plot_curves_draws_a_single_point(tmp_path: pathlib.Path) -> None:
    """A run of one iteration has a one-point curve: a line alone would draw nothing."""
    out = plot_curves([{"frames": 400.0, "reward": 1.5}], tmp_path / "one.png", y="reward")
    rgb = iio.imread(out)[..., :3].astype(int)
    blue = np.abs(rgb - np.array([31, 119, 180])).sum(-1) < 30  # matplotlib's first colour
    assert blue.sum() > 20


def test_plot_curves_names_missing_keys(tmp_path: pathlib.Path) -> None:
    rows = [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5}]
    with pytest.raises(
        ValueError, match=r"metric 'frames' is in no row; the rows hold: step, loss"
    ):
        plot_curves(rows, tmp_path / "a.png", y=["loss"])
    with pytest.raises(
        ValueError, match=r"metric 'reward' is in no row; the rows hold: step, loss"
    ):
        plot_curves(rows, tmp_path / "a.png", x="step", y=["loss", "reward"])
    with pytest.raises(ValueError, match=r"at least one metric"):
        plot_curves(rows, tmp_path / "a.png", x="step", y=[])
    assert not (tmp_path / "a.png").exists()


def test_plot_with_bands_over_seeds(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(0)
    frames = np.arange(50) * 1000.0
    curves = {}
    for name, slope in (("mappo", 1.0), ("ippo", 0.7)):
        returns = slope * np.log1p(frames / 1000) + rng.normal(0, 0.3, size=(5, 50))  # [seeds, T]
        curves[name] = (frames, *bootstrap_ci(returns))
    out = plot_with_bands(
        curves, tmp_path / "bands.png", xlabel="frames", ylabel="return", title="5 seeds"
    )
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert iio.imread(out).shape[:2] == (400, 640)
    with pytest.raises(ValueError, match=r"curve 'bad'.*1-D arrays of one length.*\[\[3\], \[2\]"):
        plot_with_bands(
            {"bad": (np.zeros(3), np.zeros(2), np.zeros(3), np.zeros(3))},
            tmp_path / "bad.png",
            xlabel="x",
            ylabel="y",
        )
    with pytest.raises(ValueError, match=r"at least one curve"):
        plot_with_bands({}, tmp_path / "bad.png", xlabel="x", ylabel="y")


# ---------------------------------------------------------------------------- bootstrap
def test_bootstrap_ci_of_constant_values_has_zero_width() -> None:
    mean, low, high = bootstrap_ci([0.1] * 7)
    assert mean.shape == low.shape == high.shape == ()
    assert float(low) == float(mean) == float(high)  # exactly
    assert float(mean) == pytest.approx(0.1)
    mean, low, high = bootstrap_ci([3.0])  # one seed
    assert (float(mean), float(low), float(high)) == (3.0, 3.0, 3.0)


def test_bootstrap_ci_contains_the_mean_and_matches_the_normal_interval() -> None:
    values = np.random.default_rng(1).normal(10.0, 2.0, size=200)
    mean, low, high = bootstrap_ci(values, confidence=0.95)
    assert float(mean) == pytest.approx(values.mean())
    assert low < mean < high
    half = 1.96 * values.std() / math.sqrt(len(values))
    assert float(high - low) / 2 == pytest.approx(half, rel=0.1)
    _, low90, high90 = bootstrap_ci(values, confidence=0.9)
    assert low < low90 < high90 < high


def test_bootstrap_ci_is_deterministic_and_vectorised_over_points() -> None:
    values = np.random.default_rng(2).normal(size=(8, 30))  # [seeds, points]
    ci = bootstrap_ci(values, seed=3)
    assert ci.mean.shape == ci.low.shape == ci.high.shape == (30,)
    again = bootstrap_ci(values, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(ci, again))
    assert not np.array_equal(bootstrap_ci(values, seed=4).low, ci.low)
    assert np.all(ci.low <= ci.mean) and np.all(ci.mean <= ci.high)
    # Each point's interval is the one of its own column.
    _, low5, high5 = bootstrap_ci(values[:, 5], seed=3, n_resamples=10_000)
    assert float(low5) == pytest.approx(ci.low[5], abs=0.1)
    assert float(high5) == pytest.approx(ci.high[5], abs=0.1)


@pytest.mark.parametrize(
    ("values", "kwargs", "match"),
    [
        ([], {}, r"at least one seed, got shape \[0\]"),
        (1.0, {}, r"shape \[seeds, \.\.\.\].*got shape \[\]"),
        (
            [1.0, 2.0],
            {"confidence": 0.0},
            r"confidence must be a finite number in \(0, 1\), got 0\.0",
        ),
        ([1.0, 2.0], {"confidence": 1.0}, r"confidence must be a finite number in \(0, 1\), got 1"),
        ([1.0, 2.0], {"confidence": 95}, r"confidence must be a finite number in \(0, 1\), got 95"),
        ([1.0, 2.0], {"n_resamples": 0}, r"n_resamples must be an int >= 1, got 0"),
    ],
)
def test_bootstrap_ci_checks_its_arguments(values: object, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bootstrap_ci(values, **kwargs)  # type: ignore[arg-type]
