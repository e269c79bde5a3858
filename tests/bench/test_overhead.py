"""marlkit.bench.overhead: an adapter against its raw loop, the measurement benchmarks/adapters*
share."""

from __future__ import annotations

import argparse
import time

import pytest
import torch

import marlkit
from marlkit.bench import Stopwatch
from marlkit.bench.overhead import (
    add_sweep,
    collector_loop,
    measure_overhead,
    random_actions,
    watching,
)


class _Sim:
    def __init__(self) -> None:
        self.calls = 0

    def step(self) -> int:
        self.calls += 1
        time.sleep(0.002)
        return self.calls


def test_measure_overhead_times_both_sides_and_the_watched_calls() -> None:
    sim, raw_sim = _Sim(), _Sim()  # the raw loop's simulator is its own, unwatched

    def raw() -> None:
        raw_sim.step()

    def adapter() -> None:
        sim.step()
        time.sleep(0.002)  # the adapter's own work, as long as the simulator's

    result = measure_overhead(
        raw, adapter, rounds=3, seconds=0.0, min_calls=2, warmup=1, inside=[(sim, "step")]
    )
    assert raw_sim.calls == sim.calls == 3 * 3  # (warmup + min_calls) a round
    assert len(result.ratio_rounds) == 3
    assert 0.15 < result.ratio < 0.9  # the adapter does the raw loop's work and as much again
    assert result.inside_fraction is not None and 0.15 < result.inside_fraction < 0.9
    raw_rate, rate = result.rates(per_call=10)
    assert raw_rate == pytest.approx(10 / result.raw_s) and rate < raw_rate
    assert "step" not in sim.__dict__  # the method is the class's again


def test_watching_puts_back_an_instance_attribute() -> None:
    sim = _Sim()
    mine = sim.step
    sim.step = mine  # type: ignore[method-assign]
    watch = Stopwatch()
    with watching(watch, [(sim, "step")]):
        assert sim.step() == 1
    assert sim.step is mine and watch.seconds > 0


def test_nothing_watched_has_no_fraction() -> None:
    result = measure_overhead(lambda: None, lambda: None, rounds=1, seconds=0.0)
    assert result.inside_fraction is None


def test_collector_loop_writes_each_groups_actions_and_goes_on_from_the_last_step() -> None:
    env = marlkit.make("navigation", num_envs=2, n_agents=2, seed=0)
    stepped: list[tuple[torch.Tensor, torch.Tensor]] = []
    step_and_maybe_reset = env.step_and_maybe_reset

    def spy(td):  # type: ignore[no-untyped-def]
        stepped.append((td["agents", "action"].clone(), td["agents", "observation"].clone()))
        out, nxt = step_and_maybe_reset(td)
        stepped.append((nxt["agents", "observation"].clone(), torch.empty(0)))
        return out, nxt

    env.step_and_maybe_reset = spy  # type: ignore[method-assign]
    drawn = [torch.full((2, 2, 2), 0.5), torch.full((2, 2, 2), -0.5)]
    step = collector_loop(env, lambda td: {"agents": drawn[len(stepped) // 2]})
    step()
    step()
    assert torch.equal(stepped[0][0], drawn[0]) and torch.equal(stepped[2][0], drawn[1])
    # The second step starts from the observation the first one returned.
    assert torch.equal(stepped[2][1], stepped[1][0])
    env.close()


def test_random_actions_draw_every_group_from_its_spec() -> None:
    env = marlkit.make("openspiel/tic_tac_toe", num_envs=3, seed=0)
    draw = random_actions(env, torch.Generator().manual_seed(0))
    td = env.reset()
    first, second = draw(td), draw(td)
    assert set(first) == set(env.group_map)
    action = first["agents"]
    assert action.shape == env.action_spec["agents", "action"].shape and action.dtype == torch.int64
    assert int(action.min()) >= 0 and int(action.max()) < 9
    assert not all(torch.equal(first[g], second[g]) for g in first)  # a fresh draw each call
    env.close()


def test_add_sweep_replaces_its_default_on_first_use() -> None:
    parser = argparse.ArgumentParser()
    add_sweep(parser, "--map-size", (16, 32), "map sizes")
    assert parser.parse_args([]).map_size == [16, 32]
    assert parser.parse_args(["--map-size", "8", "--map-size", "4"]).map_size == [8, 4]
    assert parser.parse_args(["--min-steps", "3"]).min_steps == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--map-size", "0"])
