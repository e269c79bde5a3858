"""RayCollector on a real local Ray (2 CPUs) and the native navigation scenario: batch shapes
and unique ids (sync and async), weights broadcast, seeds, state, split trajectories, and
failures (a killed actor, a raising policy or factory, an actor Ray cannot place, bad
arguments), and batches written into a replay buffer."""

from __future__ import annotations

import os
import pathlib
import signal
import sys
import textwrap
import time

import psutil
import pytest
import torch
from tensordict import TensorDict
from torch import nn

import _forked
import marlkit
from marlkit.collectors import RayCollector
from marlkit.envs.batched import WorkerError
from marlkit.replay import ReplayBuffer, TensorStorage

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

ACT = ("agents", "action")
IDS = ("collector", "traj_ids")
WORKER = ("collector", "worker")


@pytest.fixture(scope="module", autouse=True)
def local_ray():  # type: ignore[no-untyped-def]
    # The helpers below live in a test module the Ray workers cannot import by name: send them
    # by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=80 * 1024**2,
        configure_logging=False,
    )
    yield
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def nav(num_envs: int = 2):  # type: ignore[no-untyped-def]
    return marlkit.make("navigation", num_envs=num_envs, n_agents=2)


class WeightPolicy(nn.Module):
    """Writes its single weight as every action (navigation's actions lie in [-1, 1])."""

    def __init__(self, value: float):
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(value))

    def forward(self, td):  # type: ignore[no-untyped-def]
        td.set(ACT, self.weight.expand(*td.batch_size, 2, 2).clone())
        return td


def exploding_policy(td):  # type: ignore[no-untyped-def]
    raise ValueError("the policy exploded")


def exploding_factory():  # type: ignore[no-untyped-def]
    raise OSError("no simulator licence")


