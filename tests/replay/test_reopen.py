"""A buffer built on a reopened ``MemmapStorage`` carries on where the old process stopped: it
writes after the newest item (the write cursor is in ``storage.json``), samples the stored items
(prioritized too), and never joins the newest items to the oldest. Files of an older marlkit,
without the cursor, still open."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from marlkit.replay import (
    MemmapStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
    TensorStorage,
)


def items(start: int, n: int) -> TensorDict:
    """``n`` steps of one long episode, numbered from ``start`` (no done among them)."""
    t = torch.arange(start, start + n)
    return TensorDict({"t": t[:, None], "next": {"done": torch.zeros(n, 1, dtype=torch.bool)}}, [n])


def stored(rb: ReplayBuffer) -> list[int]:
    return rb[:]["t"].reshape(-1).tolist()


def meta(path: Path) -> dict[str, int]:
    return json.loads((path / "storage.json").read_text())


def test_a_reopened_storage_is_written_after_its_newest_item(tmp_path: Path) -> None:
    path = tmp_path / "mm"
    ReplayBuffer(MemmapStorage(10, path)).extend(items(0, 5))
    assert meta(path)["cursor"] == 5
    rb = ReplayBuffer(MemmapStorage.open(path))
    assert rb.extend(items(100, 3)).tolist() == [5, 6, 7]
    assert len(rb) == 8 and stored(rb) == [0, 1, 2, 3, 4, 100, 101, 102]


def test_a_reopened_wrapped_storage_overwrites_its_oldest_items(tmp_path: Path) -> None:
    path = tmp_path / "mm"
    ReplayBuffer(MemmapStorage(10, path)).extend(items(0, 13))  # slots: 10 11 12 3 4 ... 9
    assert meta(path) == {"capacity": 10, "len": 10, "cursor": 3, "allocated": True}
    rb = ReplayBuffer(MemmapStorage.open(path))
    assert rb.storage.stored_index().tolist() == [3, 4, 5, 6, 7, 8, 9, 0, 1, 2]
    assert rb.extend(items(13, 2)).tolist() == [3, 4]
    assert stored(rb) == [10, 11, 12, 13, 14, 5, 6, 7, 8, 9]
    assert meta(path)["cursor"] == 5


def test_a_prioritized_sampler_samples_the_items_of_a_reopened_storage(tmp_path: Path) -> None:
    path = tmp_path / "mm"
    first = ReplayBuffer(MemmapStorage(10, path), PrioritizedSampler(10, seed=0))
    first.extend(items(0, 5))
    first.update_priority(torch.arange(5), 7.0)  # priorities are not in the storage's files
    rb = ReplayBuffer(MemmapStorage.open(path), PrioritizedSampler(10, seed=0))
    sample = rb.sample(2000)
    assert set(sample["index"].tolist()) == {0, 1, 2, 3, 4}  # every stored item, nothing else
    assert torch.equal(sample["t"][:, 0], sample["index"])
    # the stored items: the largest priority so far (1 for a new sampler), all alike
    assert rb.sampler.priorities(torch.arange(5)).tolist() == pytest.approx([1.0] * 5)
    assert (sample["priority_weight"] == 1).all()
    rb.update_priority(torch.tensor([0]), 50.0)
    assert rb.extend(items(5, 1)).tolist() == [5]


def test_a_slice_sampler_never_crosses_the_cursor_of_a_reopened_storage(tmp_path: Path) -> None:
    path = tmp_path / "mm"
    ReplayBuffer(MemmapStorage(10, path)).extend(items(0, 13))  # newest 12 next to oldest 3
    rb = ReplayBuffer(MemmapStorage.open(path), SliceSampler(4, traj_key=None, seed=0))
    t = rb.sample(4 * 500)["t"][..., 0]
    assert ((t[:, 1:] - t[:, :-1]) == 1).all()
    assert set(t[:, 0].tolist()) == {3, 4, 5, 6}  # every window of the 7 oldest; 10-12 too short


def test_a_buffer_on_a_tensor_storage_holding_items_carries_on_too() -> None:
    storage = TensorStorage(6)
    ReplayBuffer(storage).extend(items(0, 8))
    rb = ReplayBuffer(storage, RandomSampler(seed=0))
    assert storage.cursor == 2 and rb.extend(items(8, 1)).tolist() == [2]


def _old_files(path: Path, length: int) -> None:
    """Rewrite ``storage.json`` as a marlkit without the cursor wrote it."""
    old = meta(path)
    del old["cursor"]
    old["len"] = length
    (path / "storage.json").write_text(json.dumps(old))


def test_old_files_without_a_cursor_open_with_one_derived_from_len(tmp_path: Path) -> None:
    path = tmp_path / "mm"
    ReplayBuffer(MemmapStorage(10, path)).extend(items(0, 6))
    _old_files(path, 6)
    rb = ReplayBuffer(MemmapStorage.open(path))
    assert rb.storage.cursor == 6 and rb.extend(items(6, 1)).tolist() == [6]
    assert meta(path)["cursor"] == 7  # recorded from now on


def test_old_full_files_without_a_cursor_warn_and_write_from_slot_0(tmp_path: Path) -> None:
    path = tmp_path / "mm"
    ReplayBuffer(MemmapStorage(10, path)).extend(items(0, 13))
    _old_files(path, 10)
    with pytest.warns(UserWarning, match=r"no write cursor .* full: the cursor is taken as 0"):
        storage = MemmapStorage.open(path)
    rb = ReplayBuffer(storage)
    assert len(rb) == 10 and rb.extend(items(20, 1)).tolist() == [0]


def test_a_checkpoint_state_without_the_storage_cursor_takes_the_writers(tmp_path: Path) -> None:
    rb = ReplayBuffer(MemmapStorage(10, tmp_path / "saved"))
    rb.extend(items(0, 13))
    state = rb.state_dict()
    del state["storage"]["cursor"]  # as saved before the storage recorded it
    twin = ReplayBuffer(MemmapStorage(10, tmp_path / "mm"))
    twin.load_state_dict(state)
    assert twin.storage.cursor == 3 and meta(tmp_path / "mm")["cursor"] == 3
    assert twin.extend(items(13, 1)).tolist() == rb.extend(items(13, 1)).tolist() == [3]
