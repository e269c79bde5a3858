"""Collectors writing straight into replay buffers, in this process and from worker processes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

import marlkit
from marlkit.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from marlkit.envs import WorkerError
from marlkit.replay import MemmapStorage, ReplayBuffer, SliceSampler, TensorStorage

ACT = ("agents", "action")


def nav(num_envs: int = 4):  # type: ignore[no-untyped-def]
    def make():  # type: ignore[no-untyped-def]
        return marlkit.make("navigation", num_envs=num_envs, n_agents=2, seed=0)

    return make


def test_a_collector_fills_a_buffer_with_its_transitions() -> None:
    rb = ReplayBuffer(TensorStorage(1000), SliceSampler(4, seed=0))
    collector = Collector(
        nav()(),
        None,
        frames_per_batch=40,
        total_frames=120,
        max_frames_per_traj=6,
        replay_buffer=rb,
    )
    batches = list(collector)
    assert len(rb) == 120
    stored = rb[:]
    assert torch.equal(stored[ACT], torch.cat([b.reshape(-1)[ACT] for b in batches]))
    sample = rb.sample(16)  # sequences from the collector's trajectory ids
    ids = sample["collector", "traj_ids"]
    assert sample.batch_size == (4, 4) and (ids == ids[:, :1]).all()


def test_a_multisync_collector_fills_a_memmap_buffer(tmp_path: Path) -> None:
    rb = ReplayBuffer(MemmapStorage(256, tmp_path / "rb"))
    with MultiSyncCollector(
        [nav(), nav()],
        None,
        frames_per_batch=64,
        total_frames=192,
        replay_buffer=rb,
        start_method="forkserver",
    ) as collector:
        for _ in collector:
            pass
    assert len(rb) == 192
    assert set(rb[:]["collector", "worker"].unique().tolist()) == {0, 1}


def test_a_multiasync_collector_stores_every_batch_it_yields_from_either_worker() -> None:
    """Async batches come whole, one worker's at a time, of each worker's own env batch; the
    buffer holds exactly the transitions yielded, in the order they were yielded."""
    rb = ReplayBuffer(TensorStorage(1000))
    with MultiAsyncCollector(
        [nav(2), nav(4)],
        None,
        frames_per_batch=16,
        total_frames=96,
        replay_buffer=rb,
        timeout=20.0,
    ) as collector:
        batches = [batch.clone() for batch in collector]
    assert len(batches) == 6 and len(rb) == 96
    assert {tuple(b.batch_size) for b in batches} <= {(2, 8), (4, 4)}
    expected = torch.cat([b.reshape(-1) for b in batches])
    stored = rb[:]
    for key, value in expected.items(True, True):
        assert torch.equal(stored[key], value), key


def test_bad_buffers_and_batches_that_do_not_fit_are_named() -> None:
    with pytest.raises(TypeError, match="replay_buffer must have an extend method"):
        Collector(nav()(), None, frames_per_batch=8, replay_buffer=object())
    with pytest.raises(ValueError, match="split_trajs pads trajectories"):
        Collector(
            nav()(),
            None,
            frames_per_batch=8,
            split_trajs=True,
            replay_buffer=ReplayBuffer(TensorStorage(8)),
        )

    def policy(td):  # type: ignore[no-untyped-def]
        td.set(ACT, torch.zeros(*td.batch_size, 2, 2))
        return td.set(("agents", "log_prob"), torch.zeros(*td.batch_size, 2))

    rb = ReplayBuffer(TensorStorage(100))
    collector = Collector(
        nav()(), policy, frames_per_batch=8, init_random_frames=8, replay_buffer=rb
    )
    assert ("agents", "log_prob") not in collector.next().keys(True)  # a random batch, whole
    with pytest.raises(KeyError, match=r"does not fit the replay buffer.*init_random_frames"):
        collector.next()
    assert len(rb) == 8  # nothing of the refused batch was written
    assert (collector.frames, collector.batches) == (8, 1)  # nor counted
    assert collector.state_dict()["frames"] == 8


def test_a_killed_worker_leaves_the_buffer_as_after_the_last_whole_batch() -> None:
    """Workers never write into the storage: a worker killed mid-run costs its batch, and the
    buffer keeps every item of the batches before it, unchanged."""
    rb = ReplayBuffer(TensorStorage(1000))
    collector = MultiSyncCollector(
        [nav(), nav()], None, frames_per_batch=64, replay_buffer=rb, timeout=20.0
    )
    first = collector.next().clone()
    assert len(rb) == 64
    os.kill(collector.worker_pids[1], signal.SIGKILL)
    with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) died"):
        collector.next()
    assert collector.is_shut_down
    assert len(rb) == 64
    stored, expected = rb[:], first.reshape(-1)
    assert set(stored.keys(True, True)) == set(expected.keys(True, True))
    for key, value in expected.items(True, True):
        assert torch.equal(stored[key], value), key
