"""Seeds: ``set_seed`` returns the next unused seed, batched envs chain it through their
workers, every instance of any nesting gets its own seed, and a top-level seed replays the same
rollout bit for bit."""

from __future__ import annotations

import functools
import sys
from typing import Any

import cloudpickle
import pytest
import torch

import marlkit
from marlkit.envs import EnvBase, ParallelEnv, SerialEnv, StepCounter, TransformedEnv
from marlkit.testing import AdapterCheckError, check_adapter

gym = pytest.importorskip("gymnasium")

# The spawned workers load the factories below by value (they cannot import this test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CARTPOLE = {"name": "gymnasium/CartPole-v1", "num_envs": 2}
OBS = ("agents", "observation")


def _cartpole_starts(seeds: range) -> torch.Tensor:
    """What Gymnasium itself gives CartPole after ``reset(seed=s)`` for each seed."""
    return torch.stack([torch.from_numpy(gym.make("CartPole-v1").reset(seed=s)[0]) for s in seeds])


def _nested_cartpoles() -> EnvBase:
    return SerialEnv(2, marlkit.make, CARTPOLE)  # 2 workers x 2 vector envs


@pytest.mark.parametrize(
    ("make", "used"),
    [
        (lambda: marlkit.make("navigation", num_envs=8), 1),  # one generator for the batch
        (lambda: marlkit.make("vmas/balance", num_envs=4), 1),  # one random state for all
        (lambda: marlkit.make("gymnasium/CartPole-v1"), 1),
        (lambda: marlkit.make("gymnasium/CartPole-v1", num_envs=3), 3),  # seed + i each
        (lambda: marlkit.make("pettingzoo/mpe2.simple_spread_v3", N=2, num_envs=3), 3),
        (lambda: SerialEnv(2, marlkit.make, CARTPOLE), 4),
        (lambda: TransformedEnv(SerialEnv(3, _nested_cartpoles), StepCounter(5)), 12),
    ],
)
def test_set_seed_returns_the_next_unused_seed(make: Any, used: int) -> None:
    env = make()
    assert env.set_seed(10) == 10 + used
    assert env.seed_range == (10, 10 + used)
    env.close()


def test_workers_of_batched_batches_start_from_distinct_seeds() -> None:
    # The regression: seed + w per worker met seed + i per instance (worker 0's env 1 and
    # worker 1's env 0 both got seed 1). Now the four instances get seeds 0, 1, 2 and 3.
    env = SerialEnv(2, marlkit.make, CARTPOLE)
    assert env.set_seed(0) == 4
    starts = env.reset()[OBS].reshape(4, 4)
    assert torch.equal(starts, _cartpole_starts(range(4)))
    assert torch.unique(starts, dim=0).shape[0] == 4


def test_workers_built_with_the_same_seed_are_reseeded_in_a_chain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # make("gymnasium/...") seeds each vector env with 0: four instances, two seeds, unless the
    # batched env notices the overlap.
    with caplog.at_level("INFO", logger="marlkit.envs.batched"):
        env = SerialEnv(2, marlkit.make, CARTPOLE)
    assert "overlapping seeds" in caplog.text
    assert env.seed_range == (0, 4)
    assert torch.equal(env.reset()[OBS].reshape(4, 4), _cartpole_starts(range(4)))
    distinct = SerialEnv(2, marlkit.make, [{**CARTPOLE, "seed": 0}, {**CARTPOLE, "seed": 2}])
    assert distinct.seed_range is None  # the workers' own seeds did not overlap: kept
    assert torch.equal(distinct.reset()[OBS].reshape(4, 4), _cartpole_starts(range(4)))


#: A ``ParallelEnv`` whose workers fork from the session's forkserver (imports done, conftest.py)
#: rather than spawn and import torch: the seeds reach them by message either way.
_parallel = functools.partial(ParallelEnv, start_method="forkserver")


@pytest.mark.parametrize("outer", [SerialEnv, pytest.param(_parallel, id="ParallelEnv")])
def test_every_instance_of_a_nesting_gets_its_own_seed(outer: type) -> None:
    env = outer(2, _nested_cartpoles)
    try:
        assert env.set_seed(0) == 8
        starts = env.reset()[OBS].reshape(8, 4)
        assert torch.equal(starts, _cartpole_starts(range(8)))
    finally:
        env.close()


def test_the_same_top_level_seed_replays_the_same_rollout() -> None:
    runs = []
    for cls in (SerialEnv, _parallel, SerialEnv):
        env = cls(2, _nested_cartpoles)
        env.set_seed(3)
        runs.append(env.rollout(20, break_when_any_done=False))
        env.close()
    for key in [("next", *OBS), ("agents", "action"), ("next", "done")]:
        assert torch.equal(runs[0][key], runs[1][key]), key
        assert torch.equal(runs[0][key], runs[2][key]), key


class _OldSeeding(SerialEnv):
    """The seeding this library had: ``seed + w`` for worker ``w``, whatever the workers use."""

    def _set_seed(self, seed: int) -> int:
        for w, env in enumerate(self.envs):
            env.set_seed(seed + w)
        return seed + self.num_workers


def test_the_kit_catches_instances_that_replay_one_another() -> None:
    check_adapter(SerialEnv(2, marlkit.make, CARTPOLE), steps=4)
    with pytest.raises(AdapterCheckError, match=r"instances \[0, 1\] and \[1, 0\] of the batch"):
        check_adapter(_OldSeeding(2, marlkit.make, CARTPOLE), steps=4)


def test_a_deterministic_simulator_is_not_reported() -> None:
    # tictactoe starts every game from the empty board, whatever the seed: identical
    # instances are right there, and the kit says nothing.
    env = marlkit.make("pettingzoo/pettingzoo.classic.tictactoe_v3", num_envs=3, seed=0)
    check_adapter(env, steps=4)


def test_a_set_seed_that_does_not_advance_is_refused() -> None:
    class _Stuck(type(marlkit.make("navigation"))):  # type: ignore[misc]
        def _set_seed(self, seed: int) -> int:
            super()._set_seed(seed)
            return seed

    with pytest.raises(RuntimeError, match=r"_set_seed\(4\) returned 4"):
        _Stuck(num_envs=2).set_seed(4)


def test_seeds_are_checked_before_anything_is_seeded() -> None:
    import numpy as np

    env = marlkit.make("navigation", num_envs=2, seed=0)
    rng = env._rng.get_state().clone()
    with pytest.raises(ValueError, match=r"seed must be an int in \[-2\*\*63, 2\*\*63\), got 1844"):
        env.set_seed(2**64)
    with pytest.raises(TypeError, match="seed must be an int, got float"):
        env.set_seed(1.0)
    assert torch.equal(env._rng.get_state(), rng)
    # a seed the simulator refuses (VMAS: [0, 2**32)) leaves the action generator alone too
    vmas = marlkit.make("vmas/balance", num_envs=2, seed=0)
    rng = vmas._rng.get_state().clone()
    with pytest.raises(ValueError, match="VMAS seeds must be in"):
        vmas.set_seed(-1)
    assert torch.equal(vmas._rng.get_state(), rng)
    # NumPy integers are ints: the same rollout as the Python int
    a = marlkit.make("navigation", num_envs=2, seed=np.int64(3)).rollout(4)
    b = marlkit.make("navigation", num_envs=2, seed=3).rollout(4)
    assert torch.equal(a["next", OBS], b["next", OBS])
