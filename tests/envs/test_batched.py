"""SerialEnv and ParallelEnv: batching, partial resets, seeding, factories of every kind,
masks and validation through the batch, and failing workers."""

from __future__ import annotations

import functools
import itertools
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import cloudpickle
import numpy as np
import psutil
import pytest
import torch
from tensordict import TensorDict

import marlkit
from marlkit.envs import (
    EnvBase,
    InvalidActionError,
    ParallelEnv,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
    WorkerError,
)
from marlkit.envs import _workers as workers_module
from marlkit.scenarios import NavigationEnv
from marlkit.testing import check_adapter

# The spawned workers load this module's helpers by value (they cannot import a test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NAV = {"name": "navigation", "num_envs": 3, "n_agents": 2}
TTT = {"name": "pettingzoo/pettingzoo.classic.tictactoe_v3", "num_envs": 2, "seed": 0}


class _ExplodingNavigation(NavigationEnv):
    """Navigation that raises on its third step (a simulator bug inside a worker)."""

    def _step(self, tensordict):  # type: ignore[no-untyped-def]
        self._count = getattr(self, "_count", 0) + 1
        if self._count == 3:
            raise FloatingPointError("simulated physics blow-up")
        return super()._step(tensordict)


def _exploding(**kwargs) -> EnvBase:  # type: ignore[no-untyped-def]
    return _ExplodingNavigation(**kwargs)


def _not_an_env() -> object:
    return object()


def _parallel(*args, **kwargs) -> ParallelEnv:  # type: ignore[no-untyped-def]
    """A ``ParallelEnv`` whose workers fork from the session's forkserver, which imported torch
    and marlkit once (``conftest.py``): for the tests that are not about how workers start,
    where each spawned worker would spend seconds importing them. The default (``"spawn"``)
    starts the ``parallel`` fixture's workers, the lambdas' and those of a factory defined in
    ``__main__``."""
    return ParallelEnv(*args, start_method="forkserver", **kwargs)


PARALLEL = pytest.param(_parallel, id="ParallelEnv")


@pytest.fixture(scope="module")
def parallel():
    env = ParallelEnv(2, marlkit.make, NAV)
    yield env
    env.close()


def test_serial_env_batches_and_conforms() -> None:
    env = SerialEnv(3, marlkit.make, NAV)
    assert env.batch_size == (3, 3)
    assert env.action_spec["agents", "action"].shape == (3, 3, 2, 2)
    out = env.rollout(5, break_when_any_done=False)
    assert out["next", "agents", "reward"].shape == (3, 3, 5, 2, 1)
    check_adapter(env)


def test_parallel_env_conforms(parallel: ParallelEnv) -> None:
    assert parallel.batch_size == (2, 3)
    check_adapter(parallel)


def test_parallel_matches_serial_bit_for_bit(parallel: ParallelEnv) -> None:
    serial = SerialEnv(2, marlkit.make, NAV)
    runs = []
    for env in (serial, parallel):
        env.set_seed(5)
        runs.append(env.rollout(12, break_when_any_done=False))
    for key in [("next", "agents", "observation"), ("next", "agents", "reward"), ("next", "state")]:
        assert torch.equal(runs[0][key], runs[1][key]), key


def test_partial_reset_reaches_only_selected_envs(parallel: ParallelEnv) -> None:
    td = parallel.reset()
    _, td = parallel.step_and_maybe_reset(parallel.rand_action(td))
    mask = torch.zeros(2, 3, 1, dtype=torch.bool)
    mask[1, 2] = True
    td["_reset"] = mask
    out = parallel.reset(td)
    keep = ~mask.squeeze(-1)
    assert torch.equal(out["agents", "observation"][keep], td["agents", "observation"][keep])
    assert not torch.equal(out["agents", "observation"][1, 2], td["agents", "observation"][1, 2])


def test_render_routes_to_the_right_worker(parallel: ParallelEnv) -> None:
    parallel.reset()
    frame = parallel.render(5)
    assert frame.shape == (256, 256, 3) and frame.dtype.name == "uint8"
    with pytest.raises(IndexError, match="outside a batch of 6"):
        parallel.render(6)


