"""Items keep their own batch dims: ``extend`` of a ``[E, T]`` batch stores ``E`` items of
``[T]`` and gives them back as such, and a group sub-TensorDict ``[n_agents]`` of a transition
comes back ``[B, n_agents]``. Checkpoints and reopened memory maps keep them; older ones, which
stored every item flat, load flat as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import marlkit
from marlkit.replay import (
    GroupReplayBuffers,
    MemmapStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    Storage,
    TensorStorage,
)

E, T, N = 4, 5, 3  # envs, steps per rollout, agents


def rollouts(start: int = 0) -> TensorDict:
    """``E`` rollouts ``[E, T]``; ``"agents"`` ``[E, T, N]``; ``x`` numbers the rollouts."""
    x = torch.arange(start, start + E, dtype=torch.float32)[:, None].expand(E, T)
    return TensorDict(
        {
            "x": x[..., None].clone(),
            "agents": TensorDict({"obs": torch.randn(E, T, N, 2)}, [E, T, N]),
            "next": {"agents": TensorDict({"reward": torch.randn(E, T, N, 1)}, [E, T, N])},
        },
        [E, T],
    )


def transitions(n: int, start: int = 0) -> TensorDict:
    """``n`` transitions; their group ``"agents"`` ``[n, N]`` (as env steps have it)."""
    x = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict(
        {
            "x": x[:, None],
            "agents": TensorDict({"obs": x[:, None, None].expand(n, N, 2).clone()}, [n, N]),
            "next": {
                "agents": TensorDict({"reward": torch.zeros(n, N, 1)}, [n, N]),
                "done": torch.zeros(n, 1, dtype=torch.bool),
            },
        },
        [n],
    )


def make_storage(kind: str, path: Path, capacity: int = 16) -> Storage:
    return TensorStorage(capacity) if kind == "tensor" else MemmapStorage(capacity, path)


@pytest.fixture(params=["tensor", "memmap"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_items_of_rollouts_come_back_with_their_batch_dims(kind: str, tmp_path: Path) -> None:
    data = rollouts()
    rb = ReplayBuffer(make_storage(kind, tmp_path / "mm"), RandomSampler(seed=0))
    rb.extend(data)
    assert rb.storage.item_batch_size == (T,)
    assert rb[0].batch_size == data[0].batch_size == (T,)
    assert rb[0]["agents"].batch_size == (T, N)
    assert rb[-1]["next", "agents"].batch_size == (T, N)
    assert rb[1:3].batch_size == (2, T) and rb[torch.tensor([[0], [1]])].batch_size == (2, 1, T)
    assert (rb[:] == data).all()
    sample = rb.sample(2)
    assert sample.batch_size == (2, T) and sample["agents"].batch_size == (2, T, N)
    assert sample["next", "agents"].batch_size == (2, T, N)
    assert sample.reshape(-1).batch_size == (2 * T,)
    index = sample["index"]  # one slot per item, over the item's steps
    assert index.shape == (2, T) and (index == index[:, :1]).all()
    assert torch.equal(sample["x"][..., 0], index.float())


def test_transitions_keep_the_batch_dims_of_their_group(kind: str, tmp_path: Path) -> None:
    rb = ReplayBuffer(make_storage(kind, tmp_path / "mm"), batch_size=8)
    rb.extend(transitions(10))
    assert rb.storage.item_batch_size == ()
    sample = rb.sample()
    assert sample.batch_size == (8,) and sample["index"].shape == (8,)
    assert sample["agents"].batch_size == (8, N)
    assert sample["next", "agents"].batch_size == (8, N) and sample["next"].batch_size == (8,)
    assert rb[3]["agents"].batch_size == (N,) and rb[3].batch_size == ()


def test_every_sampler_gives_samples_with_the_items_batch_dims() -> None:
    per = ReplayBuffer(TensorStorage(16), PrioritizedSampler(16, seed=0))
    per.extend(rollouts())
    sample = per.sample(6)
    assert sample.batch_size == (6, T) and sample["priority_weight"].shape == (6, T)
    td_error = torch.arange(1.0, 7.0)  # one priority per sampled item, [B]
    per.update_priority(sample["index"], td_error)
    first = sample["index"][:, 0]
    last = {int(i): float(p) for i, p in zip(first, td_error)}  # duplicates: the last wins
    expected = [(p + per.sampler.eps) ** per.sampler.alpha for p in last.values()]
    assert per.sampler.priorities(torch.tensor(list(last))).tolist() == pytest.approx(expected)

    epochs = ReplayBuffer(TensorStorage(16), SamplerWithoutReplacement(seed=0), batch_size=3)
    epochs.extend(rollouts())
    assert [b.batch_size for b in epochs] == [(3, T), (1, T)]

    sequences = ReplayBuffer(TensorStorage(32), SliceSampler(4, seed=0))
    steps = transitions(20)
    steps["collector", "traj_ids"] = torch.arange(20) // 10
    sequences.extend(steps)
    batch = sequences.sample(8)
    assert batch.batch_size == (2, 4) and batch["agents"].batch_size == (2, 4, N)
    assert batch["collector", "mask"].shape == (2, 4)


def test_checkpoints_and_reopened_memmaps_keep_the_batch_dims(tmp_path: Path) -> None:
    rb = ReplayBuffer(MemmapStorage(16, tmp_path / "mm"))
    rb.extend(rollouts())
    rb.dumps(tmp_path / "ckpt")
    restored = ReplayBuffer(MemmapStorage(16, tmp_path / "restored"))
    restored.loads(tmp_path / "ckpt")
    reopened = ReplayBuffer(MemmapStorage.open(tmp_path / "mm"))
    for buffer in (restored, reopened):
        assert buffer[0].batch_size == (T,) and buffer[0]["agents"].batch_size == (T, N)
        assert (buffer[:] == rb[:]).all()
        buffer.extend(rollouts(10))
        assert buffer[4]["x"][0].item() == 10


def _flat(data: TensorDict) -> TensorDict:
    """Slots as marlkit stored them before it kept the items' batch dims: ``[capacity]``
    everywhere."""
    flat = TensorDict(batch_size=data.batch_size[:1])
    for key, value in data.items(True, True):
        flat.set(key, value.clone())
    return flat


def test_older_checkpoints_and_memmaps_of_flat_items_load_flat(tmp_path: Path) -> None:
    rb = ReplayBuffer(TensorStorage(16))
    rb.extend(transitions(10))
    state = rb.state_dict()
    state["storage"]["data"] = _flat(state["storage"]["data"])
    old = ReplayBuffer(TensorStorage(16), batch_size=4)
    old.extend(transitions(3))  # holding items of [N]-batched groups: replaced
    old.load_state_dict(state)
    assert old.sample()["agents"].batch_size == (4,)  # flat, as before
    assert torch.equal(old[:]["agents", "obs"], rb[:]["agents", "obs"])
    old.extend(transitions(2, 50))  # items with their batch dims still fit
    assert old[10]["x"].item() == 50

    path = tmp_path / "old-mm"  # an older MemmapStorage folder
    path.mkdir()
    _flat(rb.storage.data).memmap(path / "data")  # type: ignore[arg-type]
    meta = {"capacity": 16, "len": 10, "allocated": True}
    (path / "storage.json").write_text(json.dumps(meta))
    reopened = ReplayBuffer(MemmapStorage.open(path), batch_size=4)
    assert reopened.sample()["agents"].batch_size == (4,)
    assert reopened.extend(transitions(1, 60)).tolist() == [10]


def test_groups_of_a_real_env_come_back_with_their_agents_dim() -> None:
    env = marlkit.make("predator_prey", num_envs=4, seed=0)
    buffers = GroupReplayBuffers(env.group_map, lambda g: ReplayBuffer(TensorStorage(64)))
    batch = env.rollout(5).reshape(-1)
    buffers.extend(batch)
    for group in env.group_map:
        sample = buffers.sample(group, 8)
        assert sample[group].batch_size == (8, batch[group].batch_size[-1])
        assert sample["next", group].batch_size == (8, batch[group].batch_size[-1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_storage_keeps_the_batch_dims_and_stores_plain_data() -> None:
    weight = torch.ones(1, requires_grad=True)
    data = rollouts()
    data.set("x", data["x"] * weight)
    rb = ReplayBuffer(TensorStorage(16, device="cuda"), PrioritizedSampler(16, seed=0))
    rb.extend(data)
    sample = rb.sample(3)
    assert sample.device is not None and sample.device.type == "cuda"
    assert sample.batch_size == (3, T)
    assert sample["agents"].batch_size == (3, T, N) and sample["index"].shape == (3, T)
    assert not sample["x"].requires_grad and sample["x"].is_cuda