def actor_is_dead(actor, within: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    """Whether calls to ``actor`` fail as calls to a dead actor do (``ray.kill`` takes effect
    shortly after it returns: a call made at once may still be answered)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            ray.get(actor.env_batch.remote(), timeout=within)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.05)
    return False


def wait_for_cpus(cpus: float = 2.0, within: float = 10.0) -> None:
    """Killed actors hand their CPUs back shortly after ``ray.kill``."""
    deadline = time.monotonic() + within
    while ray.available_resources().get("CPU", 0.0) < cpus:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray's CPUs are still held: {ray.available_resources()}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def shared():  # type: ignore[no-untyped-def]
    """One sync collector (actors are slow to start) for the tests that only call it: each
    asserts relative to the state it finds. Its actors reserve no CPU, so the others' can start
    while it lives."""
    policy = WeightPolicy(0.25)
    collector = RayCollector(
        [nav, nav],
        policy,
        frames_per_batch=16,
        max_frames_per_traj=2,
        num_cpus_per_actor=0,
        timeout=60,
    )
    yield collector, policy
    collector.shutdown()
    wait_for_cpus()


# ---------------------------------------------------------------------- batches and ids
def test_sync_stacks_one_batch_per_worker_with_ids_unique_across_workers(shared) -> None:  # type: ignore[no-untyped-def]
    collector, _ = shared
    frames, count = collector.frames, collector.batches
    batches = [collector.next() for _ in range(3)]
    assert collector.frames == frames + 48 and collector.batches == count + 3
    for batch in batches:
        assert batch.batch_size == (2, 2, 4)  # [W, *B, T]: each worker 8 frames of 2 envs
        assert batch["next", "agents", "reward"].shape == (2, 2, 4, 2, 1)
        assert batch[WORKER][0].eq(0).all() and batch[WORKER][1].eq(1).all()
    ids = [set(torch.cat([b[IDS][w] for b in batches]).flatten().tolist()) for w in range(2)]
    assert len(ids[0]) > 2 and not ids[0] & ids[1]  # 2-step trajectories, never shared


def test_total_frames_ends_the_iteration() -> None:
    with RayCollector([nav], None, frames_per_batch=8, total_frames=20, timeout=60) as collector:
        assert [tuple(b.batch_size) for b in collector] == [(1, 2, 4)] * 3
    wait_for_cpus()


def test_batches_are_written_into_a_replay_buffer_in_this_process() -> None:
    rb = ReplayBuffer(TensorStorage(100))
    with RayCollector(
        [nav, nav], None, frames_per_batch=16, total_frames=48, replay_buffer=rb, timeout=60
    ) as collector:
        batches = [batch.clone() for batch in collector]
    assert len(rb) == 48  # [W, *B, T] batches, stored worker after worker, env after env
    stored, expected = rb[:], torch.cat([b.reshape(-1) for b in batches])
    for key, value in expected.items(True, True):
        assert torch.equal(stored[key], value), key
    assert set(stored[WORKER].unique().tolist()) == {0, 1}
    wait_for_cpus()


def by_worker(collector: RayCollector, each: int) -> list[list]:  # type: ignore[type-arg]
    """Async batches, as they come, grouped by worker, until every worker delivered ``each``."""
    batches: list[list] = [[] for _ in range(collector.num_workers)]  # type: ignore[type-arg]
    for _ in range(10 * each * collector.num_workers):
        batch = collector.next()
        batches[int(batch[WORKER].unique())].append(batch)
        if min(map(len, batches)) >= each:
            return batches
    raise AssertionError(f"a worker is starved: {[len(b) for b in batches]} batches")


def test_async_yields_each_workers_whole_batch_and_broadcasts_weights() -> None:
    policy = WeightPolicy(0.25)
    with RayCollector(
        [nav, nav], policy, frames_per_batch=16, init_random_frames=16, sync=False, timeout=60
    ) as collector:
        batches = by_worker(collector, 2)
        with torch.no_grad():
            policy.weight.fill_(-0.5)
        collector.update_policy_weights_()
        updated = by_worker(collector, 2)
    for worker in range(2):
        assert all(b.batch_size == (2, 8) for b in batches[worker])
        # Its first 16 frames (its first batch) are random, then the policy acts.
        actions = [b[ACT].unique().tolist() for b in batches[worker]]
        assert actions[0] != [0.25] and set(map(tuple, actions[1:])) == {(0.25,)}
        # The batch it had in flight ends with the old weights, then come the new ones.
        actions = [b[ACT].unique().tolist() for b in updated[worker]]
        assert actions[0] == [0.25] and set(map(tuple, actions[1:])) == {(-0.5,)}
    ids = [{i for b in batches[w] for i in b[IDS].flatten().tolist()} for w in range(2)]
    assert not ids[0] & ids[1]
    wait_for_cpus()


def test_split_trajs_and_postproc_apply_to_the_stacked_batch() -> None:
    seen: list[tuple[int, ...]] = []

    def postproc(batch):  # type: ignore[no-untyped-def]
        seen.append(tuple(batch.batch_size))
        return batch

    with RayCollector(
        [nav, nav],
        None,
        frames_per_batch=24,
        max_frames_per_traj=2,
        split_trajs=True,
        postproc=postproc,
        timeout=60,
    ) as collector:
        batch = collector.next()
    # 2 workers x 2 envs x 6 steps in 2-step trajectories: 12 trajectories of 2 steps.
    assert batch.batch_size == (12, 2) and seen == [(12, 2)]
    assert batch["collector", "mask"].all()
    assert sorted(batch[WORKER][:, 0].tolist()) == [0] * 6 + [1] * 6
    assert batch[IDS][:, 0].unique().numel() == 12
    wait_for_cpus()


# ---------------------------------------------------------------------- weights, seeds, state
def test_broadcast_weights_are_used_by_the_next_batch(shared) -> None:  # type: ignore[no-untyped-def]
    collector, policy = shared
    with torch.no_grad():
        policy.weight.fill_(-0.5)
    collector.update_policy_weights_()  # from the user's policy
    assert collector.next()[ACT].unique().tolist() == [-0.5]
    collector.update_policy_weights_({"weight": torch.tensor(0.75)})  # a state_dict
    assert all(collector.next()[ACT].unique().tolist() == [0.75] for _ in range(2))
    assert policy.weight.item() == -0.5  # the user's policy is not touched
    with pytest.raises(TypeError, match="a state_dict or a TensorDict, got list"):
        collector.update_policy_weights_([1.0])  # type: ignore[arg-type]


def test_weights_that_do_not_fit_are_refused_in_the_driver(shared) -> None:  # type: ignore[no-untyped-def]
    collector, _ = shared
    collector.update_policy_weights_(TensorDict({"weight": torch.tensor(0.5)}))
    # Refused here, before anything is sent: no actor ever runs a wrong-shaped policy.
    with pytest.raises(ValueError, match=r"weight 'weight' has shape \[3\], the policy's has"):
        collector.update_policy_weights_({"weight": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"weight 'weight' has shape \[1\]"):
        collector.update_policy_weights_(TensorDict({"weight": torch.zeros(1)}))
    with pytest.raises(KeyError, match=r"missing \['weight'\], unexpected \['bias'\]"):
        collector.update_policy_weights_({"bias": torch.tensor(0.0)})
    assert all(collector.next()[ACT].unique().tolist() == [0.5] for _ in range(2))


def test_set_seed_chains_over_workers_and_repeats_batches(shared) -> None:  # type: ignore[no-untyped-def]
    collector, _ = shared
    env = nav()
    expected = nav().set_seed(env.set_seed(7))  # what two envs seeded in turn return
    assert collector.set_seed(7) == expected
    first = [collector.next()["agents", "observation"] for _ in range(2)]
    collector.set_seed(7)
    again = [collector.next()["agents", "observation"] for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0][0], first[0][1])  # the workers' seeds differ
    with pytest.raises(TypeError, match="seed must be an int >= 0, got float"):
        collector.set_seed(1.5)  # type: ignore[arg-type]


def noisy_policy(td):  # type: ignore[no-untyped-def]
    """Exploration noise from torch's global generator."""
    td.set(ACT, torch.rand(*td.batch_size, 2, 2) * 2 - 1)
    return td


def test_set_seed_seeds_each_actors_policy_noise() -> None:
    with RayCollector(
        [nav, nav], noisy_policy, frames_per_batch=16, num_cpus_per_actor=0, timeout=60
    ) as collector:
        runs = []
        for _ in range(2):
            collector.set_seed(3)
            runs.append([collector.next()[ACT] for _ in range(2)])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)  # the same seed, the same noise...
        assert not torch.equal(a[0], a[1])  # ...each actor its own
    wait_for_cpus()


