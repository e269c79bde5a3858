"""What one training run is made of, shared by every script of ``sota-implementations/``.

* :class:`TrainingRun`: a run's folder (locked while the run lives), its loggers, periodic
  evaluations, checkpoints, resume and summary; :class:`RunFolderInUse`.
* :class:`Checkpointer`: atomic, checksummed, pickle-free checkpoints; :func:`rng_state`,
  :func:`set_rng_state`.
* :func:`evaluate`, :class:`Evaluation`, :func:`summarise_run`: a policy's episodes with
  exploration off (optionally filmed), and the run's summary next to a random policy.
* :func:`episode_metrics`, :func:`episode_returns`, :func:`reward_groups`: per-group episode
  rewards of a collector batch.
* :class:`Callback` (:mod:`marlkit.train.callbacks`): the user's hooks at a run's events;
  :class:`EarlyStopping`, :class:`MetricRatio` (a custom metric), :class:`CallbackError`.
* :func:`gradient_steps`: optimiser steps of a loss on a buffer's samples; :func:`update_groups`
  runs them for every group, with :func:`adam_per_group` and :func:`soft_updates`.
* :mod:`marlkit.train.config`: the scripts' typed configs (the sections of their Hydra
  structured-config schemas, with their range checks), the configs' resolvers;
  :mod:`marlkit.train.scripts`: a run from a script's config (env factory, collector, run
  folder, its end, a trained policy read back); :mod:`marlkit.train.builders`: networks
  several scripts build alike.
* :class:`Experiment`, :class:`Grid`: task x algorithm x seed grids of the scripts' runs, on
  local processes or Ray, resumable (:mod:`marlkit.train.experiment`, ``docs/experiments.md``).
* :func:`load_results`, :func:`write_report`: a grid's results and their statistics (rliable),
  marl-eval JSON and report (:mod:`marlkit.train.report`, ``docs/statistics.md``).

It builds on :mod:`marlkit.record` (videos, loggers, plots), never the other way round. See
``docs/training.md``.
"""

from __future__ import annotations

from marlkit.train.callbacks import Callback, CallbackError, EarlyStopping, MetricRatio
from marlkit.train.checkpoint import Checkpointer, rng_state, set_rng_state
from marlkit.train.episodes import episode_metrics, episode_returns, reward_groups
from marlkit.train.evaluation import Evaluation, evaluate, summarise_run
from marlkit.train.experiment import Experiment, Grid
from marlkit.train.report import load_results, write_report
from marlkit.train.run import RunFolderInUse, TrainingRun
from marlkit.train.updates import adam_per_group, gradient_steps, soft_updates, update_groups

__all__ = [
    "Callback",
    "CallbackError",
    "Checkpointer",
    "EarlyStopping",
    "Evaluation",
    "Experiment",
    "Grid",
    "MetricRatio",
    "RunFolderInUse",
    "TrainingRun",
    "adam_per_group",
    "episode_metrics",
    "episode_returns",
    "evaluate",
    "gradient_steps",
    "load_results",
    "reward_groups",
    "rng_state",
    "set_rng_state",
    "soft_updates",
    "summarise_run",
    "update_groups",
    "write_report",
]
