"""make_collector: a collector kind chosen by name."""

from __future__ import annotations

import functools

import pytest

import marlkit
from marlkit.collectors import Collector, MultiAsyncCollector, MultiSyncCollector, make_collector

make_nav = functools.partial(marlkit.make, "navigation", num_envs=2, n_agents=2)


def test_single_collects_and_is_seeded():
    batches = []
    for _ in range(2):
        with make_collector("single", make_nav, None, 20, 20, seed=3) as collector:
            assert isinstance(collector, Collector)
            batches.append(next(iter(collector)))
    assert batches[0].batch_size == (2, 10)
    assert (batches[0]["agents", "observation"] == batches[1]["agents", "observation"]).all()


@pytest.mark.slow
def test_multisync_splits_the_frames_over_workers():
    with make_collector(
        "multisync", make_nav, None, 40, 40, num_workers=2, seed=0, start_method="forkserver"
    ) as c:
        assert isinstance(c, MultiSyncCollector)
        assert next(iter(c)).batch_size == (2, 2, 10)


@pytest.mark.slow
def test_multiasync_yields_one_workers_batch_and_takes_a_lambda():
    make = lambda: marlkit.make("navigation", num_envs=2, n_agents=2)  # noqa: E731  # cloudpickled
    with make_collector(
        "multiasync", make, None, 16, 32, num_workers=2, start_method="forkserver"
    ) as c:
        assert isinstance(c, MultiAsyncCollector)
        assert [b.batch_size for b in c] == [(2, 8)] * 2  # one worker's 16 frames each


def test_bad_kind_and_workers():
    with pytest.raises(ValueError, match=r"unknown collector kind 'gpu'; expected one of"):
        make_collector("gpu", make_nav, None, 20)
    with pytest.raises(ValueError, match="num_workers must be"):
        make_collector("multisync", make_nav, None, 20, num_workers=0)