def test_state_dict_round_trip_keeps_counters_and_ids_unique(shared) -> None:  # type: ignore[no-untyped-def]
    collector, _ = shared
    before = {i for _ in range(2) for i in collector.next()[IDS].flatten().tolist()}
    state = collector.state_dict()
    assert state["frames"] == collector.frames and len(state["workers"]) == 2
    assert state["workers"][0]["frames"] == collector.frames // 2  # each worker's share
    collector.next()
    collector.load_state_dict(state)
    assert collector.frames == state["frames"] and collector.batches == state["batches"]
    assert collector.state_dict() == state
    after = set(collector.next()[IDS].flatten().tolist())  # from a reset, new ids
    assert not before & after
    with pytest.raises(ValueError, match="holds 1 workers' states, this RayCollector has 2"):
        collector.load_state_dict({**state, "workers": state["workers"][:1]})
    with pytest.raises(KeyError, match="no 'workers'"):
        collector.load_state_dict({"frames": 0, "batches": 0})


# ---------------------------------------------------------------------- failures
def test_a_killed_actor_is_a_worker_error_and_the_others_are_killed() -> None:
    collector = RayCollector([nav, nav], None, frames_per_batch=16, timeout=60)
    collector.next()
    collector.update_policy_weights_()  # no weights: nothing to send, as in Collector
    with pytest.raises(TypeError, match=r"needs an nn\.Module policy, got None"):
        collector.update_policy_weights_({})
    actors = list(collector._actors)
    ray.kill(actors[1])
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker 1 \(its Ray actor\) died") as info:
        collector.next()
    assert time.monotonic() - start < 10
    assert info.value.worker == 1 and info.value.remote_traceback is None
    assert "killed by `ray.kill`" in str(info.value)
    assert collector.is_shut_down and actor_is_dead(actors[0])
    with pytest.raises(RuntimeError, match="RayCollector is shut down"):
        collector.next()
    collector.shutdown()  # idempotent
    assert ray.is_initialized()  # the Ray it found running is left running
    wait_for_cpus()


