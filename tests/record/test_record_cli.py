"""``marlkit record`` and the demo video, through the real command line."""

from __future__ import annotations

import contextlib
import json
import pathlib
import signal
import subprocess
import sys
import textwrap
import warnings

import imageio.v2 as iio2
import imageio.v3 as iio
import numpy as np
import pytest
import torch
from torch import nn

import marlkit
from marlkit.cli import main
from marlkit.envs import registry
from marlkit.record._cli import parse_env_args


def read_video(path: pathlib.Path) -> np.ndarray:
    """Every frame, ``uint8 [T, H, W, 3]``, read back with imageio."""
    if path.suffix == ".gif":
        return iio.imread(path, index=None)
    with warnings.catch_warnings():  # imageio-ffmpeg's reader leaves its pipes to the GC
        warnings.simplefilter("ignore", ResourceWarning)
        with iio2.get_reader(path, format="FFMPEG") as reader:
            return np.stack([frame for frame in reader.iter_data()])


def test_record_tiled_mp4_subprocess(tmp_path: pathlib.Path) -> None:
    exe = pathlib.Path(sys.executable).parent / "marlkit"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "marlkit.cli"]
    out = tmp_path / "rollout.mp4"
    args = ["record", "navigation", "--envs", "4", "--tile", "--steps", "10"]
    proc = subprocess.run(
        [*cmd, *args, "--env-arg", "render_size=64", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"video written to {out} (11 frames of 134x134, 10 steps, 4 envs tiled)" in proc.stdout
    assert "10/10" in proc.stderr  # the progress bar ran to the end
    frames = read_video(out)
    assert frames.shape == (11, 134, 134, 3)  # 2 x 2 tiles of 64 pixels, 2-pixel gaps
    assert np.abs(frames[1:].astype(int) - frames[:-1]).max(axis=(1, 2, 3)).min() > 16


def test_record_gif_with_env_args(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "nav.gif"
    argv = ["record", "navigation", "--steps", "12", "--max-episode-steps", "5", "--fps", "10"]
    argv += ["--env-arg", "n_agents=2", "--env-arg", "render_size=48", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    assert "(15 frames of 48x48, 12 steps, env 0)" in capsys.readouterr().out
    frames = read_video(out)
    assert frames.shape == (1 + 12 + 2, 48, 48, 3)  # two auto-resets at steps 5 and 10
    assert iio.immeta(out)["duration"] == 100


def test_record_asks_adapters_for_rgb_array(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture
) -> None:
    # PettingZoo renders only when made with render_mode="rgb_array": the command asks for it.
    out = tmp_path / "mpe.mp4"
    argv = ["record", "pettingzoo/mpe2.simple_spread_v3", "--steps", "3", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0, capsys.readouterr().err
    assert read_video(out).shape[0] == 4


def test_record_agents_is_the_envs_own_agent_count(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture
) -> None:
    from marlkit.cli import _parser
    from marlkit.record._cli import _make_env

    out = tmp_path / "spread.mp4"
    argv = ["record", "pettingzoo/mpe2.simple_spread_v3", "--agents", "2", "--envs", "2"]
    argv += ["--steps", "2", "--no-progress", "--out", str(out)]
    env = _make_env(_parser().parse_args(argv))  # what the command films: N=2, rendering
    try:
        assert env.group_map == {"agents": ["agent_0", "agent_1"]}
        assert "rgb_array" in env.render_modes
    finally:
        env.close()
    assert main(argv) == 0, capsys.readouterr().err
    assert read_video(out).shape[0] == 3


def test_record_is_seeded(tmp_path: pathlib.Path) -> None:
    args = ["record", "navigation", "--steps", "6", "--env-arg", "render_size=32", "--no-progress"]
    for name, seed in (("a.gif", "1"), ("b.gif", "1"), ("c.gif", "2")):
        assert main([*args, "--seed", seed, "--out", str(tmp_path / name)]) == 0
    a, b, c = (read_video(tmp_path / n) for n in ("a.gif", "b.gif", "c.gif"))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_record_saved_policies(tmp_path: pathlib.Path) -> None:
    env = marlkit.make("navigation", num_envs=2, n_agents=2)
    obs = env.reset()["agents", "observation"]  # [2, 2, obs_dim]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(obs.shape[-1], 2), nn.Tanh())
    with warnings.catch_warnings():  # torch >= 2.10 deprecates TorchScript; it still works
        warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
        torch.jit.script(net).save(str(tmp_path / "policy.pt"))
    torch.export.save(torch.export.export(net, (obs,)), str(tmp_path / "policy.pt2"))
    for name in ("policy.pt", "policy.pt2"):
        out = tmp_path / f"{name}.mp4"
        argv = ["record", "navigation", "--policy", str(tmp_path / name), "--steps", "5"]
        argv += ["--envs", "2", "--env-arg", "n_agents=2", "--env-arg", "render_size=32"]
        assert main([*argv, "--no-progress", "--out", str(out)]) == 0
        assert read_video(out).shape == (6, 32, 32, 3)


POLICY_MODULE = """
from tensordict.nn import TensorDictModule
from torch import nn

CALLS = []

def build(env):
    CALLS.append(env.batch_size)
    n_obs = env.observation_spec["agents", "observation"].shape[-1]
    net = nn.Sequential(nn.Linear(n_obs, 2), nn.Tanh())
    keys = dict(in_keys=[("agents", "observation")], out_keys=[("agents", "action")])
    return TensorDictModule(net, **keys)

def too_strong(env):
    return lambda td: td.set(("agents", "action"), td["agents", "observation"][..., :2] * 0 + 5)

def crashing(env):
    def policy(td):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied\\n(more lines)")
    return policy

def no_env():  # takes no env
    return None

def failing_build(env):
    raise RuntimeError("no checkpoint at runs/x")

def forgets_return(env):
    def policy(td):
        td.set(("agents", "action"), td["agents", "observation"][..., :2] * 0)
    return policy

def interrupted_at_step_3(env):
    import os, signal
    calls = []
    def policy(td):
        calls.append(1)
        if len(calls) == 3:  # as a Ctrl-C while it steps
            os.kill(os.getpid(), signal.SIGINT)
        return env.rand_action(td)
    return policy

NOT_CALLABLE = 3
"""


@pytest.fixture
def policy_module(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"record_policies_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(POLICY_MODULE))
    monkeypatch.chdir(tmp_path)  # found like `python -m` finds modules: from the cwd
    monkeypatch.setattr(sys, "path", list(sys.path))
    return name


def test_record_module_function_policy(tmp_path: pathlib.Path, policy_module: str) -> None:
    out = tmp_path / "built.gif"
    argv = ["record", "navigation", "--policy", f"{policy_module}:build", "--envs", "3"]
    argv += ["--steps", "4", "--env-arg", "render_size=32", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    calls = sys.modules[policy_module].CALLS
    assert calls == [torch.Size([3])]
    assert read_video(out).shape == (5, 32, 32, 3)


def test_bad_policies_exit_2(
    tmp_path: pathlib.Path, policy_module: str, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "junk.pt").write_bytes(b"not a zip file")
    (tmp_path / "junk.pt2").write_bytes(b"not a zip file")
    cases = {
        str(tmp_path / "missing.pt"): "no such file",
        str(tmp_path / "junk.pt"): "is not a TorchScript file (not a zip archive)",
        str(tmp_path / "junk.pt2"): "is not a torch.export (.pt2) file",
        "no_such_module_xyz:build": "cannot import 'no_such_module_xyz'",
        f"{policy_module}:nope": f"{policy_module!r} has no attribute 'nope'",
        f"{policy_module}:NOT_CALLABLE": "'NOT_CALLABLE' is not callable",
        f"{policy_module}:": "expected module:function",
        "random": "is neither an existing TorchScript file nor module:function",
        # the builder's own errors named --policy and what raised (a bare TypeError before)
        f"{policy_module}:no_env": "no_env(env) raised TypeError: no_env() takes 0 positional",
        f"{policy_module}:failing_build": "failing_build(env) raised RuntimeError: no checkpoint",
        "./missing_file.py:build": "no such file './missing_file.py'",
    }
    for spec, message in cases.items():
        out = tmp_path / "p.mp4"
        argv = ["record", "navigation", "--policy", spec, "--steps", "2", "--no-progress"]
        assert main([*argv, "--out", str(out)]) == 2, spec
        err = capsys.readouterr().err
        assert err.startswith("marlkit record: error: --policy") and message in err, err
        assert not out.exists()


def test_policy_with_bad_actions_keeps_the_frames(
    tmp_path: pathlib.Path, policy_module: str, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "bad.mp4"
    argv = ["record", "navigation", "--policy", f"{policy_module}:too_strong", "--steps", "3"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "invalid action at ('agents', 'action')" in err
    assert f"the frames recorded before the error are in {out}" in err
    assert read_video(out).shape[0] == 1  # the reset frame


def test_a_policy_that_raises_is_named_and_its_frames_kept(
    tmp_path: pathlib.Path, policy_module: str, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "crash.mp4"
    argv = ["record", "navigation", "--policy", f"{policy_module}:crashing", "--steps", "3"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"marlkit record: error: --policy '{policy_module}:crashing' failed on the env's data: "
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied\n"
    )
    assert f"the frames recorded before the error are in {out}" in err
    assert read_video(out).shape[0] == 1


def test_an_error_does_not_claim_an_earlier_video(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "old.gif"
    argv = ["record", "navigation", "--steps", "2", "--env-arg", "render_size=16", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    before = out.read_bytes()
    assert main([*argv, "--envs", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--envs must be >= 1" in err and "frames recorded before" not in err
    assert out.read_bytes() == before


def test_bad_inputs_exit_2(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def silent_navigation(**kwargs: object) -> marlkit.envs.EnvBase:
        env = marlkit.make("navigation", **kwargs)
        env.render_modes = ()  # an env without rgb_array rendering
        return env

    registry._load_plugins()
    entry = registry.EnvEntry("silent_nav", silent_navigation, "no rendering", __name__)
    monkeypatch.setitem(registry._REGISTRY, "silent_nav", entry)
    mp4 = str(tmp_path / "x.mp4")
    cases = [
        (["navigaton", "--out", mp4], "Did you mean: navigation"),
        (["silent_nav", "--out", mp4], "NavigationEnv declares render_modes=()"),
        (["navigation", "--out", str(tmp_path / "x.avi")], "unknown suffix '.avi'"),
        (["navigation", "--out", mp4, "--steps", "0"], "--steps must be >= 1, got 0"),
        (["navigation", "--out", mp4, "--envs", "0"], "--envs must be >= 1, got 0"),
        (["navigation", "--out", mp4, "--fps", "0"], "--fps must be > 0, got 0.0"),
        (["navigation", "--out", mp4, "--env-arg", "n agents=3"], "takes key=value"),
        (["navigation", "--out", mp4, "--env-arg", "bogus=1"], "bogus"),
        (["navigation", "--out", mp4, "--envs", "2", "--env-arg", "num_envs=2"], "repeats"),
        (["navigation", "--out", mp4, "--agents", "0"], "--agents must be >= 1, got 0"),
        (["predator_prey", "--out", mp4, "--agents", "3"], "counts are: n_predators, n_prey"),
        (["navigation", "--out", mp4, "--envs", "65", "--tile"], "at most 64"),
        (["navigation", "--out", mp4, "--env-arg", "seed=3"], "use --seed"),
        (["pettingzoo/nope", "--out", mp4], "no PettingZoo env module 'nope'"),
        (["navigation", "--out", str(tmp_path / "a_file" / "x.mp4")], "File exists"),
        # ffmpeg would only say "Broken pipe", and a GIF would fail after the whole rollout.
        (["navigation", "--out", "/proc/marlkit.mp4"], "No such file or directory: '/proc/"),
        (["navigation", "--out", "/proc/marlkit.gif"], "No such file or directory: '/proc/"),
    ]
    (tmp_path / "a_file").write_text("")
    for args, message in cases:
        assert main(["record", *args, "--no-progress"]) == 2, args
        err = capsys.readouterr().err
        assert "error: " in err and message in err, (args, err)
    assert not (tmp_path / "x.mp4").exists()


def test_parse_env_args() -> None:
    parsed = parse_env_args(["n=3", "x=0.5", "flag=True", "mode=fast", "shape=[1, 2]", "s='a'"])
    assert parsed == {"n": 3, "x": 0.5, "flag": True, "mode": "fast", "shape": [1, 2], "s": "a"}
    with pytest.raises(ValueError, match=r"--env-arg takes key=value .*, got 'novalue'"):
        parse_env_args(["novalue"])


def test_demo_writes_video_and_summary(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["demo", "--out", str(tmp_path / "runs"), "--steps", "20", "--no-progress"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    stdout = capsys.readouterr().out
    assert f"summary: {run_dir / 'summary.json'}" in stdout
    assert f"video:   {run_dir / 'rollout.mp4'}" in stdout
    assert json.loads((run_dir / "summary.json").read_text())["env"] == "navigation"
    frames = read_video(run_dir / "rollout.mp4")
    assert frames.shape == (21, 2 * 256 + 3 * 2, 2 * 256 + 3 * 2, 3)  # 4 envs tiled


def test_without_the_video_extra(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # as if it were not installed
    argv = ["record", "navigation", "--steps", "2", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "x.mp4")]) == 2
    assert "Install it with: pip install 'marlkit[video]'" in capsys.readouterr().err
    # The demo still runs and writes its summary, and says why there is no video.
    assert main(["demo", "--out", str(tmp_path / "runs"), "--steps", "5", "--no-progress"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "summary.json").is_file() and not (run_dir / "rollout.mp4").exists()
    assert "no video: " in capsys.readouterr().err


def test_a_policy_from_a_file_path(tmp_path: pathlib.Path, policy_module: str) -> None:
    # `./policies.py:build` is a file path (a module loaded from it), not a saved module
    out = tmp_path / "from_file.gif"
    argv = ["record", "navigation", "--policy", f"./{policy_module}.py:build", "--steps", "2"]
    assert main([*argv, "--env-arg", "render_size=16", "--no-progress", "--out", str(out)]) == 0
    assert read_video(out).shape == (3, 16, 16, 3)


def test_a_failed_run_leaves_an_existing_video_as_it_was(
    tmp_path: pathlib.Path, policy_module: str, capsys: pytest.CaptureFixture
) -> None:
    # A run that failed at its first step replaced a whole video with a one-frame one.
    out = tmp_path / "keep.mp4"
    argv = ["record", "navigation", "--steps", "3", "--env-arg", "render_size=16", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    before = out.read_bytes()
    assert main([*argv, "--policy", f"{policy_module}:too_strong", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    partial = tmp_path / "keep.partial.mp4"
    assert f"the frames recorded before the error are in {partial} ({out} was left as it" in err
    assert out.read_bytes() == before and read_video(partial).shape[0] == 1
    # a finished run replaces the video, through the partial file
    assert main([*argv, "--steps", "5", "--out", str(out)]) == 0
    assert read_video(out).shape[0] == 6 and not partial.exists()


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_ctrl_c_stops_after_the_step_and_keeps_a_readable_video(
    tmp_path: pathlib.Path, policy_module: str, capsys: pytest.CaptureFixture, suffix: str
) -> None:
    # Ctrl-C while a frame went to ffmpeg killed it: a 48-byte MP4 that no player reads.
    out = tmp_path / f"stopped{suffix}"
    argv = ["record", "navigation", "--policy", f"{policy_module}:interrupted_at_step_3"]
    argv += ["--steps", "50", "--env-arg", "render_size=16", "--no-progress", "--out", str(out)]
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where a shell started us in the background
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert f"marlkit record: interrupted after 3 steps; the frames filmed are in {out}" in err
    assert read_video(out).shape == (4, 16, 16, 3)  # the reset and three steps
    assert signal.getsignal(signal.SIGINT) is before  # put back


def test_a_policy_that_returns_none_is_named(
    tmp_path: pathlib.Path, policy_module: str, capsys: pytest.CaptureFixture
) -> None:
    # It said "step() takes a TensorDict, got NoneType": the policy forgot `return td`.
    out = tmp_path / "none.gif"
    argv = ["record", "navigation", "--policy", f"{policy_module}:forgets_return", "--steps", "2"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"marlkit record: error: --policy '{policy_module}:forgets_return' returned NoneType, "
        "not the TensorDict: a policy writes the actions into the TensorDict it is given"
    )


def test_a_gif_longer_than_a_gif_holds_is_refused_before_the_run(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture
) -> None:
    # It filmed 2000 frames, warned, then stepped on unfilmed (forever with a huge --steps).
    out = tmp_path / "long.gif"
    assert main(["record", "navigation", "--steps", "2500", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--steps 2500 films 2501 frames, more than a GIF holds (2000" in err
    assert not out.exists()


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_a_full_disk_is_an_error_naming_the_video_and_leaves_no_file(
    small_fs, capsys: pytest.CaptureFixture, suffix: str
) -> None:
    # MP4 and GIF alike: an error naming the video file, no "video written to ...", and no
    # 0-byte file left behind.
    folder = small_fs(2 * 1024 * 1024)
    with contextlib.suppress(OSError):  # written until the disk is full
        (folder / "filler").write_bytes(bytes(3 * 1024 * 1024))
    out = folder / f"rollout{suffix}"
    argv = ["record", "navigation", "--steps", "5", "--env-arg", "render_size=64"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert "video written" not in captured.out
    assert captured.err.startswith(
        f"marlkit record: error: [Errno 28] no space left on the device for '{out}'"
    ), captured.err
    assert "the frames recorded before the error" not in captured.err  # there are none
    assert sorted(p.name for p in folder.iterdir()) == ["filler"]
