"""``TrainingRun``: the folder of a training run and what a loop does to it each iteration.

A training script owns its algorithm (modules, losses, the update); the run folder's chores
are the same for every algorithm, and live here:

* **resume**: ``resume=<the run folder>`` is checked (a folder that holds no run, or a
  ``run_dir`` elsewhere, is an error); :meth:`TrainingRun.restore` loads the latest checkpoint
  (``None`` on a fresh run) and drops the metrics rows logged after it (TensorBoard hides
  them), so a run killed at any moment and resumed leaves one unbroken ``metrics.csv``;
* **timing**: :meth:`TrainingRun.batches` yields the collector's batches and times the
  collection; :meth:`TrainingRun.end_iteration` times the training since the batch came;
* **each iteration**: the frame counts, frames/s, each group's episode rewards
  (:func:`~marlkit.record.episode_metrics`), an evaluation every ``eval_every`` iterations
  (exploration off, filmed, the evaluation env seeded with ``eval_seed``), the metrics
  logged, a checkpoint every ``checkpoint_every`` iterations and at the last;
* **the end**: :meth:`TrainingRun.finish` writes ``summary.json``, ``reward.png`` and
  ``rollout.mp4`` (:func:`~marlkit.record.summarise_run`) and closes the loggers;
* **callbacks** (:mod:`marlkit.train.callbacks`): the user's hooks, called at each of these
  events; one may stop the run (:meth:`TrainingRun.stop`: early stopping);
* **the device**: with ``device``, each batch is moved there once, as it comes (the buffers
  that take it, the losses and their minibatches live there), and the policy is evaluated on the
  evaluation env's device through one move of each step's data each way.

Example (a random policy "trained" for two iterations)::

    run = TrainingRun(folder, eval_env=eval_env, eval_steps=25, checkpoint_every=1)
    state = run.restore()           # None: nothing to resume
    for batch in run.batches(collector):
        metrics = {"train/loss": 0.0}   # the update goes here
        run.end_iteration(batch, metrics, policy=policy, state=lambda: {}, frames=collector.frames)
    run.finish(policy)
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from marlkit._checks import check_int
from marlkit._files import FolderInUse, lock_folder
from marlkit._utils import get_logger
from marlkit.envs import EnvBase
from marlkit.record.loggers import Backend, MultiLogger, make_logger
from marlkit.train.callbacks import Callback, CallbackError, callback_name
from marlkit.train.checkpoint import Checkpointer, rng_state, set_rng_state
from marlkit.train.episodes import episode_metrics
from marlkit.train.evaluation import (
    EvalExploration,
    Evaluation,
    Policy,
    _filmed_envs,
    episode_wins,
    eval_modes,
    evaluate,
    summarise_run,
)

__all__ = ["TrainingRun"]

_logger = get_logger("train")
_CHECKPOINTS = "checkpoints"
_METRICS = "metrics.csv"
_UNSET = object()
#: Top-level config keys naming the run's folder: they may be spelt otherwise when resuming.
_WHERE = frozenset({"resume", "run_dir"})


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"hidden": 64}}`` -> ``{"model.hidden": 64}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


#: The lock file of a run's folder (:func:`_lock_folder`): the first thing a run writes there.
_LOCK = ".marlkit-run.lock"
#: The entries a run adds to every checkpoint itself.
_OWN_ENTRIES = ("rng", "iteration", "time", "config", "policy", "callbacks", "stopped")
#: What a run writes into its folder: any of them marks a folder that holds a run (a folder
#: that Hydra has just made for a mistyped ``resume=`` holds none; a run logging only to
#: TensorBoard or wandb, killed before its first checkpoint, holds one of those two; a run
#: killed during its start-up, before it made any of them, holds its lock file alone).
_RUN_ENTRIES = (_METRICS, _CHECKPOINTS, "tensorboard", "wandb", _LOCK)


def _run_entries_in(folder: pathlib.Path) -> str:
    """The entries of :data:`_RUN_ENTRIES` in ``folder``, comma-separated (the lock file only
    when it is the sole one: every run leaves it); ``""`` for none."""
    present = [entry for entry in _RUN_ENTRIES if (folder / entry).exists()]
    return ", ".join(present if present == [_LOCK] else [e for e in present if e != _LOCK])


def _folder_holds_a_run(folder: pathlib.Path) -> bool:
    """Whether ``folder`` holds a training run (see :data:`_RUN_ENTRIES`)."""
    return bool(_run_entries_in(folder))


def _as_device(device: str | torch.device | None) -> torch.device | None:
    """``device`` as a ``torch.device`` (``None`` stays ``None``).

    Raises:
        TypeError: neither a string nor a device.
        ValueError: a string that names no device.
    """
    if device is None or isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be a str or a torch.device, got {type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device {device!r} is not a torch device: {err}") from None


def _on_device(policy: Policy, device: torch.device) -> Policy:
    """``policy`` reading and writing data of another device: each call moves the step's data
    to ``device`` and the result back to where it came from."""

    def moved(td: TensorDictBase) -> TensorDictBase:
        where = td.device
        out = policy(td.to(device))
        return out.to(where) if where is not None else out

    return moved


class RunFolderInUse(FolderInUse):
    """Another process runs a training run in the folder (it holds the folder's lock)."""


def _lock_folder(folder: pathlib.Path) -> Any:
    """An exclusive lock on ``folder`` for this process's run (see
    :func:`marlkit._files.lock_folder`), or ``None`` where ``flock`` does not exist.

    Raises:
        RunFolderInUse: another process holds it.
    """
    try:
        return lock_folder(
            folder,
            _LOCK,
            what="training run",
            advice="two runs in one folder would interleave their metrics and checkpoints; wait "
            "for it to end, stop it, or choose another run_dir",
        )
    except FolderInUse as err:
        raise RunFolderInUse(str(err)) from None


def _resume_folder(
    run_dir: pathlib.Path, resume: bool | str | os.PathLike[str] | None
) -> pathlib.Path | None:
    """The folder to go on from (``run_dir``), or ``None`` for a new run; checks both.

    Raises:
        ValueError: ``resume`` names a folder other than ``run_dir``.
        FileNotFoundError: the folder to resume does not exist or holds no run.
        FileExistsError: a new run (no ``resume``) into a folder that holds one.
    """
    if resume is None or resume is False:
        if _folder_holds_a_run(run_dir):
            raise FileExistsError(
                f"{str(run_dir)!r} already holds a training run ({_run_entries_in(run_dir)}): "
                f"go on with it with resume={run_dir} (TrainingRun: resume=True; a run stopped "
                "before its first checkpoint, during its start-up too, starts again from "
                "iteration 1), or "
                "choose another run_dir"
            )
        return None
    if resume is True:
        folder = run_dir
    elif isinstance(resume, (str, os.PathLike)):
        folder = pathlib.Path(resume)
        if folder.resolve() != run_dir.resolve():
            raise ValueError(
                f"resume={str(folder)!r} goes on in its own folder, but run_dir={str(run_dir)!r} "
                f"is another one: leave run_dir out (or set it to {str(folder)!r}); to start a "
                "new run elsewhere, leave resume out"
            )
    else:
        raise TypeError(
            f"resume must be a bool, a run folder or None, got {type(resume).__name__}: {resume!r}"
        )
    if not folder.is_dir():
        raise FileNotFoundError(f"cannot resume {str(folder)!r}: no such folder")
    if not _folder_holds_a_run(folder):
        raise FileNotFoundError(
            f"cannot resume {str(folder)!r}: it holds no training run (none of "
            f"{', '.join(_RUN_ENTRIES)}); a mistyped folder? (the scripts' Hydra creates the "
            "folder, with its .hydra*/ and log, before the run starts)"
        )
    return folder


class TrainingRun:
    """A training run's folder: its loggers, checkpoints, evaluations and summary.

    Args:
        run_dir: the folder (created when missing); a resumed run goes on in the same one.
        resume: go on from the run in ``run_dir`` (``True``, or the folder itself: the scripts
            pass ``resume=<folder>`` through): its latest checkpoint (:meth:`restore`), or,
            when it was killed before its first checkpoint (during its start-up too, when its
            folder holds only its lock file, ``.marlkit-run.lock``), from iteration 1 (with a
            logged warning). ``False``/``None``: a new run, into a folder that holds none.
        eval_env: the evaluation env (a separate env: evaluations do not disturb training).
        eval_seed: seed the evaluation env (and torch, within the evaluation) with this before
            every evaluation and the summary's random baseline: every evaluation then plays
            the same episodes (so evaluations of different iterations compare, whatever
            ``eval_every`` and however often the run was resumed), and ``"trained"`` and
            ``"random"`` of the summary are the same episodes. ``None``: the env goes on from
            wherever the previous evaluation left it.
        eval_steps: evaluation rollout length (the episode length).
        eval_every: evaluate every this many iterations (0: only at the last).
        video: film each evaluation into ``videos/eval-<n>.mp4`` and the final one into
            ``rollout.mp4``, the envs of ``eval_env`` tiled.
        video_envs: film only the first this many envs of ``eval_env`` (all of them when it
            has fewer; ``None``: all, at most 64). The metrics still cover every env: a
            greedy policy's return varies a lot from env to env, so evaluate on more envs
            than a video can show.
        fps: the videos' frames per second.
        checkpoint_every: save a checkpoint every this many iterations (and at the last).
        keep: checkpoints kept.
        backends: the loggers (:func:`~marlkit.record.make_logger`; ``"auto"``: CSV, and
            TensorBoard and wandb when installed).
        project, config: the wandb project and the run's config (logged by wandb).
        device: where training happens: each batch is moved there once, as
            :meth:`batches` yields it (``None``: batches stay where the collector stored them);
            the script puts its modules, losses and optimisers there. The policy is evaluated
            on :attr:`eval_env`'s device's data, moved to ``device`` and back at each step.
        callbacks: :class:`~marlkit.train.callbacks.Callback` objects, called at each event
            (in this order); one with ``state_dict``/``load_state_dict`` is checkpointed.

    Raises:
        TypeError: ``eval_steps``, ``eval_every``, ``checkpoint_every``, ``video_envs`` or
            ``eval_seed`` that is not an int.
        TypeError: ``callbacks`` holding what is not a ``Callback``; ``device`` that is not a
            device (``ValueError`` for a string that names none).
        ValueError: ``eval_every`` negative; ``eval_steps``, ``checkpoint_every`` or
            ``video_envs`` below 1; ``video`` with an ``eval_env`` that does not render
            ``rgb_array`` frames (raised here, not at the first evaluation); ``resume=<folder>``
            with a ``run_dir`` that is another folder.
        FileNotFoundError: ``resume`` of a folder that does not exist or holds no run (none of
            ``metrics.csv``, ``checkpoints/``, ``tensorboard/``, ``wandb/``,
            ``.marlkit-run.lock``).
        FileExistsError: a new run (no ``resume``) into a folder that holds a run, even one
            stopped before its first iteration: the message says to resume it.

    Every check is made before anything is written.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        resume: bool | str | os.PathLike[str] | None = False,
        eval_env: EnvBase,
        eval_steps: int,
        eval_seed: int | None = None,
        eval_every: int = 0,
        eval_exploration: EvalExploration = "deterministic",
        video: bool = True,
        video_envs: int | None = None,
        fps: float = 30.0,
        checkpoint_every: int = 1,
        keep: int = 2,
        backends: Sequence[Backend] | Backend | str = "auto",
        project: str = "marlkit",
        config: Mapping[str, Any] | None = None,
        device: str | torch.device | None = None,
        callbacks: Sequence[Callback] = (),
    ):
        self.run_dir = pathlib.Path(run_dir)
        #: Where training happens (``None``: where the collector's batches are).
        self.device = _as_device(device)
        for index, callback in enumerate(callbacks):
            if not isinstance(callback, Callback):
                raise TypeError(
                    f"callbacks[{index}] must be a marlkit.train.callbacks.Callback, got "
                    f"{type(callback).__name__}: {callback!r}"
                )
        #: The callbacks, in the order they are called.
        self.callbacks: list[Callback] = list(callbacks)
        #: Why a callback stopped the run (:meth:`stop`); ``None`` while it goes on.
        self.stop_reason: str | None = None
        #: Frames collected so far (``end_iteration``'s ``frames``).
        self.frames = 0
        #: Batches moved to :attr:`device` by :meth:`batches` (one per batch that was elsewhere).
        self.batches_moved = 0
        self._set_up = False
        self.eval_env = eval_env
        self.eval_steps = check_int("eval_steps", eval_steps, low=1)
        self.eval_seed = check_int("eval_seed", eval_seed, low=0, allow_none=True)
        self.eval_every = check_int("eval_every", eval_every, low=0)
        #: The exploration modes of each evaluation, the reported (filmed) one first.
        self.eval_modes = eval_modes(eval_exploration)
        self.eval_exploration = eval_exploration
        self.video = bool(video)
        if self.video and "rgb_array" not in eval_env.render_modes:  # before anything is written
            raise ValueError(
                "video=True films every evaluation, but the evaluation env does not render "
                f"'rgb_array' frames (render_modes={tuple(eval_env.render_modes)}): pass "
                "video=False (the scripts: eval.video=false), or make the evaluation env "
                "render (render_mode='rgb_array' for PettingZoo and Gymnasium, render=True "
                "for marlkit.adapters.custom; the scripts: env.eval_kwargs)"
            )
        self.video_envs = check_int("video_envs", video_envs, low=1, allow_none=True)
        self.fps = float(fps)
        self.checkpoint_every = check_int("checkpoint_every", checkpoint_every, low=1)
        #: Whether the run goes on from the one in :attr:`run_dir`.
        self.resume = _resume_folder(self.run_dir, resume) is not None
        self.checkpointer = Checkpointer(self.run_dir / _CHECKPOINTS, keep=keep)
        latest = self.checkpointer.latest() if self.resume else None
        # the iteration the run goes on from (that of the checkpoint's folder, step-<n>)
        self._resumed_from = Checkpointer.step_of(latest) if latest is not None else 0
        #: The run's config, saved with each checkpoint and compared with the checkpoint's when
        #: resuming; through JSON (what loads with ``weights_only``; other values as text).
        self.config = None if config is None else json.loads(json.dumps(config, default=str))
        # held until close(): a second run (a resume started twice) is refused, not interleaved
        self._lock = _lock_folder(self.run_dir)
        try:
            self.logger: MultiLogger = make_logger(
                self.run_dir,
                backends=backends,  # type: ignore[arg-type]
                resume=self.resume,
                purge_step=self._resumed_from + 1,
                project=project,
                name=self.run_dir.name,
                config=config,
            )
        except BaseException:
            if not self.resume and _run_entries_in(self.run_dir) == _LOCK:
                # a new run refused before it wrote anything (a backend that does not import):
                # the folder holds no run, and a new one may still start in it
                (self.run_dir / _LOCK).unlink(missing_ok=True)
            if self._lock is not None:
                self._lock.close()
            raise
        #: Iterations done (restored by :meth:`restore`).
        self.iteration = 0
        self._parts: dict[str, Any] = {}
        self._buffers: dict[str, Any] | None = None
        self._policy: Any = None
        #: The collector's :attr:`num_batches`, known once :meth:`batches` starts.
        self.total_iterations: int | None = None
        self._start = time.perf_counter()
        self._batch_came = self._start
        self._collection_time = 0.0
        #: (iteration, {mode: evaluation}) of the latest :meth:`evaluate`: the summary reuses
        #: it when it evaluated the last iteration's policy.
        self._evaluated: tuple[int, dict[str, Evaluation]] | None = None

    # ------------------------------------------------------------------ resume
    def track(
        self,
        parts: Mapping[str, Any],
        buffers: Mapping[str, Any] | None = None,
        policy: Any = None,
    ) -> None:
        """Name what a checkpoint holds, so that :meth:`restore` loads it and
        :meth:`end_iteration` saves it with no code of the script's: ``parts`` maps a name to
        an object with ``state_dict()`` / ``load_state_dict()`` (modules, a collector,
        exploration modules) or to a mapping of them (one optimiser per group); the RNG
        states are added as ``"rng"``. ``buffers`` are replay buffers saved with each
        checkpoint through their own ``dumps``. After a restore, a part with
        ``update_policy_weights_`` (a collector) is given the restored weights. ``policy``, the
        module that acts, is saved as ``"policy"`` for
        :func:`~marlkit.train.scripts.load_policy` (not restored from it: its weights are
        those of the parts).

        Raises:
            TypeError: a part that has no ``state_dict``/``load_state_dict``.
            ValueError: a part named ``"rng"``, ``"iteration"``, ``"time"`` or ``"config"``
                (the run's own entries).
        """
        for name, part in parts.items():
            if name in _OWN_ENTRIES:
                raise ValueError(f"{name!r} is the run's own checkpoint entry; name it otherwise")
            for piece in part.values() if isinstance(part, Mapping) else (part,):
                if not (hasattr(piece, "state_dict") and hasattr(piece, "load_state_dict")):
                    raise TypeError(
                        f"part {name!r}: a {type(piece).__name__} has no state_dict() and "
                        "load_state_dict()"
                    )
        if policy is not None and not hasattr(policy, "state_dict"):
            raise TypeError(f"policy: a {type(policy).__name__} has no state_dict()")
        self._parts = dict(parts)
        self._buffers = None if buffers is None else dict(buffers)
        self._policy = policy

    def _tracked_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for name, part in self._parts.items():
            if isinstance(part, Mapping):
                state[name] = {key: piece.state_dict() for key, piece in part.items()}
            else:
                state[name] = part.state_dict()
        if self._policy is not None:
            state["policy"] = self._policy.state_dict()
        return {**state, "rng": rng_state()}

    def _callback_states(self) -> dict[str, Any]:
        """``{"callbacks": {"<index>:<class>": state}}`` of the callbacks with a
        ``state_dict``; ``{}`` for none."""
        states = {
            callback_name(c, i): c.state_dict()  # type: ignore[attr-defined]
            for i, c in enumerate(self.callbacks)
            if callable(getattr(c, "state_dict", None))
        }
        return {"callbacks": states} if states else {}

    def _load_callbacks(self, state: Mapping[str, Any]) -> None:
        saved = state.get("callbacks", {})
        for index, callback in enumerate(self.callbacks):
            name = callback_name(callback, index)
            if name in saved and callable(getattr(callback, "load_state_dict", None)):
                self._call_one(index, callback, "load_state_dict", saved[name])

    def _load_tracked(self, state: Mapping[str, Any]) -> None:
        missing = [name for name in (*self._parts, "rng") if name not in state]
        if missing:
            raise KeyError(
                f"{self.checkpointer.latest()} holds no {missing[0]!r} (it holds "
                f"{sorted(state)}): a checkpoint of another script?"
            )
        for name, part in self._parts.items():
            if isinstance(part, Mapping):
                for key, piece in part.items():
                    piece.load_state_dict(state[name][key])
            else:
                part.load_state_dict(state[name])
        for part in self._parts.values():
            if callable(getattr(part, "update_policy_weights_", None)):
                part.update_policy_weights_()
        set_rng_state(state["rng"])
        if self._buffers:
            self.checkpointer.load_buffers(self._buffers)

    def restore(self) -> dict[str, Any] | None:
        """The latest checkpoint's state when resuming and there is one, else ``None``; the
        iteration goes back to the checkpoint's and the metrics logged after it are dropped
        (they are done again). What :meth:`track` named is loaded from it (and the buffers).

        Raises:
            KeyError: the checkpoint lacks a tracked part.
        """
        state = None
        if self.resume and self.checkpointer.latest() is not None:
            # on the CPU first (a CUDA run's checkpoint resumes anywhere, and the RNG states
            # must be CPU tensors); load_state_dict then moves each part to its device
            state = self.checkpointer.load(map_location="cpu")
            if "iteration" not in state:
                raise KeyError(f"{self.checkpointer.latest()} has no 'iteration'")
            self.iteration = check_int("iteration", state["iteration"], low=0)
            if isinstance(state.get("time"), (int, float)):  # the time column goes on from it
                self._start = time.perf_counter() - float(state["time"])
            self._compare_config(state.get("config"))
            if self._parts:
                self._load_tracked(state)
            self._load_callbacks(state)
            if isinstance(state.get("stopped"), str):  # a callback ended it: nothing to go on with
                self.stop_reason = state["stopped"]
        elif self.resume:
            _logger.warning(
                "resuming %s: it holds no checkpoint yet (killed before its first): training "
                "starts from iteration 1 and the metrics logged so far are dropped",
                self.run_dir,
            )
        csv = self.logger.csv
        if csv is not None:
            csv.truncate(self.iteration)
        self._setup()
        return state

    # ------------------------------------------------------------------ callbacks
    def stop(self, reason: str) -> None:
        """End the run after the iteration in progress: it is evaluated, logged and
        checkpointed as a last one, :meth:`batches` yields no more, and the script writes its
        summary (:meth:`finish`, which records ``reason`` as ``"stopped"``). Callbacks call it
        (early stopping); a second call keeps the first reason. The checkpoint keeps it: the
        run resumed trains no more and writes its summary again."""
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        if self.stop_reason is None:
            self.stop_reason = reason
            _logger.info(
                "%s: stopping after iteration %d: %s", self.run_dir, self.iteration, reason
            )

    @property
    def stopped(self) -> bool:
        """Whether a callback asked the run to stop (:meth:`stop`)."""
        return self.stop_reason is not None

    def _call_one(self, index: int, callback: Callback, hook: str, *args: Any) -> None:
        try:
            getattr(callback, hook)(*args)
        except Exception as err:
            self.close()  # the loggers' files and the folder's lock: nothing left held
            raise CallbackError(
                f"callback {callback_name(callback, index)} ({callback!r}) raised in {hook} at "
                f"iteration {self.iteration}: {type(err).__name__}: {err}; the run's loggers and "
                f"folder lock are released ({self.run_dir})"
            ) from err

    def _call(self, hook: str, *args: Any) -> None:
        """Call ``hook`` of every callback with ``(self, *args)``.

        Raises:
            CallbackError: a callback raised (the run is closed first).
        """
        for index, callback in enumerate(self.callbacks):
            self._call_one(index, callback, hook, self, *args)

    def _setup(self) -> None:
        if not self._set_up:
            self._set_up = True
            self._call("on_setup")

    def _compare_config(self, saved: Any) -> None:
        """Warn about every setting that differs from the checkpoint's config (but where the
        run lives: ``resume``, ``run_dir``, checked already): changed networks do not load into
        the checkpoint's weights, and other changes make a run that no config describes."""
        if self.config is None or not isinstance(saved, Mapping):
            return
        old, new = _flat(saved), _flat(self.config)
        changed = [
            f"{key}: {old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r}"
            for key in sorted(old.keys() | new.keys())
            if key not in _WHERE and old.get(key, _UNSET) != new.get(key, _UNSET)
        ]
        if changed:
            kept = self.run_dir / ".hydra" / "config.yaml"
            _logger.warning(
                "resuming %s with a config that differs from its checkpoint's (a network or "
                "optimiser of another size will not load; resume with the first run's "
                "settings%s): %s",
                self.run_dir,
                f", kept in {kept}" if kept.exists() else "",
                "; ".join(changed),
            )

    def restore_buffers(self, buffers: Mapping[str, Any]) -> None:
        """Restore replay buffers saved with :meth:`end_iteration`'s ``buffers``, when
        resuming from a checkpoint."""
        if self.resume and self.checkpointer.latest() is not None:
            self.checkpointer.load_buffers(buffers)

    # ------------------------------------------------------------------ the loop
    def batches(self, collector: Iterable[TensorDictBase]) -> Iterator[TensorDictBase]:
        """The collector's batches, each timed from the end of the previous iteration, moved
        to :attr:`device` (once each) and shown to the callbacks (``on_batch_collected``);
        they end early when a callback stops the run (:meth:`stop`)."""
        self.total_iterations = getattr(collector, "num_batches", None)
        frames, total = getattr(collector, "frames", None), getattr(collector, "total_frames", None)
        # the budget that collected `frames` ended within its last batch: only a total below
        # that (not a finished run resumed with its own total) is a budget already spent
        batch = getattr(collector, "frames_per_batch", None)
        spent = frames - batch if isinstance(frames, int) and isinstance(batch, int) else frames
        if isinstance(spent, int) and isinstance(total, int) and 0 <= total <= spent:
            _logger.warning(
                "the collector's total_frames (%d) is below the %d frames already collected "
                "(the resumed checkpoint's): nothing more is trained; raise total_frames to "
                "train on",
                total,
                frames,
            )
        self._setup()
        self._batch_came = time.perf_counter()
        if self.stopped:
            _logger.warning(
                "%s was stopped at iteration %d (%s): nothing more is trained",
                self.run_dir,
                self.iteration,
                self.stop_reason,
            )
            return
        for batch in collector:
            if self.device is not None and batch.device != self.device:
                batch = batch.to(self.device)  # once per batch: minibatches are drawn there
                self.batches_moved += 1
            now = time.perf_counter()
            self._collection_time = now - self._batch_came
            self._batch_came = now
            self._call("on_batch_collected", batch)
            yield batch
            if self.stopped:
                return
            self._batch_came = time.perf_counter()

    @property
    def last(self) -> bool:
        """Whether the iteration being ended is the last: the collector's last, or a callback
        stopped the run."""
        done = self.total_iterations is not None and self.iteration >= self.total_iterations
        return done or self.stopped

    def end_iteration(
        self,
        batch: TensorDictBase,
        metrics: Mapping[str, Any],
        *,
        policy: Policy,
        state: Callable[[], Mapping[str, Any]] | None = None,
        frames: int,
        buffers: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Count the iteration, complete its metrics, evaluate, log and checkpoint when due.

        Args:
            batch: the iteration's collector batch (for its episode rewards and frames).
            metrics: the algorithm's own metrics (losses, ...).
            policy: the policy to evaluate (exploration off).
            state: builds the checkpoint's state (modules, optimisers, collector, RNG); called
                only when a checkpoint is due; ``"iteration"`` is added. Default: what
                :meth:`track` named.
            frames: the frames collected so far (``collector.frames``).
            buffers: replay buffers to save with each checkpoint (``{name: buffer}``; default:
                those :meth:`track` named).

        Raises:
            ValueError: neither ``state`` nor :meth:`track` says what a checkpoint holds.

        Returns:
            the iteration's logged metrics.
        """
        training_time = time.perf_counter() - self._batch_came
        if state is None and not self._parts:
            raise ValueError("end_iteration needs state= or the parts named by track()")
        self.iteration += 1
        out: dict[str, Any] = dict(metrics)
        out.update(
            frames=frames,
            frames_per_s=batch.numel() / max(self._collection_time + training_time, 1e-9),
            collection_time=self._collection_time,
            training_time=training_time,
            time=time.perf_counter() - self._start,
            **episode_metrics(batch),
            **episode_wins(batch),  # "won": the win rate, for envs with a root won flag
        )
        self.frames = frames
        self._call("on_train_step", batch, out)  # may add metrics, may stop the run
        if self.last or (self.eval_every and self.iteration % self.eval_every == 0):
            out.update(self.evaluate(policy, f"eval-{self.iteration:04d}"))
            self._call("on_evaluation_end", out)  # may stop the run
        self.logger.log(out, step=self.iteration)
        if self.last or self.iteration % self.checkpoint_every == 0:
            path = self.checkpointer.save(
                self.iteration,
                {
                    **(state() if state is not None else self._tracked_state()),
                    "iteration": self.iteration,
                    "time": out["time"],
                    **self._config_entry(),
                    **self._callback_states(),
                    **({"stopped": self.stop_reason} if self.stopped else {}),
                },
                buffers=buffers if buffers is not None else self._buffers,
            )
            self._call("on_checkpoint", path)
        return out

    def progress(self, out: Mapping[str, Any]) -> str:
        """A line for the console after :meth:`end_iteration`: the iteration, the frames and
        the episode rewards of ``out`` (its return)."""
        rewards = {
            k: round(v, 3)
            for k, v in out.items()
            if k.endswith("episode_reward") or k.split("/")[-1] == "won"
        }
        return f"iteration {self.iteration}: frames {out['frames']} {rewards}"

    def _config_entry(self) -> dict[str, Any]:
        return {} if self.config is None else {"config": self.config}

    def evaluate(self, policy: Policy, tag: str) -> dict[str, float]:
        """Evaluate ``policy`` on the evaluation env in each mode of ``eval_exploration``:
        the first filmed into ``videos/<tag>.mp4`` (with ``video``), its metrics prefixed
        ``eval/``; with ``"both"``, the sampled (``"random"``) one prefixed ``eval_random/``."""
        results: dict[str, Evaluation] = {}
        out: dict[str, float] = {}
        acting = self._evaluated_policy(policy)
        for mode in self.eval_modes:
            first = not results
            results[mode] = evaluate(
                self.eval_env,
                acting,
                steps=self.eval_steps,
                exploration=mode,
                video=self.run_dir / "videos" / f"{tag}.mp4" if self.video and first else None,
                env_indices=_filmed_envs(self.eval_env, self.video_envs),
                tile=True,
                fps=self.fps,
                seed=self.eval_seed,
            )
            prefix = "eval" if first else f"eval_{mode}"
            out.update({f"{prefix}/{k}": v for k, v in results[mode].metrics.items()})
        self._evaluated = (self.iteration, results)
        return out

    def _evaluated_policy(self, policy: Policy) -> Policy:
        """``policy`` as the evaluation env calls it: through a move of each step's data to
        :attr:`device` and back when the env is elsewhere."""
        if policy is None or self.device is None or self.eval_env.device == self.device:
            return policy
        return _on_device(policy, self.device)

    # ------------------------------------------------------------------ the end
    def finish(self, policy: Policy, info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Write the summary (trained vs random policy, the curve, the video; see
        :func:`~marlkit.record.summarise_run`) and close the loggers; returns the summary.

        The last iteration's evaluation, when it made one, is the summary's ``"trained"`` (and
        its video the ``rollout.mp4``): the same policy is not evaluated twice. The callbacks'
        ``on_train_end`` get the summary; a run a callback stopped has ``"stopped"`` (why) in
        it."""
        csv = self.logger.csv
        done = (
            self._evaluated[1] if self._evaluated and self._evaluated[0] == self.iteration else {}
        )
        stopped = {} if self.stop_reason is None else {"stopped": self.stop_reason}
        try:
            summary = summarise_run(
                self.run_dir,
                self.eval_env,
                self._evaluated_policy(policy),
                steps=self.eval_steps,
                rows=csv.rows() if csv is not None else [],
                video=self.video,
                video_envs=self.video_envs,
                fps=self.fps,
                info={**dict(info or {}), "iterations": self.iteration, **stopped},
                seed=self.eval_seed,
                exploration=self.eval_exploration,
                trained=done.get(self.eval_modes[0]),
                trained_random=done.get("random") if len(self.eval_modes) > 1 else None,
            )
            self._call("on_train_end", summary)
            return summary
        finally:
            self.close()

    def close(self) -> None:
        """Close the loggers and let go of the folder (idempotent)."""
        try:
            self.logger.close()
        finally:
            if self._lock is not None:
                self._lock.close()  # closing the file drops the flock
                self._lock = None

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TrainingRun({str(self.run_dir)!r}, iteration={self.iteration})"
