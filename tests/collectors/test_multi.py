"""MultiSyncCollector and MultiAsyncCollector on real worker processes: batches and ids, weights
that reach the workers, seeds and state, bad input, and faults that never hang or leak.

Most collectors here start their workers from a forkserver with marlkit preloaded (a worker
starts in milliseconds); the tests of the default start method (spawn) say so."""

from __future__ import annotations

import gc
import json
import math
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import cloudpickle
import numpy as np
import psutil
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

import marlkit
from marlkit.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from marlkit.envs import InvalidActionError, MissingActionError, WorkerError

# The policies and factories below are built in this module: the workers get them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ACT = ("agents", "action")
IDS = ("collector", "traj_ids")
WORKER = ("collector", "worker")
FAST = {"start_method": "forkserver"}
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", autouse=True)
def _preloaded_forkserver() -> None:
    # What it preloads is set for the session (tests/conftest.py). Started now, so that the
    # tests counting this process's children see it from the start.
    multiprocessing.get_context("forkserver")
    from multiprocessing import forkserver

    forkserver.ensure_running()


def nav(num_envs: int = 4, **kwargs):  # type: ignore[no-untyped-def]
    def make():  # type: ignore[no-untyped-def]
        return marlkit.make("navigation", num_envs=num_envs, n_agents=2, **kwargs)

    return make


class Constant(nn.Module):
    """Writes its one weight as every action: a batch shows the weights it was collected with."""

    def __init__(self, value: float = 0.1):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(value))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.w.expand(*obs.shape[:-1], 2).clone()


def constant_policy(value: float = 0.1) -> TensorDictModule:
    return TensorDictModule(Constant(value), [("agents", "observation")], [ACT])


