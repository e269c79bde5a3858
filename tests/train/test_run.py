"""Checkpointer, RNG states, episode metrics, evaluation and the run summary."""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import marlkit
from marlkit.envs import Compose, RewardSum, StepCounter, TransformedEnv
from marlkit.record import read_metrics, read_video
from marlkit.replay import ReplayBuffer, TensorStorage
from marlkit.train import (
    Checkpointer,
    episode_metrics,
    episode_returns,
    evaluate,
    rng_state,
    set_rng_state,
    summarise_run,
)


def nav(num_envs=4, max_steps=10, **kwargs):
    env = marlkit.make("navigation", num_envs=num_envs, n_agents=3, seed=0, **kwargs)
    return TransformedEnv(env, Compose(StepCounter(max_steps), RewardSum()))


# ---------------------------------------------------------------------------- Checkpointer
def test_checkpoint_round_trip_with_a_buffer(tmp_path):
    ckpt = Checkpointer(tmp_path / "ckpt")
    assert ckpt.latest() is None
    net = torch.nn.Linear(3, 2)
    rb = ReplayBuffer(TensorStorage(16))
    rb.extend(nav().rollout(3).reshape(-1))
    folder = ckpt.save(4, {"net": net.state_dict(), "iteration": 4}, buffers={"rb": rb})
    assert folder.name == "step-00000004" and ckpt.latest() == folder
    assert Checkpointer.step_of(folder) == 4
    state = ckpt.load()
    assert state["iteration"] == 4
    torch.testing.assert_close(state["net"]["weight"], net.weight.detach())
    other = ReplayBuffer(TensorStorage(16))
    ckpt.load_buffers({"rb": other})
    assert len(other) == len(rb) == 12
    assert (other[:] == rb[:]).all()