def gone(pids: list[int], within: float = 4.0) -> bool:
    """Whether the processes ``pids`` end (or are left as zombies for Ray to reap) in time."""
    deadline = time.monotonic() + within
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_stopped_actor_is_reported_after_the_timeout_while_the_others_answer(sync: bool) -> None:
    # Each actor's deadline runs from when it was asked: with sync=False the stopped actor is
    # reported while the other keeps yielding batches, with sync=True at the deadline (not once
    # its close has timed out too).
    collector = RayCollector([nav, nav], None, frames_per_batch=16, sync=sync, timeout=60)
    collector.next()
    collector.timeout = 2.0  # for the batches (the actors take longer than that to start here)
    actors, pids = list(collector._actors), collector.worker_pids
    os.kill(pids[1], signal.SIGSTOP)
    start, batches = time.monotonic(), 0
    with pytest.raises(
        WorkerError,
        match=rf"worker 1 \(pid {pids[1]} on [^)]+\) did not answer "
        r"(next\(\)|collecting a batch) within 2 s \(silent for [234]\.\d s since asked\)",
    ) as info:
        while time.monotonic() - start < 30:
            collector.next()
            batches += 1
    assert time.monotonic() - start < 4.5  # the actors' shutdown included
    assert info.value.worker == 1 and (sync or batches > 0)  # async: actor 0 answered meanwhile
    assert collector.is_shut_down and collector.worker_pids == []
    assert gone(pids) and actor_is_dead(actors[0])
    wait_for_cpus()


def test_shutdown_ends_a_stopped_actor_at_once() -> None:
    # A stopped actor is resumed and killed at once: shutdown waits out neither its close nor
    # ray.kill's grace (Ray takes about 2 s to end an actor that runs).
    collector = RayCollector([nav, nav], None, frames_per_batch=16, timeout=60)
    collector.next()
    pids = collector.worker_pids
    os.kill(pids[1], signal.SIGSTOP)
    start = time.monotonic()
    collector.shutdown()
    assert time.monotonic() - start < 2 and gone(pids, within=4)
    wait_for_cpus()


def test_a_raising_policy_is_a_worker_error_with_the_remote_traceback() -> None:
    collector = RayCollector([nav, nav], exploding_policy, frames_per_batch=16, timeout=60)
    actors = list(collector._actors)
    with pytest.raises(
        WorkerError, match=r"failed during next.*ValueError: the policy exploded"
    ) as info:
        collector.next()
    tb = info.value.remote_traceback
    assert tb is not None and "exploding_policy" in tb and "the policy exploded" in tb
    assert info.value.worker in (0, 1) and isinstance(info.value.__cause__, ValueError)
    assert collector.is_shut_down and all(actor_is_dead(a) for a in actors)
    wait_for_cpus()


def test_a_raising_factory_is_a_worker_error_at_construction() -> None:
    with pytest.raises(WorkerError, match=r"worker 1 \(its Ray actor\) failed to start") as info:
        RayCollector([nav, exploding_factory], None, frames_per_batch=16, timeout=60)
    assert info.value.worker == 1
    assert info.value.remote_traceback and "no simulator licence" in info.value.remote_traceback
    wait_for_cpus()