def alive(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def wait_gone(pids: list[int], seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


# ---------------------------------------------------------------------- batches and ids
def test_sync_stacks_one_batch_per_worker_with_ids_unique_across_workers() -> None:
    with MultiSyncCollector(
        [nav(), nav()], None, frames_per_batch=64, total_frames=192, max_frames_per_traj=3, **FAST
    ) as collector:
        batches = list(collector)
        assert collector.frames == 192 and collector.batches == 3
    assert len(batches) == 3 and all(b.batch_size == (2, 4, 8) for b in batches)
    owners: dict[int, tuple[int, int]] = {}
    for batch in batches:
        ids, done = batch[IDS], batch["next", "done"][..., 0]
        assert torch.equal(batch[WORKER], torch.arange(2)[:, None, None].expand(2, 4, 8))
        assert torch.equal(ids % 2, batch[WORKER])  # id * num_workers + worker
        assert torch.equal(ids[..., 1:] != ids[..., :-1], done[..., :-1])
        for w in range(2):
            for e in range(4):
                for i in ids[w, e].tolist():
                    assert owners.setdefault(i, (w, e)) == (w, e)  # one env of one worker per id
    assert len(owners) > 2 * 4 * 6


def test_async_yields_each_workers_batch_as_it_comes() -> None:
    with MultiAsyncCollector(
        [nav(2), nav(4)], None, frames_per_batch=16, total_frames=160, **FAST
    ) as collector:
        batches = list(collector)
        assert collector.frames == 160 and len(batches) == 10
        while len({int(b[WORKER][0, 0]) for b in batches}) < 2:  # the slower one, eventually
            batches.append(collector.next())
    shapes = {int(b[WORKER][0, 0]): tuple(b.batch_size) for b in batches}
    assert shapes == {0: (2, 8), 1: (4, 4)}  # each worker's own env batch, whole batches
    for b in batches:
        assert (b[WORKER] == b[WORKER][0, 0]).all()
        assert torch.equal(b[IDS] % 2, b[WORKER])


def test_split_trajs_and_postproc_run_in_the_parent_on_whole_batches() -> None:
    seen = []
    with MultiSyncCollector(
        [nav(), nav()],
        None,
        frames_per_batch=64,
        total_frames=64,
        max_frames_per_traj=3,
        split_trajs=True,
        postproc=lambda b: seen.append(b.batch_size) or b,
        **FAST,
    ) as collector:
        (batch,) = list(collector)
    assert collector.frames == 64  # real frames, not padded ones
    assert batch["collector", "mask"].sum() == 64 and batch.batch_size[-1] == 3
    assert seen == [batch.batch_size]


def test_init_random_frames_counts_the_frames_of_all_workers() -> None:
    """As in a Collector: ``init_random_frames=frames_per_batch`` makes one random batch (each
    worker took the whole count before, so the policy waited ``num_workers`` batches)."""
    with MultiSyncCollector(
        [nav(), nav()], constant_policy(0.1), frames_per_batch=32, init_random_frames=32, **FAST
    ) as collector:
        first, second = collector.next(), collector.next()
    assert not (first[ACT] == 0.1).all() and (second[ACT] == 0.1).all()


# ---------------------------------------------------------------------- weights
def test_sync_next_batch_uses_the_new_weights() -> None:  # the default start method: spawn
    policy = constant_policy(0.1)
    with MultiSyncCollector([nav(), nav()], policy, frames_per_batch=32) as collector:
        assert (collector.next()[ACT] == 0.1).all()
        with torch.no_grad():
            policy.module.w.fill_(0.5)
        assert (collector.next()[ACT] == 0.1).all()  # not published yet
        collector.update_policy_weights_()
        assert (collector.next()[ACT] == 0.5).all()
        collector.update_policy_weights_({"module.w": torch.tensor(-0.3)})  # a state_dict
        assert (collector.next()[ACT] == -0.3).all()
        collector.update_policy_weights_(TensorDict({"module": {"w": torch.tensor(0.2)}}))
        assert (collector.next()[ACT] == 0.2).all()
        with pytest.raises(KeyError, match=r"missing \['module.w'\], unexpected \['module.v'\]"):
            collector.update_policy_weights_({"module.v": torch.tensor(0.0)})
        with pytest.raises(ValueError, match=r"weight 'module.w' has shape \[2\]"):
            collector.update_policy_weights_({"module.w": torch.zeros(2)})
        assert (collector.next()[ACT] == 0.2).all()  # a refused update changes nothing


def test_async_workers_take_new_weights_at_their_next_batch() -> None:
    policy = constant_policy(0.1)
    with MultiAsyncCollector([nav(), nav()], policy, frames_per_batch=16, **FAST) as collector:
        for _ in range(4):
            assert (collector.next()[ACT] == 0.1).all()
        collector.update_policy_weights_({"module.w": torch.tensor(0.7)})
        old = {0: 0, 1: 0}
        for _ in range(8):
            batch = collector.next()
            values = batch[ACT].unique()
            assert values.numel() == 1  # never a mix of weights within a batch
            assert float(values) in (pytest.approx(0.1), pytest.approx(0.7))
            if float(values) == pytest.approx(0.1):
                old[int(batch[WORKER][0, 0])] += 1
        assert all(n <= 1 for n in old.values())  # at most the batch that was in flight


def test_weights_are_checked_in_the_parent_before_they_are_published() -> None:
    policy = constant_policy(0.1)
    with MultiSyncCollector([nav(), nav()], policy, frames_per_batch=32, **FAST) as collector:
        collector.update_policy_weights_({"module.w": torch.tensor(0.3)})
        with pytest.raises(ValueError, match=r"'module.w' has dtype torch.float64, the policy's"):
            collector.update_policy_weights_({"module.w": torch.tensor(0.5, dtype=torch.float64)})
        with pytest.raises(TypeError, match=r"weight 'module\.w' is a float, not a tensor"):
            collector.update_policy_weights_({"module.w": 0.5})  # type: ignore[dict-item]
        assert (collector.next()[ACT] == 0.3).all()  # refused updates change nothing
        collector.update_policy_weights_()
        assert (collector.next()[ACT] == 0.1).all()


class Scaled(nn.Module):
    """``w * scale``, ``scale`` a buffer that ``state_dict`` leaves out (``persistent=False``)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.4))
        self.register_buffer("scale", torch.tensor(0.5), persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (self.w * self.scale).expand(*obs.shape[:-1], 2).clone()


def test_a_state_dict_without_non_persistent_buffers_is_taken() -> None:
    policy = TensorDictModule(Scaled(), [("agents", "observation")], [ACT])
    with MultiSyncCollector([nav(), nav()], policy, frames_per_batch=32, **FAST) as collector:
        assert (collector.next()[ACT] == 0.2).all()
        with torch.no_grad():
            policy.module.w.fill_(0.6)
        collector.update_policy_weights_(policy.state_dict())  # no "module.scale" in it
        assert torch.allclose(collector.next()[ACT], torch.tensor(0.3))  # the buffer kept its value
        weights = TensorDict.from_module(policy).data.clone()
        weights["module", "scale"] = torch.tensor(0.25)
        collector.update_policy_weights_(weights)  # a buffer given is loaded
        assert torch.allclose(collector.next()[ACT], torch.tensor(0.15))
        with pytest.raises(KeyError, match=r"missing \['module.w'\], unexpected \[\]"):
            collector.update_policy_weights_({"module.scale": torch.tensor(1.0)})
        with pytest.raises(KeyError, match=r"unexpected \['module.bias'\]"):
            collector.update_policy_weights_({**policy.state_dict(), "module.bias": torch.ones(1)})
        with pytest.raises(ValueError, match=r"'module.scale' has shape \[2\]"):
            collector.update_policy_weights_(
                {"module.w": policy.module.w, "module.scale": torch.ones(2)}
            )
        assert torch.allclose(collector.next()[ACT], torch.tensor(0.15))


def noisy_policy(td):  # type: ignore[no-untyped-def]
    """Exploration noise from torch's, NumPy's and Python's global generators."""
    td.set(ACT, torch.rand(*td.batch_size, 2, 2) * 2 - 1)
    td.set("numpy_noise", torch.as_tensor(np.random.rand(*td.batch_size)))
    steps = math.prod(td.batch_size)
    td.set(
        "python_noise", torch.tensor([random.random() for _ in range(steps)]).view(td.batch_size)
    )
    return td


NOISE = (ACT, "numpy_noise", "python_noise")


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_every_worker_draws_its_own_noise_and_set_seed_repeats_it(start_method: str) -> None:
    # Forked workers start with their parent's generators: without seeding them, every worker
    # would draw the same exploration noise.
    runs = []
    for _ in range(2):
        with MultiSyncCollector(
            [nav(), nav()], noisy_policy, frames_per_batch=16, start_method=start_method
        ) as collector:
            fresh = collector.next()
            for key in NOISE:
                assert not torch.equal(fresh[key][0], fresh[key][1]), key
            collector.set_seed(11)
            runs.append([collector.next() for _ in range(2)])
    for a, b in zip(*runs, strict=True):
        for key in NOISE:  # the same seed, the same noise...
            assert torch.equal(a[key], b[key]), key
            assert not torch.equal(a[key][0], a[key][1]), key  # ...and still each worker's own


def test_a_seeded_stochastic_policy_draws_the_same_noise_in_one_worker_as_in_a_collector() -> None:
    single = Collector(nav()(), noisy_policy, frames_per_batch=16)
    single.set_seed(5)
    with MultiAsyncCollector([nav()], noisy_policy, frames_per_batch=16, **FAST) as multi:
        multi.set_seed(5)
        for _ in range(2):
            a, b = single.next(), multi.next()
            assert torch.equal(a[ACT], b[ACT]) and torch.equal(a["numpy_noise"], b["numpy_noise"])


# ---------------------------------------------------------------------- seeds and state
def test_the_same_seed_gives_the_same_batches_and_state_restores_ids() -> None:
    linear = TensorDictModule(
        nn.Sequential(nn.Linear(8, 2), nn.Tanh()), [("agents", "observation")], [ACT]
    )
    runs = []
    for _ in range(2):
        with MultiSyncCollector([nav(), nav()], linear, frames_per_batch=32, **FAST) as c:
            assert c.set_seed(3) == 5  # a native env takes one seed per worker: 3 and 4
            runs.append([c.next() for _ in range(2)])
    for a, b in zip(*runs):
        assert torch.equal(a["next", "agents", "observation"], b["next", "agents", "observation"])
    with MultiSyncCollector(
        [nav(), nav()], None, frames_per_batch=32, max_frames_per_traj=2, **FAST
    ) as collector:
        first = collector.next()
        state = collector.state_dict()
        assert state["frames"] == 32 and len(state["workers"]) == 2
    with MultiSyncCollector(
        [nav(), nav()], None, frames_per_batch=32, max_frames_per_traj=2, **FAST
    ) as fresh:
        fresh.load_state_dict(state)
        assert fresh.frames == 32
        second = fresh.next()
        assert not set(second[IDS].unique().tolist()) & set(first[IDS].unique().tolist())
        with pytest.raises(ValueError, match="holds 1 worker states; this collector has 2"):
            fresh.load_state_dict({**state, "workers": state["workers"][:1]})
        # checked here: a worker's KeyError shut every worker down, the counters overwritten
        frames = fresh.frames
        with pytest.raises(ValueError, match=r"worker state 1 is not a collector state .*nothing"):
            fresh.load_state_dict({**state, "frames": 999, "workers": [state["workers"][0], {}]})
        assert fresh.frames == frames and not fresh.is_shut_down
        fresh.reset()
        assert fresh.next().batch_size == (2, 4, 4)


# ---------------------------------------------------------------------- bad input
class _Unpicklable:
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, td):  # type: ignore[no-untyped-def]
        return td


def test_bad_arguments_are_refused_and_leave_no_process() -> None:
    before = children()
    with pytest.raises(ValueError, match="create_env_fns is empty"):
        MultiSyncCollector([], None, frames_per_batch=8)
    with pytest.raises(TypeError, match="a list of env factories"):
        MultiSyncCollector(nav(), None, frames_per_batch=8)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"create_env_fns\[1\] is not callable"):
        MultiSyncCollector([nav(), 3], None, frames_per_batch=8)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="frames_per_batch=63 does not split evenly over 2"):
        MultiSyncCollector([nav(), nav()], None, frames_per_batch=63)
    with pytest.raises(TypeError, match=r"the policy .* cannot be serialised"):
        MultiSyncCollector([nav(), nav()], _Unpicklable(), frames_per_batch=8)
    # The message names the frames as given (over all workers) and totals that fit.
    with pytest.raises(
        ValueError,
        match=r"frames_per_batch=66 does not divide into whole steps of the workers' envs: each "
        r"of the 2 workers collects 33 frames, not a multiple of the 4 envs of its batch \[4\]; "
        r"use 64 or 72",
    ):
        MultiSyncCollector([nav(), nav()], None, frames_per_batch=66, **FAST)
    with pytest.raises(
        ValueError,
        match=r"frames_per_batch=6 is not a multiple of the 4 envs of worker 1's batch \[4\]: .*"
        r"use 4 or 8",
    ):
        MultiAsyncCollector([nav(2), nav(4)], None, frames_per_batch=6, **FAST)
    with pytest.raises(ValueError, match=r"different batch sizes \[\(2,\), \(4,\)\]"):
        MultiSyncCollector([nav(2), nav(4)], None, frames_per_batch=16, **FAST)
    with MultiSyncCollector([nav(), nav()], None, frames_per_batch=8, **FAST) as collector:
        collector.update_policy_weights_()  # no weights: nothing to publish, as in Collector
        with pytest.raises(TypeError, match=r"needs an nn\.Module policy, got None"):
            collector.update_policy_weights_({})
    assert wait_gone(list(children() - before)) == []


