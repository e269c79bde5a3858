"""Particle-world kernels: soft-contact point agents in a box, and k-nearest neighbours.

Two backends do the same float32 maths in the same order: the C++ kernels of ``marlkit._C``
(CPU, threaded over environments, the GIL released) and the torch twins
:func:`particle_step_torch` and :func:`knn_torch` (any device; the fallback and the oracle of the
agreement tests). Both form ``F_i = force_i + (sum_j f_ij)``. They agree to float32 rounding,
bit for bit wherever an agent has at most two contacts: the twin sums the pair forces with
``Tensor.sum``, whose order of additions may differ from the kernel's ascending ``j``. The twin
takes its square roots through float64 on the CPU, where torch's float32 ``sqrt`` is not
correctly rounded.

Shapes: ``E`` environments, ``N`` agents, ``k`` neighbours.

Examples:
    >>> import torch
    >>> from marlkit.native.particles import knn, particle_step
    >>> pos = torch.zeros(2, 3, 2)
    >>> pos[:, 1, 0] = 0.05  # agents 0 and 1 overlap
    >>> vel, force = torch.zeros(2, 3, 2), torch.zeros(2, 3, 2)
    >>> contacts = particle_step(pos, vel, force, radius=0.05, mass=1.0, drag=0.25, dt=0.1,
    ...                          substeps=4, stiffness=100.0, half_extent=1.0)
    >>> contacts.shape, contacts.dtype
    (torch.Size([2, 3]), torch.int32)
    >>> rel, idx = knn(pos, 2)
    >>> rel.shape, idx.shape
    (torch.Size([2, 3, 2, 2]), torch.Size([2, 3, 2]))
"""

from __future__ import annotations

import math
import struct
from numbers import Integral, Real
from typing import Literal, NamedTuple

import torch

from marlkit._utils import get_logger
from marlkit.native._loader import ExtensionError, load_extension

__all__ = ["Backend", "knn", "knn_torch", "particle_step", "particle_step_torch"]

#: ``"auto"``: the C++ kernel when every tensor is on the CPU and the extension loads, else torch;
#: ``"native"``: the C++ kernel or an error; ``"torch"``: the torch twin.
Backend = Literal["auto", "native", "torch"]

_BACKENDS = ("auto", "native", "torch")
_STATE = "[E, N, 2]"
_log = get_logger("native.particles")
_native_status: list[bool] = []  # [] until "auto" first asks; then [whether the extension loads]


class _Constants(NamedTuple):
    """The float32 constants of one particle_step call, as Python floats holding float32 values."""

    two_r: float  # 2r
    contact2: float  # (2r)^2
    k: float  # stiffness
    h: float  # dt / substeps
    a: float  # 1 - drag
    b: float  # h / mass
    lim: float  # L - r
    substeps: int


def _f32(x: float) -> float:
    """``x`` rounded to float32 (as C's ``(float)x``: too large for float32 becomes +-inf)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _real(fn: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(value).__name__}")
    return float(value)


def _int(fn: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__}")
    return int(value)


def _step_constants(
    radius: float,
    mass: float,
    drag: float,
    dt: float,
    substeps: int,
    stiffness: float,
    half_extent: float,
) -> _Constants:
    """Validate the parameters (the kernel's rules) and derive the float32 constants."""
    fn = "particle_step"
    r, m, dr = _real(fn, "radius", radius), _real(fn, "mass", mass), _real(fn, "drag", drag)
    t, k = _real(fn, "dt", dt), _real(fn, "stiffness", stiffness)
    L = _real(fn, "half_extent", half_extent)
    s = _int(fn, "substeps", substeps)
    if not (math.isfinite(r) and r > 0):
        raise ValueError(f"{fn}: radius must be a finite number > 0, got {radius!r}")
    if not (math.isfinite(m) and m > 0):
        raise ValueError(f"{fn}: mass must be a finite number > 0, got {mass!r}")
    if not 0 <= dr < 1:
        raise ValueError(f"{fn}: drag must be in [0, 1), got {drag!r}")
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"{fn}: dt must be a finite number > 0, got {dt!r}")
    if s < 1:
        raise ValueError(f"{fn}: substeps must be an int >= 1, got {substeps!r}")
    if s > 2**31 - 1:
        raise ValueError(f"{fn}: substeps must be an int < 2**31, got {substeps!r}")
    if not (math.isfinite(k) and k >= 0):
        raise ValueError(f"{fn}: stiffness must be a finite number >= 0, got {stiffness!r}")
    r32, L32 = _f32(r), _f32(L)
    if not (math.isfinite(L) and r32 < L32):
        raise ValueError(
            f"{fn}: half_extent must be a finite number > radius ({radius!r}) in float32, "
            f"got {half_extent!r}"
        )
    # Each step below is one float32 operation: a double op on float32 values, rounded once.
    two_r = _f32(2.0 * r32)
    h = _f32(_f32(t) / _f32(float(s)))
    return _Constants(
        two_r=two_r,
        contact2=_f32(two_r * two_r),
        k=_f32(k),
        h=h,
        a=_f32(1.0 - _f32(dr)),
        b=_f32(h / _f32(m)),
        lim=_f32(L32 - r32),
        substeps=s,
    )


