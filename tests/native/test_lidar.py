"""The LiDAR kernel: C++ (uniform grid) vs torch twin, VMAS's own Lidar on the same positions,
hand-made cases (overlaps, discs behind, exactly at range, one ray), bad input, threads."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from marlkit.native import (
    get_min_work_per_thread,
    load_extension,
    set_min_work_per_thread,
    set_num_threads,
)
from marlkit.native.lidar import lidar, lidar_angles, lidar_torch

BACKENDS = ["native", "torch"]


@pytest.fixture
def threads() -> Iterator[None]:
    """Split even these small calls over the threads (the default keeps them on one thread);
    restores the thread settings after the test."""
    default = get_min_work_per_thread()
    set_min_work_per_thread(64)
    yield
    set_num_threads(0)
    set_min_work_per_thread(default)


def _world(e: int, n: int, seed: int, half: float) -> torch.Tensor:
    """Random centres in ``[-half, half]^2``; agent 1 overlaps agent 0, agent 2 sits exactly
    ``max_range + r`` ahead of agent 0 along ray 0, agent 3 coincides with agent 0."""
    g = torch.Generator().manual_seed(seed)
    pos = (torch.rand(e, n, 2, generator=g) * 2 - 1) * half
    if n > 1:
        pos[:, 1] = pos[:, 0] + torch.tensor([0.05, 0.03])
    if n > 2:
        pos[:, 2] = pos[:, 0] + torch.tensor([0.35 + 0.1, 0.0])
    if n > 3:
        pos[:, 3] = pos[:, 0]
    return pos


# ---- agreement ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("e", "n"), [(16, 4), (8, 64), (1, 1024), (3, 25)])
@pytest.mark.parametrize("n_rays", [1, 12, 7])
def test_native_agrees_with_torch(e: int, n: int, n_rays: int) -> None:
    # The density of VMAS's navigation spawning (agents in [-0.5 sqrt(n), 0.5 sqrt(n)]^2) and a
    # crowded one, so that the grid's cells hold several agents.
    for half in (max(1.0, 0.5 * math.sqrt(n)), 0.15 * math.sqrt(n)):
        pos = _world(e, n, seed=n + n_rays, half=half)
        native = lidar(pos, n_rays, 0.35, 0.1, backend="native")
        twin = lidar_torch(pos, n_rays, 0.35, 0.1)
        assert native.shape == (e, n, n_rays) and native.dtype == torch.float32
        torch.testing.assert_close(native, twin, atol=1e-5, rtol=0.0)
        assert torch.equal(native, twin)  # the same float32 operations: bit for bit
        assert (native < 0.35).any() and (native == 0.35).any()
        assert (native < 0).any()  # the overlapping pair reads negative
        assert native.min() >= -0.1 and native.max() <= torch.tensor(0.35)


def test_auto_is_native_on_cpu_and_torch_has_the_same_defaults() -> None:
    pos = _world(4, 30, seed=3, half=1.0)
    assert torch.equal(lidar(pos), lidar(pos, backend="native"))
    assert torch.equal(lidar(pos, backend="torch"), lidar_torch(pos))
    assert lidar(pos).shape == (4, 30, 12)  # VMAS's 12 rays by default


def test_threads_give_identical_results(threads: None) -> None:
    results = []
    for n_threads in (1, 2):
        set_num_threads(n_threads)
        # 1 env of 1500 agents: fewer envs than threads, so the env is split over the pool.
        results.append(
            [lidar(_world(e, n, seed=1, half=6.0), 12, 0.35, 0.1) for e, n in ((64, 16), (1, 1500))]
        )
    for a, b in zip(*results):
        assert torch.equal(a, b)


# ---- VMAS's own Lidar --------------------------------------------------------------------------


def _vmas_navigation(e: int, n: int, **kwargs: Any) -> Any:
    vmas = pytest.importorskip("vmas")
    with warnings.catch_warnings():  # VMAS imports the retired gym, which warns
        warnings.simplefilter("ignore")
        spawn = max(1.0, 0.5 * math.sqrt(n))
        env = vmas.make_env(
            "navigation",
            num_envs=e,
            device="cpu",
            n_agents=n,
            seed=0,
            world_spawning_x=spawn,
            world_spawning_y=spawn,
            **kwargs,
        )
        env.reset()
    return env


@pytest.mark.parametrize(
    ("e", "n", "kwargs"), [(32, 4, {}), (4, 20, {}), (8, 6, {"n_lidar_rays": 1})]
)
def test_matches_vmas_lidar(e: int, n: int, kwargs: dict) -> None:
    env = _vmas_navigation(e, n, **kwargs)
    scenario = env.scenario
    pos = _world(e, n, seed=n, half=0.4 * math.sqrt(n))
    for i, agent in enumerate(env.world.agents):
        agent.set_pos(pos[:, i], batch_index=None)
    expected = torch.stack([agent.sensors[0].measure() for agent in env.world.agents], dim=1)
    ours = lidar(pos, scenario.n_lidar_rays, scenario.lidar_range, scenario.agent_radius)
    assert ours.shape == expected.shape == (e, n, scenario.n_lidar_rays)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0.0)
    assert (expected < 0).any() and (expected < scenario.lidar_range).float().mean() > 0.1
    angles = env.world.agents[0].sensors[0]._angles[0]
    assert torch.equal(lidar_angles(scenario.n_lidar_rays), angles)


# ---- hand-made cases ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_readings_by_hand(backend: str) -> None:
    r, rng = 0.1, 0.35
    # Agent 0 at the origin, rays along +x, +y, -x, -y. Agent 1 on ray 0, its near side at 0.2.
    # Agent 2 ahead on ray 1, 0.06 off its line: crossed at 0.3 - sqrt(r^2 - 0.06^2) = 0.22.
    # Agent 3 on ray 2 beyond range (its near side at 0.4). Nobody on ray 3.
    pos = torch.tensor([[[0.0, 0.0], [0.3, 0.0], [0.06, 0.3], [-0.5, 0.0]]])
    out = lidar(pos, 4, rng, r, backend=backend)
    expected_0 = [0.2, 0.3 - math.sqrt(r * r - 0.06**2), rng, rng]
    torch.testing.assert_close(out[0, 0], torch.tensor(expected_0), atol=1e-6, rtol=0)
    # Agent 1 sees agent 0 on ray 2 (-x) at 0.2; agent 2, at (-0.24, 0.3) from it, is more than
    # r off the lines of rays 1 and 2.
    torch.testing.assert_close(out[0, 1], torch.tensor([rng, rng, 0.2, rng]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inside_a_disc_reads_negative_in_front_only(backend: str) -> None:
    # Agent 1 overlaps agent 0, its centre 0.05 along +x. Three rays (0, 2 pi / 3, 4 pi / 3):
    # agent 0's ray 0 reads 0.05 - 0.1 = -0.05; its other rays have agent 1's centre behind
    # (t < 0) and read max_range, as in VMAS. Agent 1 has agent 0's centre in front of its rays
    # 1 and 2 (t = 0.025, off their lines by 0.05 sin(2 pi / 3)).
    pos = torch.tensor([[[0.0, 0.0], [0.05, 0.0]]])
    out = lidar(pos, 3, 0.35, 0.1, backend=backend)
    inside = 0.025 - math.sqrt(0.01 - (0.05 * math.sin(2 * math.pi / 3)) ** 2)
    expected = torch.tensor([[-0.05, 0.35, 0.35], [0.35, inside, inside]])
    torch.testing.assert_close(out[0], expected, atol=1e-6, rtol=0)
    # Coincident centres: t = 0 on every ray, nothing is in front.
    same = lidar(torch.zeros(1, 2, 2), 12, 0.35, 0.1, backend=backend)
    assert torch.equal(same, torch.full((1, 2, 12), torch.tensor(0.35).item()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_exactly_at_range_and_clamp(backend: str) -> None:
    # A disc whose near side is exactly max_range away reads max_range; a bit closer reads less;
    # farther, or off every ray, reads max_range (never more).
    for x, expected in ((0.45, 0.35), (0.44, 0.34), (0.9, 0.35)):
        pos = torch.tensor([[[0.0, 0.0], [x, 0.0]]])
        out = lidar(pos, 1, 0.35, 0.1, backend=backend)
        torch.testing.assert_close(out[0, 0, 0], torch.tensor(expected), atol=1e-6, rtol=0)
        assert out[0, 1, 0] == torch.tensor(0.35)  # agent 1's single ray points away (+x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_agent_and_empty_batches(backend: str) -> None:
    assert torch.equal(
        lidar(torch.zeros(3, 1, 2), 5, 0.5, 0.1, backend=backend), torch.full((3, 1, 5), 0.5)
    )
    assert lidar(torch.zeros(0, 4, 2), 3, backend=backend).shape == (0, 4, 3)
    assert lidar(torch.zeros(2, 0, 2), 3, backend=backend).shape == (2, 0, 3)


# ---- bad input ---------------------------------------------------------------------------------

BAD = [
    (
        dict(pos=torch.zeros(2, 3, 2).double()),
        ValueError,
        r"lidar: pos must be a float32 .*float64",
    ),
    (dict(pos=torch.zeros(2, 3)), ValueError, r"pos must be a float32 .*\[E, N, 2\].*got shape"),
    (dict(pos=np.zeros((2, 3, 2), np.float32)), TypeError, r"pos must be a float32 tensor .*nd"),
    (dict(n_rays=0), ValueError, r"n_rays must be an int >= 1, got 0"),
    (dict(n_rays=2.0), TypeError, r"lidar: n_rays must be an int >= 1, got float: 2\.0"),
    (dict(max_range=0.0), ValueError, r"max_range must be a finite number > 0, got 0"),
    (dict(max_range=math.inf), ValueError, r"max_range must be a finite number > 0, got inf"),
    (dict(radius=-0.1), ValueError, r"radius must be a finite number > 0, got -0.1"),
    (dict(radius="big"), TypeError, r"lidar: radius must be a number, got str: 'big'"),
    (dict(backend="gpu"), ValueError, r"backend must be one of"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD)
@pytest.mark.parametrize("backend", BACKENDS)
def test_rejects_bad_input(kwargs: dict, error: type, match: str, backend: str) -> None:
    args = dict(pos=torch.zeros(2, 3, 2), n_rays=4, max_range=0.35, radius=0.1, backend=backend)
    with pytest.raises(error, match=match):
        lidar(**{**args, **kwargs})


@pytest.mark.parametrize("backend", BACKENDS)
def test_rejects_non_finite_positions(backend: str) -> None:
    pos = torch.zeros(2, 30, 2)
    pos[1, 7, 1] = math.nan
    pos[1, 9, 0] = math.inf
    with pytest.raises(ValueError, match=r"pos must be finite, got nan at pos\[1, 7, 1\]"):
        lidar(pos, 4, backend=backend)
    with pytest.raises(ValueError, match=r"pos .*contiguous"):
        lidar(torch.zeros(2, 2, 3).transpose(1, 2), 4, backend="native")


def test_c_lidar_rejects_bad_arrays() -> None:
    c = load_extension()
    pos, angles = np.zeros((2, 3, 2), np.float32), lidar_angles(4).numpy()
    out = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(
        TypeError,
        match=r"lidar: pos must be a float32 array of shape \[E, N, 2\], got an object of type",
    ):
        c.lidar([[0.0, 0.0]], angles, 0.35, 0.1, out)
    with pytest.raises(
        ValueError, match=r"lidar: pos must be .*\[E, N, 2\], got shape \[2, 3, 3\]"
    ):
        c.lidar(np.zeros((2, 3, 3), np.float32), angles, 0.35, 0.1, out)
    with pytest.raises(ValueError, match=r"pos must be a float32 array .*got dtype float64"):
        c.lidar(pos.astype(np.float64), angles, 0.35, 0.1, out)
    with pytest.raises(ValueError, match=r"out must be a float32 array .*\[2, 3, 4\], got shape"):
        c.lidar(pos, angles, 0.35, 0.1, np.zeros((2, 3, 5), np.float32))
    with pytest.raises(ValueError, match=r"angles must be a float32 array .*got dtype float64"):
        c.lidar(pos, angles.astype(np.float64), 0.35, 0.1, out)
    with pytest.raises(ValueError, match=r"angles must be .*\[R\], got shape \[2, 2\]"):
        c.lidar(pos, np.zeros((2, 2), np.float32), 0.35, 0.1, out)
    with pytest.raises(TypeError, match=r"angles must be .*got an object of type list"):
        c.lidar(pos, [0.0], 0.35, 0.1, out)
    with pytest.raises(ValueError, match=r"n_rays must be an int >= 1, got 0"):
        c.lidar(pos, np.zeros(0, np.float32), 0.35, 0.1, np.zeros((2, 3, 0), np.float32))
    with pytest.raises(ValueError, match=r"angles must be finite, got nan at angles\[2\]"):
        c.lidar(pos, np.array([0, 1, np.nan, 2], np.float32), 0.35, 0.1, out)
    with pytest.raises(ValueError, match=r"out is written in place and must not share memory"):
        c.lidar(pos, angles[:2].copy(), 0.35, 0.1, pos)
    read_only = out.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"out must be .*writeable"):
        c.lidar(pos, angles, 0.35, 0.1, read_only)
    out[:] = 7.0
    with pytest.raises(ValueError, match=r"radius must be a finite number > 0, got nan"):
        c.lidar(pos, angles, 0.35, math.nan, out)
    assert (out == 7.0).all()  # nothing written on error


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_twin_matches_the_kernel() -> None:
    pos = _world(4, 64, seed=2, half=1.2)
    cpu = lidar(pos, 12, 0.35, 0.1, backend="native")
    gpu = lidar(pos.cuda(), 12, 0.35, 0.1)  # "auto" on a CUDA tensor: the torch twin
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-5, rtol=0)
