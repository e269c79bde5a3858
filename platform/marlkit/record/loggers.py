"""Metric loggers: one :class:`Logger` interface over a CSV file, TensorBoard and Weights & Biases.

A training script logs its scalars once per iteration, ``logger.log({"loss": ..., "reward":
...}, step=frames)``, and does not care where they go: :func:`make_logger` builds a
:class:`MultiLogger` over every backend installed (a CSV file always; TensorBoard and wandb,
offline, when they can be imported). Values are real scalars: Python numbers, bools, or
one-element tensors and arrays (a loss straight from ``loss.detach()``); a
:class:`~tensordict.TensorDict` of scalars (the loss terms of a loss module) is logged leaf by
leaf, its nested keys joined with ``/``. NaN and infinities are logged as they come: a diverged
loss must show in the curves.

:class:`CSVLogger` is the record that survives the run: every row is on the disk (``fsync``)
before :meth:`~Logger.log` returns, so a process killed at any moment (``SIGKILL``, a lost node)
loses nothing already logged; a run resumed from its last checkpoint reopens the file with
``resume=True`` and calls :meth:`CSVLogger.truncate` with the checkpoint's step, which drops the
rows logged after it (they are logged again by the resumed run), so the run leaves one unbroken
file. A row whose write failed part-way (a kill, a full disk) is cut off the file, with a
warning, before the next row is written and when the file is reopened: it is never glued to the
next row. A full disk is an ``OSError`` (ENOSPC) that names the file and the bytes needed.

Example:
    >>> import tempfile
    >>> from marlkit.record import CSVLogger
    >>> path = tempfile.mkdtemp() + "/metrics.csv"
    >>> with CSVLogger(path) as logger:
    ...     logger.log({"loss": 0.5}, step=0)
    ...     logger.log({"loss": 0.25, "eval/reward": 3.0}, step=100)
    >>> CSVLogger(path, resume=True).rows()
    [{'step': 0, 'loss': 0.5}, {'step': 100, 'loss': 0.25, 'eval/reward': 3.0}]
"""

from __future__ import annotations

import abc
import contextlib
import csv
import errno
import glob
import io
import numbers
import os
import pathlib
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar, get_args

import numpy as np
import torch
from tensordict import TensorDictBase

from marlkit._checks import check_int, check_one_of
from marlkit._files import no_space
from marlkit._utils import get_logger, has_module, import_optional, write_text_atomic

__all__ = [
    "Backend",
    "CSVLogger",
    "Logger",
    "MultiLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "WandbMode",
    "make_logger",
    "read_metrics",
]

Backend = Literal["csv", "tensorboard", "wandb"]
WandbMode = Literal["offline", "online", "disabled"]
_BACKENDS: tuple[str, ...] = get_args(Backend)
_WANDB_MODES: tuple[str, ...] = get_args(WandbMode)
_TRAIN_EXTRA = "train"
_logger = get_logger("record")

_L = TypeVar("_L", bound="Logger")
MetricValue = float | int | bool | torch.Tensor | np.ndarray | np.number | np.bool_


