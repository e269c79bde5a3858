"""What a replay checkpoint or memmap storage a user receives may do on load: nothing but load
tensors. Crafted payloads (a pickled ``os.system`` call, a path out of the folder, a link) are
refused by name and never run; damaged files are refused by their checksums; two writers of
one folder are told apart; a full disk is an ``OSError`` naming the file, not a ``SIGBUS``."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tensordict import NonTensorData, TensorDict

from marlkit._files import MANIFEST, digest_file, lock_folder, write_manifest
from marlkit.replay import (
    FolderInUse,
    MemmapStorage,
    PrioritizedSampler,
    ReplayBuffer,
    TensorStorage,
)


class _Payload:
    """What an attacker pickles: unpickling it runs ``touch <marker>``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _items(n: int, start: int = 0) -> TensorDict:
    x = torch.arange(start, start + n, dtype=torch.float32)
    group = TensorDict({"obs": x[:, None, None].expand(n, 2, 3).clone()}, [n, 2])
    return TensorDict({"x": x[:, None], "agents": group}, [n])


def _buffer(n: int = 20) -> ReplayBuffer:
    rb = ReplayBuffer(TensorStorage(32), PrioritizedSampler(32, seed=0))
    rb.extend(_items(n))
    return rb


def _plant_pickle(items: Path, marker: Path) -> None:
    """Add a non-tensor entry holding the payload to the item folder ``items``, as tensordict
    itself writes one (``evil/meta.json`` and ``evil/other.pickle``)."""
    planted = TensorDict({"evil": NonTensorData(_Payload(marker), batch_size=[32])}, [32])
    planted.memmap(items.parent / "planted")
    shutil.move(items.parent / "planted" / "evil", items / "evil")
    shutil.rmtree(items.parent / "planted")
    meta = json.loads((items / "meta.json").read_text())
    meta["evil"] = {"type": "NonTensorData"}
    (items / "meta.json").write_text(json.dumps(meta))
    # the payload is real: unpickling it runs the command
    pickle.loads((items / "evil" / "other.pickle").read_bytes())
    assert marker.exists()
    marker.unlink()


