"""ReplayBuffer with its storages, writer and samplers: what is stored and what comes back,
bad input refused with the buffer unchanged, and state that restores exactly."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import marlkit
from marlkit.collectors import Collector
from marlkit.replay import (
    GroupReplayBuffers,
    MemmapStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorStorage,
)


def items(start: int, n: int) -> TensorDict:
    """``n`` items numbered from ``start``, with a nested group and a ``"next"``."""
    x = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict(
        {
            "x": x[:, None],
            "agents": {"obs": x[:, None, None].expand(n, 2, 3).clone()},
            "next": {"agents": {"reward": x[:, None, None].expand(n, 2, 1).clone()}},
        },
        [n],
    )


def stored(rb: ReplayBuffer) -> list[int]:
    return rb[:]["x"].reshape(-1).int().tolist()


@pytest.fixture(params=["tensor", "memmap"])
def storage(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    return TensorStorage(8) if request.param == "tensor" else MemmapStorage(8, tmp_path / "mm")


# ---------------------------------------------------------------------- storage and writer
def test_extend_keeps_nested_keys_and_wraps_around_keeping_the_newest(storage) -> None:  # type: ignore[no-untyped-def]
    rb = ReplayBuffer(storage, batch_size=4)
    assert rb.extend(items(0, 5)).tolist() == [0, 1, 2, 3, 4]
    assert len(rb) == 5 and stored(rb) == [0, 1, 2, 3, 4]
    assert rb.extend(items(5, 5)).tolist() == [5, 6, 7, 0, 1]
    assert len(rb) == 8 and stored(rb) == [8, 9, 2, 3, 4, 5, 6, 7]
    assert rb.extend(items(10, 11)).tolist() == [5, 6, 7, 0, 1, 2, 3, 4]  # 11 > 8: the newest
    assert sorted(stored(rb)) == list(range(13, 21))
    assert rb[3]["agents", "obs"].shape == (2, 3)
    assert rb[torch.tensor([0, 1])]["next", "agents", "reward"].shape == (2, 2, 1)
    assert rb.add(items(30, 1)[0]) == 5 and rb[5]["x"].item() == 30
    sample = rb.sample()
    assert sample.batch_size == (4,) and torch.equal(
        sample["x"][:, 0], rb[sample["index"]]["x"][:, 0]
    )
    rb.empty()
    assert len(rb) == 0


def test_tensor_storage_allocates_from_the_first_write_on_its_device() -> None:
    storage = TensorStorage(100, device="cpu")
    assert storage.data is None
    ReplayBuffer(storage).extend(items(0, 3))
    assert storage.data is not None and storage.data.batch_size == (100,)
    assert storage.data["agents", "obs"].shape == (100, 2, 3)


def test_bad_writes_are_refused_by_name_and_change_nothing(storage) -> None:  # type: ignore[no-untyped-def]
    rb = ReplayBuffer(storage, PrioritizedSampler(8, seed=0))
    rb.extend(items(0, 5))
    before = rb.state_dict()
    wrong_shape = items(0, 2)
    wrong_shape.set("x", torch.zeros(2, 3))
    wrong_dtype = items(0, 2)
    wrong_dtype.set(("agents", "obs"), torch.zeros(2, 2, 3, dtype=torch.float64))
    cases = [
        (items(0, 2).exclude("x"), KeyError, r"missing \['x'\], unexpected \[\]"),
        (items(0, 2).set("y", torch.zeros(2)), KeyError, r"unexpected \['y'\]"),
        (wrong_shape, ValueError, r"'x' has items of shape \[3\], the storage holds \[1\]"),
        (wrong_dtype, TypeError, r"\('agents', 'obs'\) has dtype torch.float64"),
        (torch.zeros(3), TypeError, "holds TensorDicts, got Tensor"),
        (TensorDict({"x": torch.zeros(1)}, []), ValueError, "first batch dim"),
    ]
    for data, error, message in cases:
        with pytest.raises(error, match=message):
            rb.extend(data)  # type: ignore[arg-type]
    after = rb.state_dict()
    assert after["storage"]["len"] == before["storage"]["len"] == 5
    assert torch.equal(after["sampler"]["sum"], before["sampler"]["sum"])
    assert (after["storage"]["data"] == before["storage"]["data"]).all()
    assert after["writer"] == before["writer"]


def test_sampling_needs_items_and_a_size() -> None:
    rb = ReplayBuffer(TensorStorage(8))
    with pytest.raises(RuntimeError, match="empty replay buffer"):
        rb.sample(2)
    rb.extend(items(0, 3))
    with pytest.raises(ValueError, match="needs a batch_size"):
        rb.sample()
    with pytest.raises(IndexError, match="index 3 is out of range for 3 stored items"):
        rb[3]
    with pytest.raises(TypeError, match="needs a PrioritizedSampler"):
        rb.update_priority(torch.tensor([0]), 1.0)
    with pytest.raises(ValueError, match="the sampler has capacity 9, the storage 8"):
        ReplayBuffer(TensorStorage(8), PrioritizedSampler(9))


# ---------------------------------------------------------------------- samplers
def test_random_sampler_is_uniform_and_seeded() -> None:
    rb = ReplayBuffer(TensorStorage(100), RandomSampler(seed=3))
    rb.extend(items(0, 10))
    counts = torch.bincount(rb.sample(20_000)["index"], minlength=10).float()
    assert (counts / 20_000 - 0.1).abs().max() < 0.01
    twins = []
    for _ in range(2):
        twin = ReplayBuffer(TensorStorage(100), RandomSampler(seed=3))
        twin.extend(items(0, 10))
        twins.append(twin.sample(50)["index"])
    assert torch.equal(*twins)


def test_without_replacement_gives_epochs_with_and_without_drop_last() -> None:
    rb = ReplayBuffer(TensorStorage(16), SamplerWithoutReplacement(seed=0), batch_size=4)
    rb.extend(items(0, 10))
    epoch = list(rb)
    assert [b.batch_size[0] for b in epoch] == [4, 4, 2]
    assert sorted(torch.cat([b["index"] for b in epoch]).tolist()) == list(range(10))
    second = list(rb)  # the next epoch, another order
    assert sorted(torch.cat([b["index"] for b in second]).tolist()) == list(range(10))
    rb = ReplayBuffer(
        TensorStorage(16), SamplerWithoutReplacement(drop_last=True, seed=0), batch_size=4
    )
    rb.extend(items(0, 10))
    epoch = list(rb)
    assert [b.batch_size[0] for b in epoch] == [4, 4]
    assert len(set(torch.cat([b["index"] for b in epoch]).tolist())) == 8
    ordered = ReplayBuffer(TensorStorage(16), SamplerWithoutReplacement(shuffle=False))
    ordered.extend(items(0, 6))
    assert ordered.sample(4)["index"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_prioritized_sampling_follows_priorities_and_weights(backend: str) -> None:
    alpha, beta = 0.7, 0.5
    sampler = PrioritizedSampler(8, alpha, beta, eps=1e-6, backend=backend, seed=0)
    rb = ReplayBuffer(TensorStorage(8), sampler)
    rb.extend(items(0, 4))
    priority = torch.tensor([1.0, 2.0, 4.0, 0.0])
    rb.update_priority(torch.arange(4), priority)
    sample = rb.sample(40_000)
    p = (priority.double() + 1e-6) ** alpha
    freq = torch.bincount(sample["index"], minlength=4).double() / 40_000
    assert torch.allclose(freq, p / p.sum(), atol=0.01)
    assert freq[3] < 1e-3  # zero priority: (eps)^alpha, next to never
    expected = (p / p.min()) ** -beta
    got = sample["priority_weight"].double()
    assert torch.allclose(got, expected[sample["index"]], rtol=1e-5)
    assert got.max() <= 1.0
    rb.extend(items(4, 2))  # new items: the largest priority seen so far
    assert rb.sampler.priorities(torch.tensor([4, 5])).tolist() == pytest.approx(
        [(4.0 + 1e-6) ** alpha] * 2, rel=1e-5
    )


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_bad_priorities_are_refused_and_change_nothing(backend: str) -> None:
    rb = ReplayBuffer(TensorStorage(8), PrioritizedSampler(8, backend=backend, seed=0))
    rb.extend(items(0, 5))
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([3.0, 2.0]))
    before = rb.state_dict()["sampler"]
    cases = [
        (torch.tensor([0, 5]), torch.tensor([1.0, 1.0]), IndexError, "index 5 is out of range"),
        (torch.tensor([-1]), torch.tensor([1.0]), IndexError, "index -1 is out of range"),
        (
            torch.tensor([0, 1]),
            torch.tensor([1.0, -2.0]),
            ValueError,
            "priority -2.0 at position 1",
        ),
        (torch.tensor([0]), torch.tensor([float("nan")]), ValueError, "priority nan"),
        (torch.tensor([0]), torch.tensor([float("inf")]), ValueError, "priority inf"),
        (torch.tensor([0, 1]), torch.tensor([1.0, 1.0, 1.0]), ValueError, "2 indices but 3"),
    ]
    for index, priority, error, message in cases:
        with pytest.raises(error, match=message):
            rb.update_priority(index, priority)
    after = rb.state_dict()["sampler"]
    assert torch.equal(after["sum"], before["sum"]) and torch.equal(after["min"], before["min"])
    assert after["max_priority"] == before["max_priority"] == 3.0
    with pytest.raises(ValueError, match="alpha must be a finite number >= 0"):
        PrioritizedSampler(8, alpha=-1)
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        PrioritizedSampler(8, eps=0)


def test_slices_never_cross_a_trajectory_end() -> None:
    env = marlkit.make("navigation", num_envs=3, n_agents=2, seed=0)
    collector = Collector(env, None, frames_per_batch=60, max_frames_per_traj=7)
    rb = ReplayBuffer(TensorStorage(200), SliceSampler(5, seed=0), batch_size=20)
    for _ in range(2):
        rb.extend(collector.next().reshape(-1))
    sample = rb.sample()
    assert sample.batch_size == (4, 5)
    ids = sample["collector", "traj_ids"]
    assert (ids == ids[:, :1]).all()  # one trajectory per slice
    steps = sample["next", "collector", "step_count"][..., 0]
    assert ((steps[:, 1:] - steps[:, :-1]) == 1).all()  # consecutive steps
    assert sample["collector", "mask"].all()
    # Without ids the done flags end the trajectories (one env: its steps follow in order).
    one = Collector(
        marlkit.make("navigation", num_envs=1, n_agents=2, seed=0),
        None,
        frames_per_batch=30,
        max_frames_per_traj=7,
    )
    no_ids = ReplayBuffer(TensorStorage(200), SliceSampler(5, traj_key=None, seed=0))
    for _ in range(2):
        no_ids.extend(one.next().reshape(-1))
    steps = no_ids.sample(40)["next", "collector", "step_count"][..., 0]
    assert ((steps[:, 1:] - steps[:, :-1]) == 1).all()
    short = ReplayBuffer(TensorStorage(200), SliceSampler(8, seed=0))
    short.extend(collector.next().reshape(-1))
    with pytest.raises(ValueError, match=r"no stored trajectory has 8 steps.*pad=True"):
        short.sample(16)


def test_short_trajectories_are_padded_with_a_mask() -> None:
    env = marlkit.make("navigation", num_envs=2, n_agents=2, seed=0)
    collector = Collector(env, None, frames_per_batch=24, max_frames_per_traj=3)
    rb = ReplayBuffer(TensorStorage(100), SliceSampler(5, pad=True, seed=0))
    rb.extend(collector.next().reshape(-1))
    sample = rb.sample(50)
    mask = sample["collector", "mask"]
    assert mask.sum(-1).max() <= 3 and mask[:, 0].all()
    assert (sample["agents", "observation"][~mask] == 0).all()  # zeros after the end
    assert (sample["collector", "traj_ids"][mask].reshape(-1) >= 0).all()
    with pytest.raises(ValueError, match="not a multiple of slice_len=5"):
        rb.sample(12)


# ---------------------------------------------------------------------- state
@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda: RandomSampler(seed=1),
        lambda: SamplerWithoutReplacement(seed=1),
        lambda: PrioritizedSampler(64, seed=1),
    ],
    ids=["random", "without-replacement", "prioritized"],
)
def test_dumps_and_loads_restore_the_same_future_samples(make_sampler, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rb = ReplayBuffer(TensorStorage(64), make_sampler(), batch_size=8)
    rb.extend(items(0, 80))
    if isinstance(rb.sampler, PrioritizedSampler):
        rb.update_priority(
            torch.arange(64), torch.rand(64, generator=torch.Generator().manual_seed(0))
        )
    rb.sample()
    rb.dumps(tmp_path / "ckpt")
    twin = ReplayBuffer(TensorStorage(64), make_sampler(), batch_size=8)
    twin.loads(tmp_path / "ckpt")
    assert len(twin) == 64 and stored(twin) == stored(rb)
    for _ in range(5):
        a, b = rb.sample(), twin.sample()
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["x"], b["x"])
        if "priority_weight" in a:
            assert torch.equal(a["priority_weight"], b["priority_weight"])
    assert twin.extend(items(100, 1)).tolist() == rb.extend(items(100, 1)).tolist()  # writer


def test_dumps_replaces_the_last_checkpoint_and_loads_refuses_nothing(tmp_path: Path) -> None:
    rb = ReplayBuffer(TensorStorage(8))
    with pytest.raises(FileNotFoundError, match="holds no replay buffer checkpoint"):
        rb.loads(tmp_path / "none")
    rb.extend(items(0, 3))
    first = rb.dumps(tmp_path / "ckpt")
    rb.extend(items(3, 2))
    second = rb.dumps(tmp_path / "ckpt")
    assert not first.exists() and second.exists()
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == [".lock", ".readers.lock", "checkpoint-000001", "latest"]  # and the locks
    empty = ReplayBuffer(TensorStorage(8))
    empty.dumps(tmp_path / "empty")  # nothing stored yet: a checkpoint all the same
    fresh = ReplayBuffer(TensorStorage(8))
    fresh.loads(tmp_path / "empty")
    assert len(fresh) == 0
    fresh.loads(tmp_path / "ckpt")
    assert stored(fresh) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="capacity 8, this one holds 4"):
        ReplayBuffer(TensorStorage(4)).loads(tmp_path / "ckpt")


def test_a_memmap_storage_reopens_its_items(tmp_path: Path) -> None:
    rb = ReplayBuffer(MemmapStorage(8, tmp_path / "live"))
    rb.extend(items(0, 5))
    with pytest.raises(FileExistsError, match=r"MemmapStorage.open"):
        MemmapStorage(8, tmp_path / "live")
    reopened = MemmapStorage.open(tmp_path / "live")
    assert len(reopened) == 5 and reopened.get(torch.arange(5))["x"].reshape(-1).tolist() == [
        0.0,
        1.0,
        2.0,
        3.0,
        4.0,
    ]
    with pytest.raises(FileNotFoundError, match="holds no memmap storage"):
        MemmapStorage.open(tmp_path / "nothing")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ({"len": 20}, r"storage.json: len 20 above capacity 8"),
        ({"len": -1}, r"storage.json: len must be an int >= 0"),
        ({"capacity": "8"}, r"storage.json: capacity must be an int >= 1, got str"),
        ({"capacity": 16}, r"item files hold \[8\] slots, storage.json says capacity 16"),
        ({"allocated": False}, r"5 items were written, but none are allocated"),
        ({"allocated": "yes"}, r"allocated must be true or false"),
        ("{not json", r"storage.json: Expecting property name"),
        ({"len": None, "drop": "len"}, r"storage.json: no 'len' entry"),
        ("no data", r"live/data is missing"),
    ],
)
def test_a_damaged_memmap_storage_is_refused_naming_what(
    tmp_path: Path, damage: object, message: str
) -> None:
    # a hand-edited or half-copied storage is refused with the file and what is wrong, instead
    # of opening with a length past its slots or failing deep in tensordict
    rb = ReplayBuffer(MemmapStorage(8, tmp_path / "live"))
    rb.extend(items(0, 5))
    meta_file = tmp_path / "live" / "storage.json"
    meta = json.loads(meta_file.read_text())
    if damage == "no data":
        shutil.rmtree(tmp_path / "live" / "data")
    elif isinstance(damage, str):
        meta_file.write_text(damage)
    else:
        assert isinstance(damage, dict)
        meta.update({k: v for k, v in damage.items() if k != "drop"})
        meta.pop(damage.get("drop", ""), None)
        meta_file.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=message) as err:
        MemmapStorage.open(tmp_path / "live")
    assert str(tmp_path / "live") in str(err.value) and "damaged" in str(err.value)


# ---------------------------------------------------------------------- groups
def test_group_buffers_hold_each_groups_subtree_and_the_root_keys() -> None:
    env = marlkit.make("predator_prey", num_envs=4, seed=0)
    buffers = GroupReplayBuffers(
        env.group_map,
        lambda g: ReplayBuffer(
            TensorStorage(64), PrioritizedSampler(64, seed=0) if g == "prey" else None
        ),
    )
    batch = env.rollout(5).reshape(-1)
    slots = buffers.extend(batch)
    assert {g: s.numel() for g, s in slots.items()} == {"predator": 20, "prey": 20}
    predator = buffers.sample("predator", 8)
    assert "prey" not in predator and ("next", "prey") not in predator.keys(True)
    assert {"predator", "state", "done"} <= set(predator.keys())
    assert ("next", "predator", "reward") in predator.keys(True)
    assert "priority_weight" in buffers.sample("prey", 8)  # its own sampler
    before = buffers.lengths()
    with pytest.raises(KeyError, match="the batch has no group 'prey'"):
        buffers.extend(batch.exclude("prey"))
    bad = batch.clone()
    bad.set(("prey", "observation"), bad["prey", "observation"].double())
    with pytest.raises(TypeError, match=r"group 'prey': extend: .* has dtype torch.float64"):
        buffers.extend(bad)
    assert buffers.lengths() == before  # neither group written


def test_memmap_storage_allocates_no_ram_and_sparse_files(tmp_path: Path) -> None:
    # 2.56 GB of slots: allocating them must take neither RAM nor disk until items are written
    code = f"""
import json, resource, torch
from tensordict import TensorDict
from marlkit.replay import MemmapStorage, ReplayBuffer
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rb = ReplayBuffer(MemmapStorage(20_000_000, {str(tmp_path / "big")!r}))
rb.extend(TensorDict({{"obs": torch.ones(10, 32), "n": torch.arange(10)}}, [10]))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
data = rb.storage.data
ok = bool(data["obs"][:10].eq(1).all() and data["obs"][10:1000].eq(0).all())
print(json.dumps({{"rss_kb": after - before, "ok": ok, "shape": list(data["obs"].shape)}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["shape"] == [20_000_000, 32]
    assert result["rss_kb"] < 100_000  # not the 2.56 GB of slots
    used = sum(f.stat().st_blocks * 512 for f in (tmp_path / "big").rglob("*.memmap"))
    assert used < 50_000_000  # sparse files: only the written pages take disk
    reopened = ReplayBuffer(MemmapStorage.open(tmp_path / "big"))
    assert len(reopened) == 10 and reopened[9]["n"].item() == 9
