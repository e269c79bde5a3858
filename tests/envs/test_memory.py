"""A batch of envs that would not fit in memory is refused before it is made, by every built-in
family through ``marlkit.make``, with one message: the count, the estimate, the memory available
and the most envs that fit (``marlkit.envs._memory``)."""

from __future__ import annotations

import pathlib
import time
from typing import Any

import numpy as np
import pytest

import marlkit
import marlkit.envs._memory as memory
from marlkit.envs._memory import (
    PROBE_ENVS,
    available_memory,
    check_batch_memory,
    check_on_probe,
    format_bytes,
)

#: One env of each built-in family, with the simulator it needs.
FAMILIES = [
    ("navigation", None),
    ("swarm", None),
    ("predator_prey", None),
    ("vmas/balance", "vmas"),
    ("pettingzoo/mpe2.simple_spread_v3", "mpe2"),
    ("gymnasium/CartPole-v1", "gymnasium"),
    ("mujoco/ant_2x4", "mujoco"),
]


@pytest.mark.parametrize(("name", "needs"), FAMILIES)
@pytest.mark.parametrize("num_envs", [10**9, 2**63])
def test_make_refuses_an_absurd_batch_at_once(name: str, needs: str | None, num_envs: int) -> None:
    # before: each died deep inside after seconds (torch's allocator, MuJoCo's FatalError,
    # pygame's "Out of memory", a MemoryError in gymnasium.make_vec), or, where the kernel
    # overcommits, ate the machine's memory first
    if needs is not None:
        pytest.importorskip(needs)
    start = time.perf_counter()
    with pytest.raises(ValueError) as caught:
        marlkit.make(name, num_envs=num_envs)
    assert time.perf_counter() - start < 2.0
    message = str(caught.value)
    assert f" with num_envs={num_envs} would need at least about " in message, message
    assert " per env: 4 x the " in message and " bytes its specs hold" in message, message
    assert " available: at most " in message and message.endswith(" envs fit"), message


class _Counter:
    """A one-agent simulator (PettingZoo-parallel style) that counts how many were made."""

    made = 0
    possible_agents = ["agent_0"]

    def __init__(self) -> None:
        type(self).made += 1

    def observation_space(self, agent: str) -> Any:
        from gymnasium import spaces

        return spaces.Box(-1.0, 1.0, (3,), np.float32)

    def action_space(self, agent: str) -> Any:
        from gymnasium import spaces

        return spaces.Discrete(2)

    def reset(self, seed: int | None = None) -> tuple[dict, dict]:
        return {"agent_0": np.zeros(3, np.float32)}, {}

    def step(self, actions: dict) -> Any:
        obs, _ = self.reset()
        return obs, {"agent_0": 0.0}, {"agent_0": False}, {"agent_0": False}, {}


def test_from_parallel_makes_one_probe_not_the_batch() -> None:
    pytest.importorskip("gymnasium")
    from marlkit.adapters.custom import from_parallel

    _Counter.made = 0
    with pytest.raises(
        ValueError,
        match=r"^from_parallel with num_envs=1000000000 would need at least about 115\.5 GiB "
        r"\(124 bytes per env: 4 x the 31 bytes its specs hold, measured on one env\)",
    ):
        from_parallel(_Counter, num_envs=10**9)
    assert _Counter.made == 1  # the probe
    assert from_parallel(_Counter, num_envs=PROBE_ENVS + 1).num_envs == PROBE_ENVS + 1


def test_pettingzoo_and_mujoco_constructors_refuse_too() -> None:
    pytest.importorskip("mpe2")
    pytest.importorskip("mujoco")
    from mpe2 import simple_spread_v3

    from marlkit.adapters.mujoco import MultiAgentMujocoEnv
    from marlkit.adapters.pettingzoo import PettingZooEnv

    with pytest.raises(ValueError, match=r"^PettingZooEnv with num_envs=1000000000 would need"):
        PettingZooEnv(simple_spread_v3.parallel_env, num_envs=10**9)
    # MuJoCo's own state counts too: an MjData's buffer and the arena it used
    with pytest.raises(
        ValueError,
        match=r"^mujoco/ant_2x4 with num_envs=9223372036854775808 .* 4 x the 973 bytes its specs "
        r"hold, and [\d.]+ KiB of the simulator's own, measured on one env\)",
    ):
        MultiAgentMujocoEnv("ant_2x4", 2**63)


def test_the_message_names_count_estimate_available_and_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": 3 * 2**30)
    check_batch_memory("Sim", 3 * 2**20, 1024.0)  # exactly what is available: fits
    with pytest.raises(
        ValueError,
        match=r"^Sim with num_envs=3145729 would need at least about 3\.0 GiB \(1\.0 KiB per "
        r"env: how\), more than the 3\.0 GiB available: at most 3,145,728 envs fit$",
    ):
        check_batch_memory("Sim", 3 * 2**20 + 1, 1024.0, basis="how")
    with pytest.raises(ValueError, match=r"^Sim with --envs=1 .* not even one env fits$"):
        check_batch_memory("Sim", 1, 4 * 2**30, count="--envs")
    with pytest.raises(ValueError, match=r"available on cuda:0: at most 3 envs fit$"):
        check_batch_memory("Sim", 4, 2**30, "cuda:0")


def test_available_memory(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  2000 kB\nMemFree:  10 kB\nMemAvailable:  1500 kB\n")
    monkeypatch.setattr(memory, "_MEMINFO", meminfo)
    assert available_memory() == available_memory("cpu") == 1500 * 1024
    monkeypatch.setattr(memory, "_MEMINFO", tmp_path / "none")  # not Linux
    assert available_memory() is None
    assert available_memory("meta") is None  # no memory to speak of
    assert available_memory("tpu9") is None  # not a device: the env says so itself


def test_no_probe_for_small_batches_or_unknown_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe() -> Any:
        raise AssertionError("no probe should be made")

    check_on_probe("Sim", PROBE_ENVS, probe)  # making the batch costs what a probe would
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": None)
    check_on_probe("Sim", 10**9, probe, device="cpu")


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (100, "100 bytes"),
        (1536, "1.5 KiB"),
        (3 * 2**30, "3.0 GiB"),
        (2**63 * 1404, "11.0 ZiB"),
        (2**100, "1048576.0 YiB"),
    ],
)
def test_format_bytes(count: float, text: str) -> None:
    assert format_bytes(count) == text