def test_bad_actions_rejected_in_the_parent(parallel: ParallelEnv) -> None:
    td = parallel.rand_action(parallel.reset())
    td["agents", "action"] = torch.full((2, 3, 2, 2), float("nan"))
    with pytest.raises(InvalidActionError, match="non-finite"):
        parallel.step(td)


def test_transforms_outside_the_batch() -> None:
    env = TransformedEnv(SerialEnv(2, marlkit.make, NAV), StepCounter(max_steps=4))
    out = env.rollout(9, break_when_any_done=False)
    assert out["next", "step_count"][0, 0, :, 0].tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 1]


def test_worker_exception_is_reported_with_its_worker() -> None:
    env = ParallelEnv(2, _exploding, {"num_envs": 2}, start_method="fork")
    try:
        td = env.reset()
        for _ in range(2):
            _, td = env.step_and_maybe_reset(env.rand_action(td))
        with pytest.raises(WorkerError, match=r"worker 0 failed during step: FloatingPointError"):
            env.step(env.rand_action(td))
    finally:
        env.close()


def test_killed_worker_is_detected_and_nothing_hangs() -> None:
    env = _parallel(2, marlkit.make, NAV, timeout=30)
    td = env.reset()
    victim = env._pool.pids[1]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) died with exit code -9"):
        env.step(env.rand_action(td))
    assert env.is_closed and not env._pool.pids
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


def test_a_stopped_worker_is_reported_after_the_timeout_it_was_given() -> None:
    # The message gave the time left once worker 0 answered ("within 1 s"), not the timeout, and
    # came 7 s late: SIGTERM's grace, which a stopped worker cannot act on.
    env = _parallel(2, marlkit.make, NAV, timeout=2)
    td = env.reset()
    pids = env._pool.pids
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    threading.Timer(1.2, os.kill, (pids[0], signal.SIGCONT)).start()  # worker 0 answers late
    start = time.monotonic()
    with pytest.raises(
        WorkerError,
        match=rf"worker 1 \(pid {pids[1]}\) did not answer step within 2 s \(silent for "
        r"[234]\.\d s since asked\); the ParallelEnv is shut down",
    ):
        env.step(env.rand_action(td))
    assert time.monotonic() - start < 4.5
    assert env.is_closed and not any(psutil.pid_exists(pid) for pid in pids)


def test_construction_errors() -> None:
    with pytest.raises(ValueError, match="num_workers must be an int >= 1"):
        SerialEnv(0, marlkit.make, NAV)
    with pytest.raises(TypeError, match="not an EnvBase"):
        SerialEnv(1, _not_an_env)
    with pytest.raises(
        WorkerError, match=r"worker 0 failed during start: TypeError.*not an EnvBase"
    ):
        ParallelEnv(1, _not_an_env, start_method="fork")
    with pytest.raises(WorkerError, match="n_agents must be an int >= 1"):
        ParallelEnv(1, marlkit.make, {**NAV, "n_agents": 0}, start_method="fork")
    with pytest.raises(ValueError, match="other specs"):
        SerialEnv(2, marlkit.make, [NAV, {**NAV, "n_agents": 3}])


# ---------------------------------------------------------------------- factories of every kind
def test_lambdas_and_closures_are_factories() -> None:
    n_agents = 3

    def closure() -> EnvBase:
        return marlkit.make("navigation", num_envs=2, n_agents=n_agents)

    lam = lambda: marlkit.make("navigation", num_envs=2, n_agents=n_agents)  # noqa: E731
    for factory, start_method in ((lam, "spawn"), (closure, "forkserver")):
        env = ParallelEnv(2, factory, start_method=start_method)
        try:
            assert env.batch_size == (2, 2) and env.group_map["agents"][-1] == "agent_2"
            assert env.rollout(3)["next", "agents", "reward"].shape == (2, 2, 3, 3, 1)
        finally:
            env.close()


