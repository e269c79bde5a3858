"""End-to-end runs of ``sota-implementations/qmix_vdn`` on tiny budgets (subprocesses)."""

from __future__ import annotations

import pytest

from marlkit.record import read_metrics, read_video
from marlkit.train import Checkpointer

from ._scripts import kill_after, run, summary

#: Two iterations of 8 envs x 25 steps, two short epochs.
BUDGET = (
    "env.num_envs=8",
    "env.max_steps=25",
    "collector.frames_per_batch=400",
    "collector.total_frames=800",
    "train.epochs=2",
    "train.minibatch_size=200",
    "policy.num_cells=32",
    "loss.mixing_embed_dim=8",
    "eval.every=1",
)


def test_native_navigation_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    out = run("qmix_vdn", run_dir, BUDGET).stdout
    assert "iteration 2: frames 800" in out
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "frames",
        "frames_per_s",
        "collection_time",
        "training_time",
        "eps",
        "replay/agents/size",
        "train/agents/loss",
        "train/agents/q_value",
        "train/agents/target_value",
        "train/agents/grad_norm",
        "agents/episode_reward",
        "episode_length",
        "eval/agents/episode_reward",
    ):
        assert key in rows[-1], key
    assert rows[-1]["frames"] == 800
    assert rows[-1]["episode_length"] == 25
    assert [r["replay/agents/size"] for r in rows] == [400, 400]  # one batch held
    # eps 0.3 -> 0 over half the 800 frames: the second batch is collected greedily.
    assert rows[0]["eps"] == pytest.approx(0.3) and rows[1]["eps"] == pytest.approx(0.0, abs=1e-6)
    info = summary(run_dir)
    assert info["frames"] == 800 and info["env"] == "navigation"
    assert info["algorithm"] == "qmix_vdn" and info["variant"] == "QMIX"
    assert set(info["trained"]) == set(info["random"]) >= {"agents/episode_reward"}
    for name in ("rollout.mp4", "reward.png", "videos/eval-0001.mp4", "checkpoints/latest"):
        assert (run_dir / name).stat().st_size > 0, name
    frames, _ = read_video(run_dir / "rollout.mp4")
    assert frames.shape[0] == 27  # the reset, 25 steps, the auto-reset after the last
    latest = Checkpointer(run_dir / "checkpoints").latest()
    assert latest is not None and (latest / "replay" / "replay" / "agents" / "latest").exists()


def test_vdn_sums_the_agents_values(tmp_path):
    run_dir = tmp_path / "run"
    run("qmix_vdn", run_dir, (*BUDGET, "loss.mixer=vdn", "eval.video=false"))
    assert summary(run_dir)["variant"] == "VDN"


def test_qmix_mixing_on_the_env_state(tmp_path):
    run_dir = tmp_path / "run"
    run("qmix_vdn", run_dir, (*BUDGET, "loss.mixer_state=state", "eval.video=false"))
    assert "train/agents/loss" in read_metrics(run_dir / "metrics.csv")[-1]


def test_qmix_on_vmas(tmp_path):
    run_dir = tmp_path / "run"
    run("qmix_vdn", run_dir, (*BUDGET, "env=vmas/navigation", "eval.video=false"))
    info = summary(run_dir)
    assert info["env"] == "vmas/navigation"
    assert "agents/episode_reward" in info["trained"]


def test_heterogeneous_groups_get_a_mixer_and_loss_each(tmp_path):
    run_dir = tmp_path / "run"
    run("qmix_vdn", run_dir, (*BUDGET, "env=predator_prey", "eval.video=false"))
    last = read_metrics(run_dir / "metrics.csv")[-1]
    for group in ("predator", "prey"):
        assert f"train/{group}/loss" in last
        assert last[f"replay/{group}/size"] == 400
        assert f"eval/{group}/episode_reward" in last


@pytest.mark.slow
@pytest.mark.parametrize("collector", ["multisync", "ray"])
def test_multiprocess_and_ray_collectors(tmp_path, collector):
    run_dir = tmp_path / "run"
    run("qmix_vdn", run_dir, (*BUDGET, f"collector={collector}", "eval.video=false"))
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["frames"] for r in rows] == [400, 800]