@pytest.mark.parametrize(
    ("write", "cause", "message"),
    [
        (lambda td: td.exclude(ACT), MissingActionError, r"\('agents', 'action'\) is missing"),
        (lambda td: td.set(ACT, torch.zeros(4, 2, 3)), InvalidActionError, r"shape \[4, 2, 3\]"),
        (lambda td: td.set(ACT, torch.zeros(4, 2, 2, dtype=torch.float64)), None, "float64"),
        (lambda td: td.set(ACT, torch.full((4, 2, 2), float("nan"))), None, "non-finite"),
    ],
)
def test_a_bad_policy_output_is_named_in_the_parent(write, cause, message) -> None:  # type: ignore[no-untyped-def]
    collector = MultiSyncCollector([nav(), nav()], write, frames_per_batch=16, **FAST)
    with pytest.raises(WorkerError, match=rf"worker 0 failed during collect: .*{message}") as info:
        collector.next()
    assert isinstance(info.value.__cause__, cause or InvalidActionError)
    assert "Collector: the policy's output is not an action of the env" in str(info.value)
    assert collector.is_shut_down and collector.worker_pids == []


# ---------------------------------------------------------------------- faults
def test_a_worker_that_raises_is_named_with_its_traceback() -> None:
    def policy(td):  # type: ignore[no-untyped-def]
        if td.batch_size == (3,):
            raise ValueError("boom in the policy")
        return td.set(ACT, torch.zeros(*td.batch_size, 2, 2))

    collector = MultiAsyncCollector([nav(2), nav(3)], policy, frames_per_batch=6, **FAST)
    pids = list(collector.worker_pids)
    start = time.monotonic()
    expected = "worker 1 failed during collect: ValueError: boom"
    with pytest.raises(WorkerError, match=expected) as info:
        for _ in range(10):
            collector.next()
    assert time.monotonic() - start < 10
    assert info.value.worker == 1 and "boom in the policy" in (info.value.remote_traceback or "")
    assert isinstance(info.value.__cause__, ValueError)
    assert collector.is_shut_down and wait_gone(pids) == []


