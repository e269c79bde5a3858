"""The `marlkit` command, run as a user runs it, in a process of its own (tests/_forked.py)."""

from __future__ import annotations

import contextlib
import json
import pathlib
import re
import subprocess
import sys

import pytest

import _forked
from marlkit.cli import main, run_random
from marlkit.record import read_video


def marlkit_cmd(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    exe = pathlib.Path(sys.executable).parent / "marlkit"
    cmd = [sys.executable, str(exe)] if exe.exists() else [sys.executable, "-m", "marlkit.cli"]
    return _forked.run([*cmd, *args], cwd=cwd, timeout=300)


def test_list_shows_the_native_scenarios_and_the_adapters() -> None:
    out = marlkit_cmd("list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "native scenarios:"
    for name in ("navigation", "predator_prey", "swarm"):  # a line each, with what it is
        assert re.search(rf"^  {name} +\S", out.stdout, re.M), name
    assert "adapters (make('<adapter>/<scenario>')):" in lines
    assert re.search(r"^  vmas/ +\S", out.stdout, re.M)


def test_run_prints_throughput_and_rewards(tmp_path: pathlib.Path) -> None:
    out = marlkit_cmd(
        "run",
        "navigation",
        "--agents",
        "3",
        "--envs",
        "4",
        "--steps",
        "30",
        "--max-episode-steps",
        "10",
        "--out",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "env            navigation  (4 envs, agents {'agents': 3})"
    assert re.fullmatch(r"steps +30 in [\d.]+ s", lines[1]), lines[1]
    assert re.fullmatch(r"env-steps/s +[\d,]+", lines[2]), lines[2]
    assert re.fullmatch(r"agent-steps/s +[\d,]+", lines[3]), lines[3]
    assert re.fullmatch(r"mean episode reward \[agents\]  -?[\d.]+  \(12 episodes\)", lines[4])
    assert lines[5] == f"summary written to {tmp_path / 'summary.json'}"
    assert "30/30" in out.stderr  # the progress bar ran to the end
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env"] == "navigation"
    assert summary["steps"] == 30 and summary["num_envs"] == 4
    assert summary["agents"] == {"agents": 3}
    assert summary["episodes"]["agents"] == 4 * 3  # 30 steps / 10 per episode, 4 envs
    assert set(summary["mean_episode_reward"]) == {"agents"}
    assert summary["agent_steps_per_s"] == pytest.approx(3 * summary["env_steps_per_s"])
    assert summary["env_kwargs"] == {"num_envs": 4, "n_agents": 3}


def test_run_refuses_more_envs_than_memory_holds(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # one env sizes the batch before it is made: too many envs is a one-line error with the
    # estimate and what fits, not a run the out-of-memory killer ends
    import marlkit.envs._memory as memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  1000 kB\nMemAvailable:    1000 kB\n")
    monkeypatch.setattr(memory, "_MEMINFO", meminfo)
    assert main(["run", "navigation", "--envs", "1000", "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert re.search(
        r"navigation with --envs=1000 would need at least about 1\.3 MiB \(1\.4 KiB per env: 4 x "
        r"the 351 bytes its specs hold, measured on one env\), more than the 1000\.0 KiB "
        r"available: at most 729 envs fit",
        err,
    ), err
    assert main(["run", "navigation", "--envs", "64", "--steps", "1", "--no-progress"]) == 0
    assert "navigation  (64 envs," in capsys.readouterr().out
    meminfo.write_text("MemAvailable:    100000000 kB\n")  # 95 GiB: fits
    assert main(["run", "navigation", "--envs", "1000", "--steps", "1", "--no-progress"]) == 0
    assert "navigation  (1000 envs," in capsys.readouterr().out
    monkeypatch.setattr(memory, "_MEMINFO", tmp_path / "none")  # not Linux: no check
    assert main(["run", "navigation", "--envs", "1000", "--steps", "1", "--no-progress"]) == 0
    assert "navigation  (1000 envs," in capsys.readouterr().out


def test_check_memory_probes_other_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    # check_memory sizes any registered env on one env of it, so an env that does not check
    # its own batch is refused too; the estimate and the fit are those of the shared helper
    import marlkit.envs._memory as memory
    from marlkit.cli import check_memory

    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": 10 * 2**20)
    check_memory("navigation", num_envs=7000, n_agents=4)  # 9.4 MiB: fits
    with pytest.raises(ValueError, match=r"--envs=8000 .* at most 7,468 envs fit"):
        check_memory("navigation", num_envs=8000, n_agents=4)
    check_memory("navigation", n_agents=4)  # no num_envs: nothing to size


def test_run_discrete_actions(tmp_path: pathlib.Path) -> None:
    out = marlkit_cmd(
        "run",
        "navigation",
        "--discrete",
        "--envs",
        "2",
        "--steps",
        "5",
        "--no-progress",
        "--out",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("env            navigation  (2 envs, agents {'agents': 4})\n")
    # no episode of 100 steps ends in 5: the table says so, with the return so far
    assert "mean episode reward [agents]  no episode ended in 5 steps (return so far" in out.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_kwargs"]["continuous_actions"] is False


def test_unknown_env_suggests_close_match() -> None:
    out = marlkit_cmd("run", "navigaton", "--steps", "1")
    assert out.returncode == 2
    assert out.stderr.startswith(
        "marlkit: error: no env registered as 'navigaton'. Did you mean: navigation? "
        "`marlkit list` shows them all"
    )
    assert out.stderr.count("\n") == 1 and out.stdout == ""


@pytest.mark.parametrize("flag", ["--envs", "--agents", "--steps"])
def test_non_positive_sizes_rejected(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "navigation", flag, "0"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"marlkit: error: {flag} must be >= 1, got 0\n"
    assert captured.out == ""


def test_bad_env_kwarg_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "navigation", "--device", "nonsense", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("marlkit: error: device 'nonsense' is not a torch device: "), err
    assert err.count("\n") == 1


def test_demo_writes_under_runs(tmp_path: pathlib.Path) -> None:
    out = marlkit_cmd("demo", "--out", str(tmp_path / "runs"), "--steps", "20", "--no-progress")
    assert out.returncode == 0, out.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"\d{8}-\d{6}", run_dir.name)
    assert sorted(p.name for p in run_dir.iterdir()) == ["rollout.mp4", "summary.json"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env"] == "navigation" and summary["steps"] == 20
    assert summary["num_envs"] == 32 and summary["agents"] == {"agents": 4}
    lines = out.stdout.splitlines()
    assert lines[0] == "env            navigation  (32 envs, agents {'agents': 4})"
    assert f"summary: {run_dir / 'summary.json'}" in lines
    assert f"video:   {run_dir / 'rollout.mp4'} (21 frames, 4 envs tiled)" in lines
    assert lines[-1] == f"demo outputs in {run_dir}/ (summary.json, rollout.mp4)"
    frames, _ = read_video(run_dir / "rollout.mp4")
    assert frames.shape[0] == 21  # the reset and 20 steps


def test_run_random_from_python() -> None:
    summary = run_random("navigation", steps=10, progress=False, num_envs=2, n_agents=2)
    assert summary.agent_steps_per_s > 0
    assert set(summary.mean_episode_reward) == {"agents"}
    # No episode ends in 10 steps (episodes of 100): the table says so, not a mean of none.
    assert summary.episodes == {"agents": 0}
    assert "mean episode reward [agents]  no episode ended in 10 steps" in summary.table()
    ended = run_random("navigation", steps=12, progress=False, num_envs=2, max_episode_steps=5)
    assert "(4 episodes)" in ended.table()


def test_run_passes_env_args(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "predator_prey", "--envs", "2", "--steps", "3", "--no-progress"]
    assert main([*args, "--env-arg", "n_prey=4", "--env-arg", "n_predators=1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "env            predator_prey  (2 envs, agents {'predator': 1, 'prey': 4})"
    )
    assert main([*args, "--env-arg", "num_envs=3"]) == 2
    assert capsys.readouterr().err == (
        "marlkit: error: --env-arg repeats ['num_envs'], already set by their own flags\n"
    )
    assert main([*args, "--env-arg", "not a pair"]) == 2
    assert capsys.readouterr().err == (
        "marlkit: error: --env-arg takes key=value with a Python identifier, got 'not a pair'\n"
    )


def test_runs_in_the_same_second_get_their_own_folders(tmp_path: pathlib.Path) -> None:
    from marlkit.cli import _new_run_dir

    folders = [_new_run_dir(tmp_path / "runs") for _ in range(3)]
    assert len(set(folders)) == 3 and all(f.is_dir() and not any(f.iterdir()) for f in folders)
    assert all(re.fullmatch(r"\d{8}-\d{6}(-[23])?", f.name) for f in folders)


def test_agents_is_the_envs_own_agent_count(tmp_path: pathlib.Path) -> None:
    # MPE's simple_spread counts its agents with N: --agents sets N.
    flags = ["--agents", "4", "--envs", "2", "--steps", "3", "--no-progress", "--out"]
    out = marlkit_cmd("run", "pettingzoo/mpe2.simple_spread_v3", *flags, str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "(2 envs, agents {'agents': 4})" in out.stdout.splitlines()[0]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["agents"] == {"agents": 4} and summary["env_kwargs"]["N"] == 4


def test_agents_without_an_agent_count_is_a_clean_error() -> None:
    out = marlkit_cmd("run", "pettingzoo/mpe2.simple_tag_v3", "--agents", "3", "--steps", "1")
    assert out.returncode == 2
    assert out.stderr.startswith(
        "marlkit: error: --agents: env 'pettingzoo/mpe2.simple_tag_v3' takes no agent-count "
        "argument (n_agents, num_agents, N, num_players, n_pistons, n_walkers); its counts are: "
        "num_good, num_adversaries, num_obstacles"
    )
    assert "--env-arg KEY=VALUE sets any of them" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("env", "counted"),
    [("vmas/navigation", {"agents": 3}), ("predator_prey", None), ("swarm", {"agents": 3})],
)
def test_agents_across_families(
    env: str, counted: dict[str, int] | None, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", env, "--agents", "3", "--envs", "2", "--steps", "2", "--no-progress"])
    captured = capsys.readouterr()
    if counted is None:
        assert code == 2
        assert "its counts are: n_predators, n_prey, n_landmarks" in captured.err
    else:
        assert code == 0, captured.err
        assert f"agents {counted}" in captured.out


def test_agents_of_single_agent_and_fixed_envs(capsys: pytest.CaptureFixture[str]) -> None:
    for env in ("gymnasium/CartPole-v1", "mujoco/ant_2x4"):
        assert main(["run", env, "--agents", "2", "--steps", "1", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"--agents: env '{env}' takes no agent-count argument" in err, err
        assert "it accepts: " in err


def test_agents_and_env_arg_may_not_both_set_the_count(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "pettingzoo/mpe2.simple_spread_v3", "--agents", "2", "--env-arg", "N=3"]
    assert main([*args, "--steps", "1"]) == 2
    assert "--env-arg repeats ['N'], already set by their own flags" in capsys.readouterr().err


def test_unknown_env_arg_is_refused_with_close_matches() -> None:
    out = marlkit_cmd("run", "navigation", "--env-arg", "n_agent=3", "--steps", "1")
    assert out.returncode == 2
    assert (
        "marlkit: error: env 'navigation' got an unexpected keyword argument 'n_agent' "
        "(did you mean 'n_agents'?); it accepts: num_envs, n_agents," in out.stderr
    )


def test_every_option_of_every_command_says_what_it_does() -> None:
    import argparse

    from marlkit.cli import _parser

    def undocumented(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
        missing = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    missing += undocumented(sub, f"{prefix} {name}")
            elif action.help is None and not isinstance(action, argparse._HelpAction):
                missing.append(f"{prefix} {'/'.join(action.option_strings) or action.dest}")
        return missing

    assert undocumented(_parser(), "marlkit") == []


def test_user_mistakes_are_one_line_and_status_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "a_file").write_text("")
    blocked = str(tmp_path / "a_file" / "out")  # a folder inside a file: cannot be made
    cases = [
        (["run", "pettingzoo/nope", "--steps", "2"], "no PettingZoo env module 'nope'"),
        (["run", "navigation", "--env-arg", "seed=3"], "use --seed"),
        (["run", "navigation", "--steps", "2", "--out", blocked], "Not a directory"),
        (["demo", "--steps", "2", "--out", blocked], "Not a directory"),
    ]
    for argv, message in cases:
        assert main([*argv, "--no-progress"]) == 2, argv
        captured = capsys.readouterr()
        assert captured.err.startswith("marlkit: error: ") and message in captured.err, argv
        assert "env-steps/s" not in captured.out, argv  # refused before running


SIM_MODULE = '''
"""A simulator of a user's own, registered on import."""
import numpy as np
import marlkit
from marlkit.adapters.custom import from_parallel
from marlkit.data import Bounded, Categorical


class Lamp:
    possible_agents = ["a", "b"]

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return {a: np.zeros(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        obs = {a: np.full(1, self.t, np.float32) for a in self.agents}
        done = {a: self.t >= 4 for a in self.agents}
        rew = {a: float(actions[a]) for a in self.agents}
        return obs, rew, done, dict.fromkeys(self.agents, False), {a: {} for a in self.agents}

    def render(self):
        return np.full((8, 8, 3), 40 * self.t, np.uint8)


def make(num_envs=1, seed=None, render=False):
    return from_parallel(
        Lamp, num_envs=num_envs, seed=seed, render=render,
        observation_spaces=Bounded(0.0, 10.0, (1,)), action_spaces=Categorical(2),
    )


marlkit.register("lamp", make)
'''


def test_import_reaches_an_env_of_ones_own(tmp_path: pathlib.Path) -> None:
    # `marlkit --import MODULE run/record NAME` reaches an env that MODULE registers, as
    # docs/adapters.md says; without the import the error says how.
    (tmp_path / "lampsim.py").write_text(SIM_MODULE)
    out = marlkit_cmd(
        "--import",
        "lampsim",
        "run",
        "lamp",
        "--envs",
        "2",
        "--steps",
        "8",
        "--no-progress",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("env            lamp  (2 envs, agents {'agents': 2})\n")
    assert "env-steps/s" in out.stdout
    assert "mean episode reward [agents]" in out.stdout and "(4 episodes)" in out.stdout
    video = tmp_path / "lamp.mp4"
    out = marlkit_cmd(
        "--import",
        "lampsim",
        "record",
        "lamp",
        "--env-arg",
        "render=true",
        "--steps",
        "4",
        "--out",
        str(video),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert video.stat().st_size > 0
    assert str(video) in out.stdout
    frames, _ = read_video(video)
    assert frames.shape[1:] == (8, 8, 3)  # the Lamp's own frames
    out = marlkit_cmd("--import", "no_such_module", "list", cwd=tmp_path)
    assert out.returncode == 2
    assert "marlkit: error: --import no_such_module: No module named 'no_such_module'" in out.stderr
    out = marlkit_cmd("run", "lamp", cwd=tmp_path)  # not imported: the error says how
    assert out.returncode == 2 and "marlkit --import MODULE" in out.stderr
    assert out.stderr.startswith("marlkit: error: no env registered as 'lamp'.")
    # a module whose own code fails at import: one line with what and where, no traceback
    (tmp_path / "broken_sim.py").write_text("import math\n\nraise RuntimeError('no licence')\n")
    out = marlkit_cmd("--import", "broken_sim", "list", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "marlkit: error: --import broken_sim raised RuntimeError: no licence (at " in out.stderr
    assert "broken_sim.py:3)" in out.stderr


def test_out_names_a_folder_or_a_json_file(tmp_path: pathlib.Path, capsys) -> None:
    # `--out` names a folder (summary.json inside) or a .json file; an existing file other
    # than a .json is refused naming it, and left as it was
    taken = tmp_path / "existing.txt"
    taken.write_text("mine")
    for argv in (
        ["run", "navigation", "--steps", "2", "--no-progress"],
        ["demo", "--steps", "2", "--no-progress"],
        ["bench", "scaling", "--agents", "2", "--envs", "2", "--backends", "native"],
    ):
        assert main([*argv, "--out", str(taken)]) == 2, argv
        err = capsys.readouterr().err
        assert f"--out {str(taken)!r} is a file; --out names a folder" in err, err
    assert taken.read_text() == "mine"
    summary = tmp_path / "sub" / "s.json"
    assert main(["run", "navigation", "--steps", "2", "--no-progress", "--out", str(summary)]) == 0
    assert f"summary written to {summary}\n" in capsys.readouterr().out
    assert json.loads(summary.read_text())["env"] == "navigation"
    assert main(["run", "navigation", "--steps", "2", "--no-progress", "--out", str(tmp_path)]) == 0
    assert f"summary written to {tmp_path / 'summary.json'}\n" in capsys.readouterr().out
    assert (tmp_path / "summary.json").is_file()


def test_run_out_on_a_full_disk_names_the_file_and_leaves_none(small_fs) -> None:
    # Its space is reserved before summary.json is written: a full disk is an error naming the
    # file and the bytes needed, and leaves no empty file.
    folder = small_fs(1024 * 1024)
    with contextlib.suppress(OSError):  # written until the disk is full
        (folder / "filler").write_bytes(bytes(2 * 1024 * 1024))
    summary = folder / "s.json"
    out = marlkit_cmd(
        "run", "navigation", "--envs", "2", "--steps", "5", "--no-progress", "--out", str(summary)
    )
    assert out.returncode == 2
    assert "env-steps/s" in out.stdout and "summary written" not in out.stdout  # the run ran
    assert re.search(
        rf"marlkit: error: \[Errno 28\] no space left on the device for '{re.escape(str(summary))}'"
        r": [\d,]+ bytes needed, 0 bytes free",
        out.stderr,
    ), out.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["filler"]