def test_a_factory_defined_in_main_works(tmp_path: pathlib.Path) -> None:
    # As in a notebook or `python -c`: the function lives in a __main__ the spawned workers
    # cannot import; cloudpickle carries it by value.
    script = textwrap.dedent(
        """
        import marlkit
        from marlkit.envs import ParallelEnv

        def factory(n):
            return marlkit.make("navigation", num_envs=2, n_agents=n)

        env = ParallelEnv(2, factory, {"n": 2})
        print(tuple(env.rollout(4).batch_size))
        env.close()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(2, 2, 4)"


def _raising_factory() -> EnvBase:
    raise ValueError("no such map: 'mountains'")


def _importing_factory() -> EnvBase:
    import marlkit_nonexistent_simulator  # noqa: F401  (a simulator that is not installed)

    return marlkit.make("navigation")


def test_a_worker_that_fails_to_start_reports_its_exception_and_traceback() -> None:
    with pytest.raises(WorkerError, match=r"worker 0 failed during start: ValueError: no such "):
        _parallel(1, _raising_factory)
    try:
        _parallel(2, [marlkit.make, _raising_factory], [NAV, {}])
    except WorkerError as err:
        assert err.worker == 1 and isinstance(err.__cause__, ValueError)
        assert "_raising_factory" in (err.remote_traceback or "")
        assert "--- traceback in worker 1 ---" in str(err)
        assert "in _raising_factory" in str(err)
    else:
        raise AssertionError("the failing worker went unnoticed")
    with pytest.raises(WorkerError, match="ModuleNotFoundError: No module named 'marlkit_nonex"):
        _parallel(1, _importing_factory)


def _dying_factory() -> EnvBase:
    os._exit(3)  # a simulator that takes the process down while it starts


def test_a_worker_that_dies_while_starting_is_reported_with_its_exit_code() -> None:
    with pytest.raises(WorkerError, match=r"worker 0 \(pid \d+\) .*exit(ed with)? code 3"):
        _parallel(1, _dying_factory)


def test_a_factory_the_worker_cannot_load_is_reported(tmp_path: pathlib.Path) -> None:
    # A module importable here but not in the worker (deleted since): cloudpickle refers to it
    # by name, and loading it fails inside the worker, where it is caught and sent back.
    (tmp_path / "vanishing_sim.py").write_text(
        "import marlkit\n\ndef make():\n    return marlkit.make('navigation')\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import vanishing_sim  # type: ignore[import-not-found]

        (tmp_path / "vanishing_sim.py").unlink()
        with pytest.raises(WorkerError, match=r"start: ModuleNotFoundError.*vanishing_sim") as err:
            _parallel(1, vanishing_sim.make)
        assert isinstance(err.value.__cause__, ModuleNotFoundError)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("vanishing_sim", None)


def test_a_factory_cloudpickle_cannot_serialise_is_refused_in_the_parent() -> None:
    lock = threading.Lock()

    def holds_a_lock() -> EnvBase:
        with lock:
            return marlkit.make("navigation")

    with pytest.raises(TypeError, match=r"factory of worker 0 .* cannot be serialised"):
        ParallelEnv(1, holds_a_lock)


# ---------------------------------------------------------------------- resets per worker
class _CountingNavigation(NavigationEnv):
    """Navigation that appends a line to ``log`` at every reset it is asked for."""

    def __init__(self, log: str, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.log = log

    def _reset(self, tensordict, env_mask):  # type: ignore[no-untyped-def]
        with open(self.log, "a") as f:
            f.write("all\n" if env_mask is None else f"{env_mask.int().tolist()}\n")
        return super()._reset(tensordict, env_mask)


@pytest.mark.parametrize("cls", [SerialEnv, PARALLEL])
def test_partial_resets_reach_only_the_selected_workers(cls: type, tmp_path: pathlib.Path) -> None:
    logs = [str(tmp_path / f"worker{w}.log") for w in range(3)]
    env = cls(3, _CountingNavigation, [{"log": log, "num_envs": 2} for log in logs])
    try:
        td = env.reset()
        _, td = env.step_and_maybe_reset(env.rand_action(td))
        mask = torch.zeros(3, 2, 1, dtype=torch.bool)
        mask[1, 0] = True
        td["_reset"] = mask
        out = env.reset(td)
        lines = [pathlib.Path(log).read_text().splitlines() for log in logs]
        assert lines == [["all"], ["all", "[1, 0]"], ["all"]]  # constructor resets excluded
        keep = ~mask.squeeze(-1)
        for key in [("agents", "observation"), "state"]:
            assert torch.equal(out[key][keep], td[key][keep]), key
        assert not torch.equal(
            out["agents", "observation"][1, 0], td["agents", "observation"][1, 0]
        )
    finally:
        env.close()


class _LeavesOutState(NavigationEnv):
    """Navigation whose step output lacks "state" (a simulator bug)."""

    def _step(self, tensordict):  # type: ignore[no-untyped-def]
        return super()._step(tensordict).exclude("state")


@pytest.mark.parametrize("cls", [SerialEnv, PARALLEL])
def test_a_missing_output_key_names_the_key_and_the_worker(cls: type) -> None:
    env = cls(2, [marlkit.make, _LeavesOutState], [NAV, {"num_envs": 3, "n_agents": 2}])
    try:
        td = env.rand_action(env.reset())
        error = KeyError if cls is SerialEnv else WorkerError
        with pytest.raises(error, match=r"worker 1's env returned no 'state' from step\(\)"):
            env.step(td)
    finally:
        env.close()


# ---------------------------------------------------------------------- masks through the batch
@pytest.mark.parametrize("cls", [SerialEnv, PARALLEL])
def test_the_workers_masking_policy_is_honoured_in_the_parent(cls: type) -> None:
    # The regression: illegal_actions="mask" replaced illegal moves in a bare env but outer
    # layers refused them with their own rule.
    env = TransformedEnv(cls(2, marlkit.make, {**TTT, "illegal_actions": "mask"}), StepCounter(9))
    strict = cls(2, marlkit.make, TTT)
    try:
        assert env.illegal_actions == "mask" and strict.illegal_actions == "raise"
        td = env.reset()
        td["agents", "action"] = torch.zeros(2, 2, 2, dtype=torch.int64)
        td = env._step_mdp(env.step(td))  # player 1 takes square 0
        td["agents", "action"] = torch.zeros(2, 2, 2, dtype=torch.int64)  # square 0 again
        out = env.step(td)["next"]  # replaced by a legal move, not refused
        acting = out["agents", "acting"]  # player 1 moves next: square 0 is taken for it
        assert acting.sum() == 4 and not out["agents", "action_mask"][..., 0][acting].any()
        assert (out["agents", "action_mask"].sum(-1)[acting] == 7).all()  # two moves were made
        td = strict.reset()
        td["agents", "action"] = torch.zeros(2, 2, 2, dtype=torch.int64)
        td = strict._step_mdp(strict.step(td))
        td["agents", "action"] = torch.zeros(2, 2, 2, dtype=torch.int64)
        with pytest.raises(InvalidActionError, match="masked out by"):
            strict.step(td)
    finally:
        env.close()
        strict.close()


@pytest.mark.parametrize("cls", [SerialEnv, PARALLEL])
def test_validate_actions_is_settable_on_batched_envs(cls: type) -> None:
    env = cls(2, marlkit.make, NAV, validate_actions=False)
    try:
        assert not env.validate_actions
        td = env.rand_action(env.reset())
        td["agents", "action"] = torch.full((2, 3, 2, 2), 5.0)  # out of bounds: not checked
        env.step(td)
        env.validate_actions = True
        with pytest.raises(InvalidActionError, match=r"out of bounds|outside"):
            env.step(td)
    finally:
        env.close()


# ---------------------------------------------------------------------- transforms inside workers
def _counted(**kwargs) -> EnvBase:  # type: ignore[no-untyped-def]
    """Navigation with transforms that carry entries from step to step, for the workers."""
    return TransformedEnv(marlkit.make(**NAV, **kwargs), [StepCounter(10), RewardSum()])


CARRIED = ["step_count", ("agents", "episode_reward")]


def _seeded_steps(env: EnvBase, steps: int) -> TensorDict:
    """Seed ``env`` (0), reset it and take ``steps`` random steps with auto-reset; the root."""
    env.set_seed(0)
    td = env.reset()
    for _ in range(steps):
        _, td = env.step_and_maybe_reset(env.rand_action(td))
    return td


@pytest.mark.parametrize("cls", [SerialEnv, PARALLEL])
def test_partial_resets_keep_the_carried_entries_of_every_env_not_reset(cls: type) -> None:
    # The regressions: SerialEnv zeroed the counts of every worker for an input with only the
    # mask, ParallelEnv read the previous step's counts left in its input buffer; now the last
    # step's TensorDict keeps them, and a mask alone is refused, the same way by both.
    env = cls(2, _counted)
    try:
        td = _seeded_steps(env, 2)
        mask = torch.zeros(2, 3, 1, dtype=torch.bool)
        mask[0, 0] = True
        error = KeyError if cls is SerialEnv else WorkerError
        with pytest.raises(error, match="StepCounter: the input of a partial reset has no"):
            env.reset(TensorDict({"_reset": mask}, batch_size=[2, 3]))
        td["_reset"] = mask
        out = env.reset(td)
        keep = ~mask.squeeze(-1)
        for key in CARRIED:
            assert torch.equal(out[key][keep], td[key][keep]), key
            assert not out[key][0, 0].any(), key
        assert out["step_count"].flatten().tolist() == [0, 2, 2, 2, 2, 2]
    finally:
        env.close()


@pytest.mark.parametrize("cls", [SerialEnv, PARALLEL])
def test_a_worker_never_reads_what_the_input_lacks(cls: type) -> None:
    # ParallelEnv's workers read their input from a shared buffer: a key absent from this call's
    # input held the previous call's value there, and a step went on from a stale count.
    env = cls(2, _counted)
    try:
        td = env.rand_action(env.reset())
        env.step(td)
        error = KeyError if cls is SerialEnv else WorkerError
        with pytest.raises(error, match="StepCounter: the step input has no 'step_count'"):
            env.step(td.exclude("step_count"))
        with pytest.raises(error, match=r"RewardSum: the step input has no \('agents', 'episode"):
            env.step(td.exclude(("agents", "episode_reward")))
    finally:
        env.close()


def _truncated(max_steps: int) -> EnvBase:
    """Navigation whose episodes all end after ``max_steps`` steps (per worker: each ends at
    its own steps)."""
    return TransformedEnv(marlkit.make(**NAV), [StepCounter(max_steps), RewardSum()])


@pytest.mark.parametrize("cls", [SerialEnv, PARALLEL])
def test_step_and_maybe_reset_matches_a_step_then_a_reset(cls: type) -> None:
    # ParallelEnv resets each worker's done envs inside the step command; the result must be
    # what EnvBase's own step-then-reset gives, whichever workers end (none, one, both).
    factories = [functools.partial(_truncated, 3), functools.partial(_truncated, 5)]
    env, reference = cls(2, factories), SerialEnv(2, factories)
    try:
        for e in (env, reference):
            e.set_seed(11)
        td, ref_td = env.reset(), reference.reset()
        ended = set()
        for _ in range(18):  # worker 0 resets every 3 steps, worker 1 every 5
            actions = env.rand_action(td)
            ref_td.update(actions.select(("agents", "action")))
            out, td = env.step_and_maybe_reset(actions)
            ref_out = EnvBase.step_and_maybe_reset(reference, ref_td)
            ref_out, ref_td = ref_out
            assert (out == ref_out).all() and (td == ref_td).all()
            assert set(td.keys(True, True)) == set(ref_td.keys(True, True))
            ended.add(tuple(out["next", "done"].reshape(2, -1).all(-1).tolist()))
        assert {(True, False), (False, True), (True, True), (False, False)} <= ended
        # A partial reset that leaves a worker alone reports that worker's envs as they are now
        # (just reset by the step, for worker 0 here), not the step's last output.
        assert td["step_count"][0].eq(0).all()
        mask = torch.zeros(2, 3, 1, dtype=torch.bool)
        mask[1, 0] = True
        td["_reset"] = mask
        after = env.reset(td)
        assert torch.equal(after["agents", "observation"][0], td["agents", "observation"][0])
        assert after["step_count"][0].eq(0).all()
    finally:
        env.close()
        reference.close()


def test_parallel_step_and_maybe_reset_is_one_command_per_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = _parallel(2, [functools.partial(_truncated, 2)] * 2)
    try:
        td = env.reset()
        sent: list[str] = []
        send = env._pool.send

        def spy(i: int, message: tuple, what: str) -> None:
            sent.append(message[0])
            send(i, message, what)

        monkeypatch.setattr(env._pool, "send", spy)
        for _ in range(4):  # every other step ends every episode
            _, td = env.step_and_maybe_reset(env.rand_action(td))
        assert sent == ["step_reset"] * 8
        assert td["step_count"].eq(0).all()
    finally:
        env.close()


# ---------------------------------------------------------------------- where and how workers wait
def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
def test_worker_cpus_pins_each_worker() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    env = _parallel(2, marlkit.make, NAV, worker_cpus="auto")
    try:
        expected = [{allowed[0]}, {allowed[1 % len(allowed)]}]
        assert [os.sched_getaffinity(pid) for pid in env._pool.pids] == expected
        env.rollout(3)  # pinned workers step as any
    finally:
        env.close()
    # Any collections of ints, NumPy's too (an iterator per worker, an array).
    env = _parallel(2, marlkit.make, NAV, worker_cpus=[np.int64(allowed[-1]), iter(allowed)])
    try:
        assert [os.sched_getaffinity(pid) for pid in env._pool.pids] == [
            {allowed[-1]},
            set(allowed),
        ]
    finally:
        env.close()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
@pytest.mark.parametrize(
    ("worker_cpus", "error", "match"),
    [
        ("all", ValueError, "must be None, 'auto' or one CPU"),
        ([0], ValueError, "1 entries for 2 workers"),
        ([0, 4096], ValueError, r"worker_cpus\[1\] = 4096: CPU \[4096\] is not one this process"),
        ([0, []], ValueError, r"worker_cpus\[1\] is empty"),
        ([0, 1.5], TypeError, r"worker_cpus\[1\] must be a CPU index"),
        ([True, 0], TypeError, r"worker_cpus\[0\] must be a CPU index"),
        (2, TypeError, "worker_cpus must be None, 'auto' or one CPU"),
    ],
)
def test_bad_worker_cpus_are_refused_before_any_worker_starts(
    worker_cpus: object, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        _parallel(2, marlkit.make, NAV, worker_cpus=worker_cpus)


@pytest.mark.parametrize(
    ("busy_wait", "error"),
    [
        (-0.001, ValueError),
        (float("nan"), ValueError),
        (200.0, ValueError),
        ("0.002", TypeError),
        (True, TypeError),
    ],
)
def test_bad_busy_wait_is_refused(busy_wait: object, error: type[Exception]) -> None:
    # from 0 to below the timeout (120 s by default)
    with pytest.raises(error, match=r"busy_wait must be (a finite number in \[0, 120\)|a number)"):
        _parallel(2, marlkit.make, NAV, busy_wait=busy_wait)


def test_polling_workers_sleep_once_the_commands_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker polls for its next command only while commands come in quick succession: an
    # env left alone must not keep its workers burning CPU.
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # room to poll on 2 CPUs
    env = _parallel(2, marlkit.make, NAV, busy_wait=0.05)
    try:
        assert env._pool.busy_wait == 0.05
        td = env.reset()
        for _ in range(20):
            _, td = env.step_and_maybe_reset(env.rand_action(td))
        time.sleep(0.2)  # past the polling window
        before = [_cpu_seconds(pid) for pid in env._pool.pids]
        time.sleep(1.0)
        after = [_cpu_seconds(pid) for pid in env._pool.pids]
        assert max(b - a for a, b in zip(before, after)) < 0.1, (before, after)
    finally:
        env.close()


def test_workers_do_not_poll_where_they_would_crowd_the_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    env = _parallel(cpus + 1, marlkit.make, NAV)  # more workers than CPUs
    try:
        assert env._pool.busy_wait == 0.0
    finally:
        env.close()
    monkeypatch.setattr(torch, "get_num_threads", lambda: cpus)  # this process's torch pool
    env = _parallel(2, marlkit.make, NAV)
    try:
        assert env._pool.busy_wait == 0.0
        env.rollout(3)
    finally:
        env.close()


@pytest.mark.parametrize("cls", [SerialEnv, PARALLEL])
def test_a_partial_reset_after_an_auto_reset_reports_the_reset_workers_as_they_are(
    cls: type,
) -> None:
    # Worker 0 auto-resets at its second step; a partial reset of worker 1 alone (the mask
    # only) must report worker 0 as it now is, from its last output, without asking it.
    env = cls(2, [functools.partial(_truncated, 2), functools.partial(_truncated, 100)])
    try:
        td = _seeded_steps(env, 2)
        mask = torch.zeros(2, 3, 1, dtype=torch.bool)
        mask[1] = True
        out = env.reset(TensorDict({"_reset": mask}, batch_size=[2, 3]))
        assert out["step_count"].flatten().tolist() == [0] * 6
        assert torch.equal(out["agents", "observation"][0], td["agents", "observation"][0])
    finally:
        env.close()


class _ResetFailsOnce(TransformedEnv):
    """A worker env whose second reset raises (the first is the env's own)."""

    def reset(self, tensordict=None):  # type: ignore[no-untyped-def]
        self._resets = getattr(self, "_resets", 0) + 1
        if self._resets == 2:
            raise RuntimeError("simulated reset failure")
        return super().reset(tensordict)


def _reset_fails_once() -> EnvBase:
    return _ResetFailsOnce(marlkit.make(**NAV), [StepCounter(2), RewardSum()])


def test_a_failed_auto_reset_leaves_the_other_workers_as_they_are() -> None:
    # Worker 0's auto-reset raises after its step; worker 1 stepped and reset. The error names
    # the step and the auto-reset, and a later partial reset reports worker 1's reset state.
    env = _parallel(2, [_reset_fails_once, functools.partial(_truncated, 2)])
    try:
        td = env.reset()
        _, td = env.step_and_maybe_reset(env.rand_action(td))
        with pytest.raises(WorkerError, match=r"worker 0 failed during step \(and auto-reset\)"):
            env.step_and_maybe_reset(env.rand_action(td.clone()))
        mask = torch.zeros(2, 3, 1, dtype=torch.bool)
        mask[0] = True
        td["_reset"] = mask
        out = env.reset(td)
        assert out["step_count"][1].eq(0).all() and not out["done"][1].any()
    finally:
        env.close()


def test_the_parent_keeps_one_poller_per_set_of_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _parallel(3, marlkit.make, NAV)
    try:
        env._pool._pollers.clear()  # the start's, one per worker
        for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0], [0, 2], [2, 0]):
            env._pool._woken(order, 0.0)
        assert len(env._pool._pollers) == 2  # {0, 1, 2} and {0, 2}, in any order
        # call() waits on ever smaller sets: many workers could make 2^n of them; bounded
        monkeypatch.setattr(workers_module, "_MAX_POLLERS", 3)
        for subset in itertools.chain.from_iterable(
            itertools.combinations(range(3), k) for k in (1, 2, 3)
        ):
            env._pool._woken(list(subset), 0.0)
            assert len(env._pool._pollers) <= 3
    finally:
        env.close()


