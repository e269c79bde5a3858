"""``VideoRecorder``: a transform that films an env's rollouts, and :func:`record_rollout`.

The recorder renders the env it is attached to (``env.render(i)``, the ``"rgb_array"`` frames of
the native renderer, VMAS, PettingZoo or MuJoCo) after each reset and each step, and hands the
frames to a :class:`~marlkit.record.video.VideoWriter`. Several envs of the batch can be tiled
into one frame. It changes no data and no spec.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDictBase

from marlkit._checks import check_flag, check_int
from marlkit._utils import get_logger
from marlkit.envs.common import EnvBase
from marlkit.envs.transforms.base import Transform, TransformedEnv
from marlkit.native.render import tile_frames
from marlkit.record.video import VideoWriter, open_video

__all__ = ["RecordResult", "VideoRecorder", "record_rollout"]

_logger = get_logger("record")
_MAX_TILES = 64


def _numbered(path: pathlib.Path, index: int) -> pathlib.Path:
    return path if index == 0 else path.with_name(f"{path.stem}-{index}{path.suffix}")


class VideoRecorder(Transform):
    """Film the env after each reset and each step into a video file.

    Attach it with ``TransformedEnv(env, VideoRecorder("rollout.mp4"))``: the env gives the
    recorder its frames (``env.render(i)``, ``uint8 [H, W, 3]``); the data passes through
    unchanged. Closing the env closes the recorder, which finalises the file; so does
    :meth:`close`, leaving a ``with`` block, garbage collection or the interpreter's exit, so a
    rollout interrupted by an exception still leaves a valid video of the frames so far.

    A reset that leaves every recorded env alone (a partial reset of other envs) adds no frame.
    A GIF holds its frames in memory, at most 2000 by default (``GIFWriter(max_frames=...)``):
    past that the recorder logs a warning and stops filming; the rollout goes on.

    Args:
        path: the video file (``.mp4``: H.264; ``.gif``), or a :class:`VideoWriter` to write
            into (then ``fps`` is the writer's).
        env_indices: the envs to film, flat indices into the env batch ``B``; one int, a
            sequence, or ``"all"`` (every env of the batch, at most 64; needs ``tile``).
        tile: put the frames of the ``env_indices`` side by side in one frame
            (:func:`marlkit.native.render.tile_frames`, a near-square grid, 2-pixel gaps).
            Without it, exactly one env index is allowed.
        fps: frames per second of the video.
        every: keep one capture in ``every`` (1 keeps them all).
        max_frames: stop capturing after this many frames (``None``: no limit).
        cols: grid columns when tiling (``None``: near-square).

    Attributes:
        paths: the files written so far (more than one after :meth:`flush`).
        frames_written: frames captured, over all files.

    Examples:
        >>> import marlkit
        >>> from marlkit.envs import TransformedEnv
        >>> from marlkit.record import VideoRecorder
        >>> env = TransformedEnv(
        ...     marlkit.make("navigation", num_envs=4, n_agents=3, seed=0),
        ...     VideoRecorder("nav.mp4", env_indices="all", tile=True),
        ... )
        >>> _ = env.rollout(50, break_when_any_done=False)  # doctest: +SKIP
        >>> env.close()  # nav.mp4: 51 frames, 4 envs tiled  # doctest: +SKIP
    """

    changes_done_flags = False  # it only renders

    def __init__(
        self,
        path: str | os.PathLike[str] | VideoWriter,
        *,
        env_indices: int | Sequence[int] | str = (0,),
        tile: bool = False,
        fps: float = 30.0,
        every: int = 1,
        max_frames: int | None = None,
        cols: int | None = None,
    ):
        self._writer: VideoWriter | None
        self._base_path: pathlib.Path | None
        if isinstance(path, VideoWriter):
            self._writer, self._base_path = path, None
            self.paths = [path.path]
            self.fps = path.fps
        elif isinstance(path, (str, os.PathLike)):
            self._writer, self._base_path = None, pathlib.Path(path)
            self.paths = []
            # A bad suffix or fps, or a missing video extra, fail now rather than at the first
            # frame; a writer that gets no frame writes no file.
            open_video(self._base_path, fps=fps).close()
            self.fps = float(fps)
        else:
            raise TypeError(
                f"VideoRecorder takes a file path or a VideoWriter, got {type(path).__name__}"
            )
        self.env_indices = self._parse_indices(env_indices)
        tile = check_flag("tile", tile)
        if not tile and (self.env_indices == "all" or len(self.env_indices) != 1):
            raise ValueError(
                f"VideoRecorder films one env unless tile=True; got env_indices={env_indices!r}"
            )
        self.tile = tile
        self.every = check_int("every", every, low=1)
        self.max_frames = check_int("max_frames", max_frames, low=1, allow_none=True)
        self.cols = check_int("cols", cols, low=1, allow_none=True)
        self.frames_written = 0
        self._captures = 0
        self._indices: list[int] = []
        self._closed = False
        self._stopped = False  # no more frames: closed, a full GIF, a writer closed elsewhere

    @staticmethod
    def _parse_indices(env_indices: int | Sequence[int] | str) -> list[int] | str:
        if isinstance(env_indices, str):
            if env_indices != "all":
                raise ValueError(f"env_indices must be ints or 'all', got {env_indices!r}")
            return "all"
        if isinstance(env_indices, (int, np.integer)) and not isinstance(env_indices, bool):
            return [int(env_indices)]
        if not isinstance(env_indices, Sequence) or not env_indices:
            raise ValueError(
                f"env_indices must be an int, a non-empty sequence of ints or 'all', got "
                f"{env_indices!r}"
            )
        return [check_int("each env index", i) for i in env_indices]

    # ------------------------------------------------------------------ attachment
    def set_parent(self, env: EnvBase) -> None:
        """Check that ``env`` renders ``rgb_array`` frames and holds the ``env_indices``."""
        if self.parent is not None and self.parent is not env:
            raise RuntimeError(
                "this VideoRecorder is already attached to another env; make one per env"
            )
        if "rgb_array" not in env.render_modes:
            inner = env
            while isinstance(inner, TransformedEnv):
                inner = inner.base_env
            raise ValueError(
                f"VideoRecorder needs an env that renders 'rgb_array' frames; "
                f"{type(inner).__name__} declares "
                f"render_modes={tuple(env.render_modes)} (some adapters need "
                "render_mode='rgb_array' when the env is made, marlkit.adapters.custom ones "
                "render=True)"
            )
        n = env.batch_size.numel()
        if isinstance(self.env_indices, str):  # "all"
            if n > _MAX_TILES:
                raise ValueError(
                    f"env_indices='all' tiles at most {_MAX_TILES} envs; the batch has {n}: "
                    "pass the indices to film"
                )
            indices = list(range(n))
        else:
            indices = list(self.env_indices)
            bad = [i for i in indices if not -n <= i < n]
            if bad:
                raise IndexError(
                    f"VideoRecorder env_indices {bad} are outside the env batch of {n} envs"
                )
        self._indices = [i % n for i in indices]
        super().set_parent(env)

    # ------------------------------------------------------------------ capture
    def _frame(self) -> np.ndarray:
        env = self.parent
        if env is None:
            raise RuntimeError("VideoRecorder is not attached: use TransformedEnv(env, recorder)")
        frames = [env.render(i) for i in self._indices]
        if not self.tile:
            return frames[0]
        return tile_frames(frames, cols=self.cols)

    def _writer_for_next_frame(self) -> VideoWriter | None:
        if self._writer is None and self._base_path is not None:
            path = _numbered(self._base_path, len(self.paths))
            self._writer = open_video(path, fps=self.fps)
            self.paths.append(path)
        return self._writer

    def capture(self) -> None:
        """Render the filmed envs now and write the frame (subject to ``every`` and
        ``max_frames``). The env calls this after each reset and step."""
        if self._stopped or (
            self.max_frames is not None and self.frames_written >= self.max_frames
        ):
            return
        self._captures += 1
        if (self._captures - 1) % self.every:
            return
        writer = self._writer_for_next_frame()
        if writer is None or writer.closed:  # a writer handed in and closed by its owner
            _logger.warning("VideoRecorder: its writer was closed; recording stops")
            self._stopped = True
            return
        if writer.max_frames is not None and writer.frames_written >= writer.max_frames:
            # A full GIF: stop filming rather than break the rollout.
            _logger.warning(
                "VideoRecorder: %s is full (%d frames); later frames are dropped (use .mp4)",
                writer.path,
                writer.max_frames,
            )
            self._stopped = True
            writer.close()
            return
        writer.append(self._frame())
        self.frames_written += 1

    def reset(
        self,
        tensordict: TensorDictBase | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        if env_mask is None or bool(env_mask.reshape(-1)[self._indices].any()):
            self.capture()
        return tensordict_reset

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        self.capture()
        return next_tensordict

    # ------------------------------------------------------------------ files
    def flush(self) -> pathlib.Path | None:
        """Finalise the current file now (a valid video of every frame so far) and return its
        path (``None`` when no frame was captured since the last flush).

        Later frames go to a new file: ``rollout-1.mp4``, ``rollout-2.mp4``, ... next to the
        first (``paths`` lists them), e.g. one file per episode: flush between ``step`` and the
        ``reset`` of the finished env (``step_and_maybe_reset`` has already filmed the next
        episode's first frame when it returns, so that frame ends the file flushed after it).
        A recorder given a :class:`VideoWriter` instead of a path stops recording after a flush.
        """
        writer = self._writer
        if writer is None or writer.closed:
            return None
        writer.close()
        if self._base_path is not None:
            self._writer = None
        else:
            self._stopped = True  # a writer handed in cannot be reopened
        return writer.path if writer.frames_written else None

    def close(self) -> None:
        """Finalise the file and stop recording (idempotent); the env calls it on close."""
        if self._closed:
            return
        self._closed = self._stopped = True
        if self._writer is not None:
            self._writer.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> VideoRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        target = self.paths[-1] if self.paths else self._base_path
        return (
            f"VideoRecorder({str(target)!r}, env_indices={self.env_indices!r}, "
            f"tile={self.tile}, fps={self.fps:g}, every={self.every}, frames={self.frames_written})"
        )


@dataclass
class RecordResult:
    """What :func:`record_rollout` wrote."""

    path: pathlib.Path
    frames: int
    steps: int
    frame_size: tuple[int, int]


Policy = Callable[[TensorDictBase], TensorDictBase]


def record_rollout(
    env: EnvBase,
    path: str | os.PathLike[str],
    *,
    steps: int,
    policy: Policy | None = None,
    env_indices: int | Sequence[int] | str = (0,),
    tile: bool = False,
    fps: float = 30.0,
    progress: Callable[[int], None] | None = None,
    close: bool = True,
) -> RecordResult:
    """Run ``steps`` steps of ``env`` (done envs are reset) and film them into ``path``.

    Args:
        env: the env; it is wrapped in a ``TransformedEnv`` with a :class:`VideoRecorder`.
        path: ``.mp4`` or ``.gif``.
        steps: number of steps; the video has ``steps + 1`` frames (the reset, then each step;
            plus one per auto-reset that touches a filmed env).
        policy: reads the root TensorDict and writes the actions; random actions when ``None``.
        env_indices, tile, fps: see :class:`VideoRecorder`.
        progress: called with ``1`` after each step (e.g. ``tqdm.update``).
        close: close ``env`` afterwards (the file is finalised either way, also on error).

    Returns:
        the file, the number of frames and steps, and the frame ``(height, width)``.
    """
    try:
        steps = check_int("steps", steps, low=1)
        recorder = VideoRecorder(path, env_indices=env_indices, tile=tile, fps=fps)
        recorded = TransformedEnv(env, recorder)
    except BaseException:
        if close:
            env.close()
        raise
    try:
        with torch.no_grad():
            td = recorded.reset()
            for _ in range(steps):
                td = policy(td) if policy is not None else recorded.rand_action(td)
                _, td = recorded.step_and_maybe_reset(td)
                if progress is not None:
                    progress(1)
    finally:
        recorder.close()
        if close:
            env.close()
    writer_path = recorder.paths[-1]
    size = _frame_size(recorder)
    return RecordResult(writer_path, recorder.frames_written, steps, size)


def _frame_size(recorder: VideoRecorder) -> tuple[int, int]:
    writer = recorder._writer
    if writer is None or writer.frame_size is None:
        return (0, 0)
    return writer.frame_size
