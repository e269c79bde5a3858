"""``TrainingRun``: the folder of a training run and what a loop does to it each iteration.

A training script owns its algorithm (modules, losses, the update); the run folder's chores
are the same for every algorithm, and live here:

* **resume**: :meth:`TrainingRun.restore` loads the latest checkpoint (``None`` on a fresh
  run) and drops the metrics rows logged after it, so a run killed at any moment and resumed
  leaves one unbroken ``metrics.csv``;
* **timing**: :meth:`TrainingRun.batches` yields the collector's batches and times the
  collection; :meth:`TrainingRun.end_iteration` times the training since the batch came;
* **each iteration**: the frame counts, frames/s, each group's episode rewards
  (:func:`~marlkit.record.episode_metrics`), an evaluation every ``eval_every`` iterations
  (exploration off, filmed), the metrics logged, a checkpoint every ``checkpoint_every``
  iterations and at the last;
* **the end**: :meth:`TrainingRun.finish` writes ``summary.json``, ``reward.png`` and
  ``rollout.mp4`` (:func:`~marlkit.record.summarise_run`) and closes the loggers.

Example (a random policy "trained" for two iterations)::

    run = TrainingRun(folder, eval_env=eval_env, eval_steps=25, checkpoint_every=1)
    state = run.restore()           # None: nothing to resume
    for batch in run.batches(collector):
        metrics = {"train/loss": 0.0}   # the update goes here
        run.end_iteration(batch, metrics, policy=policy, state=lambda: {}, frames=collector.frames)
    run.finish(policy)
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase

from marlkit._utils import check_int
from marlkit.envs import EnvBase
from marlkit.record.checkpoint import Checkpointer
from marlkit.record.episodes import episode_metrics
from marlkit.record.evaluation import Evaluation, Policy, _filmed_envs, evaluate, summarise_run
from marlkit.record.loggers import Backend, MultiLogger, make_logger

__all__ = ["TrainingRun"]


class TrainingRun:
    """A training run's folder: its loggers, checkpoints, evaluations and summary.

    Args:
        run_dir: the folder (created when missing); a resumed run goes on in the same one.
        resume: go on from the folder's latest checkpoint (:meth:`restore`).
        eval_env: the evaluation env (a separate env: evaluations do not disturb training).
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

    Raises:
        TypeError: ``eval_steps``, ``eval_every``, ``checkpoint_every`` or ``video_envs`` that
            is not an int.
        ValueError: ``eval_every`` negative; ``eval_steps``, ``checkpoint_every`` or
            ``video_envs`` below 1; ``video`` with an ``eval_env`` that does not render
            ``rgb_array`` frames (raised here, not at the first evaluation).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        resume: bool = False,
        eval_env: EnvBase,
        eval_steps: int,
        eval_every: int = 0,
        video: bool = True,
        video_envs: int | None = None,
        fps: float = 30.0,
        checkpoint_every: int = 1,
        keep: int = 2,
        backends: Sequence[Backend] | Backend | str = "auto",
        project: str = "marlkit",
        config: Mapping[str, Any] | None = None,
    ):
        self.run_dir = pathlib.Path(run_dir)
        self.resume = bool(resume)
        self.eval_env = eval_env
        self.eval_steps = check_int("eval_steps", eval_steps, low=1)
        self.eval_every = check_int("eval_every", eval_every, low=0)
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
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", keep=keep)
        self.logger: MultiLogger = make_logger(
            self.run_dir,
            backends=backends,  # type: ignore[arg-type]
            resume=self.resume,
            project=project,
            name=self.run_dir.name,
            config=config,
        )
        #: Iterations done (restored by :meth:`restore`).
        self.iteration = 0
        #: The collector's :attr:`num_batches`, known once :meth:`batches` starts.
        self.total_iterations: int | None = None
        self._start = time.perf_counter()
        self._batch_came = self._start
        self._collection_time = 0.0
        #: (iteration, evaluation) of the latest :meth:`evaluate`: the summary reuses it when
        #: it evaluated the last iteration's policy.
        self._evaluated: tuple[int, Evaluation] | None = None

    # ------------------------------------------------------------------ resume
    def restore(self) -> dict[str, Any] | None:
        """The latest checkpoint's state when resuming and there is one, else ``None``; the
        iteration goes back to the checkpoint's and the metrics logged after it are dropped
        (they are done again)."""
        state = None
        if self.resume and self.checkpointer.latest() is not None:
            state = self.checkpointer.load()
            if "iteration" not in state:
                raise KeyError(f"{self.checkpointer.latest()} has no 'iteration'")
            self.iteration = check_int("iteration", state["iteration"], low=0)
        csv = self.logger.csv
        if csv is not None:
            csv.truncate(self.iteration)
        return state

    def restore_buffers(self, buffers: Mapping[str, Any]) -> None:
        """Restore replay buffers saved with :meth:`end_iteration`'s ``buffers``, when
        resuming from a checkpoint."""
        if self.resume and self.checkpointer.latest() is not None:
            self.checkpointer.load_buffers(buffers)

    # ------------------------------------------------------------------ the loop
    def batches(self, collector: Iterable[TensorDictBase]) -> Iterator[TensorDictBase]:
        """The collector's batches, each timed from the end of the previous iteration."""
        self.total_iterations = getattr(collector, "num_batches", None)
        self._batch_came = time.perf_counter()
        for batch in collector:
            now = time.perf_counter()
            self._collection_time = now - self._batch_came
            self._batch_came = now
            yield batch
            self._batch_came = time.perf_counter()

    @property
    def last(self) -> bool:
        """Whether the iteration being ended is the collector's last."""
        return self.total_iterations is not None and self.iteration >= self.total_iterations

    def end_iteration(
        self,
        batch: TensorDictBase,
        metrics: Mapping[str, Any],
        *,
        policy: Policy,
        state: Callable[[], Mapping[str, Any]],
        frames: int,
        buffers: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Count the iteration, complete its metrics, evaluate, log and checkpoint when due.

        Args:
            batch: the iteration's collector batch (for its episode rewards and frames).
            metrics: the algorithm's own metrics (losses, ...).
            policy: the policy to evaluate (exploration off).
            state: builds the checkpoint's state (modules, optimisers, collector, RNG); called
                only when a checkpoint is due; ``"iteration"`` is added.
            frames: the frames collected so far (``collector.frames``).
            buffers: replay buffers to save with each checkpoint (``{name: buffer}``).

        Returns:
            the iteration's logged metrics.
        """
        training_time = time.perf_counter() - self._batch_came
        self.iteration += 1
        out: dict[str, Any] = dict(metrics)
        out.update(
            frames=frames,
            frames_per_s=batch.numel() / max(self._collection_time + training_time, 1e-9),
            collection_time=self._collection_time,
            training_time=training_time,
            time=time.perf_counter() - self._start,
            **episode_metrics(batch),
        )
        last = self.last
        if last or (self.eval_every and self.iteration % self.eval_every == 0):
            out.update(self.evaluate(policy, f"eval-{self.iteration:04d}"))
        self.logger.log(out, step=self.iteration)
        if last or self.iteration % self.checkpoint_every == 0:
            self.checkpointer.save(
                self.iteration, {**state(), "iteration": self.iteration}, buffers=buffers
            )
        return out

    def evaluate(self, policy: Policy, tag: str) -> dict[str, float]:
        """Evaluate ``policy`` on the evaluation env (filmed into ``videos/<tag>.mp4`` with
        ``video``); the metrics are prefixed ``eval/``."""
        result = evaluate(
            self.eval_env,
            policy,
            steps=self.eval_steps,
            video=self.run_dir / "videos" / f"{tag}.mp4" if self.video else None,
            env_indices=_filmed_envs(self.eval_env, self.video_envs),
            tile=True,
            fps=self.fps,
        )
        self._evaluated = (self.iteration, result)
        return {f"eval/{k}": v for k, v in result.metrics.items()}

    # ------------------------------------------------------------------ the end
    def finish(self, policy: Policy, info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Write the summary (trained vs random policy, the curve, the video; see
        :func:`~marlkit.record.summarise_run`) and close the loggers; returns the summary.

        The last iteration's evaluation, when it made one, is the summary's ``"trained"`` (and
        its video the ``rollout.mp4``): the same policy is not evaluated twice."""
        csv = self.logger.csv
        done = self._evaluated
        try:
            return summarise_run(
                self.run_dir,
                self.eval_env,
                policy,
                steps=self.eval_steps,
                rows=csv.rows() if csv is not None else [],
                video=self.video,
                video_envs=self.video_envs,
                fps=self.fps,
                info={**dict(info or {}), "iterations": self.iteration},
                trained=done[1] if done is not None and done[0] == self.iteration else None,
            )
        finally:
            self.close()

    def close(self) -> None:
        """Close the loggers (idempotent)."""
        self.logger.close()

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TrainingRun({str(self.run_dir)!r}, iteration={self.iteration})"
