"""``FrameWriter`` writes each group's step in one go (rewards and flags as arrays, observations
stacked into the group's array): the outputs are bit for bit those of the agent-by-agent path it
falls back to, on a simulator where every case shows up at once: agents dying (with and without a
final observation, by termination, truncation or no flag at all), agents joining mid-episode,
rewards of every number type, action masks in infos, observations in a dtype the space casts
(float64 into float32), mixed dtypes within a step, scalar (Discrete) observations and a state.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from marlkit.adapters import _dict_writer
from marlkit.adapters._dict_writer import FrameWriter
from marlkit.adapters.custom import SimulatorOutputError, from_parallel

RED = [f"red_{i}" for i in range(6)]  # Box float32 observations, no action masks
BLUE = [f"blue_{i}" for i in range(4)]  # Box int32 observations, action masks in infos
GREEN = [f"green_{i}" for i in range(3)]  # Discrete observations (scalars)
LATE = {"red_5", "blue_3", "green_2"}  # join the game at step 2


class Arena:
    """Agents of three types that die at random, some joining late; ``bad`` breaks one output
    of ``red_1`` (or ``blue_1``) on the third step (the names of ``Corridor``'s modes)."""

    possible_agents = RED + BLUE + GREEN

    def __init__(self, horizon: int = 9, bad: str | None = None):
        self.horizon, self.bad = horizon, bad
        self.rng = np.random.default_rng()
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> Any:
        if agent.startswith("red"):
            return spaces.Box(-10, 10, (3,), np.float32)
        if agent.startswith("blue"):
            return spaces.Box(0, 50, (2,), np.int32)
        return spaces.Discrete(5)

    def action_space(self, agent: str) -> Any:
        return spaces.Discrete(4)

    state_space = spaces.Box(-np.inf, np.inf, (4,), np.float64)

    def state(self) -> np.ndarray:
        return np.array([self.t, len(self.agents), self.rng.random(), -1.5])

    def reset(self, seed: int | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = [a for a in self.possible_agents if a not in LATE]
        return self._obs(self.agents), self._infos(self.agents)

    def _obs(self, agents: list[str]) -> dict[str, Any]:
        obs: dict[str, Any] = {}
        mixed = self.t % 2 == 1  # odd steps: red in float32 and float64 within one step
        for i, a in enumerate(agents):
            if a.startswith("red"):
                dtype = np.float32 if mixed and i % 2 else np.float64
                obs[a] = (self.rng.standard_normal(3) * 3).astype(dtype)
            elif a.startswith("blue"):
                obs[a] = self.rng.integers(0, 50, 2).astype(np.int32)
            else:
                obs[a] = int(self.rng.integers(0, 5))
        return obs

    def _infos(self, agents: list[str]) -> dict[str, dict]:
        infos: dict[str, dict] = {a: {} for a in agents}
        for a in agents:
            if a.startswith("blue"):
                infos[a]["action_mask"] = (self.rng.random(4) < 0.7).astype(np.int8)
        return infos

    def step(self, actions: dict[str, int]) -> Any:
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        before = list(self.agents)
        rewards: dict[str, Any] = {}
        for i, a in enumerate(before):  # every number type a simulator hands out
            value = self.rng.standard_normal()
            rewards[a] = [float(value), np.float32(value), np.float64(value), int(value * 3)][i % 4]
        terminations = dict.fromkeys(before, False)
        truncations = dict.fromkeys(before, self.t >= self.horizon)
        staying, final = [], []
        for a in before:
            fate = self.rng.random()
            if fate < 0.08:  # dies, with its final observation
                terminations[a] = True
                final.append(a)
            elif fate < 0.13:  # dies without one
                terminations[a] = np.bool_(True)
            elif fate < 0.16:  # leaves without any flag (over for it)
                pass
            elif fate < 0.19:  # cut short, with its final observation
                truncations[a] = True
                final.append(a)
            elif fate < 0.5 and a.startswith("green"):  # done, but left in the game
                terminations[a] = True
                staying.append(a)
            else:
                staying.append(a)
        # at the horizon the agents stay in the game, truncated (as some simulators do)
        self.agents = [a for a in staying if not truncations[a] or self.t >= self.horizon]
        if self.t == 2:
            self.agents += [a for a in self.possible_agents if a in LATE]
        obs = self._obs(self.agents)
        obs.update({a: v for a, v in self._obs(final).items() if a not in obs})
        if self.t == 3 and self.bad:
            self._break(obs, rewards, terminations)
        return obs, rewards, terminations, truncations, self._infos(list(obs))

    def _break(self, obs: dict, rewards: dict, terminations: dict) -> None:
        red = next((a for a in self.agents if a.startswith("red")), "red_5")
        blue = next((a for a in self.agents if a.startswith("blue")), "blue_3")
        if self.bad == "shape":
            obs[red] = np.zeros(4)
        elif self.bad == "int_overflow":
            obs[blue] = np.array([2**40, 1], np.int64)
        elif self.bad == "missing":
            obs.pop(red)
        elif self.bad == "nan":
            obs[red] = np.array([0.0, np.nan, 1.0])
        elif self.bad == "nan_reward":
            rewards[self.agents[-1]] = float("inf")
        elif self.bad == "no_reward":
            rewards.pop(next(iter(rewards)))
        elif self.bad == "text_reward":
            rewards[next(iter(rewards))] = "one"
        elif self.bad == "no_flag":
            terminations.pop(next(iter(terminations)))
        elif self.bad == "stray":
            obs["ghost"] = np.zeros(3)


@pytest.fixture(autouse=True)
def _every_group_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    """These groups (3-6 agents) are below ``BATCHED_FROM``: batch them all the same."""
    monkeypatch.setattr(_dict_writer, "BATCHED_FROM", 1)


def _by_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every group written agent by agent (the path the writer had before it batched)."""
    monkeypatch.setattr(FrameWriter, "_write_group", lambda *args, **kwargs: None)


def _rollout(num_envs: int, steps: int) -> list[Any]:
    env = from_parallel(Arena, num_envs=num_envs, seed=3, illegal_actions="mask")
    writer, overs = env._writer, []
    write_step = writer.write_step

    def write_and_record(env_index: int, *args: Any) -> None:
        write_step(env_index, *args)
        overs.append(bool(writer.over[env_index]))  # whether the next step leaves it still
        flags = [  # over: every agent in the game done, read from the flags written
            writer.terminated[group][env_index, index] or writer.truncated[group][env_index, index]
            for group, index in map(writer.slots.__getitem__, writer.present[env_index])
        ]
        assert overs[-1] == all(flags)

    writer.write_step = write_and_record  # type: ignore[method-assign]
    torch.manual_seed(0)
    td = env.reset()
    outs = [td.clone()]
    for _ in range(steps):
        out, td = env.step_and_maybe_reset(env.rand_action(td))
        outs.append(out.clone())
    return [*outs, torch.tensor(overs)]


def _assert_bitwise_equal(got: list[Any], expected: list[Any]) -> None:
    assert torch.equal(got[-1], expected[-1])  # the writer's own episode-over flags
    got, expected = got[:-1], expected[:-1]
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        keys = sorted(a.keys(True, True), key=str)
        assert keys == sorted(b.keys(True, True), key=str), step
        for key in keys:
            x, y = a[key], b[key]
            assert x.dtype == y.dtype and x.shape == y.shape, (step, key)
            same = x.view(torch.uint8) if x.dtype != torch.bool else x
            other = y.view(torch.uint8) if y.dtype != torch.bool else y
            assert torch.equal(same, other), (step, key)


def test_a_batched_step_writes_what_agent_by_agent_writes(monkeypatch: pytest.MonkeyPatch):
    calls = []
    by_agent = FrameWriter._write_group_by_agent

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[2])
        return by_agent(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(FrameWriter, "_write_group_by_agent", counted)
        batched = _rollout(num_envs=3, steps=40)
    assert calls == []  # every group of every step went in one go
    with monkeypatch.context() as patch:
        _by_agent(patch)
        expected = _rollout(num_envs=3, steps=40)
    _assert_bitwise_equal(batched, expected)
    # the rollout went through every case: deaths mid-episode, late joiners, episode ends
    batched = batched[:-1]
    nxt = torch.stack([out["next", "red", "mask"] for out in batched[1:]])
    assert (~nxt).any() and nxt.any()
    assert any(bool(out["next", "done"].any()) for out in batched[1:])
    masks = torch.stack([out["next", "blue", "action_mask"] for out in batched[1:]])
    assert not masks.all()


@pytest.mark.parametrize(
    "bad",
    [
        "shape",
        "int_overflow",
        "missing",
        "nan",
        "nan_reward",
        "no_reward",
        "text_reward",
        "no_flag",
        "stray",
    ],
)
def test_errors_are_those_of_the_agent_by_agent_path(monkeypatch: pytest.MonkeyPatch, bad: str):
    def failure() -> str:
        env = from_parallel(lambda: Arena(bad=bad), seed=5, illegal_actions="mask")
        torch.manual_seed(0)
        td = env.reset()
        with pytest.raises(SimulatorOutputError) as info:
            for _ in range(3):
                _, td = env.step_and_maybe_reset(env.rand_action(td))
        return str(info.value)

    message = failure()
    with monkeypatch.context() as patch:
        _by_agent(patch)
        assert failure() == message