# ---------------------------------------------------------------------------- validation
def _scalar(key: str, value: object) -> float:
    """``value`` as a float: a real number, a bool, or a one-element real tensor or array."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        kind = type(value).__name__
        size = value.numel() if isinstance(value, torch.Tensor) else value.size
        if size != 1:
            raise ValueError(
                f"metric {key!r} must be a scalar (one element), got a {kind} of shape "
                f"{list(value.shape)}"
            )
        complex_ = value.is_complex() if isinstance(value, torch.Tensor) else np.iscomplexobj(value)
        if complex_:
            raise TypeError(f"metric {key!r} must be real, got a complex {kind}")
        return float(value.reshape(()).item())
    if isinstance(value, (numbers.Real, np.bool_)):
        return float(value)
    raise TypeError(
        f"metric {key!r} must be a real number, a bool or a one-element tensor, got "
        f"{type(value).__name__}: {value!r}"
    )


def _items(metrics: object) -> Iterable[tuple[object, object]]:
    if isinstance(metrics, TensorDictBase):
        return (
            ("/".join(k) if isinstance(k, tuple) else k, v)
            for k, v in metrics.items(include_nested=True, leaves_only=True)
        )
    if isinstance(metrics, Mapping):
        return metrics.items()
    raise TypeError(
        f"metrics must be a mapping of names to scalars (a dict or a TensorDict), got "
        f"{type(metrics).__name__}"
    )


def _check_metrics(metrics: object) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in _items(metrics):
        if not isinstance(key, str):
            raise TypeError(f"metric names must be str, got {type(key).__name__}: {key!r}")
        if not key:
            raise ValueError("metric names must be non-empty strings, got ''")
        out[key] = _scalar(key, value)
    return out


# ---------------------------------------------------------------------------- the interface
class Logger(abc.ABC):
    """One interface for metric sinks.

    :meth:`log` checks its arguments and hands them, as ``{name: float}``, to the subclass's
    :meth:`_log`; :meth:`close` calls :meth:`_close` once. A logger is a context manager that
    closes on exit.
    """

    _closed: bool = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def log(self, metrics: Mapping[str, MetricValue] | TensorDictBase, step: int) -> None:
        """Log scalars at one step.

        Args:
            metrics: ``{name: value}``; each value a real scalar: a Python number, a bool, or a
                one-element tensor or array (any shape with one element: ``[]``, ``[1]``, ...),
                converted with ``float``. A TensorDict of scalars is logged leaf by leaf, its
                nested keys joined with ``/``. NaN and infinities are logged as they are. An
                empty mapping logs nothing.
            step: the x value of the point, an int >= 0 (frames collected, say).

        Raises:
            RuntimeError: the logger is closed.
            TypeError: a step that is not an int, a name that is not a str, a value that is not a
                real scalar.
            ValueError: a negative step, an empty name, a value of more than one element (the
                message names the metric and its shape).
        """
        if self._closed:
            raise RuntimeError(f"cannot log to a closed {type(self).__name__}")
        step = check_int("step", step, low=0)
        values = _check_metrics(metrics)
        if values:
            self._log(values, step)

    @abc.abstractmethod
    def _log(self, metrics: dict[str, float], step: int) -> None:
        """Write checked metrics (at least one) at ``step``."""

    def close(self) -> None:
        """Flush and release the sink; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self._close()

    def _close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Release the sink (called once)."""

    def __enter__(self: _L) -> _L:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ---------------------------------------------------------------------------- CSV
def _read_table(path: pathlib.Path) -> tuple[list[str], list[list[str]], bool]:
    """The header and the rows of a metrics file, without a torn last line (one with no newline,
    cut by a kill), and whether there was one."""
    with open(path, newline="", encoding="utf-8") as f:
        text = f.read()
    torn = bool(text) and not text.endswith("\n")
    if torn:
        text = text[: text.rfind("\n") + 1]
    table = [row for row in csv.reader(io.StringIO(text)) if row]  # blank lines: none
    if not table:
        return [], [], torn
    header, rows = table[0], table[1:]
    for i, row in enumerate(rows):
        if len(row) > len(header):
            raise ValueError(
                f"{str(path)!r} is not a metrics file: row {i + 1} has {len(row)} cells, the "
                f"header {len(header)}"
            )
    return header, rows, torn


def _parse_rows(
    path: pathlib.Path, header: list[str], rows: list[list[str]]
) -> list[dict[str, float]]:
    out: list[dict[str, float]] = []
    for i, row in enumerate(rows):
        try:
            parsed: dict[str, float] = {header[0]: int(row[0])}
            parsed.update({k: float(v) for k, v in zip(header[1:], row[1:]) if v != ""})
        except (ValueError, IndexError) as err:
            raise ValueError(f"{str(path)!r}: cannot read row {i + 1} ({row!r}): {err}") from err
        out.append(parsed)
    return out


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """The rows of a metrics file written by :class:`CSVLogger`, oldest first.

    Each row is ``{step_key: int, name: float, ...}`` with the empty cells left out; a torn last
    line (no newline after it: a process killed while writing it, a write that failed part-way)
    is ignored.
    """
    path = pathlib.Path(path)
    header, rows, _ = _read_table(path)
    return _parse_rows(path, header, rows) if header else []


def _format_row(step: int, columns: Sequence[str], metrics: Mapping[str, float]) -> list[str]:
    return [str(step), *(repr(metrics[c]) if c in metrics else "" for c in columns)]


def _csv_bytes(rows: Iterable[Sequence[str]]) -> bytes:
    """``rows`` as the lines of a metrics file (``\\n`` after each)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode("utf-8")