def _knn_radius2(fn: str, k: int, n: int, radius: float) -> float:
    """Validate ``k`` and ``radius``; return ``float32(radius)**2`` in float32."""
    if k < 0 or k > max(n - 1, 0):
        raise ValueError(f"{fn}: k must be in [0, N - 1] = [0, {n - 1}] (other agents), got {k}")
    if not radius > 0:
        raise ValueError(f"{fn}: radius must be > 0 (inf allowed), got {radius!r}")
    r32 = _f32(radius)
    return _f32(r32 * r32)


def _check_state(
    fn: str, name: str, t: object, like: torch.Tensor | None, contiguous: bool
) -> torch.Tensor:
    """Check one float32 ``[E, N, 2]`` tensor (shaped and placed like ``like`` when given)."""
    expected = _STATE if like is None else f"{_STATE} = {list(like.shape)} (like pos)"
    what = f"{fn}: {name} must be a float32 tensor of shape {expected}"
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}, got {type(t).__name__}")
    if t.ndim != 3 or t.shape[2] != 2 or (like is not None and t.shape != like.shape):
        raise ValueError(f"{what}, got shape {list(t.shape)}")
    if t.dtype != torch.float32:
        raise ValueError(f"{what}, got dtype {t.dtype}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{what} on pos's device {like.device}, got device {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{what} and contiguous, got a non-contiguous tensor")
    return t