def test_killed_run_resumes_with_its_replay_buffer_and_epsilon(tmp_path):
    run_dir = tmp_path / "run"
    budget = (
        *BUDGET,
        "collector.total_frames=2000",  # five iterations; eps 0.3 -> 0 over the first 1000
        "buffer.capacity=800",  # two batches: a fresh buffer would hold 400 after one
        "checkpoint.every=1",
        "eval.every=0",
        "eval.video=false",
    )
    kill_after("qmix_vdn", run_dir, budget, "iteration 3:")
    before = read_metrics(run_dir / "metrics.csv")
    assert 3 <= len(before) < 5
    run("qmix_vdn", run_dir, (*budget, f"resume={run_dir}"))
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["frames"] for r in rows] == [400, 800, 1200, 1600, 2000]
    assert rows[:3] == before[:3]  # the rows before the checkpoint are kept as they were
    # The restored buffer is full at the first resumed iteration; the restored eps goes on.
    assert [r["replay/agents/size"] for r in rows] == [400, 800, 800, 800, 800]
    eps = [r["eps"] for r in rows]
    assert eps == pytest.approx([0.3, 0.18, 0.06, 0.0, 0.0], abs=1e-6)
    assert summary(run_dir)["frames"] == 2000


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("loss.mixer=foo", r"loss.mixer must be one of \['qmix', 'vdn'\], got 'foo'"),
        (
            "loss=vdn",
            r"loss is a group of settings \(loss.mixer, ...\), got loss='vdn'; set its keys",
        ),
        ("loss.mixer_state=global", r"loss.mixer_state must be one of \['observation', 'state'\]"),
        (
            "+env.kwargs.continuous_actions=true",
            r"discrete actions are needed.*Bounded actions \(continuous_actions=True in its",
        ),
        (
            "env=vmas/navigation loss.mixer_state=state",
            r"needs an env with a global 'state'.*use loss.mixer_state=observation",
        ),
    ],
)
def test_a_bad_config_is_named(tmp_path, override, message):
    with pytest.raises(AssertionError, match=message):
        run("qmix_vdn", tmp_path / "run", (*BUDGET, *override.split()))


class _Payload:
    """Unpickling it runs ``touch <marker>``: what a crafted replay dump would hold."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_run_folder_with_a_planted_pickle_resumes_no_code(tmp_path):
    # A non-tensor entry added to the replay dump of the latest checkpoint ran its pickled
    # os.system call in the resumed run's restore.
    import json
    import shutil

    from tensordict import NonTensorData, TensorDict

    run_dir = tmp_path / "run"
    budget = (*BUDGET, "checkpoint.every=1", "eval.every=0", "eval.video=false")
    run("qmix_vdn", run_dir, budget)
    step = Checkpointer(run_dir / "checkpoints").latest()
    assert step is not None
    replay = next(step.glob("replay/**/latest")).parent  # replay/<buffer>/<group>/
    items = replay / (replay / "latest").read_text() / "items"
    marker = tmp_path / "pwned"
    capacity = json.loads((items / "meta.json").read_text())["shape"][0]
    evil = TensorDict({"evil": NonTensorData(_Payload(marker), batch_size=[capacity])}, [capacity])
    evil.memmap(tmp_path / "planted")
    shutil.move(tmp_path / "planted" / "evil", items / "evil")
    meta = json.loads((items / "meta.json").read_text())
    meta["evil"] = {"type": "NonTensorData"}
    (items / "meta.json").write_text(json.dumps(meta))
    more = (*budget, "collector.total_frames=1200", f"resume={run_dir}")
    with pytest.raises(AssertionError, match=r"replay buffer checkpoint .*items/evil/ is not part"):
        run("qmix_vdn", run_dir, more)
    assert not marker.exists()


def test_a_run_on_a_full_disk_names_the_file(tmp_path, small_fs):
    # The replay dump's memory-mapped write killed the run with SIGBUS, and no message.
    run_dir = small_fs(2 << 20) / "run"
    budget = (*BUDGET, "buffer.capacity=20000", "checkpoint.every=1", "eval.video=false")
    with pytest.raises(
        AssertionError, match=r"(?s)rc 1\).*no space left on the device for '.*run/"
    ):
        run("qmix_vdn", run_dir, budget)
