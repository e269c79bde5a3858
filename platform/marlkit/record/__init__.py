"""What a run leaves for a person to look at: video writers, the ``VideoRecorder`` transform,
``record_rollout``, metric loggers and plots.

``TransformedEnv(env, VideoRecorder("rollout.mp4"))`` films an env's rollouts through its
``"rgb_array"`` rendering; :func:`open_video` writes frames to H.264 MP4 or GIF; ``marlkit record``
is the command-line face (:mod:`marlkit.record._cli`). Needs the ``video`` extra (imageio,
imageio-ffmpeg), imported when a writer is made.

:func:`make_logger` logs a training run's metrics to a CSV file that a killed and resumed run
leaves whole (:class:`CSVLogger`), TensorBoard and wandb (:mod:`marlkit.record.loggers`);
:func:`plot_curves`, :func:`plot_with_bands` and :func:`bootstrap_ci` turn them into figures
(:mod:`marlkit.record.plot`). TensorBoard, wandb and matplotlib come with the ``train`` extra.

What a training run is made of (run folders, checkpoints, evaluation, configs) is
:mod:`marlkit.train`, which builds on this package; this package never imports it.
"""

from __future__ import annotations

from marlkit.record.loggers import (
    CSVLogger,
    Logger,
    MultiLogger,
    TensorBoardLogger,
    WandbLogger,
    make_logger,
    read_metrics,
)
from marlkit.record.plot import ConfidenceInterval, bootstrap_ci, plot_curves, plot_with_bands
from marlkit.record.recorder import RecordResult, VideoRecorder, record_rollout
from marlkit.record.video import (
    GIFWriter,
    MP4Writer,
    VideoFormat,
    VideoWriter,
    open_video,
    read_video,
    video_format,
)

__all__ = [
    "CSVLogger",
    "ConfidenceInterval",
    "GIFWriter",
    "Logger",
    "MP4Writer",
    "MultiLogger",
    "RecordResult",
    "TensorBoardLogger",
    "VideoFormat",
    "VideoRecorder",
    "VideoWriter",
    "WandbLogger",
    "bootstrap_ci",
    "make_logger",
    "open_video",
    "plot_curves",
    "plot_with_bands",
    "read_metrics",
    "read_video",
    "record_rollout",
    "video_format",
]
