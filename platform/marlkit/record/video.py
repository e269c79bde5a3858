"""Video writers: RGB frames to an H.264 MP4 (through imageio-ffmpeg) or an animated GIF.

The format comes from the file's suffix (:func:`open_video`). Both writers take ``uint8
[H, W, 3]`` frames one at a time, all of one size, and finalise the file on :meth:`close`; they
also finalise it when the writer is garbage-collected or the interpreter exits (an uncaught
exception in a rollout loop still leaves a valid file holding the frames written so far).

* **MP4** (``.mp4``): H.264 (``libx264``), ``yuv420p`` pixels, the ``moov`` atom at the front
  (``+faststart``) so that browsers start playing at once. Frames stream to an ``ffmpeg``
  process as they come (constant memory); ``imageio-ffmpeg`` ships its own static ``ffmpeg``
  binary, so nothing else needs installing and no display or GPU is involved. ``yuv420p``
  needs an even width and height: an odd-sized frame gets one more column/row, a copy of its
  last one (the picture is not scaled).
* **GIF** (``.gif``): encoded by Pillow through imageio when the writer closes, so the frames
  are held in memory until then (GIF suits short clips). Pillow merges consecutive identical
  frames into one longer frame, and the GIF frame delay has a resolution of 10 ms.

A video that cannot be written whole is an ``OSError`` naming the file, and leaves no file
(no empty or unplayable one): ffmpeg's exit status and messages are checked when it finishes
(and when it stops taking frames), and the GIF's bytes are written with their space reserved
first. A full disk is ENOSPC (``err.errno == errno.ENOSPC``), its message starting with
``no space left on the device for '<file>'``.

Example:
    >>> import numpy as np
    >>> from marlkit.record import open_video
    >>> with open_video("ramp.mp4", fps=10) as video:  # doctest: +SKIP
    ...     for i in range(20):
    ...         video.append(np.full((64, 64, 3), 10 * i, np.uint8))
"""

from __future__ import annotations

import abc
import contextlib
import errno
import os
import pathlib
import re
import subprocess
import tempfile
import warnings
import weakref
from collections.abc import Callable
from fractions import Fraction
from typing import IO, Any, Literal, cast, get_args

import numpy as np
from numpy.typing import NDArray

from marlkit._checks import check_int, check_one_of, check_real
from marlkit._files import write_bytes
from marlkit._utils import get_logger, import_optional

__all__ = [
    "GIFWriter",
    "MP4Writer",
    "VideoFormat",
    "VideoWriter",
    "X264Preset",
    "open_video",
    "read_video",
    "video_format",
]

VideoFormat = Literal["mp4", "gif"]
X264Preset = Literal[
    "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow"
]
_X264_PRESETS: tuple[str, ...] = get_args(X264Preset)
_SUFFIXES: dict[str, VideoFormat] = {".mp4": "mp4", ".gif": "gif"}
_logger = get_logger("record")
#: The shortest GIF frame delay that players honour (browsers show 0 and 10 ms as 100 ms).
_GIF_MIN_DELAY_MS = 20.0


def video_format(path: str | os.PathLike[str]) -> VideoFormat:
    """The format a path's suffix asks for: ``"mp4"`` or ``"gif"`` (case-insensitive).

    Raises:
        ValueError: any other suffix (the message lists the supported ones).
    """
    suffix = pathlib.Path(path).suffix.lower()
    fmt = _SUFFIXES.get(suffix)
    if fmt is None:
        raise ValueError(
            f"cannot write a video to {str(path)!r}: unknown suffix {suffix or '(none)'!r}; "
            f"use one of {', '.join(_SUFFIXES)}"
        )
    return fmt


