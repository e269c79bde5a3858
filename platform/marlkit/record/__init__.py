"""Recording rollouts: video writers, the ``VideoRecorder`` transform and ``record_rollout``.

``TransformedEnv(env, VideoRecorder("rollout.mp4"))`` films an env's rollouts through its
``"rgb_array"`` rendering; :func:`open_video` writes frames to H.264 MP4 or GIF; ``marlkit record``
is the command-line face (:mod:`marlkit.record._cli`). Needs the ``video`` extra (imageio,
imageio-ffmpeg), imported when a writer is made.
"""

from __future__ import annotations

from marlkit.record.recorder import RecordResult, VideoRecorder, record_rollout
from marlkit.record.video import (
    GIFWriter,
    MP4Writer,
    VideoFormat,
    VideoWriter,
    open_video,
    video_format,
)

__all__ = [
    "GIFWriter",
    "MP4Writer",
    "RecordResult",
    "VideoFormat",
    "VideoRecorder",
    "VideoWriter",
    "open_video",
    "record_rollout",
    "video_format",
]