def _check_disjoint(fn: str, tensors: dict[str, torch.Tensor]) -> None:
    """Raise if two of the (contiguous) tensors share memory: pos and vel are written in place."""
    spans = [
        (name, t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
        for name, t in tensors.items()
        if t.numel() > 0
    ]
    for i, (a, a0, a1) in enumerate(spans):
        for b, b0, b1 in spans[i + 1 :]:
            if a0 < b1 and b0 < a1:
                raise ValueError(f"{fn}: {a} and {b} must not share memory ({a} is written)")


def _use_native(fn: str, backend: str, tensors: tuple[torch.Tensor, ...]) -> bool:
    if backend not in _BACKENDS:
        raise ValueError(f"{fn}: backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    on_cpu = all(t.device.type == "cpu" for t in tensors)
    if backend == "native":
        if not on_cpu:
            devices = sorted({str(t.device) for t in tensors})
            raise ValueError(f"{fn}: backend='native' needs CPU tensors, got devices {devices}")
        load_extension()  # raises ExtensionError saying how to rebuild
        return True
    if not on_cpu:
        return False
    if not _native_status:
        try:
            load_extension()
            _native_status.append(True)
        except ExtensionError as err:
            _log.warning("particle kernels fall back to torch: %s", err)
            _native_status.append(False)
    return _native_status[0]


def _pair_geometry(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dx, dy, d2`` of ``pos_i - pos_j``, each ``[E, N, N]`` (i along dim 1, j along dim 2)."""
    x, y = pos[..., 0], pos[..., 1]
    dx = x[:, :, None] - x[:, None, :]
    dy = y[:, :, None] - y[:, None, :]
    return dx, dy, dx * dx + dy * dy


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 square root, as C++'s ``std::sqrt``.

    torch's CPU float32 ``sqrt`` (MKL's vector maths) is off by one ulp for ~0.7% of inputs; the
    float64 square root rounded to float32 is exact (a float32's root is never that close to a
    float32 rounding midpoint). Other devices (CUDA: IEEE ``sqrtf``; MPS: no float64) use float32.
    """
    if x.device.type == "cpu":
        return torch.sqrt(x.double()).float()
    return torch.sqrt(x)


def _step_torch(
    pos: torch.Tensor, vel: torch.Tensor, force: torch.Tensor, c: _Constants
) -> torch.Tensor:
    n = pos.shape[1]
    others = ~torch.eye(n, dtype=torch.bool, device=pos.device)  # [N, N]: j != i
    i_before_j = torch.ones(n, n, dtype=torch.bool, device=pos.device).triu(1)
    fallback_nx = torch.where(i_before_j, 1.0, -1.0).to(pos.dtype)  # normal at d <= 1e-6
    x, v = pos, vel
    for _ in range(c.substeps):
        dx, dy, d2 = _pair_geometry(x)
        d = _sqrt(d2)
        touching = (d2 < c.contact2) & others  # [E, N, N]
        kp = torch.where(touching, c.k * (c.two_r - d), 0.0)
        far = touching & (d > 1e-6)  # elsewhere the normal is the finite fallback: kp * n = 0
        nx = torch.where(far, dx / d, fallback_nx)
        ny = torch.where(far, dy / d, 0.0)
        # The dense pair forces f_ij, [E, N, N] per component, summed over j.
        total = force + torch.stack(((kp * nx).sum(dim=2), (kp * ny).sum(dim=2)), dim=-1)
        v = v * c.a + total * c.b
        x = x + v * c.h
        over, under = x > c.lim, x < -c.lim
        x = torch.where(over, c.lim, torch.where(under, -c.lim, x))
        v = torch.where(over | under, 0.0, v)
    pos.copy_(x)
    vel.copy_(v)
    _, _, d2 = _pair_geometry(pos)
    return ((d2 < c.contact2) & others).sum(dim=-1, dtype=torch.int32)


def _knn_torch(pos: torch.Tensor, k: int, radius2: float) -> tuple[torch.Tensor, torch.Tensor]:
    e, n = pos.shape[0], pos.shape[1]
    rel_all = pos[:, None, :, :] - pos[:, :, None, :]  # [E, N(i), N(j), 2]: pos_j - pos_i
    rx, ry = rel_all[..., 0], rel_all[..., 1]
    d2 = rx * rx + ry * ry  # [E, N, N]
    others = ~torch.eye(n, dtype=torch.bool, device=pos.device)
    valid = (d2 <= radius2) & others
    # NaN sorts after +inf: a qualifying neighbour at d2 = inf still beats every invalid one.
    key = torch.where(valid, d2, math.nan)
    order = torch.sort(key, dim=-1, stable=True).indices[..., :k]  # [E, N, k]
    found = torch.gather(valid, -1, order)
    rel = torch.gather(rel_all, 2, order[..., None].expand(e, n, k, 2))
    rel = torch.where(found[..., None], rel, 0.0)
    idx = torch.where(found, order, -1)
    return rel.contiguous(), idx.contiguous()


def particle_step(
    pos: torch.Tensor,
    vel: torch.Tensor,
    force: torch.Tensor,
    *,
    radius: float,
    mass: float,
    drag: float,
    dt: float,
    substeps: int,
    stiffness: float,
    half_extent: float,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Advance ``E`` particle worlds by one step; ``pos`` and ``vel`` are updated in place.

    Per substep ``h = dt / substeps``, with the positions at the start of the substep:
    ``F_i = force_i + sum_j f_ij`` where a touching pair (``d_ij < 2r``) pushes with
    ``f_ij = stiffness * (2r - d_ij) * (pos_i - pos_j) / d_ij``; then
    ``vel = vel * (1 - drag) + F * (h / mass)``, ``pos = pos + vel * h``, and each coordinate is
    clamped to ``[-(L - r), L - r]`` with its velocity zeroed where it was clamped.
    Not differentiable (runs without autograd).

    Args:
        pos: ``[E, N, 2]`` float32, contiguous; agent centres, updated in place.
        vel: ``[E, N, 2]`` float32, contiguous; velocities, updated in place.
        force: ``[E, N, 2]`` float32, contiguous; action forces (already scaled and clipped).
        radius: agent radius ``r > 0``.
        mass: agent mass ``> 0``.
        drag: velocity damping per substep, in ``[0, 1)``.
        dt: time per step ``> 0``.
        substeps: integration substeps, an int ``>= 1``.
        stiffness: contact spring constant ``>= 0``.
        half_extent: the box is ``[-L, L]^2``, ``L > r``.
        backend: see :data:`Backend`.

    Returns:
        ``[E, N]`` int32: per agent, the number of others closer than ``2r`` after the step.

    Raises:
        TypeError: a tensor or parameter of the wrong type.
        ValueError: a bad shape, dtype, device, layout or parameter value.
        ExtensionError: ``backend="native"`` without a loadable extension.
    """
    fn = "particle_step"
    c = _step_constants(radius, mass, drag, dt, substeps, stiffness, half_extent)
    _check_state(fn, "pos", pos, None, contiguous=True)
    _check_state(fn, "vel", vel, pos, contiguous=True)
    _check_state(fn, "force", force, pos, contiguous=True)
    _check_disjoint(fn, {"pos": pos, "vel": vel, "force": force})
    if not _use_native(fn, backend, (pos, vel, force)):
        with torch.no_grad():
            return _step_torch(pos, vel, force, c)
    contacts = torch.empty(pos.shape[:2], dtype=torch.int32)
    load_extension().particle_step(
        pos.detach().numpy(),
        vel.detach().numpy(),
        force.detach().numpy(),
        contacts.numpy(),
        radius=float(radius),
        mass=float(mass),
        drag=float(drag),
        dt=float(dt),
        substeps=int(substeps),
        stiffness=float(stiffness),
        half_extent=float(half_extent),
    )
    return contacts


def particle_step_torch(
    pos: torch.Tensor,
    vel: torch.Tensor,
    force: torch.Tensor,
    *,
    radius: float,
    mass: float,
    drag: float,
    dt: float,
    substeps: int,
    stiffness: float,
    half_extent: float,
) -> torch.Tensor:
    """The torch twin of :func:`particle_step` (any device, tensors need not be contiguous).

    Same arguments (``pos``, ``vel``, ``force``: ``[E, N, 2]`` float32 on one device) and result
    (``[E, N]`` int32 contacts, on that device); pair forces are a dense ``[E, N, N, 2]`` tensor.
    """
    fn = "particle_step"
    c = _step_constants(radius, mass, drag, dt, substeps, stiffness, half_extent)
    _check_state(fn, "pos", pos, None, contiguous=False)
    _check_state(fn, "vel", vel, pos, contiguous=False)
    _check_state(fn, "force", force, pos, contiguous=False)
    with torch.no_grad():
        return _step_torch(pos, vel, force, c)


def knn(
    pos: torch.Tensor, k: int, *, radius: float = math.inf, backend: Backend = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` nearest other agents of every agent, within ``radius``.

    Neighbours are ordered by squared distance (float32 ``rx * rx + ry * ry``), ties by the
    smaller index; only those with ``d2 <= radius**2`` qualify.

    Args:
        pos: ``[E, N, 2]`` float32, contiguous; agent centres.
        k: neighbours per agent, ``0 <= k <= N - 1``.
        radius: the search radius, ``> 0`` (``math.inf``: no limit).
        backend: see :data:`Backend`.

    Returns:
        ``(rel, idx)``: ``rel`` ``[E, N, k, 2]`` float32 holds ``pos_j - pos_i``; ``idx``
        ``[E, N, k]`` int64 holds ``j``. Slots without a qualifying neighbour hold rel ``0`` and
        idx ``-1``.

    Raises:
        TypeError: ``pos`` is not a tensor, or ``k`` / ``radius`` of the wrong type.
        ValueError: a bad shape, dtype, layout, ``k`` or ``radius``.
        ExtensionError: ``backend="native"`` without a loadable extension.
    """
    fn = "knn"
    _check_state(fn, "pos", pos, None, contiguous=True)
    k_int = _int(fn, "k", k)
    radius2 = _knn_radius2(fn, k_int, pos.shape[1], _real(fn, "radius", radius))
    e, n = pos.shape[0], pos.shape[1]
    if not _use_native(fn, backend, (pos,)):
        with torch.no_grad():
            return _knn_torch(pos, k_int, radius2)
    rel = torch.empty((e, n, k_int, 2), dtype=torch.float32)
    idx = torch.empty((e, n, k_int), dtype=torch.int64)
    load_extension().knn(pos.detach().numpy(), k_int, float(radius), rel.numpy(), idx.numpy())
    return rel, idx


def knn_torch(
    pos: torch.Tensor, k: int, *, radius: float = math.inf
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch twin of :func:`knn` (any device; ``pos`` ``[E, N, 2]`` float32).

    Returns ``rel`` ``[E, N, k, 2]`` float32 and ``idx`` ``[E, N, k]`` int64 on ``pos``'s device,
    from a dense ``[E, N, N]`` squared-distance tensor and a stable sort.
    """
    fn = "knn"
    _check_state(fn, "pos", pos, None, contiguous=False)
    k_int = _int(fn, "k", k)
    radius2 = _knn_radius2(fn, k_int, pos.shape[1], _real(fn, "radius", radius))
    with torch.no_grad():
        return _knn_torch(pos, k_int, radius2)