def test_an_actor_ray_cannot_place_times_out() -> None:
    with pytest.raises(WorkerError, match=r"worker 0 did not answer start.*within 2 s"):
        RayCollector([nav], None, frames_per_batch=8, num_cpus_per_actor=3, timeout=2)
    wait_for_cpus()


def test_env_batches_are_checked_against_the_frames_and_each_other() -> None:
    with pytest.raises(ValueError, match=r"different batch sizes \[\(2,\), \(4,\)\].*sync=False"):
        RayCollector([nav, lambda: nav(4)], None, frames_per_batch=16, timeout=60)
    wait_for_cpus()
    with pytest.raises(
        ValueError,
        match=r"frames_per_batch=6 does not divide .* the worker collects 6 frames, not a "
        r"multiple of the 4 envs of its batch \[4\]; use 4 or 8",
    ):
        RayCollector([lambda: nav(4)], None, frames_per_batch=6, timeout=60)
    wait_for_cpus()


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (([], None, 8), {}, ValueError, "create_env_fns is empty"),
        ((nav, None, 8), {}, TypeError, "must be a list of env factories"),
        (([nav, 3], None, 8), {}, TypeError, r"create_env_fns\[1\] is not callable: 3"),
        (([nav, nav], None, 9), {}, ValueError, "does not split evenly over 2 workers; use 8 or"),
        (([nav], "policy", 8), {}, TypeError, "policy must be callable or None"),
        (([nav], None, 8), {"num_cpus_per_actor": -1}, ValueError, "finite number >= 0"),
        (([nav], None, 8), {"num_cpus_per_actor": "1"}, TypeError, "must be a number, got str"),
        (([nav], None, 8), {"timeout": 0}, ValueError, "timeout must be a finite number > 0"),
        (([nav], None, 8), {"init_random_frames": -1}, ValueError, "init_random_frames"),
        (([nav], None, 8), {"device": "gpu:x"}, ValueError, "device 'gpu:x' is not a torch"),
        (([nav], None, 8), {"ray_init_kwargs": 2}, TypeError, "ray_init_kwargs must be a map"),
    ],
)
def test_bad_arguments_are_refused_before_any_actor_starts(
    args: tuple, kwargs: dict, error: type[Exception], match: str
) -> None:
    before = ray.available_resources().get("CPU")
    with pytest.raises(error, match=match):
        RayCollector(*args, **kwargs)
    assert ray.available_resources().get("CPU") == before


def test_without_ray_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without Ray imports
    with pytest.raises(ImportError, match=r"pip install 'marlkit\[ray\]'"):
        RayCollector([nav], None, frames_per_batch=8)


def test_a_ray_it_starts_itself_is_stopped_at_shutdown(tmp_path: pathlib.Path) -> None:
    # In another process, where Ray is not initialised (a second local Ray, of 1 CPU): forked
    # with torch and marlkit imported (_forked.py), Ray is not.
    script = textwrap.dedent(
        """
        import ray, marlkit
        from marlkit.collectors import RayCollector
        make = lambda: marlkit.make("navigation", num_envs=2, n_agents=2)
        init = dict(num_cpus=1, include_dashboard=False, log_to_driver=False,
                    object_store_memory=80 * 1024**2, configure_logging=False)
        collector = RayCollector([make], None, frames_per_batch=8, ray_init_kwargs=init)
        assert ray.is_initialized() and ray.cluster_resources()["CPU"] == 1
        assert collector.next().batch_size == (1, 2, 4)
        collector.shutdown()
        assert not ray.is_initialized()
        print("stopped")
        """
    )
    (tmp_path / "own_ray.py").write_text(script)
    done = _forked.run([sys.executable, str(tmp_path / "own_ray.py")], timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr[-3000:]