def test_workers_whose_commands_come_slower_than_busy_wait_sleep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Commands 70 ms apart, busy_wait 50 ms: a worker polls once, sees the gap, then sleeps
    # until each command (it used to poll the whole 50 ms of every 70).
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    env = _parallel(2, marlkit.make, NAV, busy_wait=0.05)
    try:
        td = env.reset()
        for _ in range(3):
            time.sleep(0.07)
            _, td = env.step_and_maybe_reset(env.rand_action(td))
        before = [_cpu_seconds(pid) for pid in env._pool.pids]
        start = time.monotonic()
        for _ in range(15):
            time.sleep(0.07)
            _, td = env.step_and_maybe_reset(env.rand_action(td))
        wall = time.monotonic() - start
        used = [_cpu_seconds(pid) - b for pid, b in zip(env._pool.pids, before)]
        assert max(used) < 0.25 * wall, (used, wall)  # polling every window: ~0.7 x wall
    finally:
        env.close()


@pytest.mark.parametrize("timeout", [1e7, float("inf")])
def test_a_timeout_of_days_waits(timeout: float) -> None:
    # poll() takes a C int of milliseconds: the wait polls a day at a time.
    env = _parallel(2, marlkit.make, NAV, timeout=timeout)
    try:
        assert env.rollout(2).batch_size == (2, 3, 2)
    finally:
        env.close()


