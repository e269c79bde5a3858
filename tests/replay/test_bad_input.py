"""Replay inputs that used to be reinterpreted silently: bool and float indices, a trajectory
key that is not in the items, a checkpoint of another kind of buffer, a group list given as
one string."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from marlkit.replay import (
    GroupReplayBuffers,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
    TensorStorage,
)


def _items(n: int) -> TensorDict:
    return TensorDict({"o": torch.arange(n, dtype=torch.float32)[:, None]}, [n])


@pytest.mark.parametrize("index", [torch.tensor([True, False, True]), torch.tensor([0.0, 2.0])])
def test_bool_and_float_indices_are_refused(index: torch.Tensor) -> None:
    rb = ReplayBuffer(TensorStorage(10), PrioritizedSampler(10, 0.6, 0.4))
    rb.extend(_items(3))
    before = rb.sampler.priorities(torch.arange(3)).clone()
    with pytest.raises(TypeError, match=rf"index must hold integer positions, got {index.dtype}"):
        rb[index]
    with pytest.raises(TypeError, match=r"mask\.nonzero"):
        rb.update_priority(index, 9.0)
    torch.testing.assert_close(rb.sampler.priorities(torch.arange(3)), before)


def test_a_trajectory_key_the_items_lack_is_a_key_error() -> None:
    data = _items(8)
    data["collector", "traj_ids"] = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    data["next", "done"] = torch.zeros(8, 1, dtype=torch.bool)
    typo = ReplayBuffer(TensorStorage(8), SliceSampler(2, traj_key=("collector", "traj_id")))
    typo.extend(data)
    with pytest.raises(KeyError, match=r"have no .*traj_id.* \(traj_key\)"):
        typo.sample(4)
    flags = ReplayBuffer(TensorStorage(8), SliceSampler(4, traj_key=None, seed=0))
    flags.extend(data)  # no done: one trajectory of 8 by the flags, two of 4 by the ids
    starts = {int(s["o"][0, 0]) for s in (flags.sample(4) for _ in range(30))}
    assert starts - {0.0, 4.0}  # slices that cross the ids' boundary: the ids were not read


def test_a_checkpoint_of_another_kind_of_buffer_is_refused_before_loading(tmp_path) -> None:
    saved = ReplayBuffer(TensorStorage(4), RandomSampler())
    saved.extend(_items(3))
    saved.dumps(tmp_path)
    other = ReplayBuffer(TensorStorage(4), PrioritizedSampler(4, 0.6, 0.4))
    other.extend(_items(2))
    with pytest.raises(TypeError, match=r"another sampler \(RandomSampler, this buffer has "):
        other.loads(tmp_path)
    assert len(other) == 2  # untouched


def test_groups_given_as_one_string_are_refused() -> None:
    with pytest.raises(TypeError, match="groups must be a list of group names, got the str"):
        GroupReplayBuffers("agents", lambda g: ReplayBuffer(TensorStorage(4)))


def test_non_tensor_data_is_refused_not_dropped() -> None:
    rb = ReplayBuffer(TensorStorage(8))
    items = _items(2)
    items["info"] = "hello"
    for stored in (0, 2):  # the first write, then a later one
        with pytest.raises(TypeError, match=r"'info' is non-tensor data .* drop it first"):
            rb.extend(items)
        assert len(rb) == stored
        rb.extend(items.exclude("info"))


_DAMAGES = {
    "truncated": r"items/o\.memmap holds 100 bytes, the manifest says 1,024",
    "emptied": r"items/o\.memmap holds 0 bytes, the manifest says 1,024",
    "deleted": r"items/o\.memmap is missing",
    "state": r"state\.pt holds 16 bytes",
    "flipped item": r"items/o\.memmap does not match its checksum",
    "flipped state": r"state\.pt does not match its checksum",
}


@pytest.mark.parametrize("damage", list(_DAMAGES))
def test_a_damaged_checkpoint_is_refused_and_the_buffer_kept(tmp_path, damage: str) -> None:
    # Every file of a checkpoint is checked against the size and checksum of its manifest, so
    # a damaged one is refused by name, before anything is loaded.
    saved = ReplayBuffer(TensorStorage(64))
    saved.extend(TensorDict({"o": torch.randn(40, 4), "a": torch.ones(40)}, [40]))
    folder = saved.dumps(tmp_path)
    item = folder / "items" / "o.memmap"
    if damage == "truncated":
        item.write_bytes(item.read_bytes()[:100])
    elif damage == "emptied":
        item.write_bytes(b"")
    elif damage == "deleted":
        item.unlink()
    elif damage == "state":
        (folder / "state.pt").write_bytes(b"not a checkpoint")
    else:
        target = item if damage == "flipped item" else folder / "state.pt"
        raw = bytearray(target.read_bytes())
        raw[len(raw) // 2] ^= 0x10  # one bit
        target.write_bytes(bytes(raw))
    other = ReplayBuffer(TensorStorage(64))
    other.extend(_items(3).rename_key_("o", "x"))
    with pytest.raises(
        ValueError,
        match=rf"replay buffer checkpoint .*checkpoint-000000: {_DAMAGES[damage]}.*nothing was "
        "loaded",
    ):
        other.loads(tmp_path)
    assert len(other) == 3  # left as it was
    assert other.storage.data is not None and "x" in other.storage.data


def test_a_slice_sampler_over_whole_rollouts_is_refused() -> None:
    # extend([E, T]) stores E items of [T]: a slice sampler over them would join items of
    # different envs into one "sequence", so it is refused with a message.
    import marlkit

    env = marlkit.make("navigation", num_envs=4, n_agents=2, seed=0)
    rb = ReplayBuffer(TensorStorage(100), SliceSampler(2, seed=0))
    rb.extend(env.rollout(20))
    with pytest.raises(ValueError, match=r"these items are sequences already \(\[20\] each"):
        rb.sample(4)


def test_prioritized_sampler_names_a_string_alpha() -> None:
    # torch's "must be real number, not str", naming no argument
    with pytest.raises(TypeError, match=r"alpha must be a number, got str: '0\.5'"):
        PrioritizedSampler(4, alpha="0.5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"beta must be a finite number >= 0, got -1"):
        PrioritizedSampler(4, beta=-1.0)