def test_a_worker_that_exits_or_is_killed_is_detected_within_seconds() -> None:
    def policy(td):  # type: ignore[no-untyped-def]
        if td.batch_size == (3,):
            os._exit(3)
        return td.set(ACT, torch.zeros(*td.batch_size, 2, 2))

    collector = MultiAsyncCollector([nav(2), nav(3)], policy, frames_per_batch=6, **FAST)
    pids = list(collector.worker_pids)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) died with exit code 3 during"):
        # Worker 0's batches come until worker 1 has started and died: on a loaded machine its
        # start-up can outlast any fixed number of them (10 once did), so the bound is time.
        while time.monotonic() - start < 20:
            collector.next()
    # seen by the process's sentinel, far sooner than the 120-s timeout would (20 s: worker 0's
    # batches on a loaded 2-core CI machine take seconds before the death is read)
    assert time.monotonic() - start < 20
    assert collector.is_shut_down and wait_gone(pids) == []

    collector = MultiSyncCollector([nav(), nav()], None, frames_per_batch=16, **FAST)
    pids = list(collector.worker_pids)
    collector.next()
    os.kill(pids[0], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker 0 \(pid \d+\) died with exit code -9"):
        collector.next()
    assert time.monotonic() - start < 20
    assert wait_gone(pids) == []


def test_a_worker_killed_while_another_is_busy_is_reported_as_it_dies() -> None:
    # A worker that dies is reported as it dies, not once the busy worker 0 answers (a whole
    # batch, here 20 s, later).
    def slow(td):  # type: ignore[no-untyped-def]
        time.sleep(0.2)
        return td.set(("agents", "action"), torch.zeros(4, 2, 2))

    collector = MultiSyncCollector([nav(), nav()], slow, frames_per_batch=8 * 100, **FAST)
    pids = list(collector.worker_pids)
    threading.Timer(1.0, os.kill, (pids[1], signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) died with exit code -9"):
        collector.next()
    assert time.monotonic() - start < 5
    assert collector.is_shut_down and wait_gone(pids) == []


def test_a_worker_that_fails_to_construct_or_hangs() -> None:
    def broken():  # type: ignore[no-untyped-def]
        raise RuntimeError("no simulator here")

    before = children()
    with pytest.raises(
        WorkerError, match="worker 1 failed during start: RuntimeError: no simulator here"
    ) as info:
        MultiSyncCollector([nav(), broken], None, frames_per_batch=8, **FAST)
    assert "broken" in (info.value.remote_traceback or "")
    assert wait_gone(list(children() - before)) == []

    def slow(td):  # type: ignore[no-untyped-def]
        time.sleep(30)
        return td

    collector = MultiSyncCollector([nav(), nav()], slow, frames_per_batch=8, timeout=1, **FAST)
    pids = list(collector.worker_pids)
    start = time.monotonic()
    # Both hang; on a loaded machine one may be asked (or its silence read) a moment after the
    # other, so the error may name the first one alone once its second is up.
    with pytest.raises(
        WorkerError,
        match=r"(workers \[0, 1\] \(pids \d+, \d+\)|worker [01] \(pid \d+\)) did not answer "
        r"collect within 1",
    ):
        collector.next()
    assert time.monotonic() - start < 5
    assert collector.is_shut_down and wait_gone(pids) == []


def slow_to_build():  # type: ignore[no-untyped-def]
    time.sleep(1.5)  # a simulator that takes longer to build than the commands' timeout
    return nav()()


def test_a_worker_slower_to_start_than_the_timeout_is_not_hung() -> None:
    # a 1-s timeout is for commands; starting may take START_TIMEOUT (a loaded machine takes
    # seconds to spawn a process and import torch)
    collector = MultiSyncCollector(
        [nav(), slow_to_build], None, frames_per_batch=8, timeout=1, **FAST
    )
    try:
        assert collector.next().numel() == 8
    finally:
        collector.shutdown()


def silent_for(err: pytest.ExceptionInfo[WorkerError]) -> float:
    """How long the error says the hung worker was silent."""
    found = re.search(r"silent for (\d+\.\d) s since asked", str(err.value))
    assert found, str(err.value)
    return float(found.group(1))


def test_async_reports_a_stopped_worker_while_another_keeps_answering() -> None:
    # The timeout restarted at every wait: worker 0's batches hid worker 1 for ever (86 batches
    # over 30 s without an error).
    before = children()
    collector = MultiAsyncCollector([nav(), nav()], None, frames_per_batch=8, timeout=2, **FAST)
    pids = list(collector.worker_pids)
    seen: set[int] = set()
    while seen != {0, 1}:  # both buffers shared: worker 1 is asked for a batch and collecting
        seen.add(int(collector.next()[WORKER][0, 0]))
    os.kill(pids[1], signal.SIGSTOP)
    start, batches = time.monotonic(), 0
    with pytest.raises(
        WorkerError, match=rf"worker 1 \(pid {pids[1]}\) did not answer collect within 2 s"
    ) as info:
        while time.monotonic() - start < 30:
            collector.next()
            batches += 1
    elapsed = time.monotonic() - start
    assert batches > 0 and elapsed < 4.5  # worker 0 answered meanwhile; shut down included
    assert 2.0 <= silent_for(info) < 4.5 and info.value.worker == 1
    assert collector.is_shut_down and alive(pids) == [] and children() - before == set()


def test_sync_reports_a_stopped_worker_after_the_timeout_with_the_time_it_waited() -> None:
    # It came 7 s late (SIGTERM's grace, lost on a stopped worker), saying "within 1 s": the time
    # left once worker 0 answered.
    before = children()
    collector = MultiSyncCollector([nav(), nav()], None, frames_per_batch=16, timeout=2, **FAST)
    pids = list(collector.worker_pids)
    collector.next()  # both buffers shared: the next answers are short messages
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    threading.Timer(1.2, os.kill, (pids[0], signal.SIGCONT)).start()  # worker 0 answers late
    start = time.monotonic()
    with pytest.raises(
        WorkerError, match=rf"worker 1 \(pid {pids[1]}\) did not answer collect within 2 s"
    ) as info:
        collector.next()
    assert time.monotonic() - start < 4.5
    assert 2.0 <= silent_for(info) < 4.5 and info.value.worker == 1
    assert collector.is_shut_down and alive(pids) == [] and children() - before == set()


def test_shutdown_ends_a_stopped_worker_at_once() -> None:
    # A stopped process acts on no signal but SIGKILL: shutdown resumes it first, so that it
    # ends at once instead of after SIGTERM's grace (5 s + 2 s).
    before = children()
    for cls in (MultiSyncCollector, MultiAsyncCollector):  # idle, and busy (asked for a batch)
        collector = cls([nav(), nav()], None, frames_per_batch=16, **FAST)
        collector.next()
        pids = list(collector.worker_pids)
        os.kill(pids[1], signal.SIGSTOP)
        start = time.monotonic()
        collector.shutdown()
        assert time.monotonic() - start < 2, cls.__name__
        assert alive(pids) == [] and children() - before == set()


# ---------------------------------------------------------------------- processes
def test_shutdown_garbage_collection_and_with_leave_no_child() -> None:
    collector = MultiSyncCollector([nav(), nav()], None, frames_per_batch=8, **FAST)
    pids = list(collector.worker_pids)
    assert len(alive(pids)) == 2
    collector.shutdown()
    collector.shutdown()  # idempotent
    assert wait_gone(pids) == []
    with pytest.raises(RuntimeError, match="shut down"):
        collector.next()

    collector = MultiAsyncCollector([nav(), nav()], None, frames_per_batch=8, **FAST)
    collector.next()  # the workers are now busy with their next batches
    pids = list(collector.worker_pids)
    del collector
    gc.collect()
    assert wait_gone(pids) == []

    with MultiSyncCollector([nav(), nav()], None, frames_per_batch=8, **FAST) as collector:
        pids = list(collector.worker_pids)
    assert wait_gone(pids) == []


SCRIPT = """
import faulthandler, json, signal, sys
import marlkit
from marlkit.collectors import MultiSyncCollector

if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's view if it hangs
    # A terminal's Ctrl-C reaches a foreground process whose SIGINT is at Python's default. A
    # test runner started in the background without job control (`cmd &` in a script) hands
    # its children SIGINT ignored, and Python keeps it so: restore what a user's process has.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    make = lambda: marlkit.make("navigation", num_envs=4, n_agents=2)
    collector = MultiSyncCollector([make, make], None, frames_per_batch=64)
    print(json.dumps(collector.worker_pids), flush=True)
    for batch in collector:  # forever, until a signal
        pass
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "parent-killed"])
def test_ctrl_c_and_the_parents_death_leave_no_child(tmp_path: Path, sig: int) -> None:
    script = tmp_path / "collect.py"
    script.write_text(textwrap.dedent(SCRIPT))
    with subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            pids = json.loads(proc.stdout.readline())
            assert len(alive(pids)) == 2
            time.sleep(1.0)  # collecting
            proc.send_signal(sig)
            try:
                _, err = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGUSR1)  # dump every thread's stack to stderr
                time.sleep(2.0)
                proc.kill()
                _, err = proc.communicate(timeout=10)
                pytest.fail(f"the parent did not exit within 20 s of {sig!r}; its stacks:\n{err}")
        finally:
            proc.kill()
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err and proc.returncode != 0
    assert wait_gone(pids, 10) == []


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.slow
@pytest.mark.serial  # /dev/shm is the machine's: another test's Ray or tensors would show here
def test_500_iterations_keep_fds_shared_memory_and_children_flat() -> None:
    policy = constant_policy(0.1)
    with MultiSyncCollector([nav(2), nav(2)], policy, frames_per_batch=8, **FAST) as collector:
        for _ in range(20):  # warm up: buffers shared, lazy imports done
            collector.next()
        pids = collector.worker_pids
        shared = [b[ACT].data_ptr() for b in collector._buffers]  # the workers' shared batches
        before = (
            _open_fds(os.getpid()),
            len(os.listdir("/dev/shm")),
            children(),
            [_open_fds(p) for p in pids],
        )
        for i in range(500):
            batch = collector.next()
            if i % 10 == 0:
                collector.update_policy_weights_({"module.w": torch.tensor(i / 1000)})
        after = (
            _open_fds(os.getpid()),
            len(os.listdir("/dev/shm")),
            children(),
            [_open_fds(p) for p in pids],
        )
        assert (batch[ACT] == 0.49).all()
        assert [b[ACT].data_ptr() for b in collector._buffers] == shared  # no batch re-sent
    assert after == before


def test_a_single_process_collector_and_a_multi_collector_agree() -> None:
    """One worker of a MultiSyncCollector yields what a Collector on the same env does."""
    linear = TensorDictModule(
        nn.Sequential(nn.Linear(8, 2), nn.Tanh()), [("agents", "observation")], [ACT]
    )
    single = Collector(nav()(), linear, frames_per_batch=32)
    single.set_seed(5)
    with MultiSyncCollector([nav()], linear, frames_per_batch=32, **FAST) as multi:
        multi.set_seed(5)
        for _ in range(2):
            a, b = single.next(), multi.next()
            assert torch.equal(a[ACT], b[ACT][0])
            assert torch.equal(a["next", "agents", "reward"], b["next", "agents", "reward"][0])


# ---------------------------------------------------------------------- where the workers run
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_collector_workers_can_be_pinned_and_poll(cls, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    allowed = sorted(os.sched_getaffinity(0))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # room to poll on 2 CPUs
    collector = cls([nav(), nav()], None, frames_per_batch=16, worker_cpus="auto", **FAST)
    try:
        pinned = [os.sched_getaffinity(pid) for pid in collector.worker_pids]
        assert pinned == [{allowed[0]}, {allowed[1 % len(allowed)]}]
        assert collector._pool.busy_wait == 0.002  # the default; collectors' commands are rare
        for _ in range(3):
            assert collector.next().numel() > 0
    finally:
        collector.shutdown()
