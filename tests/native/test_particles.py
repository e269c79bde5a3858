"""The particle-world kernels: C++ (uniform grids) vs torch twin agreement, physics sanity,
landmarks and inactive agents, kNN exactness on hard layouts, bad input, threads and the pool."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
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
from marlkit.native.particles import knn, knn_torch, particle_step, particle_step_torch

PARAMS: dict[str, Any] = dict(
    radius=0.05, mass=1.0, drag=0.25, dt=0.1, substeps=4, stiffness=100.0, half_extent=1.0
)


@pytest.fixture
def threads() -> Iterator[None]:
    """Split even these small calls over the threads (the default keeps them on one thread);
    restores the thread settings after the test."""
    default = get_min_work_per_thread()
    set_min_work_per_thread(64)
    yield
    set_num_threads(0)
    set_min_work_per_thread(default)


def _world(e: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    """Random ``pos`` / ``vel`` ``[E, N, 2]``; agents 0, 1 (and 2) overlap from the start."""
    g = torch.Generator().manual_seed(seed)
    pos = (torch.rand(e, n, 2, generator=g) * 2 - 1) * 0.9
    pos[:, 1] = pos[:, 0] + 0.03
    if n > 2:
        pos[:, 2] = pos[:, 0]  # coincident centres: the (+-1, 0) normal
    vel = torch.randn(e, n, 2, generator=g) * 0.1
    return pos, vel, g


def _run_agreement(e: int, n: int, steps: int, seed: int, params: dict[str, Any]) -> int:
    pos, vel, g = _world(e, n, seed)
    pos_t, vel_t = pos.clone(), vel.clone()
    total_contacts = 0
    for _ in range(steps):
        force = torch.rand(e, n, 2, generator=g) * 2 - 1
        contacts = particle_step(pos, vel, force, backend="native", **params)
        contacts_t = particle_step_torch(pos_t, vel_t, force, **params)
        torch.testing.assert_close(pos, pos_t, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(vel, vel_t, atol=1e-5, rtol=1e-5)
        assert torch.equal(contacts, contacts_t)
        total_contacts += int(contacts.sum())
    return total_contacts


# ---- agreement ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "radius"), [(4, 0.2), (64, 0.05)])
def test_step_agrees_with_torch(n: int, radius: float) -> None:
    contacts = _run_agreement(8, n, 100, seed=n, params=dict(PARAMS, radius=radius))
    assert contacts > 0  # the contact forces were exercised


@pytest.mark.slow  # the dense [1, 1024, 1024] torch twin: 5-11 s on a loaded 2-core machine
def test_step_agrees_with_torch_n1024() -> None:
    contacts = _run_agreement(1, 1024, 20, seed=3, params=dict(PARAMS, radius=0.02))
    assert contacts > 0


@pytest.mark.parametrize("n", [4, 64, 1024])
@pytest.mark.parametrize("finite", [False, True])
def test_knn_agrees_with_torch(n: int, finite: bool) -> None:
    e = 1 if n == 1024 else 8
    # Finite radii leave some slots empty and fill others (about 1.6 neighbours at N = 1024).
    radius = {4: 0.6, 64: 0.2, 1024: 0.04}[n] if finite else math.inf
    pos, _, _ = _world(e, n, seed=n)
    k = min(n - 1, 8)
    rel, idx = knn(pos, k, radius=radius, backend="native")
    rel_t, idx_t = knn_torch(pos, k, radius=radius)
    assert rel.shape == (e, n, k, 2) and rel.dtype == torch.float32
    assert idx.shape == (e, n, k) and idx.dtype == torch.int64
    assert torch.equal(idx, idx_t)
    torch.testing.assert_close(rel, rel_t, atol=0.0, rtol=0.0)
    if finite:
        missing = idx == -1
        assert missing.any() and (~missing).any()
        assert torch.equal(rel[missing], torch.zeros_like(rel[missing]))
    else:
        assert (idx >= 0).all()


@pytest.mark.parametrize("k", [33, 63])  # above 32 the kernel sorts instead of inserting
@pytest.mark.parametrize("radius", [math.inf, 0.5])
def test_knn_agrees_with_torch_large_k(k: int, radius: float) -> None:
    pos, _, _ = _world(4, 64, seed=5)
    pos[:, 3] = pos[:, 4]  # a tie in distance for everyone
    rel, idx = knn(pos, k, radius=radius, backend="native")
    rel_t, idx_t = knn_torch(pos, k, radius=radius)
    assert torch.equal(idx, idx_t)
    assert torch.equal(rel, rel_t)


def test_knn_order_and_ties() -> None:
    # Agent 0 at the origin; 1, 2, 3 at the same distance 0.5; 4 farther; 5 coincident with 0.
    pts = [[0.0, 0.0], [0.0, 0.5], [-0.5, 0.0], [0.5, 0.0], [0.0, -0.75], [0.0, 0.0]]
    pos = torch.tensor([pts], dtype=torch.float32)
    for backend in ("native", "torch"):
        rel, idx = knn(pos, 5, radius=0.6, backend=backend)
        assert idx[0, 0].tolist() == [5, 1, 2, 3, -1]
        assert rel[0, 0].tolist() == [[0.0, 0.0], [0.0, 0.5], [-0.5, 0.0], [0.5, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_knn_k_zero_and_empty_batches(backend: str) -> None:
    rel, idx = knn(torch.zeros(3, 4, 2), 0, backend=backend)
    assert rel.shape == (3, 4, 0, 2) and idx.shape == (3, 4, 0)
    rel, idx = knn(torch.zeros(0, 4, 2), 2, backend=backend)
    assert rel.shape == (0, 4, 2, 2) and idx.shape == (0, 4, 2)
    contacts = particle_step(
        torch.zeros(0, 4, 2), torch.zeros(0, 4, 2), torch.zeros(0, 4, 2), backend=backend, **PARAMS
    )
    assert contacts.shape == (0, 4) and contacts.dtype == torch.int32


def test_auto_backend_is_native_on_cpu() -> None:
    pos, vel, g = _world(4, 16, seed=1)
    force = torch.rand(4, 16, 2, generator=g)
    pos_n, vel_n = pos.clone(), vel.clone()
    data_ptr = pos.data_ptr()
    contacts = particle_step(pos, vel, force, **PARAMS)
    contacts_n = particle_step(pos_n, vel_n, force, backend="native", **PARAMS)
    assert pos.data_ptr() == data_ptr  # updated in place
    assert torch.equal(pos, pos_n) and torch.equal(vel, vel_n) and torch.equal(contacts, contacts_n)


# ---- physics sanity ----------------------------------------------------------------------------

BACKENDS = ["native", "torch"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_free_agent_accelerates_along_force(backend: str) -> None:
    pos, vel = torch.zeros(1, 1, 2), torch.zeros(1, 1, 2)
    force = torch.tensor([[[0.6, -0.8]]])
    speeds = []
    for _ in range(5):
        particle_step(pos, vel, force, backend=backend, **dict(PARAMS, half_extent=10.0))
        speeds.append(float(vel.norm()))
        direction = vel[0, 0] / vel[0, 0].norm()
        torch.testing.assert_close(direction, force[0, 0])
        torch.testing.assert_close(pos[0, 0] / pos[0, 0].norm(), force[0, 0])
    assert speeds == sorted(speeds) and speeds[0] > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("offset", [0.06, 0.0])
def test_overlapping_agents_are_pushed_apart(backend: str, offset: float) -> None:
    pos = torch.tensor([[[0.0, 0.0], [offset, 0.0]]])
    vel, force = torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)
    distance = offset
    contacts = particle_step(pos, vel, force, backend=backend, **PARAMS)
    for _ in range(10):
        new_distance = float((pos[0, 1] - pos[0, 0]).norm())
        if new_distance >= 2 * PARAMS["radius"]:
            break
        assert new_distance > distance
        distance = new_distance
        contacts = particle_step(pos, vel, force, backend=backend, **PARAMS)
    assert float((pos[0, 1] - pos[0, 0]).norm()) > max(offset, 0.09)
    assert contacts.shape == (1, 2)
    # Equal and opposite forces: the centre of mass does not move.
    torch.testing.assert_close(pos.sum(dim=1), torch.tensor([[offset, 0.0]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bounds_hold(backend: str) -> None:
    g = torch.Generator().manual_seed(7)
    pos = (torch.rand(4, 16, 2, generator=g) * 2 - 1) * 0.9
    vel = torch.zeros(4, 16, 2)
    lim = torch.tensor(PARAMS["half_extent"]) - torch.tensor(PARAMS["radius"])  # float32
    force = torch.sign(torch.rand(4, 16, 2, generator=g) - 0.5) * 5.0  # hard into the walls
    for step in range(30):
        particle_step(pos, vel, force, backend=backend, **PARAMS)
        assert bool((pos.abs() <= lim).all())
        if step > 10:
            assert bool((pos.abs() == lim).any())


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_drag_no_force_keeps_velocity(backend: str) -> None:
    pos = torch.tensor([[[-0.5, 0.0], [0.5, 0.2]]])
    vel = torch.tensor([[[0.1, 0.05], [-0.2, 0.0]]])
    vel0 = vel.clone()
    contacts = particle_step(
        pos, vel, torch.zeros(1, 2, 2), backend=backend, **dict(PARAMS, drag=0.0)
    )
    assert torch.equal(vel, vel0)
    torch.testing.assert_close(pos, torch.tensor([[[-0.49, 0.005], [0.48, 0.2]]]))
    assert contacts.tolist() == [[0, 0]]


# ---- bad input ---------------------------------------------------------------------------------


def _state(e: int = 2, n: int = 3) -> list[torch.Tensor]:
    return [torch.zeros(e, n, 2) for _ in range(3)]


BAD_STATES = [
    ("pos", lambda s: s[0].double(), r"pos must be a float32 .*got dtype (torch\.)?float64"),
    ("vel", lambda s: torch.zeros(2, 3, 3), r"vel must be a float32 .*\[E, N, 2\].*got shape"),
    ("force", lambda s: torch.zeros(2, 2, 3).transpose(1, 2), r"force .*contiguous"),
    ("vel", lambda s: torch.zeros(3, 3, 2), r"vel must be .*shape.*got shape \[3, 3, 2\]"),
    ("force", lambda s: torch.zeros(2, 4, 2), r"force must be .*shape.*got shape \[2, 4, 2\]"),
    ("pos", lambda s: torch.zeros(2, 3), r"pos must be a float32 .*got shape \[2, 3\]"),
]


@pytest.mark.parametrize(("name", "make", "match"), BAD_STATES)
@pytest.mark.parametrize("backend", ["native", "torch"])
def test_step_rejects_bad_tensor(name: str, make: Any, match: str, backend: str) -> None:
    state = _state()
    index = ["pos", "vel", "force"].index(name)
    state[index] = make(state)
    with pytest.raises(ValueError, match=match):
        particle_step(*state, backend=backend, **PARAMS)


@pytest.mark.parametrize(("name", "make", "match"), BAD_STATES)
def test_c_step_rejects_bad_array(name: str, make: Any, match: str) -> None:
    state = _state()
    index = ["pos", "vel", "force"].index(name)
    state[index] = make(state)
    arrays = [t.numpy() for t in state]
    contacts = np.zeros((2, 3), np.int32)
    with pytest.raises(ValueError, match=match):
        load_extension().particle_step(*arrays, contacts, **PARAMS)


BAD_PARAMS = [
    ("radius", 0.0, r"radius must be a finite number > 0, got 0"),
    ("radius", -1.0, r"radius must be a finite number > 0"),
    ("substeps", 0, r"substeps must be an int >= 1, got 0"),
    ("mass", 0.0, r"mass must be a finite number > 0"),
    ("drag", 1.0, r"drag must be in \[0, 1\), got 1"),
    ("dt", math.nan, r"dt must be a finite number > 0, got nan"),
    ("stiffness", -1.0, r"stiffness must be a finite number >= 0"),
    ("half_extent", 0.05, r"half_extent must be a finite number > radius"),
]


@pytest.mark.parametrize(("name", "value", "match"), BAD_PARAMS)
@pytest.mark.parametrize("backend", ["native", "torch"])
def test_step_rejects_bad_param(name: str, value: Any, match: str, backend: str) -> None:
    pos, vel, force = _state()
    with pytest.raises(ValueError, match=match):
        particle_step(pos, vel, force, backend=backend, **dict(PARAMS, **{name: value}))
    assert not pos.any() and not vel.any()  # untouched


@pytest.mark.parametrize(("name", "value", "match"), BAD_PARAMS)
def test_c_step_rejects_bad_param(name: str, value: Any, match: str) -> None:
    arrays = [t.numpy() for t in _state()]
    with pytest.raises(ValueError, match=match):
        load_extension().particle_step(
            *arrays, np.zeros((2, 3), np.int32), **dict(PARAMS, **{name: value})
        )


def test_step_rejects_bad_types_and_aliasing() -> None:
    pos, vel, force = _state()
    with pytest.raises(TypeError, match=r"step: substeps must be an int >= 1, got float: 1\.5"):
        particle_step(pos, vel, force, **dict(PARAMS, substeps=1.5))
    with pytest.raises(TypeError, match=r"vel must be a float32 tensor .*got ndarray"):
        particle_step(pos, vel.numpy(), force, **PARAMS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pos and vel must not share memory"):
        particle_step(pos, pos, force, **PARAMS)
    with pytest.raises(ValueError, match=r"backend must be one of"):
        particle_step(pos, vel, force, backend="cuda", **PARAMS)  # type: ignore[arg-type]
    c = load_extension()
    arrays = [t.numpy() for t in (pos, vel, force)]
    with pytest.raises(
        TypeError, match=r"vel must be a float32 array .*got an object of type list"
    ):
        c.particle_step(arrays[0], [[0.0, 0.0]], arrays[2], np.zeros((2, 3), np.int32), **PARAMS)
    with pytest.raises(ValueError, match=r"contacts_out must be an int32 array .*got dtype int64"):
        c.particle_step(*arrays, np.zeros((2, 3), np.int64), **PARAMS)
    with pytest.raises(ValueError, match=r"pos is written in place and must not share memory"):
        c.particle_step(arrays[0], arrays[0], arrays[2], np.zeros((2, 3), np.int32), **PARAMS)
    read_only = arrays[0].copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"pos must be .*writeable"):
        c.particle_step(read_only, *arrays[1:], np.zeros((2, 3), np.int32), **PARAMS)


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_knn_rejects_bad_input(backend: str) -> None:
    pos = torch.zeros(2, 4, 2)
    with pytest.raises(ValueError, match=r"k must be in \[0, N - 1\] = \[0, 3\].*got 4"):
        knn(pos, 4, backend=backend)
    with pytest.raises(ValueError, match=r"k must be in .*got -1"):
        knn(pos, -1, backend=backend)
    with pytest.raises(ValueError, match=r"radius must be > 0 \(inf allowed\), got 0"):
        knn(pos, 2, radius=0.0, backend=backend)
    with pytest.raises(ValueError, match=r"pos must be a float32 .*got dtype torch.float64"):
        knn(pos.double(), 2, backend=backend)
    with pytest.raises(ValueError, match=r"pos must be a float32 .*got shape \[2, 4, 3\]"):
        knn(torch.zeros(2, 4, 3), 2, backend=backend)
    with pytest.raises(TypeError, match=r"k must be an int, got float"):
        knn(pos, 2.0, backend=backend)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pos .*contiguous"):
        knn(torch.zeros(2, 2, 4).transpose(1, 2), 2, backend="native")


def test_c_knn_rejects_bad_array() -> None:
    c = load_extension()
    pos = np.zeros((2, 4, 2), np.float32)
    rel, idx = np.zeros((2, 4, 2, 2), np.float32), np.zeros((2, 4, 2), np.int64)
    with pytest.raises(ValueError, match=r"k must be in \[0, N - 1\] = \[0, 3\].*got 4"):
        c.knn(pos, 4, math.inf, np.zeros((2, 4, 4, 2), np.float32), np.zeros((2, 4, 4), np.int64))
    with pytest.raises(ValueError, match=r"radius must be > 0"):
        c.knn(pos, 2, -1.0, rel, idx)
    with pytest.raises(ValueError, match=r"pos must be a float32 array .*got dtype float64"):
        c.knn(pos.astype(np.float64), 2, math.inf, rel, idx)
    with pytest.raises(ValueError, match=r"pos .*C-contiguous"):
        c.knn(np.zeros((2, 2, 4), np.float32).transpose(0, 2, 1), 2, math.inf, rel, idx)
    with pytest.raises(
        ValueError, match=r"rel_out must be .*\[2, 4, 2, 2\], got shape \[2, 4, 3, 2\]"
    ):
        c.knn(pos, 2, math.inf, np.zeros((2, 4, 3, 2), np.float32), idx)
    with pytest.raises(ValueError, match=r"idx_out must be an int64 array .*got dtype int32"):
        c.knn(pos, 2, math.inf, rel, idx.astype(np.int32))
    with pytest.raises(ValueError, match=r"rel_out .*must not share memory with pos"):
        c.knn(pos, 1, math.inf, pos.reshape(2, 4, 1, 2), idx[:, :, :1].copy())


# ---- threads -----------------------------------------------------------------------------------


def test_threads_give_identical_results(threads: None) -> None:
    results = []
    for n_threads in (1, 2):
        set_num_threads(n_threads)
        pos, vel, g = _world(16, 64, seed=11)
        contacts_all = []
        for _ in range(10):
            force = torch.rand(16, 64, 2, generator=g) * 2 - 1
            contacts_all.append(particle_step(pos, vel, force, backend="native", **PARAMS))
        rel, idx = knn(pos, 6, radius=0.4, backend="native")
        results.append((pos, vel, torch.stack(contacts_all), rel, idx))
    for a, b in zip(*results):
        assert torch.equal(a, b)


# ---- options: per-agent radius, speed limits, inactive agents, landmarks -----------------------


def _options(e: int, n: int, m: int, seed: int, radius: float) -> dict[str, Any]:
    """Per-agent radii and speed limits, ~20% inactive agents, ``m`` landmarks."""
    g = torch.Generator().manual_seed(seed)
    return dict(
        radius=radius * (0.5 + torch.rand(n, generator=g)),
        max_speed=0.2 + torch.rand(n, generator=g),
        active=torch.rand(e, n, generator=g) > 0.2,
        landmarks=(torch.rand(e, m, 2, generator=g) * 2 - 1) * 0.8,
        landmark_radius=2 * radius * (0.5 + torch.rand(m, generator=g)),
    )


def _run_agreement_options(e: int, n: int, m: int, steps: int, seed: int, radius: float) -> int:
    opts = _options(e, n, m, seed, radius)
    params = dict(PARAMS, **opts)
    pos, vel, g = _world(e, n, seed)
    pos0, vel0 = pos.clone(), vel.clone()
    pos_t, vel_t = pos.clone(), vel.clone()
    contacts_seen = 0
    for _ in range(steps):
        force = (torch.rand(e, n, 2, generator=g) * 2 - 1) * 3.0
        contacts = particle_step(pos, vel, force, backend="native", **params)
        contacts_t = particle_step_torch(pos_t, vel_t, force, **params)
        torch.testing.assert_close(pos, pos_t, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(vel, vel_t, atol=1e-5, rtol=1e-5)
        assert torch.equal(contacts, contacts_t)
        contacts_seen += int(contacts.sum())
    inactive = ~opts["active"]
    assert torch.equal(pos[inactive], pos0[inactive]) and torch.equal(vel[inactive], vel0[inactive])
    assert not contacts[inactive].any()
    speed_ok = vel.norm(dim=-1) <= opts["max_speed"] * (1 + 1e-6)
    assert speed_ok[opts["active"]].all()  # inactive agents keep their first velocity
    return contacts_seen


@pytest.mark.parametrize(("n", "m", "radius"), [(4, 2, 0.2), (64, 3, 0.05), (64, 40, 0.05)])
def test_step_with_options_agrees_with_torch(n: int, m: int, radius: float) -> None:
    # m = 40 landmarks go through their own grid in the kernel (more than 8).
    assert _run_agreement_options(4, n, m, 60, seed=n + m, radius=radius) > 0


@pytest.mark.slow  # the dense twin at N = 1024
def test_step_with_options_agrees_with_torch_n1024() -> None:
    assert _run_agreement_options(1, 1024, 16, 10, seed=5, radius=0.03) > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_landmark_pushes_agent_and_stays(backend: str) -> None:
    pos, vel, force = torch.tensor([[[0.08, 0.0]]]), torch.zeros(1, 1, 2), torch.zeros(1, 1, 2)
    landmarks = torch.zeros(1, 1, 2)
    kw = dict(PARAMS, landmarks=landmarks, landmark_radius=0.1)
    contacts = particle_step(pos, vel, force, backend=backend, **kw)
    assert float(pos[0, 0, 0]) > 0.08 and float(pos[0, 0, 1]) == 0.0  # pushed along +x
    assert contacts.tolist() == [[0]]  # landmarks are not counted
    assert torch.equal(landmarks, torch.zeros(1, 1, 2))
    on_top = torch.zeros(1, 1, 2)  # coincident with the landmark: pushed along +x
    particle_step(on_top, torch.zeros(1, 1, 2), force, backend=backend, **kw)
    assert float(on_top[0, 0, 0]) > 0 and float(on_top[0, 0, 1]) == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_inactive_agents_do_not_collide(backend: str) -> None:
    pos = torch.tensor([[[0.0, 0.0], [0.05, 0.0]]])
    vel, force = torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)
    active = torch.tensor([[True, False]])
    contacts = particle_step(pos, vel, force, active=active, backend=backend, **PARAMS)
    assert torch.equal(pos, torch.tensor([[[0.0, 0.0], [0.05, 0.0]]]))  # nobody pushed
    assert contacts.tolist() == [[0, 0]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_agent_bounds_and_speed(backend: str) -> None:
    pos, vel = torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)
    radius = torch.tensor([0.05, 0.2])
    force = torch.full((1, 2, 2), 50.0)
    for _ in range(20):
        particle_step(pos, vel, force, backend=backend, **dict(PARAMS, radius=radius))
    lim = torch.tensor(1.0) - radius  # float32 L - r_i
    assert torch.equal(pos[0], lim[:, None].expand(2, 2))
    pos, vel = torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)
    kw = dict(PARAMS, half_extent=100.0, max_speed=torch.tensor([0.5, math.inf]))
    particle_step(pos, vel, force, backend=backend, **kw)
    torch.testing.assert_close(vel[0, 0].norm(), torch.tensor(0.5))
    assert float(vel[0, 1].norm()) > 1.0
    particle_step(pos, vel, force, backend=backend, **dict(kw, max_speed=0.25))
    torch.testing.assert_close(vel[0].norm(dim=-1), torch.tensor([0.25, 0.25]))


# ---- kNN exactness on layouts that stress the grid ---------------------------------------------


def _layout(name: str, e: int, n: int, g: torch.Generator) -> torch.Tensor:
    u = torch.rand(e, n, 2, generator=g)
    if name == "uniform":
        return (u * 2 - 1) * 3
    if name == "clusters":  # dense blobs far apart: most cells empty, a few crowded
        centres = (torch.rand(e, 4, 2, generator=g) * 2 - 1) * 50
        return centres[:, torch.arange(n) % 4] + (u - 0.5) * 0.2
    if name == "line":  # a degenerate bounding box
        return torch.stack([u[..., 0] * 10, torch.zeros(e, n)], dim=-1)
    if name == "lattice":  # many exact distance ties
        side = math.isqrt(n) + 1
        i = torch.arange(n)
        return torch.stack([i % side, i // side], dim=-1).float().expand(e, n, 2).contiguous()
    if name == "coincident":
        pos = (u * 2 - 1) * 0.001
        pos[:, ::3] = 0.0
        return pos
    if name == "huge":  # float32 extremes: d2 overflows to inf
        pos = (u * 2 - 1) * 1e30
        pos[:, :4] = (u[:, :4] * 2 - 1) * 1e-30
        return pos
    pos = (u * 2 - 1) * 2  # "nonfinite": the kernel falls back to all pairs for that env
    pos[0, 3] = math.nan
    pos[0, 5, 1] = math.inf
    pos[-1, 7, 0] = -math.inf
    return pos


LAYOUTS = ["uniform", "clusters", "line", "lattice", "coincident", "huge", "nonfinite"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("k", "radius"), [(4, math.inf), (6, 0.3), (40, math.inf), (40, 2.0)])
def test_knn_is_exact_on_hard_layouts(layout: str, k: int, radius: float) -> None:
    g = torch.Generator().manual_seed(hash(layout) % 1000)
    pos = _layout(layout, 3, 200, g)
    active = torch.rand(3, 200, generator=g) > 0.1
    for act in (None, active):
        rel, idx = knn(pos, k, radius=radius, active=act, backend="native")
        rel_t, idx_t = knn_torch(pos, k, radius=radius, active=act)
        assert torch.equal(idx, idx_t)
        assert torch.equal(rel.isnan(), rel_t.isnan())
        torch.testing.assert_close(rel, rel_t, atol=0.0, rtol=0.0, equal_nan=True)
    assert (idx[~active] == -1).all()
    found = idx >= 0
    neighbour_active = torch.gather(active, 1, idx.clamp(min=0).view(3, -1)).view_as(idx)
    assert neighbour_active[found].all()


def test_knn_exact_just_above_the_all_pairs_size() -> None:
    g = torch.Generator().manual_seed(2)
    for n in (24, 25, 33):
        pos = _layout("uniform", 4, n, g)
        for k in (1, n - 1):
            assert torch.equal(knn(pos, k, backend="native")[1], knn_torch(pos, k)[1])


@pytest.mark.parametrize("layout", ["uniform", "nonfinite"])
def test_step_exact_on_hard_layouts(layout: str) -> None:
    g = torch.Generator().manual_seed(9)
    pos = _layout(layout, 2, 300, g) * 0.3  # inside the box; NaN and inf stay
    pos[:, 10] = pos[:, 11]  # coincident centres
    vel = torch.zeros(2, 300, 2)
    pos_t, vel_t = pos.clone(), vel.clone()
    force = torch.rand(2, 300, 2, generator=g) * 2 - 1
    params = dict(PARAMS, radius=0.04)
    contacts = particle_step(pos, vel, force, backend="native", **params)
    contacts_t = particle_step_torch(pos_t, vel_t, force, **params)
    assert torch.equal(pos.isnan(), pos_t.isnan()) and torch.equal(contacts, contacts_t)
    torch.testing.assert_close(pos, pos_t, atol=1e-5, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(vel, vel_t, atol=1e-5, rtol=1e-5, equal_nan=True)


# ---- bad optional inputs -----------------------------------------------------------------------

BAD_OPTIONS = [
    ({"radius": torch.full((4,), 0.05)}, ValueError, r"radius must be a float32 tensor of shape"),
    ({"radius": torch.full((3,), 0.05).double()}, ValueError, r"radius .*got dtype"),
    ({"radius": torch.tensor([0.05, -1.0, 0.05])}, ValueError, r"radius\[1\] must be a finite"),
    ({"radius": torch.tensor([0.05, 2.0, 0.05])}, ValueError, r"half_extent must be .*> radius"),
    ({"radius": "big"}, TypeError, r"radius must be a real number"),
    ({"max_speed": torch.tensor([1.0, 0.0, 1.0])}, ValueError, r"max_speed\[1\] must be > 0"),
    ({"max_speed": -1.0}, ValueError, r"max_speed must be > 0"),
    ({"active": torch.ones(2, 3)}, ValueError, r"active must be a bool tensor .*got dtype"),
    ({"active": torch.ones(2, 4, dtype=torch.bool)}, ValueError, r"active must be .*\[2, 3\]"),
    ({"landmarks": torch.zeros(2, 3, 2)}, ValueError, r"landmarks need landmark_radius"),
    ({"landmark_radius": 0.1}, ValueError, r"landmark_radius was given without landmarks"),
    (
        {"landmarks": torch.zeros(3, 1, 2), "landmark_radius": 0.1},
        ValueError,
        r"landmarks must be .*\[E, M, 2\]",
    ),
    (
        {"landmarks": torch.zeros(2, 1, 3), "landmark_radius": 0.1},
        ValueError,
        r"landmarks must be .*got shape \[2, 1, 3\]",
    ),
    (
        {"landmarks": torch.zeros(2, 2, 2), "landmark_radius": torch.tensor([0.1, math.nan])},
        ValueError,
        r"landmark_radius\[1\] must be a finite number >= 0",
    ),
    (
        {"landmarks": torch.zeros(2, 2, 2), "landmark_radius": torch.zeros(3)},
        ValueError,
        r"landmark_radius must be a float32 tensor of shape \[M\] = \[2\]",
    ),
]


@pytest.mark.parametrize(("opts", "error", "match"), BAD_OPTIONS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_step_rejects_bad_options(opts: dict, error: type, match: str, backend: str) -> None:
    pos, vel, force = _state()
    pos[:, 1, 0] = 0.05  # overlapping: a step would move something
    before = pos.clone()
    with pytest.raises(error, match=match):
        particle_step(pos, vel, force, backend=backend, **dict(PARAMS, **opts))
    assert torch.equal(pos, before) and not vel.any()


def test_c_step_rejects_bad_option_arrays() -> None:
    c = load_extension()
    arrays = [t.numpy() for t in _state()]
    contacts = np.zeros((2, 3), np.int32)
    cases = [
        ({"radius": np.full(4, 0.05, np.float32)}, r"radius must be a float32 array .*\[3\]"),
        ({"radius": np.array([0.05, np.inf, 0.05], np.float32)}, r"radius\[1\] must be"),
        ({"active": np.ones((2, 3), np.int8)}, r"active must be a bool array .*got dtype int8"),
        ({"max_speed": np.zeros(3, np.float32)}, r"max_speed\[0\] must be > 0"),
        ({"landmarks": np.zeros((2, 1, 2), np.float32)}, r"landmarks need landmark_radius"),
        ({"landmarks": np.zeros((2, 1, 2), np.float64), "landmark_radius": 0.1}, r"got dtype"),
        ({"landmark_radius": 0.1}, r"landmark_radius was given without landmarks"),
    ]
    for opts, match in cases:
        with pytest.raises(ValueError, match=match):
            c.particle_step(*arrays, contacts, **dict(PARAMS, **opts))
    with pytest.raises(TypeError, match=r"max_speed must be a number or a float32 array"):
        c.particle_step(*arrays, contacts, **dict(PARAMS, max_speed="fast"))
    with pytest.raises(ValueError, match=r"active must be a bool array .*\[2, 3\]"):
        c.knn(
            arrays[0],
            1,
            math.inf,
            np.zeros((2, 3, 1, 2), np.float32),
            np.zeros((2, 3, 1), np.int64),
            active=np.ones((2, 4), bool),
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_knn_rejects_bad_active(backend: str) -> None:
    with pytest.raises(ValueError, match=r"knn: active must be a bool tensor of shape"):
        knn(torch.zeros(2, 4, 2), 1, active=torch.ones(2, 4), backend=backend)
    with pytest.raises(TypeError, match=r"knn: active must be a bool tensor .*got list"):
        knn(torch.zeros(2, 4, 2), 1, active=[True] * 4, backend=backend)  # type: ignore[arg-type]


# ---- threads and the pool ----------------------------------------------------------------------


@pytest.mark.parametrize(("e", "n"), [(1, 2048), (3, 600)])
def test_split_environments_match_one_thread(threads: None, e: int, n: int) -> None:
    """Fewer environments than threads: each environment is split over the pool by agents."""
    opts = _options(e, n, 12, seed=1, radius=0.02)
    results = []
    for n_threads in (1, 2):
        set_num_threads(n_threads)
        pos, vel, g = _world(e, n, seed=4)
        pos = pos * 2.0
        out = []
        for _ in range(5):
            force = torch.rand(e, n, 2, generator=g) * 2 - 1
            params = dict(PARAMS, half_extent=2.0, **opts)
            out.append(particle_step(pos, vel, force, backend="native", **params))
        out += [pos, vel, *knn(pos, 8, active=opts["active"], backend="native")]
        out += list(knn(pos, 3, radius=0.1, backend="native"))
        results.append(out)
    for a, b in zip(*results):
        assert torch.equal(a, b)
    pos = results[1][5]
    rel_t, idx_t = knn_torch(pos, 8, active=opts["active"])
    assert torch.equal(results[1][7], rel_t) and torch.equal(results[1][8], idx_t)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_pool_survives_fork_and_thread_changes() -> None:
    """Kernels keep working in a forked child (the parent's pool threads do not exist there),
    after changing the thread count, and from several Python threads at once."""
    script = textwrap.dedent(
        """
        import os, threading, torch
        from marlkit.native import set_min_work_per_thread, set_num_threads
        from marlkit.native.particles import knn
        set_num_threads(2)
        set_min_work_per_thread(64)  # split these small calls over the threads
        pos = torch.rand(8, 600, 2)
        expected = knn(pos, 4)[1]
        pid = os.fork()
        if pid == 0:
            ok = torch.equal(knn(pos, 4)[1], expected)
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        for n in (1, 3, 2):
            set_num_threads(n)
            assert torch.equal(knn(pos, 4)[1], expected)
        results = []
        workers = [threading.Thread(target=lambda: results.append(knn(pos, 4)[1]))
                   for _ in range(4)]
        for t in workers: t.start()
        for t in workers: t.join()
        assert len(results) == 4 and all(torch.equal(r, expected) for r in results)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
