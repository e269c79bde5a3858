"""Video writers and the ``VideoRecorder`` transform, on real envs and real files read back."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

import marlkit
from marlkit.data.keys import DONE, NEXT
from marlkit.envs import EnvBase, StepCounter, TransformedEnv
from marlkit.record import (
    GIFWriter,
    MP4Writer,
    VideoRecorder,
    open_video,
    read_video,
    record_rollout,
    video_format,
)
from marlkit.testing import check_adapter


def assert_frames_change(frames: np.ndarray) -> None:
    diffs = [np.abs(frames[i].astype(int) - frames[i - 1]).max() for i in range(1, len(frames))]
    assert sum(d > 16 for d in diffs) >= len(diffs) // 2, f"frames barely change: {diffs}"


def navigation(num_envs: int = 2, **kwargs: object) -> EnvBase:
    return marlkit.make("navigation", num_envs=num_envs, n_agents=3, seed=0, **kwargs)


def expected_frames(rollout: TensorDictBase, env_index: int = 0) -> int:
    """Reset + each step + each auto-reset of the filmed env (``break_when_any_done=False``)."""
    done = rollout.get((NEXT, DONE)).reshape(-1, rollout.shape[-1])[env_index]
    return 1 + rollout.shape[-1] + int(done.sum())


# --------------------------------------------------------------------------- writers


def ramp(height: int, width: int, count: int) -> list[np.ndarray]:
    frames = []
    for i in range(count):
        frame = np.zeros((height, width, 3), np.uint8)
        frame[:, : 1 + (i * 7) % width, 0] = 220
        frame[..., 1] = 15 * i
        frames.append(frame)
    return frames


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_writer_round_trip(tmp_path: pathlib.Path, suffix: str) -> None:
    frames = ramp(48, 64, 12)
    path = tmp_path / "sub" / f"ramp{suffix}"
    with open_video(path, fps=10) as video:
        video.extend(frames)
        assert video.frames_written == 12 and video.frame_size == (48, 64)
    assert video.closed
    back, meta = read_video(path)
    assert back.shape == (12, 48, 64, 3)
    assert_frames_change(back)
    assert np.abs(back.astype(int) - np.stack(frames)).mean() < 4.0  # lossy, but close
    if suffix == ".mp4":
        assert meta["codec"] == "h264" and meta["pix_fmt"].startswith("yuv420p")
        assert meta["fps"] == 10.0
    else:
        assert meta["duration"] == 100 and meta["loop"] == 0  # milliseconds per frame


def test_mp4_pads_odd_sizes_to_even(tmp_path: pathlib.Path) -> None:
    with MP4Writer(tmp_path / "odd.mp4", fps=5) as video:
        video.extend(ramp(47, 63, 4))
    back, _ = read_video(tmp_path / "odd.mp4")
    assert back.shape == (4, 48, 64, 3)  # one more row and column, copies of the last ones
    assert np.abs(back[:, 46].astype(int) - back[:, 47]).max() < 12

    with MP4Writer(tmp_path / "odd_red.mp4", fps=5, pad_color=(255, 0, 0)) as video:
        video.extend(ramp(47, 63, 2))
    back, _ = read_video(tmp_path / "odd_red.mp4")
    # The added row is red (yuv420p shares colour between rows 46 and 47, hence the margin).
    assert int(back[0, 47, 10, 0]) > int(back[0, 46, 10, 0]) + 60 and back[0, 47, 10, 2] < 60


def test_gif_rates_above_50_fps_are_written_at_50_with_a_warning(tmp_path: pathlib.Path) -> None:
    with pytest.warns(UserWarning, match="GIFs play at most 50 frames per second"):
        video = GIFWriter(tmp_path / "fast.gif", fps=150)
    with video:
        video.extend(ramp(8, 8, 3))
    assert read_video(tmp_path / "fast.gif")[1]["duration"] == 20  # not 0: shown at 100 ms


def test_writer_accepts_torch_frames(tmp_path: pathlib.Path) -> None:
    with GIFWriter(tmp_path / "t.gif", fps=20) as video:
        for frame in ramp(16, 16, 3):
            video.append(torch.from_numpy(frame))
    assert read_video(tmp_path / "t.gif")[0].shape == (3, 16, 16, 3)


def test_no_frames_no_file(tmp_path: pathlib.Path) -> None:
    for name in ("empty.mp4", "empty.gif"):
        open_video(tmp_path / name).close()
        assert not (tmp_path / name).exists()


@pytest.mark.parametrize("name", ["x.mp4", "x.gif"])
def test_an_unwritable_path_fails_at_the_first_frame_with_the_os_reason(name: str) -> None:
    video = open_video(pathlib.Path("/proc") / name)  # no file can be made in /proc
    with pytest.raises(FileNotFoundError, match=f"No such file or directory: '/proc/{name}'"):
        video.append(ramp(16, 16, 1)[0])
    video.close()


def test_the_write_check_leaves_an_existing_file_until_the_writer_replaces_it(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "old.gif"
    path.write_bytes(b"old")
    with open_video(path) as video:
        video.append(ramp(16, 16, 1)[0])
        assert path.read_bytes() == b"old"  # a GIF is written when the writer closes
    assert read_video(path)[0].shape == (1, 16, 16, 3)


@pytest.mark.parametrize(
    ("name", "room", "count"),
    [("full.mp4", 0, 5), ("full.gif", 0, 5), ("filled-midway.mp4", 200_000, 200)],
)
def test_a_full_disk_is_an_error_naming_the_video_and_leaves_no_file(
    small_fs, name: str, room: int, count: int
) -> None:
    # ffmpeg failed to write, and the writer said nothing: a 0-byte "video", a success
    folder = small_fs(2 * 1024 * 1024)
    filler = folder / "filler"
    with contextlib.suppress(OSError):  # written until the disk is full
        filler.write_bytes(bytes(3 * 1024 * 1024))
    os.truncate(filler, filler.stat().st_size - room)
    rng = np.random.default_rng(0)  # noise: frames H.264 cannot shrink
    frames = rng.integers(0, 256, (count, 128, 128, 3), dtype=np.uint8)
    video = open_video(folder / name, fps=10)
    message = f"no space left on the device for '{folder / name}'"
    with pytest.raises(OSError, match=re.escape(message)) as err, video:
        video.extend(frames)
    assert err.value.errno == errno.ENOSPC
    assert sorted(p.name for p in folder.iterdir()) == ["filler"]
    if room:  # it stopped when ffmpeg did, not at the end
        assert 0 < video.frames_written < len(frames)


def test_bad_writer_inputs(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match=r"unknown suffix '\.avi'; use one of \.mp4, \.gif"):
        open_video(tmp_path / "x.avi")
    with pytest.raises(ValueError, match=r"unknown suffix '\(none\)'"):
        video_format("rollout")
    assert video_format("A.MP4") == "mp4"
    with pytest.raises(ValueError, match=r"MP4Writer writes \.mp4 files"):
        MP4Writer(tmp_path / "x.gif")
    with pytest.raises(ValueError, match=r"fps must be a finite number > 0, got 0\.0"):
        open_video(tmp_path / "x.mp4", fps=0)
    with pytest.raises(ValueError, match=r"fps must be a finite number > 0, got nan"):
        open_video(tmp_path / "x.mp4", fps=float("nan"))
    with pytest.raises(TypeError, match="fps must be a number, got str: '30'"):
        open_video(tmp_path / "x.mp4", fps="30")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"quality must be a finite number in \[0, 10\], got 11\.0"
    ):
        MP4Writer(tmp_path / "x.mp4", quality=11)
    with pytest.raises(ValueError, match=r"preset must be one of \['ultrafast', .*\], got 'quick'"):
        MP4Writer(tmp_path / "x.mp4", preset="quick")  # type: ignore[arg-type]

    video = open_video(tmp_path / "bad.mp4")
    with pytest.raises(ValueError, match=r"must be uint8 \[H, W, 3\], got float32 \[4, 4, 3\]"):
        video.append(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match=r"must be uint8 \[H, W, 3\], got uint8 \[4, 4\]"):
        video.append(np.zeros((4, 4), np.uint8))
    with pytest.raises(TypeError, match="got list"):
        video.append([[0, 0, 0]])
    video.append(np.zeros((4, 6, 3), np.uint8))
    with pytest.raises(
        ValueError, match=r"started with \[H, W, 3\] = \[4, 6, 3\], got \[6, 4, 3\]"
    ):
        video.append(np.zeros((6, 4, 3), np.uint8))
    video.close()
    with pytest.raises(RuntimeError, match="is closed"):
        video.append(np.zeros((4, 6, 3), np.uint8))
    assert read_video(tmp_path / "bad.mp4")[0].shape == (1, 4, 6, 3)  # the good frame is kept

    gif = GIFWriter(tmp_path / "long.gif", max_frames=2)
    with pytest.raises(ValueError, match="at most max_frames=2 frames"), gif:
        gif.extend(ramp(8, 8, 3))
    assert read_video(tmp_path / "long.gif")[0].shape[0] == 2


# --------------------------------------------------------------------------- recorder


def test_recorder_films_navigation(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nav.mp4"
    env = TransformedEnv(navigation(), VideoRecorder(path, fps=15))
    rollout = env.rollout(20, break_when_any_done=False)
    recorder = env.transform[0]
    assert recorder.parent is env
    env.close()  # closing the env finalises the video
    assert recorder.closed
    frames, meta = read_video(path)
    assert frames.shape == (expected_frames(rollout), 256, 256, 3)
    assert recorder.frames_written == frames.shape[0] and meta["fps"] == 15.0
    assert_frames_change(frames)
    # The first frame is the rendering of the reset state.
    fresh = navigation()
    fresh.reset()
    assert np.abs(frames[0].astype(int) - fresh.render(0)).mean() < 2.0


def test_recorder_tiles_envs_and_counts_auto_resets(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "tiled.gif"
    env = TransformedEnv(
        navigation(num_envs=4, render_size=64),
        [StepCounter(max_steps=4), VideoRecorder(path, env_indices="all", tile=True)],
    )
    with env:
        rollout = env.rollout(10, break_when_any_done=False)
    frames, _ = read_video(path)
    # 2 x 2 grid of 64-pixel frames with 2-pixel gaps; resets at steps 4 and 8 add frames.
    assert frames.shape == (1 + 10 + 2, 2 * 64 + 3 * 2, 2 * 64 + 3 * 2, 3)
    assert frames.shape[0] == expected_frames(rollout)
    assert_frames_change(frames)


def test_partial_reset_of_other_envs_adds_no_frame(tmp_path: pathlib.Path) -> None:
    env = TransformedEnv(navigation(num_envs=3), VideoRecorder(tmp_path / "p.gif", env_indices=1))
    recorder = env.transform[0]
    td = env.reset()
    assert recorder.frames_written == 1
    mask = torch.zeros(3, 1, dtype=torch.bool)
    mask[0] = True
    td["_reset"] = mask
    env.reset(td)  # env 1 is not reset: no new frame
    assert recorder.frames_written == 1
    mask[1] = True
    env.reset(td)
    assert recorder.frames_written == 2
    env.close()


def test_every_and_max_frames(tmp_path: pathlib.Path) -> None:
    env = TransformedEnv(navigation(), VideoRecorder(tmp_path / "e.gif", every=3, max_frames=4))
    with env:
        env.rollout(20, break_when_any_done=False)
    assert env.transform[0].frames_written == 4
    assert read_video(tmp_path / "e.gif")[0].shape[0] == 4


def test_exception_mid_rollout_keeps_a_valid_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "crash.mp4"
    env = TransformedEnv(navigation(), VideoRecorder(path))
    calls = 0

    def exploding_policy(td: TensorDictBase) -> TensorDictBase:
        nonlocal calls
        calls += 1
        if calls == 6:
            raise RuntimeError("policy exploded")
        return env.rand_action(td)

    with pytest.raises(RuntimeError, match="policy exploded"), env:
        env.rollout(20, exploding_policy, break_when_any_done=False)
    frames, _ = read_video(path)
    assert frames.shape[0] == 1 + 5  # the reset and the five steps before the error
    assert_frames_change(frames)


def test_uncaught_exception_still_finalises_the_files(tmp_path: pathlib.Path) -> None:
    # Nobody closes anything: the writers are finalised when the interpreter exits.
    script = textwrap.dedent(
        """
        import sys
        import marlkit
        from marlkit.envs import TransformedEnv
        from marlkit.record import VideoRecorder

        env = TransformedEnv(
            marlkit.make("navigation", num_envs=2, n_agents=2, seed=0, render_size=64),
            [VideoRecorder(sys.argv[1]), VideoRecorder(sys.argv[2], env_indices=1)],
        )
        td = env.reset()
        for _ in range(7):
            td = env.step(env.rand_action(td))["next"]
        raise SystemError("boom")
        """
    )
    mp4, gif = tmp_path / "exit.mp4", tmp_path / "exit.gif"
    proc = subprocess.run(
        [sys.executable, "-c", script, str(mp4), str(gif)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "SystemError: boom" in proc.stderr
    for path in (mp4, gif):
        frames, _ = read_video(path)
        assert frames.shape == (8, 64, 64, 3)
        assert_frames_change(frames)


def test_flush_starts_a_new_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ep.mp4"
    recorder = VideoRecorder(path)
    env = TransformedEnv(navigation(), recorder)
    env.rollout(5, break_when_any_done=False)
    assert recorder.flush() == path
    assert read_video(path)[0].shape[0] == 6  # valid while the env goes on
    env.rollout(3, break_when_any_done=False)
    assert recorder.flush() == tmp_path / "ep-1.mp4"
    assert recorder.flush() is None  # nothing new
    env.close()
    assert recorder.paths == [path, tmp_path / "ep-1.mp4"]
    assert read_video(tmp_path / "ep-1.mp4")[0].shape[0] == 4
    assert not (tmp_path / "ep-2.mp4").exists()


def test_recorder_into_a_writer(tmp_path: pathlib.Path) -> None:
    writer = GIFWriter(tmp_path / "w.gif", fps=12)
    env = TransformedEnv(navigation(render_size=32), VideoRecorder(writer))
    env.rollout(4, break_when_any_done=False)
    assert env.transform[0].fps == 12
    env.close()
    assert writer.closed and read_video(tmp_path / "w.gif")[0].shape == (5, 32, 32, 3)


def test_full_gif_stops_filming_not_the_rollout(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = GIFWriter(tmp_path / "full.gif", max_frames=3)
    env = TransformedEnv(navigation(render_size=16), VideoRecorder(writer))
    with env:
        assert env.rollout(6, break_when_any_done=False).shape == (2, 6)
    assert "full.gif is full (3 frames); later frames are dropped (use .mp4)" in caplog.text
    assert read_video(tmp_path / "full.gif")[0].shape == (3, 16, 16, 3)


def test_record_rollout(tmp_path: pathlib.Path) -> None:
    seen = []
    result = record_rollout(
        TransformedEnv(navigation(num_envs=2, render_size=48), StepCounter(max_steps=5)),
        tmp_path / "r.mp4",
        steps=12,
        env_indices=[0, 1],
        tile=True,
        progress=seen.append,
    )
    assert result.path == tmp_path / "r.mp4" and result.steps == 12
    assert result.frames == 1 + 12 + 2 and len(seen) == 12
    assert result.frame_size == (48 + 4, 2 * 48 + 6)
    frames, _ = read_video(result.path)
    assert frames.shape == (15, 52, 102, 3)


def test_recorded_env_passes_the_conformance_kit(tmp_path: pathlib.Path) -> None:
    env = TransformedEnv(navigation(render_size=32), VideoRecorder(tmp_path / "c.mp4"))
    check_adapter(env)  # the recorder changes no data and no spec
    env.close()
    assert read_video(tmp_path / "c.mp4")[0].shape[0] == env.transform[0].frames_written


def test_bad_recorder_inputs(tmp_path: pathlib.Path) -> None:
    mp4 = tmp_path / "x.mp4"
    with pytest.raises(ValueError, match=r"unknown suffix '\.webm'"):
        VideoRecorder(tmp_path / "x.webm")
    with pytest.raises(TypeError, match="takes a file path or a VideoWriter, got int"):
        VideoRecorder(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="films one env unless tile=True"):
        VideoRecorder(mp4, env_indices=[0, 1])
    with pytest.raises(ValueError, match="env_indices must be ints or 'all', got 'some'"):
        VideoRecorder(mp4, env_indices="some", tile=True)
    with pytest.raises(ValueError, match="non-empty sequence"):
        VideoRecorder(mp4, env_indices=[], tile=True)
    with pytest.raises(TypeError, match=r"each env index must be an int, got float: 1\.5"):
        VideoRecorder(mp4, env_indices=[0, 1.5], tile=True)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="every must be an int >= 1, got 0"):
        VideoRecorder(mp4, every=0)
    with pytest.raises(ValueError, match="max_frames must be an int >= 1 or None, got 0"):
        VideoRecorder(mp4, max_frames=0)
    with pytest.raises(TypeError, match="tile must be a bool, got int: 1"):
        VideoRecorder(mp4, tile=1)  # type: ignore[arg-type]
    with pytest.raises(IndexError, match=r"env_indices \[5\] are outside the env batch of 2"):
        TransformedEnv(navigation(), VideoRecorder(mp4, env_indices=5))
    with pytest.raises(ValueError, match="'all' tiles at most 64 envs; the batch has 65"):
        TransformedEnv(navigation(num_envs=65), VideoRecorder(mp4, env_indices="all", tile=True))

    silent = navigation()
    silent.render_modes = ()  # an env that does not render
    with pytest.raises(
        ValueError, match=r"'rgb_array' frames; NavigationEnv declares render_modes=\(\)"
    ):
        TransformedEnv(silent, VideoRecorder(mp4))

    recorder = VideoRecorder(mp4)
    TransformedEnv(navigation(), recorder)
    with pytest.raises(RuntimeError, match="already attached to another env"):
        TransformedEnv(navigation(), recorder)
    with pytest.raises(RuntimeError, match="not attached"):
        VideoRecorder(tmp_path / "y.mp4").capture()


# --------------------------------------------------------------------------- simulators


def film(env: EnvBase, path: pathlib.Path, steps: int = 8) -> None:
    """Film ``steps`` random steps of ``env`` and check the video read back."""
    recorded = TransformedEnv(env, VideoRecorder(path))
    recorded.reset()
    size = recorded.render(0).shape
    rollout = recorded.rollout(steps, break_when_any_done=False)
    recorded.close()
    frames, _ = read_video(path)
    # rollout() resets again: the reset() above adds one more frame.
    assert frames.shape[0] == 1 + expected_frames(rollout)
    assert frames.shape[1:] == (size[0] + size[0] % 2, size[1] + size[1] % 2, 3)
    assert_frames_change(frames[1:])


def test_vmas_video(tmp_path: pathlib.Path) -> None:
    film(marlkit.make("vmas/navigation", num_envs=2), tmp_path / "vmas.mp4")


def test_pettingzoo_video(tmp_path: pathlib.Path) -> None:
    env = marlkit.make("pettingzoo/mpe2.simple_spread_v3", render_mode="rgb_array")
    film(env, tmp_path / "pettingzoo.mp4")


def test_mujoco_video(tmp_path: pathlib.Path) -> None:
    film(marlkit.make("mujoco/ant_2x4"), tmp_path / "mujoco.mp4")


def test_env_close_closes_the_recorder_even_if_another_transform_fails(
    tmp_path: pathlib.Path,
) -> None:
    class Failing(StepCounter):
        def close(self) -> None:
            raise OSError("cannot release")

    recorder = VideoRecorder(tmp_path / "f.mp4")
    env = TransformedEnv(navigation(), [Failing(), recorder])
    env.rollout(3, break_when_any_done=False)
    with pytest.raises(OSError, match="cannot release"):
        env.close()
    assert recorder.closed and env.base_env.is_closed
    assert read_video(tmp_path / "f.mp4")[0].shape[0] == 4
