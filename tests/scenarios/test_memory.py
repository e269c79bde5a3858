"""The native scenarios refuse a batch that would not fit in memory before they allocate it."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

import marlkit
import marlkit.envs._memory as memory
from marlkit.envs._memory import spec_bytes_per_env
from marlkit.scenarios import NavigationEnv, PredatorPreyEnv, SwarmEnv

SCENARIOS = {"navigation": NavigationEnv, "swarm": SwarmEnv, "predator_prey": PredatorPreyEnv}
#: The message of a refused batch: the count, the estimate, what is available, what fits.
REFUSED = (
    r"with num_envs={n} would need at least about [\d.]+ [KMGTPEZY]iB \([\d.]+ [KM]iB per env: "
    r"4 x the [\d,]+ bytes its specs hold(, and [\d.]+ (bytes|KiB) of the torch backend's "
    r"dense pair tensors)?\), more than the [\d.]+ [KMGT]iB available: at most [\d,]+ envs fit"
)


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("backend", ["native", "torch"])
@pytest.mark.parametrize("num_envs", [10**9, 2**63])
def test_absurd_num_envs_is_refused_at_once(name: str, backend: str, num_envs: int) -> None:
    # before: torch's allocator failed deep inside (or a spec said its bounds do not broadcast),
    # or, where the kernel overcommits, the batch ate the machine's memory
    start = time.perf_counter()
    with pytest.raises(ValueError, match=REFUSED.format(n=num_envs)):
        marlkit.make(name, num_envs=num_envs, backend=backend)
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_constructors_refuse_too(name: str) -> None:
    with pytest.raises(ValueError, match=REFUSED.format(n=10**9)):
        SCENARIOS[name](num_envs=10**9)


@pytest.mark.parametrize(
    ("name", "kwargs", "owner"),
    [
        ("navigation", {"n_agents": 10**9}, r"NavigationEnv\(n_agents=1000000000\)"),
        ("swarm", {"n_agents": 2**63}, r"SwarmEnv\(n_agents=9223372036854775808\)"),
        (
            "predator_prey",
            {"n_prey": 10**9},
            r"PredatorPreyEnv\(n_predators=3, n_prey=1000000000, n_landmarks=2\)",
        ),
    ],
)
def test_absurd_agent_counts_are_refused_at_once(
    name: str, kwargs: dict[str, Any], owner: str
) -> None:
    # before: a list of 10**9 agent names was built (minutes) before anything was allocated
    start = time.perf_counter()
    with pytest.raises(ValueError, match=rf"^{owner} with num_envs=1 .* not even one env fits$"):
        marlkit.make(name, num_envs=1, **kwargs)
    assert time.perf_counter() - start < 2.0


def test_the_torch_backend_counts_its_pair_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    # one world of 20,000 agents: 5.1 MiB estimated from its specs, but the torch twins' dense
    # [N, N] pair tensors take gigabytes, which the C++ kernels never hold
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": 2**30)
    kwargs = {"num_envs": 1, "n_agents": 20_000, "k_nearest": 1}
    with pytest.raises(
        ValueError,
        match=r"with num_envs=1 would need at least about 8\.9 GiB \(8\.9 GiB per env: 4 x the "
        r"1,340,003 bytes its specs hold, and 8\.9 GiB of the torch backend's dense pair "
        r"tensors\), more than the 1\.0 GiB available: not even one env fits",
    ):
        SwarmEnv(backend="torch", **kwargs)
    assert SwarmEnv(backend="native", **kwargs).n_agents == 20_000


def test_the_estimate_and_what_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    # navigation's defaults hold 351 bytes of specs per env: 4 x 351 = 1,404 bytes per env
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": 10 * 2**20)
    assert NavigationEnv(num_envs=7468).num_envs == 7468
    with pytest.raises(
        ValueError,
        match=r"^NavigationEnv\(n_agents=4\) with num_envs=7469 would need at least about 10\.0 "
        r"MiB \(1\.4 KiB per env: 4 x the 351 bytes its specs hold\), more than the 10\.0 MiB "
        r"available: at most 7,468 envs fit$",
    ):
        NavigationEnv(num_envs=7469)
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": None)
    assert NavigationEnv(num_envs=7469).num_envs == 7469  # unknown: nothing is refused


def test_a_large_batch_that_fits_is_still_made() -> None:
    env = marlkit.make("navigation", num_envs=100_000, seed=0)
    assert env.reset()["agents", "observation"].shape == (100_000, 4, 12)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("navigation", {}),
        ("navigation", {"continuous_actions": False, "group_map": "per_agent", "n_agents": 3}),
        ("navigation", {"obs_mode": "lidar", "n_lidar_rays": 7, "n_agents": 5}),
        ("swarm", {"k_nearest": 3, "n_agents": 9}),
        ("swarm", {"obs_mode": "lidar", "continuous_actions": False}),
        ("predator_prey", {}),
        (
            "predator_prey",
            {"continuous_actions": False, "n_landmarks": 0, "group_map": "per_agent"},
        ),
        ("predator_prey", {"n_predators": 1, "n_prey": 6, "k_nearest_prey": 9}),
    ],
)
def test_the_estimate_counts_what_the_specs_hold(name: str, kwargs: dict[str, Any]) -> None:
    # the bytes worked out before the specs exist are those the specs then hold
    env = marlkit.make(name, num_envs=3, **kwargs)
    assert env._spec_bytes_per_env() == spec_bytes_per_env(env)


def test_bad_counts_are_still_named_first() -> None:
    with pytest.raises(ValueError, match=re.escape("num_envs must be an int >= 1, got -1")):
        NavigationEnv(num_envs=-1)
    with pytest.raises(
        TypeError, match=re.escape("num_envs must be an int >= 1, got float: 1e+18")
    ):
        SwarmEnv(num_envs=1e18)
    with pytest.raises(ValueError, match=re.escape("n_prey must be an int >= 1, got 0")):
        PredatorPreyEnv(num_envs=10**9, n_prey=0)