@contextlib.contextmanager
def _full_disk_named(path: pathlib.Path, needed: int) -> Iterator[None]:
    """A full disk (ENOSPC, EDQUOT) within the block is an ``OSError`` naming ``path`` and the
    ``needed`` bytes (:func:`marlkit._files.no_space`), not a bare ``[Errno 28]``."""
    try:
        yield
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise no_space(path, needed, err) from None
        raise


_TAIL = 4096  # bytes read at a time, backwards, looking for a torn row's start


def _cut_torn_row(f: io.FileIO, path: pathlib.Path) -> int:
    """Cut off what follows the last newline of the open file ``f`` (a row whose write failed
    part-way: a kill, a full disk; the next row would be glued to it), with a warning; the
    file's size after it."""
    size = end = f.seek(0, os.SEEK_END)
    while end > 0:
        start = f.seek(max(0, end - (1 if end == size else _TAIL)))  # the last byte first
        newline = f.read(end - start).rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    if end == size:
        return size
    _logger.warning(
        "%s ended in a torn row (%d bytes without a newline: a write that failed or was killed "
        "part-way); it is cut off, as readers ignore it",
        path,
        size - end,
    )
    f.truncate(end)
    return end


class CSVLogger(Logger):
    """Metrics to a CSV file that a killed and resumed run leaves whole.

    One row per :meth:`log` call: the step, then one column per metric, in the order the names
    were first seen; a metric absent from a call leaves its cell empty. Values are written with
    ``repr(float)``, which reads back to the same float (``nan``, ``inf`` included). Each row is
    flushed and ``fsync``-ed before :meth:`log` returns. A call that brings a new name rewrites
    the file with the wider header (the older rows get empty cells): a temporary file in the same
    folder, ``fsync``, then ``os.replace``, so a kill at any moment leaves the old file or the new
    one. One process writes a file at a time.

    A row is only ever written after the file's last newline: a torn last line (a row whose write
    failed part-way, or a kill while it was written; a complete row without its newline too,
    since a torn row can have all its cells) is cut off, with a logged warning, before the next
    row is written and when the file is reopened with ``resume``; a :meth:`log` whose write fails
    takes its partial row back before it raises.

    Args:
        path: the CSV file; its parent folders are created.
        resume: go on with an existing file (its columns and rows are kept; a torn last line is
            cut off); then :meth:`truncate` drops the rows logged after the checkpoint the run
            resumes from. Without it, an existing file is an error. A missing file is started
            either way.
        step_key: the name of the first column.

    Raises:
        FileExistsError: ``path`` exists and ``resume`` is false.
        ValueError: with ``resume``, a file whose first column is not ``step_key``.
        OSError: a full disk (ENOSPC), here or in :meth:`log`, naming ``path`` and the bytes
            needed; the file keeps its rows.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, resume: bool = False, step_key: str = "step"
    ):
        if not isinstance(step_key, str):
            raise TypeError(f"step_key must be a str, got {type(step_key).__name__}")
        if not step_key:
            raise ValueError("step_key must be a non-empty str, got ''")
        self.path = pathlib.Path(path)
        self.step_key = step_key
        self._columns: list[str] = []
        exists = self.path.exists()
        if exists and not resume:
            raise FileExistsError(
                f"metrics file {str(self.path)!r} already exists; pass resume=True to go on "
                f"with it (and truncate it to the checkpoint's step), or choose another path"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for stale in self.path.parent.glob(glob.escape(self._tmp_prefix) + "*"):
            stale.unlink(missing_ok=True)  # the temporary file of a rewrite cut by a kill
        header, rows, torn = _read_table(self.path) if exists else ([], [], False)
        if header and header[0] != step_key:
            raise ValueError(
                f"{str(self.path)!r} starts with the column {header[0]!r}, expected the step "
                f"column {step_key!r} (pass step_key={header[0]!r} to go on with it)"
            )
        self._columns = header[1:]
        if not header:
            self._rewrite(rows)  # a new file
        elif torn:  # cut in place: no room needed for a copy of the file
            with open(self.path, "r+b", buffering=0) as f:
                _cut_torn_row(f, self.path)

    @property
    def _tmp_prefix(self) -> str:
        return f".{self.path.name}."

    @property
    def columns(self) -> tuple[str, ...]:
        """The metric columns, in file order (the step column left out)."""
        return tuple(self._columns)

    def rows(self) -> list[dict[str, float]]:
        """Read the file back: ``[{step_key: int, name: float, ...}, ...]``, empty cells left
        out (see :func:`read_metrics`)."""
        return read_metrics(self.path)

    def truncate(self, after_step: int) -> int:
        """Drop the rows whose step is greater than ``after_step`` (an atomic rewrite).

        A run resumed from the checkpoint of step ``s`` calls ``truncate(s)``: the rows it logged
        after that checkpoint are logged again by the resumed run. The columns are kept.

        Returns:
            The number of rows dropped.
        """
        if self._closed:
            raise RuntimeError("cannot truncate a closed CSVLogger")
        after_step = check_int("after_step", after_step, low=-1)
        header, rows, torn = _read_table(self.path)
        steps = [int(r[self.step_key]) for r in _parse_rows(self.path, header, rows)]
        kept = [r for r, s in zip(rows, steps) if s <= after_step]
        if len(kept) != len(rows) or torn:
            self._rewrite(kept)
        return len(rows) - len(kept)

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if self.step_key in metrics:
            raise ValueError(
                f"metric {self.step_key!r} is the name of the step column; pass the step as "
                f"`step` or choose another step_key"
            )
        new = [k for k in metrics if k not in self._columns]
        if new:  # the wider file first: a failed rewrite leaves the logger as it was
            self._rewrite(_read_table(self.path)[1], [*self._columns, *new])
        self._append(_format_row(step, self._columns, metrics))

    def _append(self, row: Sequence[str]) -> None:
        """Append ``row`` after the file's last newline (a torn row before it is cut off) and
        ``fsync`` it; a write that fails is undone, so it leaves no torn row either."""
        line = _csv_bytes([row])
        with open(self.path, "r+b", buffering=0) as f:
            end = _cut_torn_row(f, self.path)
            if end == 0:  # not even the header is left (a file emptied by hand)
                line = _csv_bytes([[self.step_key, *self._columns]]) + line
            try:
                with _full_disk_named(self.path, len(line)):
                    f.seek(end)
                    view = memoryview(line)
                    while view:
                        view = view[f.write(view) :]
                    os.fsync(f.fileno())
            except BaseException:
                with contextlib.suppress(OSError):
                    f.truncate(end)
                raise

    def _rewrite(self, rows: Sequence[Sequence[str]], columns: Sequence[str] | None = None) -> None:
        """Write the header (with ``columns``, the current ones when ``None``) and ``rows``
        (padded to the header's width) atomically."""
        columns = list(self._columns if columns is None else columns)
        width = len(columns) + 1
        text = _csv_bytes(
            [[self.step_key, *columns], *([*row, *[""] * (width - len(row))] for row in rows)]
        )
        with _full_disk_named(self.path, len(text)):
            write_text_atomic(self.path, text.decode("utf-8"))
        self._columns = columns

    def __repr__(self) -> str:
        return f"CSVLogger({str(self.path)!r}, columns={len(self._columns)})"


# ---------------------------------------------------------------------------- TensorBoard
_EVENT_FILE = re.compile(r"^events\.out\.tfevents\.(\d+)\.")


def _wait_past_event_files(log_dir: pathlib.Path) -> None:
    """Sleep until the clock's second is past the newest event file's in ``log_dir``.

    A new writer's file then sorts after every earlier one (its 10-digit second is larger).
    A file stamped more than a second ahead (another machine's clock) is not waited for.
    """
    seconds = [
        int(m.group(1))
        for name in (os.listdir(log_dir) if log_dir.is_dir() else ())
        if (m := _EVENT_FILE.match(name))
    ]
    if seconds:
        wait = max(seconds) + 1 - time.time()
        if 0 < wait <= 1:
            time.sleep(wait + 0.01)


class TensorBoardLogger(Logger):
    """Metrics to TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``).

    One scalar per metric and step (``add_scalar(name, value, step)``; names with ``/`` are
    grouped by TensorBoard), flushed at each :meth:`log`. Needs the ``train`` extra.

    Args:
        log_dir: the folder of the event files (created); ``tensorboard --logdir`` reads it.
        purge_step: a resumed run's first step (the checkpoint's step + 1): TensorBoard hides
            the events that earlier writers of ``log_dir`` logged at this step and after it
            (they are logged again), as :meth:`CSVLogger.truncate` drops those rows. The
            events stay in the older files; TensorBoard's readers skip them
            (``SummaryWriter(purge_step=...)``).

    TensorBoard reads a folder's event files in the order of their names
    (``events.out.tfevents.<second>.<host>.<pid>.<n>``), so a writer opened in the same
    second as an earlier file of ``log_dir`` could be read before it (``"1000" < "999"``), its
    purge then applying to nothing and the old steps read back after the new ones. The logger
    waits for the next second in that case (under one second, only then).
    """

    def __init__(self, log_dir: str | os.PathLike[str], *, purge_step: int | None = None):
        purge_step = check_int("purge_step", purge_step, low=0, allow_none=True)
        import_optional("tensorboard", extra=_TRAIN_EXTRA, purpose="TensorBoardLogger")
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = pathlib.Path(log_dir)
        _wait_past_event_files(self.log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    def _log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def _close(self) -> None:
        self.writer.close()

    def __repr__(self) -> str:
        return f"TensorBoardLogger({str(self.log_dir)!r})"


# ---------------------------------------------------------------------------- Weights & Biases
def _plain(value: Any) -> Any:
    """Nested mappings and sequences (a Hydra ``DictConfig`` too) as dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def _version(text: str) -> tuple[int, ...]:
    """``"0.19.10rc1"`` -> ``(0, 19, 10)``."""
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


class WandbLogger(Logger):
    """Metrics to a Weights & Biases run, offline by default (no account, no network).

    ``wandb.init(dir=dir, mode=mode)`` starts a run of its own (other runs of the process are
    left alone); offline, it lands in ``dir/wandb/offline-run-*`` and ``wandb sync`` uploads it
    later. Each :meth:`log` is ``run.log(metrics, step=step)``; :meth:`close` finishes the run.
    wandb keeps steps increasing: a step below the last one logged is dropped by wandb (with a
    warning of its own). Needs the ``train`` extra.

    Args:
        project: the wandb project.
        name: the run's display name (wandb makes one up when ``None``).
        dir: the folder under which wandb writes (created).
        config: the run's configuration (hyper-parameters), nested mappings and sequences
            (a Hydra ``DictConfig`` is fine).
        mode: ``"offline"``, ``"online"`` (needs a login) or ``"disabled"`` (wandb does
            nothing).
        run_id: the wandb run id; an existing run with this id is continued (``resume=
            "allow"``: online, its curves go on; offline, ``wandb sync`` uploads both folders
            into that run). ``None``: a new run.
    """

    def __init__(
        self,
        *,
        project: str = "marlkit",
        name: str | None = None,
        dir: str | os.PathLike[str],
        config: Mapping[str, Any] | None = None,
        mode: WandbMode = "offline",
        run_id: str | None = None,
    ):
        check_one_of("mode", mode, _WANDB_MODES, owner="WandbLogger")
        wandb = import_optional("wandb", extra=_TRAIN_EXTRA, purpose="WandbLogger")
        self.dir = pathlib.Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        # "create_new" (wandb >= 0.19.10) lets several runs live side by side; before it, True
        # finished the run in progress instead of silently returning it.
        reinit: Any = "create_new" if _version(wandb.__version__) >= (0, 19, 10) else True
        self.run = wandb.init(
            project=project,
            name=name,
            dir=str(self.dir),
            config=_plain(config) if config is not None else None,
            mode=mode,
            reinit=reinit,
            id=run_id,
            resume="allow" if run_id is not None else None,
            # console="off": wandb leaves sys.stdout and sys.stderr alone.
            settings=wandb.Settings(silent=True, console="off"),
        )
        _logger.info("wandb run %s (%s) in %s", self.run.id, mode, self.dir)

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def _close(self) -> None:
        self.run.finish()

    def __repr__(self) -> str:
        return f"WandbLogger(dir={str(self.dir)!r}, run={self.run.id!r})"


# ---------------------------------------------------------------------------- fan-out
class MultiLogger(Logger):
    """Several loggers behind one: each :meth:`log` goes to all of them.

    A logger that raises does not stop the others: all are logged to (or closed), then the first
    error is raised.

    Args:
        loggers: the loggers, in the order they are called.
    """

    def __init__(self, loggers: Iterable[Logger]):
        self.loggers: tuple[Logger, ...] = tuple(loggers)
        for logger in self.loggers:
            if not isinstance(logger, Logger):
                raise TypeError(f"MultiLogger takes Loggers, got {type(logger).__name__}")

    @property
    def csv(self) -> CSVLogger | None:
        """The first :class:`CSVLogger` among :attr:`loggers` (``None`` without one): a resumed
        run calls ``logger.csv.truncate(checkpoint_step)``."""
        return next((lg for lg in self.loggers if isinstance(lg, CSVLogger)), None)

    def _each(self, call: str, *args: Any) -> None:
        error: BaseException | None = None
        for logger in self.loggers:
            try:
                getattr(logger, call)(*args)
            except Exception as err:
                error = error or err
        if error is not None:
            raise error

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self._each("log", metrics, step)

    def _close(self) -> None:
        self._each("close")

    def __repr__(self) -> str:
        return f"MultiLogger({list(self.loggers)!r})"


def _backends(backends: Sequence[str] | str) -> list[str]:
    if backends == "auto":
        found = ["csv"]
        found += [b for b in ("tensorboard", "wandb") if has_module(b)]
        return found
    names = [backends] if isinstance(backends, str) else list(backends)
    for name in names:
        if name not in _BACKENDS:
            raise ValueError(
                f"unknown logger backend {name!r}; choose among {', '.join(_BACKENDS)} "
                f"(or backends='auto')"
            )
    if not names:
        raise ValueError(f"backends is empty; choose among {', '.join(_BACKENDS)} or 'auto'")
    return list(dict.fromkeys(names))


def _wandb_run_id(id_file: pathlib.Path) -> str | None:
    """The wandb run a resumed run goes on with (``run-id``); ``None`` (a new wandb run) when
    the file is missing or empty, with a warning for the latter."""
    if not id_file.is_file():
        return None
    run_id = id_file.read_text().strip()
    if not run_id:
        _logger.warning(
            "%s is empty (a kill while it was written, before marlkit wrote it atomically): "
            "the resumed run logs to a new wandb run",
            id_file,
        )
        return None
    return run_id


def make_logger(
    run_dir: str | os.PathLike[str],
    *,
    backends: Sequence[Backend] | Backend | Literal["auto"] = "auto",
    resume: bool = False,
    purge_step: int | None = None,
    project: str = "marlkit",
    name: str | None = None,
    config: Mapping[str, Any] | None = None,
    wandb_mode: WandbMode = "offline",
) -> MultiLogger:
    """The loggers of a training run, all writing under ``run_dir``.

    ``run_dir/metrics.csv`` (:class:`CSVLogger`), ``run_dir/tensorboard``
    (:class:`TensorBoardLogger`), ``run_dir/wandb`` (:class:`WandbLogger`, offline unless
    ``wandb_mode`` says otherwise).

    Args:
        run_dir: the run's folder (created).
        backends: ``"auto"``: the CSV file, plus TensorBoard and wandb when they can be imported
            (one that fails to start is skipped with a warning); or the backends to use (a name
            or a sequence of names), each of which must work.
        resume: reopen ``metrics.csv`` to go on with it (then ``logger.csv.truncate(step)``);
            without it, an existing ``metrics.csv`` is an error.
        purge_step: with ``resume``, the first step the run logs again (the checkpoint's step
            + 1): TensorBoard hides the events logged before at this step and after it
            (:class:`TensorBoardLogger`); ``logger.csv.truncate(purge_step - 1)`` does the same
            for the CSV file.
        project: the wandb project.
        name: the wandb run's name; the name of ``run_dir`` when ``None``.
        config: the run's configuration, given to wandb.
        wandb_mode: the wandb mode (see :class:`WandbLogger`); offline by default. The wandb
            run's id is kept in ``run_dir/wandb/run-id``: a resumed run continues that wandb run
            instead of starting another.

    Returns:
        A :class:`MultiLogger`; its :attr:`~MultiLogger.csv` is the CSV logger.

    Raises:
        ValueError: an unknown backend (the message lists the valid ones).
        ImportError: a backend asked for by name is not installed (the message names the
            ``train`` extra).
        FileExistsError: ``metrics.csv`` exists and ``resume`` is false.
    """
    auto = isinstance(backends, str) and backends == "auto"
    chosen = _backends(backends)
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    made: dict[str, Logger] = {}
    try:
        # The CSV file first: refused (an existing run's metrics.csv without resume) before any
        # other backend writes into that run's folder. The loggers keep the order asked for.
        for backend in sorted(chosen, key=lambda b: b != "csv"):
            try:
                if backend == "csv":
                    made[backend] = CSVLogger(run_dir / "metrics.csv", resume=resume)
                elif backend == "tensorboard":
                    made[backend] = TensorBoardLogger(
                        run_dir / "tensorboard", purge_step=purge_step if resume else None
                    )
                else:
                    id_file = run_dir / "wandb" / "run-id"
                    wandb_logger = WandbLogger(
                        project=project,
                        name=name if name is not None else run_dir.resolve().name,
                        dir=run_dir,
                        config=config,
                        mode=wandb_mode,
                        run_id=_wandb_run_id(id_file) if resume else None,
                    )
                    made[backend] = wandb_logger
                    if wandb_mode != "disabled":  # a disabled run's id names no run
                        id_file.parent.mkdir(parents=True, exist_ok=True)
                        # atomic: a kill while it was written left it empty, and wandb refuses
                        # an empty id at every resume after
                        write_text_atomic(id_file, wandb_logger.run.id + "\n")
            except ImportError as err:
                if not auto:
                    raise
                _logger.warning("logger backend %s skipped: %s", backend, err)
    except BaseException:
        for logger in made.values():
            logger.close()
        raise
    return MultiLogger(made[b] for b in chosen if b in made)