def _rechecksum(folder: Path) -> None:
    """What an attacker who knows the format does: a manifest that lists every file."""
    files = {
        p.relative_to(folder).as_posix(): (p.stat().st_size, digest_file(p))
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    write_manifest(folder, files)


@pytest.mark.parametrize("manifest", ["kept", "rewritten"])
def test_a_pickle_planted_in_a_dump_never_runs(tmp_path: Path, manifest: str) -> None:
    folder = _buffer().dumps(tmp_path / "ckpt")
    marker = tmp_path / "pwned"
    _plant_pickle(folder / "items", marker)
    if manifest == "rewritten":
        _rechecksum(folder)
        message = r"entry 'evil' is not a tensor or a TensorDict .*non-tensor"
    else:
        message = r"items/evil/ is not part of the format"
    other = _buffer(3)
    with pytest.raises(ValueError, match=rf"checkpoint-000000.*{message}"):
        other.loads(tmp_path / "ckpt")
    assert not marker.exists()
    assert len(other) == 3  # left as it was


def test_a_pickle_planted_in_a_memmap_storage_never_runs(tmp_path: Path) -> None:
    storage = MemmapStorage(32, tmp_path / "live")
    ReplayBuffer(storage).extend(_items(5))
    marker = tmp_path / "pwned"
    _plant_pickle(tmp_path / "live" / "data", marker)
    with pytest.raises(
        ValueError, match=r"memmap storage .*live is damaged: .*entry 'evil' is not"
    ):
        MemmapStorage.open(tmp_path / "live")
    assert not marker.exists()


def test_a_stray_pickle_file_in_a_memmap_storage_is_refused(tmp_path: Path) -> None:
    ReplayBuffer(MemmapStorage(32, tmp_path / "live")).extend(_items(5))
    (tmp_path / "live" / "data" / "other.pickle").write_bytes(pickle.dumps(_Payload(tmp_path)))
    with pytest.raises(ValueError, match=r"data/other\.pickle is not part of the format"):
        MemmapStorage.open(tmp_path / "live")


@pytest.mark.parametrize(
    ("craft", "message"),
    [
        ("latest outside", r"latest names '\.\./elsewhere/checkpoint-000000', not a checkpoint-"),
        ("item link", r"items/x\.memmap is a link"),
        ("entry path", r"declares an entry named '\.\.', not a plain file name"),
        ("class", r"declares a 'mypackage:Evil'; marlkit loads plain TensorDicts only"),
        ("dtype", r"entry 'x' has the unknown dtype 'torch.object'"),
        ("nested", r"entry 'x' is not a tensor or a TensorDict"),
        ("shape", r"items/x\.memmap holds 128 bytes; \[32, 2\] of torch.float32 take 256"),
        ("meta", r"items/meta\.json does not parse"),
    ],
)
def test_crafted_checkpoints_are_refused_by_name(tmp_path: Path, craft: str, message: str) -> None:
    # The attacker rewrites the manifest, so only the format's own checks stand.
    folder = _buffer().dumps(tmp_path / "ckpt")
    items = folder / "items"
    meta = json.loads((items / "meta.json").read_text())
    if craft == "latest outside":
        (tmp_path / "ckpt" / "latest").write_text("../elsewhere/checkpoint-000000")
    elif craft == "item link":
        (items / "x.memmap").unlink()
        (items / "x.memmap").symlink_to("/etc/passwd")
    elif craft == "entry path":
        meta[".."] = {"type": "TensorDict"}
    elif craft == "class":
        meta["_class"] = "mypackage:Evil"
    elif craft == "dtype":
        meta["x"]["dtype"] = "torch.object"
    elif craft == "nested":
        meta["x"]["is_nested"] = True
    elif craft == "shape":
        meta["x"]["shape"] = [32, 2]
    if craft == "meta":
        (items / "meta.json").write_text('{"x": ')
    elif craft not in ("latest outside", "item link"):
        (items / "meta.json").write_text(json.dumps(meta))
    _rechecksum(folder)
    other = _buffer(3)
    with pytest.raises(ValueError, match=message):
        other.loads(tmp_path / "ckpt")
    assert len(other) == 3


@pytest.mark.parametrize("edit", ["dtype", "shape"])
def test_a_meta_json_of_the_same_byte_size_is_refused(tmp_path: Path, edit: str) -> None:
    # float32 -> int32, or [32, 1] -> [16, 2]: the same bytes, and still refused.
    folder = _buffer().dumps(tmp_path / "ckpt")
    meta_file = folder / "items" / "meta.json"
    meta = json.loads(meta_file.read_text())
    if edit == "dtype":
        meta["x"]["dtype"] = "torch.int32"
    else:
        meta["x"]["shape"] = [16, 2]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"items/meta\.json (holds|does not match)"):
        _buffer(3).loads(tmp_path / "ckpt")


def test_random_bit_flips_are_all_refused(tmp_path: Path) -> None:
    # Before checksums, 57 of 60 flips in state.pt and every flip in an item file loaded.
    rng = random.Random(0)
    folder = _buffer().dumps(tmp_path / "ckpt")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    original = {p: p.read_bytes() for p in files}
    for _ in range(40):
        target = rng.choice(files)
        raw = bytearray(original[target])
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(raw))
        with pytest.raises(ValueError, match=r"does not match its checksum"):
            _buffer(3).loads(tmp_path / "ckpt")
        target.write_bytes(original[target])
    restored = _buffer(3)
    restored.loads(tmp_path / "ckpt")
    assert len(restored) == 20


def test_a_flipped_manifest_is_refused(tmp_path: Path) -> None:
    folder = _buffer().dumps(tmp_path / "ckpt")
    manifest = folder / MANIFEST
    manifest.write_text(manifest.read_text().replace('"size": 128', '"size": 129', 1))
    with pytest.raises(ValueError, match=r"manifest\.json is damaged .*does not match its digest"):
        _buffer(3).loads(tmp_path / "ckpt")


def _hold_the_lock(folder: str, ready: multiprocessing.synchronize.Event, done: object) -> None:
    handle = lock_folder(Path(folder), ".lock", what="test", advice="")
    ready.set()
    done.wait(30)  # type: ignore[attr-defined]
    assert handle is not None
    handle.close()