def prepare_path(path: pathlib.Path) -> None:
    """Create ``path``'s parent folders and check that the file can be written, so that an
    unwritable path fails with the OS's own reason before any frame is made (ffmpeg only
    reports a broken pipe, and a GIF is written at the end). A file this check creates is
    removed; an existing one is left as it is.

    Raises:
        OSError: the folders cannot be created or the file cannot be opened for writing.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    with open(path, "ab"):
        pass
    if not existed:
        path.unlink()


def _check_fps(fps: float) -> float:
    return check_real("fps", fps)


def _as_frame(frame: Any) -> NDArray[np.uint8]:
    """A C-contiguous ``uint8 [H, W, 3]`` array from a NumPy array or a torch tensor."""
    if hasattr(frame, "detach"):  # a torch tensor, without importing torch here
        frame = frame.detach().cpu().numpy()
    if not isinstance(frame, np.ndarray):
        raise TypeError(
            f"a video frame must be a uint8 [H, W, 3] array or tensor, got {type(frame).__name__}"
        )
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
        raise ValueError(
            f"a video frame must be uint8 [H, W, 3], got {frame.dtype} {list(frame.shape)}"
        )
    if frame.shape[0] == 0 or frame.shape[1] == 0:
        raise ValueError(f"a video frame must not be empty, got {list(frame.shape)}")
    return np.ascontiguousarray(frame)


class VideoWriter(abc.ABC):
    """Writes ``uint8 [H, W, 3]`` frames, all of one size, to one video file.

    Args:
        path: the file to write (parent folders are created). A path that cannot be written
            raises the OS's ``OSError`` at the first frame.
        fps: frames per second of the video.

    Use it as a context manager, or call :meth:`close` to finalise the file.
    """

    #: The format this writer produces.
    format: VideoFormat
    #: The most frames the writer takes (``None``: no limit); see :class:`GIFWriter`.
    max_frames: int | None = None

    def __init__(self, path: str | os.PathLike[str], *, fps: float = 30.0):
        self.path = pathlib.Path(path)
        expected = video_format(self.path)
        if expected != self.format:
            raise ValueError(
                f"{type(self).__name__} writes .{self.format} files, got {str(path)!r}; "
                "use open_video(path) to pick the writer from the suffix"
            )
        self.fps = _check_fps(fps)
        self._frame_shape: tuple[int, ...] | None = None
        self._count = 0
        self._closed = False
        # Set by subclasses: finalises the file without a reference to ``self``, so that it
        # also runs when the writer is garbage-collected or at interpreter exit.
        self._finalizer: weakref.finalize | None = None

    @property
    def frames_written(self) -> int:
        """Frames appended so far."""
        return self._count

    @property
    def frame_size(self) -> tuple[int, int] | None:
        """``(height, width)`` of the frames given (``None`` before the first)."""
        return None if self._frame_shape is None else self._frame_shape[:2]  # type: ignore[return-value]

    @property
    def closed(self) -> bool:
        return self._closed

    def append(self, frame: Any) -> None:
        """Add one frame, ``uint8 [H, W, 3]`` (NumPy or torch), the size of the first one.

        Raises:
            RuntimeError: the writer is closed.
            TypeError, ValueError: not a ``uint8 [H, W, 3]`` frame, or another size.
        """
        if self._closed:
            raise RuntimeError(f"the video writer of {str(self.path)!r} is closed")
        array = _as_frame(frame)
        if self._frame_shape is None:
            prepare_path(self.path)
            self._open(array.shape[0], array.shape[1])
            self._frame_shape = array.shape
        elif array.shape != self._frame_shape:
            raise ValueError(
                f"video frames must all have one size: {str(self.path)!r} started with "
                f"[H, W, 3] = {list(self._frame_shape)}, got {list(array.shape)}"
            )
        self._write(array)
        self._count += 1

    def extend(self, frames: Any) -> None:
        """Append each frame of ``uint8 [K, H, W, 3]`` (or a sequence of ``[H, W, 3]``)."""
        for frame in frames:
            self.append(frame)

    def close(self) -> None:
        """Finalise the file (idempotent). A writer that received no frame writes no file."""
        if self._closed:
            return
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()
        elif self._count == 0:
            _logger.debug("no frame was written: %s not created", self.path)

    @abc.abstractmethod
    def _open(self, height: int, width: int) -> None:
        """Prepare the output for frames of this size; set ``self._finalizer``."""

    @abc.abstractmethod
    def _write(self, frame: NDArray[np.uint8]) -> None:
        """Write one checked frame."""

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"{type(self).__name__}({str(self.path)!r}, fps={self.fps:g}, "
            f"frames={self._count}, {state})"
        )


#: ffmpeg runs in a process group of its own: a Ctrl-C at the terminal reaches this process,
#: which finalises the video, and not ffmpeg, which would die mid-file.
_OWN_GROUP: dict[str, Any] = (
    {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
    if os.name == "nt"
    else {"start_new_session": True}
)
#: How ffmpeg says that the disk is full (``strerror`` of ENOSPC and EDQUOT).
_FULL_DISK = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


def _ffmpeg_error(path: pathlib.Path, code: int, said: str) -> OSError:
    """The error of an ffmpeg that did not write ``path`` whole: ``code`` its exit status,
    ``said`` what it wrote to its stderr."""
    removed = "; the incomplete file was removed"
    if any(words in said for words in _FULL_DISK):
        return OSError(
            errno.ENOSPC,
            f"no space left on the device for {str(path)!r}: ffmpeg could not write the "
            f"video{removed}",
            str(path),
        )
    first = next((line for line in said.splitlines() if line.strip()), "")
    first = re.sub(r"^\[[^\]]*\]\s*", "", first.strip())  # "[out#0/mp4 @ 0x5611...] "
    why = f"exit status {code}" if code else "it wrote an empty file"
    return OSError(
        f"ffmpeg failed to write {str(path)!r} ({why}){': ' + first if first else ''}{removed}"
    )


def _finish_ffmpeg(process: subprocess.Popen[bytes], log: IO[bytes], path: pathlib.Path) -> None:
    """Close ffmpeg's input, wait for it to finish ``path``, and check that it did: a file
    that ffmpeg failed to write, or an empty one, is removed, and the error names it."""
    try:
        with contextlib.suppress(OSError):  # a broken pipe: ffmpeg has stopped already
            process.stdin.close()  # type: ignore[union-attr]
        code = process.wait()
        log.seek(0)
        said = log.read().decode(errors="replace")
    except BaseException:  # interrupted while ffmpeg finishes: do not leave it running
        process.kill()
        raise
    finally:
        log.close()
    if code == 0 and path.is_file() and path.stat().st_size > 0:
        return
    path.unlink(missing_ok=True)
    raise _ffmpeg_error(path, code, said)


class MP4Writer(VideoWriter):
    """H.264 MP4 through imageio-ffmpeg (frames stream to an ``ffmpeg`` process).

    Args:
        path: a ``.mp4`` file.
        fps: frames per second.
        quality: 0 (smallest) to 10 (best); mapped to x264's CRF (``51 * (1 - q / 10)``);
            the default 7 gives CRF 15.
        pad_color: how odd-sized frames grow to even sizes: ``None`` repeats their last
            row/column, an ``(r, g, b)`` adds a row/column of that colour.
        preset: x264's speed/compression trade-off; ``"veryfast"`` (the default) takes about a
            quarter less CPU than x264's ``"medium"`` for the same file size on rendered scenes.

    Odd frame sizes grow by one pixel (``yuv420p`` needs even sizes): read-back frames are
    ``[H + H % 2, W + W % 2, 3]``.
    """

    format: VideoFormat = "mp4"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fps: float = 30.0,
        quality: float = 7.0,
        pad_color: tuple[int, int, int] | None = None,
        preset: X264Preset = "veryfast",
    ):
        super().__init__(path, fps=fps)
        self.preset = check_one_of("preset", preset, _X264_PRESETS)
        self.quality = check_real("quality", quality, strict=False, high=10.0)
        self.pad_color = pad_color
        self._ffmpeg = import_optional("imageio_ffmpeg", extra="video", purpose="MP4 videos")
        self._process: subprocess.Popen[bytes] | None = None
        self._pad = (0, 0)

    def _command(self, width: int, height: int) -> list[str]:
        """ffmpeg's command: raw RGB frames of ``width x height`` on its stdin, H.264 out."""
        crf = int((1 - self.quality / 10) * 51)
        rate = str(Fraction(self.fps).limit_denominator())
        return [
            self._ffmpeg.get_ffmpeg_exe(),
            "-y", "-v", "error",
            "-f", "rawvideo", "-vcodec", "rawvideo", "-pix_fmt", "rgb24",
            "-s", f"{width}x{height}", "-r", rate, "-i", "-", "-an",
            "-vcodec", "libx264", "-pix_fmt", "yuv420p", "-crf", str(crf),
            "-preset", self.preset, "-movflags", "+faststart",
            str(self.path),
        ]  # fmt: skip

    def _open(self, height: int, width: int) -> None:
        self._pad = (height % 2, width % 2)
        command = self._command(width + self._pad[1], height + self._pad[0])
        log = tempfile.TemporaryFile()  # noqa: SIM115 - ffmpeg's messages, closed by the finalizer
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
                **_OWN_GROUP,
            )
        except BaseException:
            log.close()
            raise
        self._process = process
        self._finalizer = weakref.finalize(self, _finish_ffmpeg, process, log, self.path)

    def _write(self, frame: NDArray[np.uint8]) -> None:
        dh, dw = self._pad
        if dh or dw:
            if self.pad_color is None:
                frame = np.pad(frame, ((0, dh), (0, dw), (0, 0)), mode="edge")
            else:
                grown = np.empty((frame.shape[0] + dh, frame.shape[1] + dw, 3), np.uint8)
                grown[...] = np.asarray(self.pad_color, np.uint8)
                grown[: frame.shape[0], : frame.shape[1]] = frame
                frame = grown
        process = cast("subprocess.Popen[bytes]", self._process)  # set by _open
        try:
            process.stdin.write(frame.data)  # type: ignore[union-attr]  # stdin=PIPE: set
        except OSError:  # ffmpeg has stopped (a full disk, ...): its exit says why
            self.close()  # raises the error that names the file
            raise