def test_checkpoints_keep_the_newest_and_drop_a_stale_future(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        ckpt.save(step, {"step": step})
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000002", "step-00000003"]
    # A run resumed from step 2 saves step 2 again: step 3 describes a future that did not
    # happen, and goes.
    ckpt.save(2, {"step": 2, "again": True})
    assert ckpt.load()["again"] is True
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000002"]


def test_checkpoint_errors(tmp_path):
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        ckpt.load()
    with pytest.raises(TypeError, match="state must be a mapping"):
        ckpt.save(0, [1, 2])
    with pytest.raises(TypeError, match="buffer 'rb' \\(int\\) has no dumps"):
        ckpt.save(0, {}, buffers={"rb": 3})
    with pytest.raises(ValueError, match="step must be"):
        ckpt.save(-1, {})
    ckpt.save(0, {})
    with pytest.raises(FileNotFoundError, match="holds no buffer 'rb'"):
        ckpt.load_buffers({"rb": ReplayBuffer(TensorStorage(4))})
    with pytest.raises(FileNotFoundError, match="is not a checkpoint"):
        ckpt.load(tmp_path)
    with pytest.raises(ValueError, match="not named step-"):
        Checkpointer.step_of(tmp_path / "other")


def test_checkpoint_refuses_pickled_objects(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(0, {"fn": Checkpointer})  # torch.save pickles it; weights_only loading refuses
    with pytest.raises(Exception, match=r"[Ww]eights only load failed|Unsupported global"):
        ckpt.load()


_KILLED = textwrap.dedent(
    """
    import sys, torch
    from marlkit.train import Checkpointer
    ckpt = Checkpointer(sys.argv[1], keep=3)
    big = torch.arange(2_000_000, dtype=torch.float64)
    for step in range(10_000):
        ckpt.save(step, {"step": step, "big": big + step})
        print(step, flush=True)
    """
)


def test_a_killed_save_leaves_the_latest_checkpoint_whole(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    saved = [int(proc.stdout.readline()) for _ in range(3)]
    os.kill(proc.pid, signal.SIGKILL)  # most likely in the middle of a save
    proc.wait(30)
    proc.stdout.close()
    state = Checkpointer(tmp_path).load()  # a torn file would fail to load
    assert state["step"] >= saved[-1]
    assert torch.equal(state["big"], torch.arange(2_000_000, dtype=torch.float64) + state["step"])


# ---------------------------------------------------------------------------- RNG states
def test_rng_state_round_trip():
    state = rng_state()
    a = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(state)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_rng_state_survives_weights_only_loading(tmp_path):
    torch.save(rng_state(), tmp_path / "rng.pt")
    loaded = torch.load(tmp_path / "rng.pt", weights_only=True)
    x = torch.rand(2)
    set_rng_state(loaded)
    set_rng_state(loaded)
    with pytest.raises(KeyError, match="no 'numpy'"):
        set_rng_state({"torch": loaded["torch"], "random": loaded["random"]})
    assert x.shape == (2,)


# ---------------------------------------------------------------------------- episodes
def test_episode_metrics_read_the_ended_episodes():
    env = nav(num_envs=4, max_steps=5)
    batch = env.rollout(12, break_when_any_done=False)  # episodes end at steps 5 and 10
    out = episode_metrics(batch)
    done = batch["next", "done"].squeeze(-1)
    assert out["episodes"] == done.sum() == 8
    assert out["episode_length"] == 5
    expected = batch["next", "agents", "episode_reward"].mean((-2, -1))[done].mean()
    assert out["agents/episode_reward"] == pytest.approx(float(expected))
    # Before an episode ends there is nothing to report but the count.
    assert episode_metrics(batch[:, :3]) == {"episodes": 0.0}


def test_episode_metrics_per_group_and_errors():
    env = TransformedEnv(
        marlkit.make("predator_prey", num_envs=2, seed=0), Compose(StepCounter(3), RewardSum())
    )
    out = episode_metrics(env.rollout(3))
    assert {"predator/episode_reward", "prey/episode_reward"} <= set(out)
    plain = marlkit.make("navigation", num_envs=2, n_agents=3, seed=0)
    batch = TransformedEnv(plain, StepCounter(2)).rollout(2)
    with pytest.raises(KeyError, match="add RewardSum to the env"):
        episode_metrics(batch, groups=["agents"])
    with pytest.raises(KeyError, match=r"no \('next', 'done'\)"):
        episode_metrics(batch.exclude(("next", "done")))


def test_episode_returns_stop_at_the_first_done():
    env = nav(num_envs=3, max_steps=4)
    rollout = env.rollout(10, break_when_any_done=False)
    expected = rollout["next", "agents", "reward"][:, :4].mean((-2, -1)).sum(-1)
    torch.testing.assert_close(episode_returns(rollout, "agents"), expected)
    with pytest.raises(KeyError, match=r"groups with rewards: \['agents'\]"):
        episode_returns(rollout, "prey")


# ---------------------------------------------------------------------------- evaluation
def test_evaluate_is_deterministic_and_films(tmp_path):
    from marlkit.modules import MultiAgentMLP, NormalParamExtractor, ProbabilisticActor

    env = nav(num_envs=2, max_steps=8)
    torch.manual_seed(0)
    net = torch.nn.Sequential(MultiAgentMLP(10, 4, 3, num_cells=8), NormalParamExtractor())
    actor = ProbabilisticActor(net)
    a = evaluate(env, actor, steps=8)
    b = evaluate(env, actor, steps=8, video=tmp_path / "eval.mp4", env_indices="all", tile=True)
    assert a.metrics.keys() == b.metrics.keys()
    assert a.metrics["episode_length"] == 8 and a.returns["agents"].shape == (2,)
    frames, _ = read_video(b.video)
    assert frames.shape[0] == 10  # the reset, 8 steps, the auto-reset after the last
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        evaluate(env, actor, steps=0)


def test_summarise_run_writes_the_summary_curve_and_video(tmp_path):
    from marlkit.modules import MultiAgentMLP, NormalParamExtractor, ProbabilisticActor

    env = nav(num_envs=2, max_steps=6)
    actor = ProbabilisticActor(
        torch.nn.Sequential(MultiAgentMLP(10, 4, 3, num_cells=8), NormalParamExtractor())
    )
    rows = [{"step": i, "frames": 100.0 * i, "agents/episode_reward": 0.1 * i} for i in (1, 2)]
    out = summarise_run(tmp_path, env, actor, steps=6, rows=rows, fps=10, info={"algo": "x"})
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == out and out["algo"] == "x" and out["eval_episodes"] == 2
    assert set(out["trained"]) == set(out["random"]) == {"agents/episode_reward", "episode_length"}
    assert out["improvement"]["agents/episode_reward"] == pytest.approx(
        out["trained"]["agents/episode_reward"] - out["random"]["agents/episode_reward"]
    )
    assert (tmp_path / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert read_video(tmp_path / "rollout.mp4")[0].shape[0] == 8
    quiet = summarise_run(tmp_path / "q", env, actor, steps=6, rows=[], video=False)
    assert quiet["video"] is None and quiet["curve"] is None
    assert out["files"] == ["reward.png", "rollout.mp4", "summary.json"]  # no logger wrote here
    assert quiet["files"] == ["summary.json"]  # what the scripts' last line names
    # the same folder summarised again without filming nor curve (a run resumed with
    # video=false): the earlier rollout.mp4 and reward.png stay on disk but are not this run's
    again = summarise_run(tmp_path, env, actor, steps=6, rows=[], video=False)
    assert (tmp_path / "rollout.mp4").exists() and (tmp_path / "reward.png").exists()
    assert again["files"] == ["summary.json"] and again["video"] is None
    # an evaluation filmed elsewhere, summarised without filming: its video is not rollout.mp4
    filmed = evaluate(env, actor, steps=6, video=tmp_path / "elsewhere.mp4")
    other = summarise_run(tmp_path / "o", env, actor, steps=6, rows=[], video=False, trained=filmed)
    assert other["files"] == ["summary.json"] and other["video"] == str(tmp_path / "elsewhere.mp4")


# ---------------------------------------------------------------------------- TrainingRun
def _run_loop(
    folder,
    resume,
    iterations_before_kill=None,
    total=4,
    checkpoint_every=1,
    backends=("csv",),
    **kwargs,
):
    from marlkit.collectors import Collector
    from marlkit.train import TrainingRun

    env = nav(num_envs=2, max_steps=5)
    policy = None  # random actions; the "training" is a counter
    collector = Collector(env, policy, frames_per_batch=10, total_frames=int(10 * total))
    run = TrainingRun(
        folder,
        resume=resume,
        eval_env=nav(num_envs=2, max_steps=5),
        eval_steps=5,
        eval_every=kwargs.pop("eval_every", 2),
        video=False,
        checkpoint_every=checkpoint_every,
        backends=list(backends),
        **kwargs,
    )
    counter = {"updates": 0}
    try:
        state = run.restore()
    except BaseException:
        run.close()  # its folder's lock with it
        raise
    if state is not None:
        counter["updates"] = state["updates"]
        collector.load_state_dict(state["collector"])
    for batch in run.batches(collector):
        counter["updates"] += 1
        run.end_iteration(
            batch,
            {"train/updates": counter["updates"]},
            policy=policy,
            state=lambda: {"updates": counter["updates"], "collector": collector.state_dict()},
            frames=collector.frames,
        )
        if iterations_before_kill is not None and run.iteration == iterations_before_kill:
            run.close()
            return None
    return run.finish(policy, info={"what": "test"})


def test_training_run_logs_evaluates_checkpoints_and_resumes(tmp_path):
    assert _run_loop(tmp_path, resume=False, iterations_before_kill=3) is None
    # As a killed run: rows for iterations 1-3 and checkpoint 3. Roll back to checkpoint 2 by
    # hand (a kill between logging row 3 and saving checkpoint 3): row 3 is logged again.
    ckpt = Checkpointer(tmp_path / "checkpoints")
    (tmp_path / "checkpoints" / "latest").write_text("step-00000002")
    summary = _run_loop(tmp_path, resume=True)
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["train/updates"] for r in rows] == [1, 2, 3, 4]
    assert [r["frames"] for r in rows] == [10, 20, 30, 40]
    assert ["eval/agents/episode_reward" in r for r in rows] == [False, True, False, True]
    assert all(r["collection_time"] > 0 and r["training_time"] >= 0 for r in rows)
    assert ckpt.load()["iteration"] == 4
    assert summary["iterations"] == 4 and summary["what"] == "test"
    assert (tmp_path / "summary.json").exists()


def test_the_summary_reuses_the_last_iterations_evaluation(tmp_path):
    from marlkit.collectors import Collector
    from marlkit.train import TrainingRun

    eval_env = nav(num_envs=2, max_steps=5)
    calls = []

    def policy(td):  # counts its calls: one rollout of the trained policy, not two
        calls.append(1)
        return eval_env.rand_action(td)

    collector = Collector(nav(num_envs=2, max_steps=5), None, frames_per_batch=10, total_frames=20)
    run = TrainingRun(
        tmp_path, eval_env=eval_env, eval_steps=5, video=True, fps=10, backends=["csv"]
    )
    for batch in run.batches(collector):
        run.end_iteration(batch, {}, policy=policy, state=dict, frames=collector.frames)
    evaluated = len(calls)
    assert evaluated > 0  # the last iteration evaluates
    summary = run.finish(policy)
    assert len(calls) == evaluated
    last = read_metrics(tmp_path / "metrics.csv")[-1]
    assert summary["trained"] == {k[5:]: v for k, v in last.items() if k.startswith("eval/")}
    rollout, _ = read_video(tmp_path / "rollout.mp4")
    np.testing.assert_array_equal(rollout, read_video(tmp_path / "videos" / "eval-0002.mp4")[0])
    assert summary["video"] == str(tmp_path / "rollout.mp4")
    assert summary["files"] == ["metrics.csv", "reward.png", "rollout.mp4", "summary.json"]


def test_training_run_refuses_bad_settings(tmp_path):
    from marlkit.train import TrainingRun

    with pytest.raises(ValueError, match="checkpoint_every must be"):
        TrainingRun(tmp_path, eval_env=nav(), eval_steps=5, checkpoint_every=0)
    with pytest.raises(ValueError, match="eval_steps must be"):
        TrainingRun(tmp_path / "b", eval_env=nav(), eval_steps=0)
    # an eval env that cannot film is refused at once, not at the first evaluation (which
    # comes before that iteration's checkpoint), and nothing is written
    blind = marlkit.make("pettingzoo/mpe2.simple_spread_v3", num_envs=2, N=2)
    assert "rgb_array" not in blind.render_modes  # PettingZoo renders only when asked
    with pytest.raises(ValueError, match=r"does not render 'rgb_array' frames.*video=False"):
        TrainingRun(tmp_path / "c", eval_env=blind, eval_steps=5)
    assert not (tmp_path / "c").exists()
    TrainingRun(tmp_path / "d", eval_env=blind, eval_steps=5, video=False).close()


def test_evaluate_leaves_the_global_rng_alone():
    from marlkit.modules import MultiAgentMLP, NormalParamExtractor, ProbabilisticActor

    env = nav(num_envs=2, max_steps=4)
    actor = ProbabilisticActor(  # samples its actions from torch's global RNG
        torch.nn.Sequential(MultiAgentMLP(10, 4, 3, num_cells=8), NormalParamExtractor())
    )
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    actor(env.reset())  # an evaluation's draws, outside evaluate: the stream moves on
    assert not torch.equal(torch.rand(3), expected)
    torch.manual_seed(3)
    evaluate(env, actor, steps=4, exploration="random")
    torch.testing.assert_close(torch.rand(3), expected)


def test_video_envs_films_the_first_envs_and_the_metrics_cover_all(tmp_path):
    from marlkit.collectors import Collector
    from marlkit.train import TrainingRun

    def tiled(indices, folder):  # the frame shape of a video of these envs, tiled
        path = evaluate(
            nav(num_envs=6, max_steps=5),
            None,
            steps=5,
            video=tmp_path / folder / "v.mp4",
            env_indices=indices,
            tile=True,
        ).video
        return read_video(path)[0].shape[1:]

    two, six = tiled([0, 1], "two"), tiled("all", "six")
    assert two != six
    collector = Collector(nav(num_envs=2, max_steps=5), None, frames_per_batch=10, total_frames=10)
    run = TrainingRun(
        tmp_path / "run",
        eval_env=nav(num_envs=6, max_steps=5),
        eval_steps=5,
        video_envs=2,
        backends=["csv"],
    )
    for batch in run.batches(collector):
        run.end_iteration(batch, {}, policy=None, state=dict, frames=collector.frames)
    assert run._evaluated is not None and run._evaluated[1]["deterministic"].returns[
        "agents"
    ].shape == (6,)
    assert read_video(tmp_path / "run" / "videos" / "eval-0001.mp4")[0].shape[1:] == two
    summary = run.finish(None)
    assert read_video(summary["video"])[0].shape[1:] == two
    # more than the env has: every env
    out = summarise_run(tmp_path / "all", nav(num_envs=6), None, steps=5, rows=[], video_envs=9)
    assert read_video(out["video"])[0].shape[1:] == six
    for bad, error in ((0, ValueError), (1.5, TypeError)):
        with pytest.raises(error, match="video_envs must be an int >= 1 or None, got"):
            TrainingRun(tmp_path / "bad", eval_env=nav(), eval_steps=5, video_envs=bad)
        with pytest.raises(error, match="video_envs must be an int >= 1 or None, got"):
            summarise_run(tmp_path / "bad", nav(), None, steps=5, rows=[], video_envs=bad)
        assert not (tmp_path / "bad").exists()


# ---------------------------------------------------------------------------- resume checks
def test_resume_checks_the_folder_before_writing_anything(tmp_path):
    from marlkit.train import TrainingRun

    def make(run_dir, resume):
        return TrainingRun(run_dir, resume=resume, eval_env=nav(), eval_steps=5, video=False)

    missing = tmp_path / "typo"
    with pytest.raises(FileNotFoundError, match=r"cannot resume '.*typo': no such folder"):
        make(missing, resume=missing)
    with pytest.raises(FileNotFoundError, match=r"no such folder"):
        make(missing, resume=True)
    assert not missing.exists()
    # what Hydra leaves for a mistyped resume=: the folder, its config, its log, and no run
    (missing / ".hydra").mkdir(parents=True)
    (missing / "mappo_ippo.log").write_text("")
    with pytest.raises(FileNotFoundError, match=r"'.*typo': it holds no training run"):
        make(missing, resume=str(missing))
    assert sorted(p.name for p in missing.iterdir()) == [".hydra", "mappo_ippo.log"]

    done = tmp_path / "done"
    _run_loop(done, resume=False, total=2)
    # go on from `done` but write elsewhere: refused, the run goes on in its own folder
    with pytest.raises(ValueError, match=r"resume='.*done' goes on in its own folder, but "):
        make(tmp_path / "fork", resume=done)
    assert not (tmp_path / "fork").exists()
    # a new run into a folder that holds one: the hint is the scripts' resume=<folder>
    with pytest.raises(FileExistsError, match=rf"go on with it with resume={done} "):
        make(done, resume=None)
    with pytest.raises(TypeError, match=r"resume must be a bool, a run folder or None"):
        make(done, resume=3)
    # the same folder spelt otherwise is the same folder
    other = TrainingRun(
        tmp_path / "x" / ".." / "done", resume=done, eval_env=nav(), eval_steps=5, video=False
    )
    assert other.resume and other.restore()["iteration"] == 2
    other.close()


def test_resume_before_the_first_checkpoint_starts_over(tmp_path, caplog):
    # killed after 2 iterations, before its first checkpoint: metrics rows but no checkpoint
    assert _run_loop(tmp_path, resume=False, iterations_before_kill=2, checkpoint_every=3) is None
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.csv")] == [1, 2]
    assert Checkpointer(tmp_path / "checkpoints").latest() is None
    with caplog.at_level("WARNING", logger="marlkit.train"):
        summary = _run_loop(tmp_path, resume=tmp_path, checkpoint_every=3)
    assert any("holds no checkpoint yet" in r.getMessage() for r in caplog.records)
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["frames"] for r in rows] == [10, 20, 30, 40]
    assert summary["iterations"] == 4


def test_resume_with_a_budget_already_spent_says_so(tmp_path, caplog):
    _run_loop(tmp_path, resume=False, total=4)
    with caplog.at_level("WARNING", logger="marlkit.train"):
        summary = _run_loop(tmp_path, resume=True, total=2)
    (warned,) = [r.getMessage() for r in caplog.records if "total_frames" in r.getMessage()]
    assert "total_frames (20) is below the 40 frames already collected" in warned
    assert summary["iterations"] == 4
    caplog.clear()
    with caplog.at_level("WARNING", logger="marlkit.train"):
        _run_loop(tmp_path, resume=True, total=4)  # a finished run, resumed to its summary
    assert not caplog.records
    # a total that is not a multiple of the batch: the run ended past it, in its last batch;
    # resumed with that same total, nothing is "below the frames already collected"
    _run_loop(tmp_path / "odd", resume=False, total=3.5)  # 35 frames: 4 batches, 40 frames
    with caplog.at_level("WARNING", logger="marlkit.train"):
        _run_loop(tmp_path / "odd", resume=True, total=3.5)
    assert not caplog.records


def test_resume_names_each_setting_that_differs_from_the_checkpoints(tmp_path, caplog):
    first = {"model": {"hidden": 64, "path": pathlib.Path("a")}, "lr": 3e-4, "resume": None}
    _run_loop(tmp_path, resume=False, total=2, config=first)
    later = {
        "model": {"hidden": 128, "path": pathlib.Path("a")},
        "lr": 3e-4,
        "resume": "x",
        "run_dir": "y",
    }
    with caplog.at_level("WARNING", logger="marlkit.train"):
        _run_loop(tmp_path, resume=True, total=3, config={**later, "extra": 1})
    (warned,) = [r.getMessage() for r in caplog.records if "differs" in r.getMessage()]
    assert warned.endswith("extra: '<unset>' -> 1; model.hidden: 64 -> 128")
    caplog.clear()
    with caplog.at_level("WARNING", logger="marlkit.train"):  # the same settings: no word
        _run_loop(tmp_path, resume=True, total=3, config={**later, "extra": 1})
    assert not [r for r in caplog.records if "differs" in r.getMessage()]


def test_resume_purges_the_tensorboard_steps_after_the_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # killed after iteration 3, its checkpoint at 2: step 3 is logged again by the resumed run
    kept = {"iterations_before_kill": 3, "checkpoint_every": 2, "backends": ["csv", "tensorboard"]}
    assert _run_loop(tmp_path, resume=False, **kept) is None
    kept.pop("iterations_before_kill")
    _run_loop(tmp_path, resume=True, eval_every=1, **kept)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    updates = [(e.step, e.value) for e in events.Scalars("train/updates")]
    assert updates == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
    # eval/ at 2 (first run), then at 3 and 4 (resumed, eval_every=1): step 3 once
    assert [e.step for e in events.Scalars("eval/episode_length")] == [2, 3, 4]
    csv_steps = [r["step"] for r in read_metrics(tmp_path / "metrics.csv")]
    assert csv_steps == [1, 2, 3, 4]


# ---------------------------------------------------------------------------- evaluation seeds
def test_evaluate_with_a_seed_plays_the_same_episodes(tmp_path):
    from marlkit.modules import MultiAgentMLP, NormalParamExtractor, ProbabilisticActor

    env = nav(num_envs=3, max_steps=6)
    first = evaluate(env, None, steps=6, seed=11)
    unseeded = evaluate(env, None, steps=6)  # the env goes on from where it was
    again = evaluate(env, None, steps=6, seed=11)
    filmed = evaluate(env, None, steps=6, seed=11, video=tmp_path / "v.mp4")
    assert first.metrics == again.metrics == filmed.metrics
    assert not torch.equal(first.returns["agents"], unseeded.returns["agents"])
    actor = ProbabilisticActor(  # samples its actions: the seed fixes them too
        torch.nn.Sequential(MultiAgentMLP(10, 4, 3, num_cells=8), NormalParamExtractor())
    )
    a, b = (evaluate(env, actor, steps=6, exploration="random", seed=2) for _ in range(2))
    torch.testing.assert_close(a.returns["agents"], b.returns["agents"])
    with pytest.raises(ValueError, match="seed must be an int >= 0 or None"):
        evaluate(env, None, steps=6, seed=-1)


def test_eval_seed_makes_evaluations_independent_of_eval_every_and_resumes(tmp_path):
    def evals(folder):
        rows = read_metrics(folder / "metrics.csv")
        key = "eval/agents/episode_reward"
        return {r["step"]: r[key] for r in rows if key in r}

    every = _run_loop(tmp_path / "every", resume=False, eval_every=1, eval_seed=5)
    _run_loop(tmp_path / "resumed", resume=False, iterations_before_kill=3, eval_seed=5)
    resumed = _run_loop(tmp_path / "resumed", resume=True, eval_seed=5)
    one, two = evals(tmp_path / "every"), evals(tmp_path / "resumed")
    assert sorted(one) == [1, 2, 3, 4] and sorted(two) == [2, 4]
    # a random policy on the same episodes: every evaluation, however the run went, the same
    assert len({*one.values(), *two.values()}) == 1
    # the summary's trained and random policies (both random here) played the same episodes
    for summary in (every, resumed):
        assert summary["trained"] == summary["random"]
        assert summary["improvement"]["agents/episode_reward"] == 0


# ---------------------------------------------------------------------------- folder hygiene
def test_a_second_run_in_a_folder_in_use_is_refused_until_the_first_closes(tmp_path):
    # two resumes of one folder at once both ran to the end, every metrics row twice
    from marlkit.train import RunFolderInUse, TrainingRun

    _run_loop(tmp_path, resume=False, total=2)

    def resumed():
        env = nav(num_envs=2, max_steps=5)
        return TrainingRun(
            tmp_path, resume=True, eval_env=env, eval_steps=5, video=False, backends=["csv"]
        )

    first = resumed()
    with pytest.raises(
        RunFolderInUse, match=rf"in use by another training run \(pid {os.getpid()}\)"
    ):
        resumed()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.csv")] == [1, 2]  # untouched
    first.close()
    resumed().close()  # free again
    # a process killed while it runs leaves the lock to the kernel, which drops it
    code = (
        "import sys, os, signal; from marlkit.train.run import _lock_folder; "
        f"_lock_folder(__import__('pathlib').Path({str(tmp_path)!r})); "
        "print('locked', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and "locked" in proc.stdout
    resumed().close()


def test_the_time_column_goes_on_from_the_checkpoint_after_a_resume(tmp_path):
    assert _run_loop(tmp_path, resume=False, iterations_before_kill=2, total=4) is None
    saved = Checkpointer(tmp_path / "checkpoints").load()["time"]
    _run_loop(tmp_path, resume=True, total=4)
    times = [r["time"] for r in read_metrics(tmp_path / "metrics.csv")]
    assert times[1] == pytest.approx(saved)
    assert times == sorted(times) and times[2] > saved  # it restarted from 0 before


def test_a_damaged_latest_checkpoint_is_named_with_the_one_before(tmp_path):
    _run_loop(tmp_path, resume=False, total=3)
    state = tmp_path / "checkpoints" / "step-00000003" / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(
        ValueError,
        match=r"step-00000003: state.pt holds 100 bytes, the manifest says [\d,]+; it is damaged; "
        r"the checkpoint before it, step-00000002",
    ) as err:
        _run_loop(tmp_path, resume=True, total=3)
    assert "write its name into" in str(err.value)
    (tmp_path / "checkpoints" / "latest").write_text("step-00000002")  # as the message says
    summary = _run_loop(tmp_path, resume=True, total=3)
    assert summary["iterations"] == 3
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.csv")] == [1, 2, 3]


def test_a_blank_line_in_the_metrics_file_does_not_stop_a_resume(tmp_path):
    assert _run_loop(tmp_path, resume=False, iterations_before_kill=2, total=3) is None
    with open(tmp_path / "metrics.csv", "a") as f:
        f.write("\n")  # a hand edit, an editor's trailing line
    _run_loop(tmp_path, resume=True, total=3)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.csv")] == [1, 2, 3]


def test_the_metrics_file_has_the_folder_s_usual_mode(tmp_path):
    # created through a temporary file, it was 0600 where the other files follow the umask
    old = os.umask(0o022)
    try:
        _run_loop(tmp_path, resume=False, total=2)
    finally:
        os.umask(old)
    mode = (tmp_path / "metrics.csv").stat().st_mode & 0o777
    assert mode == 0o644 == (tmp_path / "summary.json").stat().st_mode & 0o777


def test_an_empty_wandb_run_id_resumes_into_a_new_wandb_run(tmp_path, caplog, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert (
        _run_loop(
            tmp_path, resume=False, iterations_before_kill=2, total=3, backends=("csv", "wandb")
        )
        is None
    )
    id_file = tmp_path / "wandb" / "run-id"
    first = id_file.read_text().strip()
    assert first
    id_file.write_text("")  # a kill while an older marlkit rewrote it
    with caplog.at_level("WARNING", logger="marlkit.train"):
        _run_loop(tmp_path, resume=True, total=3, backends=("csv", "wandb"))
    assert any("is empty" in r.getMessage() for r in caplog.records)
    assert id_file.read_text().strip() not in ("", first)


def test_a_run_logging_only_to_tensorboard_is_a_run_before_its_first_checkpoint(tmp_path, caplog):
    pytest.importorskip("tensorboard")
    # killed before its first checkpoint, it left only tensorboard/: resume= said "holds no
    # training run", and a new run into the folder was accepted (its steps shown twice)
    args = {"checkpoint_every": 3, "backends": ("tensorboard",)}
    assert _run_loop(tmp_path, resume=False, iterations_before_kill=2, **args) is None
    with pytest.raises(FileExistsError, match=r"already holds a training run \(tensorboard\)"):
        _run_loop(tmp_path, resume=False, **args)
    with caplog.at_level("WARNING", logger="marlkit.train"):
        summary = _run_loop(tmp_path, resume=True, **args)
    assert any("holds no checkpoint yet" in r.getMessage() for r in caplog.records)
    assert summary["iterations"] == 4


_KILLED_DURING_START_UP = """
import os, pathlib, signal, sys
import marlkit
from marlkit.train import run
from marlkit.train import TrainingRun

def killed(*args, **kwargs):  # the run has locked its folder, and makes its first file now
    print("locked", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

run.make_logger = killed
env = marlkit.make("navigation", num_envs=2, n_agents=3, seed=0)
TrainingRun(pathlib.Path(sys.argv[1]), eval_env=env, eval_steps=5, video=False)
"""


def test_a_run_killed_during_its_start_up_resumes_from_the_start(tmp_path, caplog):
    # SIGKILLed before its metrics.csv existed, it left its lock and Hydra's config: resume=
    # said "it holds no training run ... a mistyped folder?", and nothing could go on with it
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("seed: 0\n")
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_DURING_START_UP, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL and "locked" in proc.stdout, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hydra", ".marlkit-run.lock"]
    # a new run into it is refused, and told to resume it (no folder is blocked for good)
    with pytest.raises(
        FileExistsError,
        match=r"already holds a training run \(\.marlkit-run\.lock\): go on with it with "
        rf"resume={tmp_path} \(.*starts again from iteration 1\)",
    ):
        _run_loop(tmp_path, resume=None)
    with caplog.at_level("WARNING", logger="marlkit.train"):
        summary = _run_loop(tmp_path, resume=tmp_path)
    assert any("holds no checkpoint yet" in r.getMessage() for r in caplog.records)
    assert summary["iterations"] == 4
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.csv")] == [1, 2, 3, 4]


def test_a_run_stopped_before_its_first_iteration_is_resumed_not_overwritten(tmp_path):
    # The rule for a folder holding no checkpoint and no metric row (issue 35): it holds a run
    # that resumes from iteration 1; a new run into it is refused with the way out, resume=.
    from marlkit.train import TrainingRun

    first = TrainingRun(tmp_path, eval_env=nav(), eval_steps=5, video=False, backends=["csv"])
    first.close()  # as a script whose first batch raised
    assert read_metrics(tmp_path / "metrics.csv") == []
    with pytest.raises(
        FileExistsError,
        match=r"already holds a training run \(metrics.csv\): go on with it with "
        rf"resume={tmp_path} \(.*starts again from iteration 1\)",
    ):
        _run_loop(tmp_path, resume=False)
    assert _run_loop(tmp_path, resume=True)["iterations"] == 4
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.csv")] == [1, 2, 3, 4]


def test_a_new_run_refused_before_it_wrote_anything_leaves_no_run_behind(tmp_path, monkeypatch):
    # its lock file alone would have made the folder hold a run: the next new run refused
    from marlkit.train import TrainingRun

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'marlkit\[train\]'"):
        TrainingRun(tmp_path, eval_env=nav(), eval_steps=5, video=False, backends="tensorboard")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert _run_loop(tmp_path, resume=None)["iterations"] == 4


def _saved_as_cuda():
    """Until the returned undo: every CPU tensor ``torch.save`` writes is tagged as saved on
    ``cuda:0``, as a CUDA run's checkpoint is (no GPU needed to write one)."""
    import torch.serialization as ser

    registry = list(ser._package_registry)
    ser.register_package(1, lambda obj: "cuda:0" if obj.device.type == "cpu" else None, _none)

    def undo() -> None:  # in place: setattr would restore the list register_package grew
        ser._package_registry[:] = registry

    return undo


def _none(obj, location):
    return None  # leaves loading to torch's own deserializers


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine loads CUDA checkpoints")
def test_a_cuda_runs_checkpoint_loads_and_resumes_on_a_machine_without_cuda(tmp_path):
    undo = _saved_as_cuda()
    try:
        Checkpointer(tmp_path / "c").save(1, {"w": torch.ones(3), "iteration": 1})
        assert _run_loop(tmp_path / "run", resume=False, iterations_before_kill=2) is None
    finally:
        undo()
    ckpt = Checkpointer(tmp_path / "c")
    with pytest.raises(RuntimeError, match=r"CUDA run saved .* map_location='cpu'"):
        ckpt.load()  # not "damaged": it says what to do
    state = ckpt.load(map_location="cpu")
    assert state["w"].device.type == "cpu" and state["iteration"] == 1
    summary = _run_loop(tmp_path / "run", resume=True)  # TrainingRun.restore maps to the CPU
    assert summary["iterations"] == 4
    assert [r["train/updates"] for r in read_metrics(tmp_path / "run" / "metrics.csv")] == [
        1,
        2,
        3,
        4,
    ]