class _Closing(NavigationEnv):
    """Navigation that records its close (and raises there when told to)."""

    closed: list[int] = []

    def __init__(self, tag: int = 0, raise_on_close: bool = False, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.tag, self.raise_on_close = tag, raise_on_close

    def _close(self) -> None:
        _Closing.closed.append(self.tag)
        super()._close()
        if self.raise_on_close:
            raise OSError(f"env {self.tag} failed to close")


def test_a_serial_env_closes_every_env_it_made_when_it_refuses_them_and_on_close() -> None:
    # refused for other specs, the envs made so far stayed open (a ParallelEnv shuts down);
    # and close() stopped at the first env whose close raised, for good
    _Closing.closed.clear()
    makers = [
        functools.partial(_Closing, 0, num_envs=3, n_agents=2),
        functools.partial(_Closing, 1, num_envs=3, n_agents=3),  # other specs
    ]
    with pytest.raises(ValueError, match="env 1 has other specs than env 0"):
        SerialEnv(2, makers)
    assert sorted(_Closing.closed) == [0, 1]
    _Closing.closed.clear()
    env = SerialEnv(
        3,
        [
            functools.partial(_Closing, i, raise_on_close=i == 0, num_envs=3, n_agents=2)
            for i in range(3)
        ],
    )
    with pytest.raises(OSError, match="env 0 failed to close"):
        env.close()
    assert sorted(_Closing.closed) == [0, 1, 2]  # the others closed all the same


def _plain() -> EnvBase:
    return TransformedEnv(marlkit.make(**NAV), [])


def _plain_reset_fails_once() -> EnvBase:
    return _ResetFailsOnce(marlkit.make(**NAV), [])


def test_a_serial_reset_failing_part_way_reports_the_workers_that_did_reset() -> None:
    # worker 0 resets, worker 1 raises: a later partial reset of worker 1 alone reported
    # worker 0's observation from before the failed reset (a ParallelEnv reports the new one)
    env = SerialEnv(2, [_plain, _plain_reset_fails_once])
    try:
        first = env.reset()
        with pytest.raises(RuntimeError, match="simulated reset failure"):
            env.reset()  # worker 0 resets again, worker 1 raises
        mask = torch.zeros(2, 3, 1, dtype=torch.bool)
        mask[1] = True
        out = env.reset(TensorDict({"_reset": mask}, [2, 3]))
        none = TensorDict({"_reset": torch.zeros(3, 1, dtype=torch.bool)}, [3])
        now = env.envs[0].reset(none)  # worker 0 as it is, nothing reset
        assert torch.equal(out["agents", "observation"][0], now["agents", "observation"])
        assert not torch.equal(out["agents", "observation"][0], first["agents", "observation"][0])
    finally:
        env.close()


def test_a_serial_seed_chain_past_int64_is_refused_with_nothing_changed() -> None:
    env = SerialEnv(2, marlkit.make, NAV)
    try:
        before = [e.seed_range for e in env.envs]
        with pytest.raises(ValueError, match=r"too large for 2 workers.*a seed of at most"):
            env.set_seed(2**63 - 1)
        assert [e.seed_range for e in env.envs] == before
        env.set_seed(2**63 - 6)  # 2 workers of 3 envs: the last seed is 2**63 - 1
    finally:
        env.close()


def test_an_env_on_cpu_0_is_an_env_on_the_cpu() -> None:
    # "cpu:0" was kept, and the env refused its own random actions ("device cpu != spec
    # device cpu:0"): tensors made on cpu:0 report cpu
    env = marlkit.make("navigation", num_envs=2, n_agents=2, seed=0, device="cpu:0")
    assert env.device == torch.device("cpu")
    assert env.action_spec["agents", "action"].device == torch.device("cpu")
    assert env.rollout(3).batch_size == (2, 3)
    serial = SerialEnv(2, marlkit.make, {**NAV, "device": "cpu:0"})
    try:
        assert serial.rollout(2).batch_size == (2, 3, 2)
    finally:
        serial.close()