def _write_gif(
    imwrite: Callable[..., Any], path: pathlib.Path, frames: list[NDArray[np.uint8]], fps: float
) -> None:
    if not frames:
        return
    # GIF delays are in 10 ms units; Pillow takes milliseconds per frame. Delays under 20 ms
    # (fps above 50) are shown at 100 ms by browsers, hence the floor (see GIFWriter).
    delay = max(1000.0 / fps, _GIF_MIN_DELAY_MS)
    data = imwrite("<bytes>", np.stack(frames), extension=".gif", duration=delay, loop=0)
    # its space reserved first: a full disk is an error naming the file, which is not left
    write_bytes(path, [memoryview(data)], len(data))


class GIFWriter(VideoWriter):
    """Animated GIF through imageio's Pillow plugin, written when the writer closes.

    Args:
        path: a ``.gif`` file.
        fps: frames per second (GIF delays are rounded to 10 ms). GIFs play at most 50 frames
            per second: browsers slow delays under 20 ms to 100 ms, so a higher ``fps`` is
            written as 50, with a warning (use ``.mp4`` for more).
        max_frames: refuse frames beyond this many (they are held in memory until
            :meth:`close`); ``None`` for no limit.
    """

    format: VideoFormat = "gif"

    def __init__(
        self, path: str | os.PathLike[str], *, fps: float = 30.0, max_frames: int | None = 2000
    ):
        super().__init__(path, fps=fps)
        self.max_frames = check_int("max_frames", max_frames, low=1, allow_none=True)
        if self.fps > 1000.0 / _GIF_MIN_DELAY_MS:
            warnings.warn(
                f"GIFs play at most {1000.0 / _GIF_MIN_DELAY_MS:g} frames per second (browsers "
                f"slow shorter delays to 100 ms): {str(self.path)!r} is written at that rate, "
                f"not {self.fps:g}; write an .mp4 for a higher rate",
                UserWarning,
                stacklevel=2,
            )
        self._iio = import_optional("imageio.v3", extra="video", purpose="GIF videos")
        self._frames: list[NDArray[np.uint8]] = []

    def _open(self, height: int, width: int) -> None:
        self._finalizer = weakref.finalize(
            self, _write_gif, self._iio.imwrite, self.path, self._frames, self.fps
        )

    def _write(self, frame: NDArray[np.uint8]) -> None:
        if self.max_frames is not None and len(self._frames) >= self.max_frames:
            raise ValueError(
                f"GIFWriter holds at most max_frames={self.max_frames} frames in memory; "
                f"write longer videos as .mp4 (or raise max_frames) — {str(self.path)!r}"
            )
        self._frames.append(frame.copy())