def test_a_second_writer_is_refused_naming_the_first(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    ready, done = context.Event(), context.Event()
    holder = context.Process(target=_hold_the_lock, args=(str(tmp_path / "ckpt"), ready, done))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(
            FolderInUse,
            match=rf"in use by another process writing replay buffer checkpoints \(pid "
            rf"{holder.pid}\)",
        ):
            _buffer().dumps(tmp_path / "ckpt")
        assert not list((tmp_path / "ckpt").glob("checkpoint-*"))
    finally:
        done.set()
        holder.join(30)
    _buffer().dumps(tmp_path / "ckpt")  # the lock went with its holder


WRITER = """
import sys, torch
from tensordict import TensorDict
from marlkit._files import FolderInUse
from marlkit.replay import ReplayBuffer, TensorStorage
root, mine = sys.argv[1], float(sys.argv[2])
rb = ReplayBuffer(TensorStorage(4096))
rb.extend(TensorDict({"who": torch.full((4096, 64), mine)}, [4096]))
refused = 0
for _ in range(40):
    try:
        rb.dumps(root)
    except FolderInUse:
        refused += 1
print(refused)
"""


@pytest.mark.slow
def test_concurrent_writers_and_a_reader_never_see_damage(tmp_path: Path) -> None:
    # Before the lock, 19 and 27 of 40 writes failed with raw OSErrors about internal folders,
    # and a reader saw damaged loads.
    root = tmp_path / "ckpt"
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(WRITER))
    writers = [
        subprocess.Popen(
            [sys.executable, str(script), str(root), str(who)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for who in (1, 2)
    ]
    reads = 0
    while any(w.poll() is None for w in writers):
        if (root / "latest").exists():
            rb = ReplayBuffer(TensorStorage(4096))
            rb.loads(root)  # never damaged: a checkpoint is not removed while it is read
            who = rb[:]["who"]
            assert (who == who[0, 0]).all()  # one writer's items, whole
            reads += 1
    for writer in writers:
        out, err = writer.communicate()
        assert writer.returncode == 0, err
        assert 0 <= int(out) <= 40
    assert reads > 0
    assert not list(root.glob(".tmp-*"))


FILL = """
import sys, torch
from tensordict import TensorDict
from marlkit.replay import MemmapStorage, ReplayBuffer
rb = ReplayBuffer(MemmapStorage(6000, sys.argv[1]))
try:
    for start in range(0, 6000, 500):  # 6 MB of items onto a 3 MB file system
        rb.extend(TensorDict({"x": torch.ones(500, 250)}, [500]))
except OSError as err:
    print("refused", len(rb), err)
"""


def test_a_memmap_storage_on_a_full_disk_is_an_oserror_not_sigbus(tmp_path: Path, small_fs) -> None:
    # A write into the memory maps on a full disk is an OSError naming the file, not a SIGBUS
    # (exit 135) without a message.
    disk = small_fs(3 << 20)
    script = tmp_path / "fill.py"
    script.write_text(textwrap.dedent(FILL))
    done = subprocess.run(
        [sys.executable, str(script), str(disk / "live")], capture_output=True, text=True
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.startswith("refused "), done.stdout
    written = int(done.stdout.split()[1])
    assert 0 < written < 6000
    assert "no space left on the device for" in done.stdout
    assert "x.memmap" in done.stdout and "bytes needed" in done.stdout
    reopened = MemmapStorage.open(disk / "live")  # what was written before stays readable
    assert len(reopened) == written
    assert bool((reopened.get(torch.arange(written))["x"] == 1).all())


def test_dumps_on_a_full_disk_names_the_file_and_keeps_the_last_checkpoint(small_fs) -> None:
    disk = small_fs(3 << 20)
    small = ReplayBuffer(TensorStorage(500))
    small.extend(TensorDict({"x": torch.ones(500, 250)}, [500]))  # 0.5 MB
    small.dumps(disk / "ckpt")
    large = ReplayBuffer(TensorStorage(6000))
    large.extend(TensorDict({"x": torch.ones(6000, 250)}, [6000]))  # 6 MB
    with pytest.raises(
        OSError,
        match=r"no space left on the device for .*x\.memmap': 6,000,000 "
        r"bytes needed, [\d,]+ bytes free \(No space left on device\)$",
    ):
        large.dumps(disk / "ckpt")
    assert not list((disk / "ckpt").glob(".tmp-*"))  # the failed write left nothing
    restored = ReplayBuffer(TensorStorage(500))
    restored.loads(disk / "ckpt")
    assert len(restored) == 500


def test_a_checkpoint_of_another_capacity_is_named(tmp_path: Path) -> None:
    # "the saved items are of batch [32], not [16, ...]" named no checkpoint
    _buffer().dumps(tmp_path / "ckpt")
    small = ReplayBuffer(TensorStorage(16), PrioritizedSampler(16))
    with pytest.raises(ValueError, match=r"replay buffer checkpoint .*ckpt: .*capacity 32"):
        small.loads(tmp_path / "ckpt")
