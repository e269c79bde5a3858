"""What a training checkpoint a user receives may do on load: nothing but load tensors, after
every file passed its checksum. A damaged, crafted or half-written one is refused by name, and a
full disk is an ``OSError`` naming the file, with the checkpoint before it kept."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from tensordict import NonTensorData, TensorDict

from marlkit._files import MANIFEST
from marlkit.replay import ReplayBuffer, TensorStorage
from marlkit.train import Checkpointer


def _buffer() -> ReplayBuffer:
    rb = ReplayBuffer(TensorStorage(16))
    rb.extend(TensorDict({"x": torch.arange(8.0)[:, None]}, [8]))
    return rb


def _save(folder: Path, step: int = 1) -> Path:
    net = torch.nn.Linear(4, 2)
    state = {"net": net.state_dict(), "iteration": step, "eps": 0.25}
    return Checkpointer(folder).save(step, state, {"agents": _buffer()})


def test_a_checkpoint_lists_its_state_with_a_checksum(tmp_path: Path) -> None:
    folder = _save(tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert sorted(manifest["files"]) == ["state.pt"]
    assert manifest["files"]["state.pt"]["size"] == (folder / "state.pt").stat().st_size
    assert Checkpointer(tmp_path).load()["iteration"] == 1


def test_every_bit_flip_in_state_pt_is_refused(tmp_path: Path) -> None:
    # Before checksums, 52 of 60 random flips in a training state.pt loaded.
    rng = random.Random(0)
    folder = _save(tmp_path)
    state = folder / "state.pt"
    original = state.read_bytes()
    for _ in range(30):
        raw = bytearray(original)
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        state.write_bytes(bytes(raw))
        with pytest.raises(ValueError, match=r"state\.pt does not match its checksum"):
            Checkpointer(tmp_path).load()
    state.write_bytes(original)
    assert Checkpointer(tmp_path).load()["eps"] == 0.25


def test_a_planted_pickle_in_a_checkpoint_s_buffer_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            import os

            return (os.system, (f"touch {marker}",))

    folder = _save(tmp_path / "ckpt")
    items = next((folder / "replay" / "agents").glob("checkpoint-*")) / "items"
    TensorDict({"evil": NonTensorData(Payload(), batch_size=[16])}, [16]).memmap(tmp_path / "p")
    (tmp_path / "p" / "evil").rename(items / "evil")
    meta = json.loads((items / "meta.json").read_text())
    meta["evil"] = {"type": "NonTensorData"}
    (items / "meta.json").write_text(json.dumps(meta))
    restored = _buffer()
    with pytest.raises(ValueError, match=r"replay buffer checkpoint .*checkpoint-000000"):
        Checkpointer(tmp_path / "ckpt").load_buffers({"agents": restored})
    assert not marker.exists()
    assert len(restored) == 8


@pytest.mark.parametrize(
    ("craft", "message"),
    [
        ("extra file", r"checkpoint .*step-00000001: extra\.pickle is not part of the format"),
        ("latest outside", r"latest names '\.\./\.\./etc', not a step-<n> checkpoint"),
        ("link", r"state\.pt is a link"),
        ("no manifest entry", r"manifest\.json is damaged"),
    ],
)
def test_crafted_training_checkpoints_are_refused(tmp_path: Path, craft: str, message: str) -> None:
    folder = _save(tmp_path)
    if craft == "extra file":
        (folder / "extra.pickle").write_bytes(b"\x80\x04N.")
    elif craft == "latest outside":
        (tmp_path / "latest").write_text("../../etc")
    elif craft == "link":
        (folder / "state.pt").rename(tmp_path / "elsewhere.pt")
        (folder / "state.pt").symlink_to(tmp_path / "elsewhere.pt")
    else:
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["files"] = {}
        (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=message):
        Checkpointer(tmp_path).load()


def test_a_checkpoint_written_before_checksums_loads_with_a_warning(tmp_path: Path) -> None:
    folder = _save(tmp_path)
    (folder / MANIFEST).unlink()
    with pytest.warns(UserWarning, match=r"written before marlkit kept checksums"):
        assert Checkpointer(tmp_path).load()["iteration"] == 1
    buffer_folder = next((folder / "replay" / "agents").glob("checkpoint-*"))
    (buffer_folder / MANIFEST).unlink()
    restored = ReplayBuffer(TensorStorage(16))
    with pytest.warns(UserWarning, match=r"only its files' sizes are checked"):
        Checkpointer(tmp_path).load_buffers({"agents": restored})
    assert len(restored) == 8


def test_a_checkpoint_on_a_full_disk_names_the_file_and_keeps_the_last_one(small_fs) -> None:
    # torch.save said "basic_ios::clear: iostream error", naming neither ENOSPC nor the file.
    disk = small_fs(2 << 20)
    ckpt = Checkpointer(disk / "ckpt")
    ckpt.save(1, {"w": torch.zeros(1000)})
    with pytest.raises(
        OSError, match=r"no space left on the device for .*state\.pt': [\d,]+ bytes needed"
    ):
        ckpt.save(2, {"w": torch.zeros(1_000_000)})  # 4 MB
    assert ckpt.latest() == disk / "ckpt" / "step-00000001"
    assert not list((disk / "ckpt").glob(".tmp-*"))
    assert ckpt.load()["w"].shape == (1000,)
