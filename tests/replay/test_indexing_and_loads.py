"""Indexing like a Python sequence, loads that replace whatever the buffer held or change
nothing, and iteration that finishes the epoch under way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from marlkit.replay import (
    GroupReplayBuffers,
    MemmapStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    Storage,
    TensorStorage,
)


def items(start: int, n: int) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n, dtype=torch.float32)[:, None]}, [n])


def xs(data: TensorDict) -> list[float]:
    return data["x"].reshape(-1).tolist()


def test_negative_positions_count_from_len_like_a_sequence() -> None:
    rb = ReplayBuffer(TensorStorage(10))
    rb.extend(items(0, 5))
    assert rb[-1]["x"].item() == 4 and rb[-5]["x"].item() == 0
    assert xs(rb[torch.tensor([-1, 0, -2])]) == [4, 0, 3]
    assert xs(rb[[-1]]) == xs(rb[-1:]) == [4]
    assert xs(rb[-2:]) == [3, 4]
    assert xs(rb[::-1]) == [4, 3, 2, 1, 0] and xs(rb[3:0:-2]) == [3, 1]
    assert xs(rb[3:1]) == []
    for bad in (-6, torch.tensor([0, -6]), 5):
        with pytest.raises(IndexError, match="out of range for 5 stored items"):
            rb[bad]


def _groups(sampler: type) -> GroupReplayBuffers:
    def make(group: str) -> ReplayBuffer:
        if group == "pred":
            return ReplayBuffer(TensorStorage(16), PrioritizedSampler(16, seed=0))
        return ReplayBuffer(TensorStorage(16), sampler(seed=0))

    return GroupReplayBuffers(["pred", "prey"], make)


def _batch(n: int) -> TensorDict:
    return TensorDict(
        {
            "pred": TensorDict({"o": torch.randn(n, 2, 3)}, [n, 2]),
            "prey": TensorDict({"o": torch.randn(n, 4, 5)}, [n, 4]),
            "state": torch.randn(n, 7),
        },
        [n],
    )


def test_group_loads_check_every_group_before_loading_any(tmp_path: Path) -> None:
    saved = _groups(RandomSampler)
    saved.extend(_batch(6))
    saved.dumps(tmp_path / "groups")
    other = _groups(SamplerWithoutReplacement)  # "prey" samples otherwise
    other.extend(_batch(2))
    before = other.state_dict()
    with pytest.raises(TypeError, match=r"group 'prey': .*another sampler \(RandomSampler"):
        other.loads(tmp_path / "groups")
    with pytest.raises(TypeError, match=r"group 'prey': .*another sampler"):
        other.load_state_dict(saved.state_dict())
    assert other.lengths() == {"pred": 2, "prey": 2}  # "pred", first, was not loaded either
    assert (other["pred"][:] == before["pred"]["storage"]["data"][:2]).all()
    twin = _groups(RandomSampler)
    twin.loads(tmp_path / "groups")
    assert twin.lengths() == {"pred": 6, "prey": 6}
    (tmp_path / "groups" / "prey" / "latest").unlink()
    fresh = _groups(RandomSampler)
    with pytest.raises(FileNotFoundError, match="no replay buffer checkpoint"):
        fresh.loads(tmp_path / "groups")
    assert fresh.lengths() == {"pred": 0, "prey": 0}


@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_loads_replaces_items_of_other_keys(kind: str, tmp_path: Path) -> None:
    def storage(name: str) -> Storage:
        return TensorStorage(8) if kind == "tensor" else MemmapStorage(8, tmp_path / name)

    saved = ReplayBuffer(storage("saved"))
    saved.extend(items(0, 3))
    saved.dumps(tmp_path / "ckpt")
    rb = ReplayBuffer(storage("mm"))
    rb.extend(TensorDict({"y": torch.zeros(2, 2)}, [2]))
    rb.loads(tmp_path / "ckpt")
    assert len(rb) == 3 and xs(rb[:]) == [0, 1, 2] and "y" not in rb[:]
    rb.extend(items(3, 1))
    assert xs(rb[:]) == [0, 1, 2, 3]
    if kind == "memmap":  # the files hold the new layout
        reopened = MemmapStorage.open(tmp_path / "mm")
        assert xs(reopened.get(torch.arange(4))) == [0, 1, 2, 3]
        assert not list((tmp_path / "mm").rglob("y.memmap"))


def test_iteration_finishes_the_epoch_that_samples_began() -> None:
    rb = ReplayBuffer(TensorStorage(16), SamplerWithoutReplacement(seed=0), batch_size=4)
    rb.extend(items(0, 12))
    first = rb.sample()["index"]
    rest = [b["index"] for b in rb]  # the rest of that epoch: 8 items
    assert [len(b) for b in rest] == [4, 4]
    assert sorted(torch.cat([first, *rest]).tolist()) == list(range(12))
    assert [len(b["index"]) for b in rb] == [4, 4, 4]  # then a whole one


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine loads CUDA tensors")
@pytest.mark.parametrize("sampler", [SamplerWithoutReplacement, PrioritizedSampler])
def test_a_buffer_dumped_by_a_cuda_run_loads_on_a_machine_without_cuda(
    sampler: type, tmp_path: Path
) -> None:
    """The buffer's ``state.pt`` (the sampler's generator and priorities, the writer's cursor)
    holds tensors a CUDA run saved tagged ``cuda:0``: they load onto the CPU, where a plain
    ``torch.load`` would fail and the checkpoint would be called damaged."""
    import torch.serialization as ser

    def make() -> ReplayBuffer:
        kwargs = {"capacity": 8, "alpha": 0.6, "beta": 0.4} if sampler is PrioritizedSampler else {}
        return ReplayBuffer(TensorStorage(8), sampler=sampler(**kwargs), batch_size=4)

    saved = make()
    saved.extend(items(0, 6))
    saved.sample()  # the sampler's state moves on
    registry = list(ser._package_registry)
    ser.register_package(1, lambda obj: "cuda:0" if obj.device.type == "cpu" else None, _none)
    try:
        saved.dumps(tmp_path / "rb")
    finally:
        ser._package_registry[:] = registry  # the list itself: torch reads it from there
    with pytest.raises(RuntimeError, match="CUDA"):  # what torch.load alone does with it
        torch.load(next((tmp_path / "rb").glob("*/state.pt")), weights_only=True)
    loaded = make()
    loaded.loads(tmp_path / "rb")
    assert xs(loaded[:]) == xs(saved[:])
    torch.manual_seed(0)
    first = xs(loaded.sample())
    torch.manual_seed(0)
    assert first == xs(saved.sample())  # the sampler goes on where it was


def _none(obj: object, location: str) -> None:
    return None  # leaves loading to torch's own deserializers
