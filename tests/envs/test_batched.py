"""SerialEnv and ParallelEnv: batching, partial resets, seeding, and failing workers."""

from __future__ import annotations

import os
import signal

import pytest
import torch

import marlkit
from marlkit.envs import (
    EnvBase,
    InvalidActionError,
    ParallelEnv,
    SerialEnv,
    StepCounter,
    TransformedEnv,
    WorkerError,
)
from marlkit.scenarios import NavigationEnv
from marlkit.testing import check_adapter

NAV = {"name": "navigation", "num_envs": 3, "n_agents": 2}


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
    env = ParallelEnv(2, marlkit.make, NAV, timeout=30)
    td = env.reset()
    victim = env._procs[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=10)
    with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) died with exit code -9"):
        env.step(env.rand_action(td))
    assert env.is_closed and not env._procs
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


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
