"""What is QMIX's and VDN's own in ``sota-implementations/qmix_vdn`` (what every script does:
``test_scripts.py``)."""

from __future__ import annotations

import pytest

from marlkit.record import read_metrics
from marlkit.train import Checkpointer

from ._scripts import ALGORITHMS, run, summary

BUDGET = ALGORITHMS["qmix_vdn"].budget


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


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("loss.mixer=foo", r"loss.mixer must be one of \['qmix', 'vdn'\], got 'foo'"),
        (  # a section replaced by a value: refused while Hydra composes, naming the key
            "loss=vdn",
            r"str is not a subclass of QmixVdnLossConfig(?s:.*)full_key: loss",
        ),
        ("loss.mixer_state=global", r"loss.mixer_state must be one of \['observation', 'state'\]"),
        ("loss.hard_update_interval=-1", r"loss.hard_update_interval must be an int >= 0, got -1"),
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
    # A non-tensor entry planted in the replay dump of the latest checkpoint is refused by the
    # resumed run's restore, naming the file, and never unpickled.
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
    # The replay dump's memory-mapped write on a full disk ends the run with rc 1 and a message
    # naming the file (not a SIGBUS).
    run_dir = small_fs(2 << 20) / "run"
    budget = (*BUDGET, "buffer.capacity=20000", "checkpoint.every=1", "eval.video=false")
    with pytest.raises(
        AssertionError, match=r"(?s)rc 1\).*no space left on the device for '.*run/"
    ):
        run("qmix_vdn", run_dir, budget)


def _targets_and_online(state: dict) -> list[tuple[str, object, object]]:
    """``(name, target, online)`` for every target tensor of a run's QMIX loss."""
    losses = state["losses"]
    online = {k.replace("target_", "", 1): k for k in losses if "target_" in k}
    pairs = [(t, losses[t], losses[o]) for o, t in online.items()]
    assert len(pairs) >= 4  # the Q-network's and the mixer's weights and biases
    return pairs


def test_hard_target_updates_copy_every_interval_steps_across_a_resume(tmp_path):
    """``loss.hard_update_interval=8`` with 4 gradient steps a batch: no copy after the first
    batch (the targets are still the initial networks), a copy at the 8th step, the last of
    the second batch, even when the run was stopped and resumed between the two batches."""
    import torch

    run_dir = tmp_path / "run"
    budget = (*BUDGET, "loss.hard_update_interval=8", "checkpoint.every=1", "eval.every=0")
    budget = (*budget, "eval.video=false")
    run("qmix_vdn", run_dir, (*budget, "collector.total_frames=400"))
    first = Checkpointer(run_dir / "checkpoints").load()
    for name, target, online in _targets_and_online(first):
        assert not torch.equal(target, online), name  # 4 Adam steps since the initial copy
    run("qmix_vdn", run_dir, (*budget, "collector.total_frames=800", f"resume={run_dir}"))
    second = Checkpointer(run_dir / "checkpoints").load()
    assert second["iteration"] == 2
    for name, target, online in _targets_and_online(second):
        assert torch.equal(target, online), name  # copied at the 8th step, the last
        assert not torch.equal(target, first["losses"][name]), name