def open_video(path: str | os.PathLike[str], *, fps: float = 30.0, **kwargs: Any) -> VideoWriter:
    """A writer for ``path``, chosen by its suffix: :class:`MP4Writer` for ``.mp4``,
    :class:`GIFWriter` for ``.gif``; ``kwargs`` go to that writer.

    Raises:
        ValueError: an unknown suffix.
        ImportError: imageio / imageio-ffmpeg are missing (``pip install 'marlkit[video]'``).
    """
    fmt = video_format(path)
    cls: type[VideoWriter] = MP4Writer if fmt == "mp4" else GIFWriter
    return cls(path, fps=fps, **kwargs)


def read_video(path: str | os.PathLike[str]) -> tuple[NDArray[np.uint8], dict[str, Any]]:
    """Every frame of a video file, ``uint8 [T, H, W, 3]``, and its metadata (imageio's).

    Raises:
        ImportError: imageio / imageio-ffmpeg are missing (``pip install 'marlkit[video]'``).
    """
    path = pathlib.Path(path)
    if video_format(path) == "gif":
        iio = import_optional("imageio.v3", extra="video", purpose="reading videos")
        return np.asarray(iio.imread(path, index=None))[..., :3], dict(iio.immeta(path))
    iio2 = import_optional("imageio.v2", extra="video", purpose="reading videos")
    # imageio-ffmpeg 0.8's reader leaves ffmpeg's pipes open when it reads to the end of the
    # file (its cleanup skips a process that has already exited): they are freed right here,
    # and their ResourceWarning is not about the file read.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        with iio2.get_reader(path, format="FFMPEG") as reader:
            frames = np.stack(list(reader.iter_data()))
            meta = dict(reader.get_meta_data())
    return frames, meta
