"""LiDAR of the particle worlds: rays from every agent against the other agents' discs.

The sensor of VMAS's ``navigation`` (``vmas.simulator.sensors.Lidar`` with
``entity_filter`` = agents, ``World._cast_rays_to_sphere``), for worlds of equal discs: ``R``
rays per agent at the angles ``linspace(0, 2 pi, R + 1)[:R]`` (float32, as VMAS; the agents
of the native scenarios do not rotate), each reading the distance to the nearest other agent's
disc it crosses, at most ``max_range``. Two backends do the same float32 maths in the same
order: the C++ kernel of ``marlkit._C`` (CPU, O(N) per environment through a uniform grid, on
marlkit's thread pool with the GIL released) and the torch twin :func:`lidar_torch` (any device,
dense ``[E, N, N, R]`` tensors; the fallback and the oracle of the agreement tests). They agree
bit for bit on the CPU.

For agent ``i``, ray ``k`` with direction ``u = (cos a_k, sin a_k)`` and another agent ``j``,
with ``w = p_j - p_i``: ``t = w . u``, ``c = wx uy - wy ux``, ``q = r^2 - c^2``. The ray hits
``j`` when ``t > 0`` (the centre is in front) and ``q > 0``, at ``t - sqrt(q)``. As in VMAS:
the agent itself is skipped; a disc the agent lies inside reads negative (down to ``-r``) on the
rays pointing towards its centre, and ``max_range`` on the others (its centre is behind them);
the reading is ``min(max_range, nearest hit)``.

Examples:
    >>> import torch
    >>> from marlkit.native.lidar import lidar
    >>> pos = torch.tensor([[[0.0, 0.0], [0.3, 0.0]]])  # agent 1 is 0.3 to the right of agent 0
    >>> readings = lidar(pos, n_rays=4, max_range=0.35, radius=0.1)
    >>> readings.shape
    torch.Size([1, 2, 4])
    >>> [round(x, 4) for x in readings[0, 0].tolist()]  # rays at 0, pi/2, pi, 3 pi/2
    [0.2, 0.35, 0.35, 0.35]
"""

from __future__ import annotations

import functools
import math

import torch

from marlkit._checks import check_int, check_real
from marlkit.native._loader import load_extension
from marlkit.native.particles import (
    Backend,
    _check_state,
    _f32,
    _fmt,
    _sqrt,
    _use_native,
)

__all__ = ["lidar", "lidar_angles", "lidar_torch"]

_FN = "lidar"


@functools.lru_cache(maxsize=32)
def _angles_cpu(n_rays: int) -> torch.Tensor:
    return torch.linspace(0.0, 2.0 * math.pi, n_rays + 1, dtype=torch.float32)[:n_rays]


def lidar_angles(n_rays: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """The ray angles ``[n_rays]`` float32: VMAS's ``linspace(0, 2 pi, n_rays + 1)[:n_rays]``."""
    return _angles_cpu(check_int("n_rays", n_rays, low=1, owner=_FN)).to(device)


def _check(pos: object, n_rays: object, max_range: object, radius: object, contiguous: bool):
    """Check the arguments (the kernel's rules and messages); return ``(pos, n, R, r)``."""
    pos_t = _check_state(_FN, "pos", pos, None, contiguous=contiguous)
    n = check_int("n_rays", n_rays, low=1, owner=_FN)
    rng = check_real("max_range", max_range, owner=_FN)
    r = check_real("radius", radius, owner=_FN)
    return pos_t, n, rng, r


def _check_finite(pos: torch.Tensor) -> None:
    """The kernel's check: the first non-finite coordinate, in memory order, is named."""
    bad = (~torch.isfinite(pos)).flatten().nonzero()
    if bad.numel() == 0:
        return
    q = int(bad[0, 0])
    n = pos.shape[1]
    where = f"pos[{q // (2 * n)}, {q // 2 % n}, {q % 2}]"
    raise ValueError(f"{_FN}: pos must be finite, got {_fmt(float(pos.flatten()[q]))} at {where}")


def _lidar_torch(pos: torch.Tensor, angles: torch.Tensor, max_range: float, radius: float):
    e, n, dev = pos.shape[0], pos.shape[1], pos.device
    a = angles.double()
    ux, uy = a.cos().float(), a.sin().float()  # [R]: as the kernel, through float64
    r32 = _f32(radius)
    r2 = _f32(r32 * r32)
    w = pos[:, None, :, :] - pos[:, :, None, :]  # [E, N(i), N(j), 2]: p_j - p_i
    wx, wy = w[..., 0, None], w[..., 1, None]  # [E, N, N, 1]
    t = wx * ux + wy * uy  # [E, N, N, R]
    c = wx * uy - wy * ux
    q = r2 - c * c
    hit = (t > 0) & (q > 0) & ~torch.eye(n, dtype=torch.bool, device=dev)[None, :, :, None]
    d = torch.where(hit, t - _sqrt(torch.where(hit, q, 0.0)), math.inf)
    best = d.amin(dim=2) if n > 0 else torch.full((e, n, angles.numel()), math.inf, device=dev)
    return best.clamp(max=_f32(max_range)).contiguous()


def lidar(
    pos: torch.Tensor,
    n_rays: int = 12,
    max_range: float = 0.35,
    radius: float = 0.1,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """LiDAR readings of every agent against the other agents' discs (see the module docstring).

    Defaults are VMAS ``navigation``'s: 12 rays, range 0.35, agents of radius 0.1.

    Args:
        pos: ``[E, N, 2]`` float32, contiguous; agent centres, finite.
        n_rays: rays per agent ``R >= 1``, at angles :func:`lidar_angles`.
        max_range: the reading when nothing is hit, ``> 0``.
        radius: radius ``> 0`` of every agent's disc.
        backend: ``"auto"`` (the C++ kernel when ``pos`` is on the CPU and the extension loads,
            else torch), ``"native"`` (the kernel or an error) or ``"torch"``.

    Returns:
        ``[E, N, R]`` float32 on ``pos``'s device: per agent and ray, the distance from the
        agent's centre to the nearest crossing of another agent's disc, ``min(max_range, ...)``;
        in ``[-radius, max_range]``.

    Raises:
        TypeError: ``pos`` is not a tensor, or a parameter of the wrong type.
        ValueError: a bad shape, dtype, layout or parameter value, or a non-finite position.
        ExtensionError: ``backend="native"`` without a loadable extension.
    """
    pos_t, n, rng, r = _check(pos, n_rays, max_range, radius, contiguous=True)
    if not _use_native(_FN, backend, (pos_t,)):
        return lidar_torch(pos_t, n, rng, r)
    out = torch.empty((pos_t.shape[0], pos_t.shape[1], n), dtype=torch.float32)
    load_extension().lidar(pos_t.detach().numpy(), _angles_cpu(n).numpy(), rng, r, out.numpy())
    return out


def lidar_torch(
    pos: torch.Tensor, n_rays: int = 12, max_range: float = 0.35, radius: float = 0.1
) -> torch.Tensor:
    """The torch twin of :func:`lidar` (any device; ``pos`` ``[E, N, 2]`` float32, any layout).

    Returns ``[E, N, R]`` float32 on ``pos``'s device, from dense ``[E, N, N, R]`` tensors (memory
    grows with ``N^2 R``).
    """
    pos_t, n, rng, r = _check(pos, n_rays, max_range, radius, contiguous=False)
    _check_finite(pos_t)
    with torch.no_grad():
        return _lidar_torch(pos_t, lidar_angles(n, pos_t.device), rng, r)
