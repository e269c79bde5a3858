"""The particle-world kernels: C++ vs torch twin agreement, physics sanity, bad input, threads."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from marlkit.native import load_extension, set_num_threads
from marlkit.native.particles import knn, knn_torch, particle_step, particle_step_torch

PARAMS: dict[str, Any] = dict(
    radius=0.05, mass=1.0, drag=0.25, dt=0.1, substeps=4, stiffness=100.0, half_extent=1.0
)


@pytest.fixture
def threads() -> Iterator[None]:
    yield
    set_num_threads(0)


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
    with pytest.raises(TypeError, match=r"substeps must be an int, got float"):
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
