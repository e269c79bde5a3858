"""Particle-world kernels: soft-contact circular agents in a box, landmarks, k-nearest neighbours.

Two backends do the same float32 maths in the same order: the C++ kernels of ``marlkit._C``
(CPU, O(N) per environment through uniform grids, on marlkit's thread pool with the GIL
released) and the torch twins :func:`particle_step_torch` and :func:`knn_torch` (any device,
dense O(N^2) pair tensors; the fallback and the oracle of the agreement tests).

The contact force on an agent is one running sum, from 0, of its partners' terms in ascending
order (other agents by index, then landmarks by index), then ``F_i = force_i + sum``. The C++
grid only finds the partners and sorts them before summing, so its result does not depend on the
grid or the threads. The twin sums a dense row (zeros for non-touching partners) with
``Tensor.sum``: the same additions in the same order wherever torch sums a row sequentially, so
the backends agree bit for bit where an agent has at most two contacts and to float32 rounding
elsewhere. The twin takes its square roots through float64 on the CPU, where torch's float32
``sqrt`` is not correctly rounded. :func:`knn` is exact in both backends (the same neighbours in
the same order, the same ``rel`` bits).

Shapes: ``E`` environments, ``N`` agents, ``M`` landmarks, ``k`` neighbours.

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
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Literal, NamedTuple

import torch

from marlkit._checks import check_int, check_one_of, check_real
from marlkit._utils import get_logger
from marlkit.native._loader import ExtensionError, load_extension

__all__ = ["Backend", "knn", "knn_torch", "particle_step", "particle_step_torch"]

#: ``"auto"``: the C++ kernel when every tensor is on the CPU and the extension loads, else torch;
#: ``"native"``: the C++ kernel or an error; ``"torch"``: the torch twin.
Backend = Literal["auto", "native", "torch"]

#: A number for every agent (or landmark), or a float32 tensor with one value each.
PerAgent = float | torch.Tensor

_BACKENDS = ("auto", "native", "torch")
_F32_TINY = 1.1754943508222875e-38  # the smallest normal float32: the radius bound when N = 0
_STATE = "[E, N, 2]"
_log = get_logger("native.particles")
_native_status: list[bool] = []  # [] until "auto" first asks; then [whether the extension loads]


class _Constants(NamedTuple):
    """The float32 constants of one particle_step call, as Python floats holding float32 values."""

    two_r: float  # 2r (scalar radius only)
    contact2: float  # (2r)^2 (scalar radius only)
    k: float  # stiffness
    h: float  # dt / substeps
    a: float  # 1 - drag
    b: float  # h / mass
    lim: float  # L - r (scalar radius only)
    substeps: int
    half_extent: float  # float32(L)


@dataclass
class _Options:
    """The optional inputs of one particle_step call, checked (tensors on pos's device)."""

    radius: float | torch.Tensor  # a float or float32 [N]
    max_speed: float | torch.Tensor | None = None  # None, a float or float32 [N]
    active: torch.Tensor | None = None  # bool [E, N]
    landmarks: torch.Tensor | None = None  # float32 [E, M, 2]
    landmark_radius: float | torch.Tensor | None = None  # a float or float32 [M]


def _f32(x: float) -> float:
    """``x`` rounded to float32 (as C's ``(float)x``: too large for float32 becomes +-inf)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _fmt(x: float) -> str:
    """A number as the C++ kernels print it (``%.9g``)."""
    return f"{x:.9g}"


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
    r = check_real("radius", radius, owner=fn)
    m = check_real("mass", mass, owner=fn)
    dr = check_real("drag", drag, low=None, finite=False, owner=fn)
    if not 0 <= dr < 1:  # the kernel's message
        raise ValueError(f"{fn}: drag must be in [0, 1), got {drag!r}")
    t = check_real("dt", dt, owner=fn)
    s = check_int("substeps", substeps, low=1, owner=fn)
    if s > 2**31 - 1:
        raise ValueError(f"{fn}: substeps must be an int < 2**31, got {substeps!r}")
    k = check_real("stiffness", stiffness, strict=False, owner=fn)
    L = check_real("half_extent", half_extent, low=None, finite=False, owner=fn)
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
        half_extent=L32,
    )


def _knn_radius2(fn: str, k: int, n: int, radius: float) -> float:
    """Validate ``k`` and ``radius``; return ``float32(radius)**2`` in float32."""
    if k < 0 or k > max(n - 1, 0):
        raise ValueError(f"{fn}: k must be in [0, N - 1] = [0, {n - 1}] (other agents), got {k}")
    if not radius > 0:
        raise ValueError(f"{fn}: radius must be > 0 (inf allowed), got {radius!r}")
    r32 = _f32(radius)
    return _f32(r32 * r32)


def _check_tensor(
    fn: str,
    name: str,
    t: object,
    dtype: torch.dtype,
    layout: str,
    shape: tuple[int, ...] | None,
    like: torch.Tensor | None,
    contiguous: bool,
) -> torch.Tensor:
    """Check a tensor's type, shape (``None``: ``[*, *, 2]``), dtype, device and layout."""
    dtype_name = str(dtype).removeprefix("torch.")
    article = "an" if dtype_name[0] in "aeiou" else "a"
    expected = layout if shape is None else f"{layout} = {list(shape)}"
    if shape is not None and layout.endswith("(like pos)"):
        expected = f"{layout.removesuffix(' (like pos)')} = {list(shape)} (like pos)"
    what = f"{fn}: {name} must be {article} {dtype_name} tensor of shape {expected}"
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}, got {type(t).__name__}")
    bad_shape = t.ndim != 3 or t.shape[2] != 2 if shape is None else tuple(t.shape) != shape
    if bad_shape:
        raise ValueError(f"{what}, got shape {list(t.shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{what}, got dtype {t.dtype}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{what} on pos's device {like.device}, got device {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{what} and contiguous, got a non-contiguous tensor")
    return t


def _check_state(
    fn: str, name: str, t: object, like: torch.Tensor | None, contiguous: bool
) -> torch.Tensor:
    """Check one float32 ``[E, N, 2]`` tensor (shaped and placed like ``like`` when given)."""
    if like is None:
        return _check_tensor(fn, name, t, torch.float32, _STATE, None, None, contiguous)
    layout = f"{_STATE} (like pos)"
    shape = tuple(like.shape)
    return _check_tensor(fn, name, t, torch.float32, layout, shape, like, contiguous)


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


def _per_item(
    fn: str, name: str, value: object, layout: str, count: int, pos: torch.Tensor
) -> float | torch.Tensor:
    """A real number, or a float32 tensor of shape ``[count]`` on pos's device."""
    if isinstance(value, torch.Tensor):
        return _check_tensor(fn, name, value, torch.float32, layout, (count,), pos, False)
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{fn}: {name} must be a real number or a float32 tensor of shape {layout}, got "
            f"{type(value).__name__}"
        )
    return float(value)


def _first_bad(values: torch.Tensor, ok: torch.Tensor) -> tuple[int, float] | None:
    """``(index, value)`` of the first entry where ``ok`` is false, or None."""
    bad = (~ok).nonzero()
    if bad.numel() == 0:
        return None
    i = int(bad[0, 0])
    return i, float(values[i])


def _largest_radius(fn: str, radius: float | torch.Tensor) -> float:
    """Check a radius tensor's values (the kernel's rule and message); return the largest radius.

    A scalar is returned as is (``_step_constants`` checks it).
    """
    if isinstance(radius, float):
        return radius
    if radius.numel() == 0:
        return _F32_TINY
    bad = _first_bad(radius, torch.isfinite(radius) & (radius > 0))
    if bad is not None:
        raise ValueError(f"{fn}: radius[{bad[0]}] must be a finite number > 0, got {_fmt(bad[1])}")
    return float(radius.max())


def _check_options(fn: str, opts: _Options) -> None:
    """Check the values of max_speed and landmark_radius (the kernel's rules and messages)."""
    speed = opts.max_speed
    if isinstance(speed, float) and not speed > 0:
        raise ValueError(f"{fn}: max_speed must be > 0 (inf allowed), got {speed!r}")
    if isinstance(speed, torch.Tensor) and speed.numel() > 0:
        bad = _first_bad(speed, speed > 0)
        if bad is not None:
            raise ValueError(
                f"{fn}: max_speed[{bad[0]}] must be > 0 (inf allowed), got {_fmt(bad[1])}"
            )
    lr = opts.landmark_radius
    if isinstance(lr, float):
        check_real("landmark_radius", lr, strict=False, owner=fn)
    if isinstance(lr, torch.Tensor) and lr.numel() > 0:
        bad = _first_bad(lr, torch.isfinite(lr) & (lr >= 0))
        if bad is not None:
            raise ValueError(
                f"{fn}: landmark_radius[{bad[0]}] must be a finite number >= 0, got {_fmt(bad[1])}"
            )


def _gather_options(
    fn: str,
    pos: torch.Tensor,
    radius: object,
    max_speed: object,
    active: object,
    landmarks: object,
    landmark_radius: object,
) -> _Options:
    """Check types, shapes, dtypes and devices of the optional inputs."""
    e, n = pos.shape[0], pos.shape[1]
    opts = _Options(radius=_per_item(fn, "radius", radius, "[N]", n, pos))
    if max_speed is not None:
        opts.max_speed = _per_item(fn, "max_speed", max_speed, "[N]", n, pos)
    if active is not None:
        opts.active = _check_tensor(fn, "active", active, torch.bool, "[E, N]", (e, n), pos, False)
    if landmarks is not None:
        lm = _check_tensor(fn, "landmarks", landmarks, torch.float32, "[E, M, 2]", None, pos, False)
        if lm.shape[0] != e:
            raise ValueError(
                f"{fn}: landmarks must be a float32 tensor of shape [E, M, 2] with E = {e} "
                f"(like pos), got shape {list(lm.shape)}"
            )
        if landmark_radius is None:
            raise ValueError(
                f"{fn}: landmarks need landmark_radius (a number or a float32 array of shape [M])"
            )
        opts.landmarks = lm
        opts.landmark_radius = _per_item(
            fn, "landmark_radius", landmark_radius, "[M]", lm.shape[1], pos
        )
    elif landmark_radius is not None:
        raise ValueError(f"{fn}: landmark_radius was given without landmarks")
    return opts


def _use_native(fn: str, backend: str, tensors: tuple[torch.Tensor | None, ...]) -> bool:
    check_one_of("backend", backend, _BACKENDS, owner=fn)
    if backend == "torch":
        return False
    on_cpu = all(t.device.type == "cpu" for t in tensors if t is not None)
    if backend == "native":
        if not on_cpu:
            devices = sorted({str(t.device) for t in tensors if t is not None})
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


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 square root, as C++'s ``std::sqrt``.

    torch's CPU float32 ``sqrt`` (MKL's vector maths) is off by one ulp for ~0.7% of inputs; the
    float64 square root rounded to float32 is exact (a float32's root is never that close to a
    float32 rounding midpoint). Other devices (CUDA: IEEE ``sqrtf``; MPS: no float64) use float32.
    """
    if x.device.type == "cpu":
        return torch.sqrt(x.double()).float()
    return torch.sqrt(x)


def _as_tensor(value: float | torch.Tensor, count: int, like: torch.Tensor) -> torch.Tensor:
    """A float32 ``[count]`` tensor (a float is rounded to float32 and repeated)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.full((count,), _f32(value), dtype=torch.float32, device=like.device)


def _contact_terms(
    dx: torch.Tensor,
    dy: torch.Tensor,
    d2: torch.Tensor,
    reach: torch.Tensor,
    touching: torch.Tensor,
    k: float,
    fallback_x: torch.Tensor | float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense contact terms ``(fx, fy)``: ``k (reach - d) n`` where touching, else 0."""
    d = _sqrt(d2)
    kp = torch.where(touching, k * (reach - d), 0.0)
    far = touching & (d > 1e-6)  # elsewhere the normal is the finite fallback: kp * n = 0
    nx = torch.where(far, dx / d, fallback_x)
    ny = torch.where(far, dy / d, 0.0)
    return kp * nx, kp * ny


def _step_torch(
    pos: torch.Tensor, vel: torch.Tensor, force: torch.Tensor, c: _Constants, opts: _Options
) -> torch.Tensor:
    n, dev = pos.shape[1], pos.device
    r = _as_tensor(opts.radius, n, pos)  # [N]
    reach = r[:, None] + r[None, :]  # [N, N] float32: r_i + r_j
    reach2 = reach * reach
    lim = (c.half_extent - r)[None, :, None]  # [1, N, 1] float32: L - r_i
    pair_ok = ~torch.eye(n, dtype=torch.bool, device=dev)  # [N, N]: j != i
    act = opts.active
    if act is not None:
        pair_ok = pair_ok & act[:, :, None] & act[:, None, :]  # [E, N, N]
    i_before_j = torch.ones(n, n, dtype=torch.bool, device=dev).triu(1)
    fallback_nx = torch.where(i_before_j, 1.0, -1.0).to(pos.dtype)  # normal at d <= 1e-6
    lm = opts.landmarks
    if lm is not None:
        if opts.landmark_radius is None:  # unreachable: _options refuses it with its message
            raise ValueError("particle_step_torch: landmarks need landmark_radius")
        lr = _as_tensor(opts.landmark_radius, lm.shape[1], pos)  # [M]
        l_reach = r[:, None] + lr[None, :]  # [N, M]
        l_reach2 = l_reach * l_reach
    speed = None if opts.max_speed is None else _as_tensor(opts.max_speed, n, pos)[None, :]
    x, v = pos, vel
    for _ in range(c.substeps):
        px, py = x[..., 0], x[..., 1]
        dx = px[:, :, None] - px[:, None, :]  # [E, N, N]: p_i - p_j
        dy = py[:, :, None] - py[:, None, :]
        d2 = dx * dx + dy * dy
        fx, fy = _contact_terms(dx, dy, d2, reach, (d2 < reach2) & pair_ok, c.k, fallback_nx)
        if lm is not None:
            ldx = px[:, :, None] - lm[:, None, :, 0]  # [E, N, M]: p_i - l_m
            ldy = py[:, :, None] - lm[:, None, :, 1]
            ld2 = ldx * ldx + ldy * ldy
            touch = ld2 < l_reach2
            if act is not None:
                touch = touch & act[:, :, None]
            lfx, lfy = _contact_terms(ldx, ldy, ld2, l_reach, touch, c.k, 1.0)
            fx, fy = torch.cat([fx, lfx], dim=2), torch.cat([fy, lfy], dim=2)
        # One dense row per agent: agents ascending, then landmarks ascending.
        total = force + torch.stack((fx.sum(dim=2), fy.sum(dim=2)), dim=-1)
        nv = v * c.a + total * c.b
        if speed is not None:
            s2 = nv[..., 0] * nv[..., 0] + nv[..., 1] * nv[..., 1]
            over = s2 > speed * speed
            nv = torch.where(over[..., None], nv * (speed / _sqrt(s2))[..., None], nv)
        nxt = x + nv * c.h
        over, under = nxt > lim, nxt < -lim
        nxt = torch.where(over, lim, torch.where(under, -lim, nxt))
        nv = torch.where(over | under, 0.0, nv)
        if act is not None:
            nxt = torch.where(act[..., None], nxt, x)
            nv = torch.where(act[..., None], nv, v)
        x, v = nxt, nv
    pos.copy_(x)
    vel.copy_(v)
    px, py = pos[..., 0], pos[..., 1]
    dx = px[:, :, None] - px[:, None, :]
    dy = py[:, :, None] - py[:, None, :]
    return ((dx * dx + dy * dy < reach2) & pair_ok).sum(dim=-1, dtype=torch.int32)


def _knn_torch(
    pos: torch.Tensor, k: int, radius2: float, active: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    e, n = pos.shape[0], pos.shape[1]
    rel_all = pos[:, None, :, :] - pos[:, :, None, :]  # [E, N(i), N(j), 2]: pos_j - pos_i
    rx, ry = rel_all[..., 0], rel_all[..., 1]
    d2 = rx * rx + ry * ry  # [E, N, N]
    valid = (d2 <= radius2) & ~torch.eye(n, dtype=torch.bool, device=pos.device)
    if active is not None:
        valid = valid & active[:, :, None] & active[:, None, :]
    # NaN sorts after +inf: a qualifying neighbour at d2 = inf still beats every invalid one.
    key = torch.where(valid, d2, math.nan)
    order = torch.sort(key, dim=-1, stable=True).indices[..., :k]  # [E, N, k]
    found = torch.gather(valid, -1, order)
    rel = torch.gather(rel_all, 2, order[..., None].expand(e, n, k, 2))
    rel = torch.where(found[..., None], rel, 0.0)
    idx = torch.where(found, order, -1)
    return rel.contiguous(), idx.contiguous()


def _prepare_step(
    fn: str,
    pos: torch.Tensor,
    vel: torch.Tensor,
    force: torch.Tensor,
    params: Mapping[str, object],
    opts_in: Mapping[str, object],
    contiguous: bool,
) -> tuple[_Constants, _Options]:
    _check_state(fn, "pos", pos, None, contiguous=contiguous)
    _check_state(fn, "vel", vel, pos, contiguous=contiguous)
    _check_state(fn, "force", force, pos, contiguous=contiguous)
    opts = _gather_options(fn, pos, **opts_in)
    # The kernel's order: radius entries, the scalar parameters (against the largest radius),
    # then the other optional inputs.
    c = _step_constants(_largest_radius(fn, opts.radius), **params)  # type: ignore[arg-type]
    _check_options(fn, opts)
    return c, opts


def particle_step(
    pos: torch.Tensor,
    vel: torch.Tensor,
    force: torch.Tensor,
    *,
    radius: PerAgent,
    mass: float,
    drag: float,
    dt: float,
    substeps: int,
    stiffness: float,
    half_extent: float,
    max_speed: PerAgent | None = None,
    active: torch.Tensor | None = None,
    landmarks: torch.Tensor | None = None,
    landmark_radius: PerAgent | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Advance ``E`` particle worlds by one step; ``pos`` and ``vel`` are updated in place.

    Per substep ``h = dt / substeps``, with the positions at the start of the substep, for every
    active agent ``i``: ``F_i = force_i + S_i`` where ``S_i`` is the running float32 sum, from 0,
    of the contact terms of its partners, other active agents ``j`` ascending then landmarks
    ``m`` ascending. A partner touches when ``d < r_i + r_j`` (``r_i + R_m`` for a landmark) and
    pushes with ``stiffness * (r_i + r_j - d) * (p_i - p_j) / d`` (coincident centres,
    ``d <= 1e-6``: along ``(+1, 0)`` for the smaller agent index and against a landmark,
    ``(-1, 0)`` for the larger). Then ``vel = vel * (1 - drag) + F * (h / mass)``; where
    ``|vel| > max_speed_i``, ``vel *= max_speed_i / |vel|``; ``pos = pos + vel * h``; each
    coordinate is clamped to ``[-(L - r_i), L - r_i]`` with its velocity zeroed where clamped.
    Inactive agents keep ``pos`` and ``vel``, exert and feel no force, count no contacts.
    Landmarks never move. The C++ kernel finds touching pairs through a uniform grid per
    environment (O(N)); the result does not depend on it (see the module docstring).
    Not differentiable (runs without autograd).

    Args:
        pos: ``[E, N, 2]`` float32, contiguous; agent centres, updated in place.
        vel: ``[E, N, 2]`` float32, contiguous; velocities, updated in place.
        force: ``[E, N, 2]`` float32, contiguous; action forces (already scaled and clipped).
        radius: agent radius ``> 0``: a number, or float32 ``[N]`` per agent.
        mass: agent mass ``> 0``.
        drag: velocity damping per substep, in ``[0, 1)``.
        dt: time per step ``> 0``.
        substeps: integration substeps, an int ``>= 1``.
        stiffness: contact spring constant ``>= 0``.
        half_extent: the box is ``[-L, L]^2``, ``L > r`` (every ``r_i``) in float32.
        max_speed: speed limit ``> 0`` (``inf`` allowed): a number or float32 ``[N]``; ``None``
            (default) for none.
        active: ``[E, N]`` bool; ``None`` (default): every agent is active.
        landmarks: ``[E, M, 2]`` float32 centres of static circles; ``None`` (default): none.
        landmark_radius: landmark radius ``>= 0``, a number or float32 ``[M]``; required with
            ``landmarks``.
        backend: see :data:`Backend`.

    Returns:
        ``[E, N]`` int32: per agent, the number of other active agents closer than ``r_i + r_j``
        after the step (0 for inactive agents; landmarks are not counted).

    Raises:
        TypeError: a tensor or parameter of the wrong type.
        ValueError: a bad shape, dtype, device, layout or parameter value.
        ExtensionError: ``backend="native"`` without a loadable extension.
    """
    fn = "particle_step"
    params = dict(mass=mass, drag=drag, dt=dt, substeps=substeps, stiffness=stiffness)
    params["half_extent"] = half_extent
    opts_in = dict(
        radius=radius,
        max_speed=max_speed,
        active=active,
        landmarks=landmarks,
        landmark_radius=landmark_radius,
    )
    c, opts = _prepare_step(fn, pos, vel, force, params, opts_in, contiguous=True)
    _check_disjoint(fn, {"pos": pos, "vel": vel, "force": force})
    tensors = (pos, vel, force, *(t for t in opts_in.values() if isinstance(t, torch.Tensor)))
    if not _use_native(fn, backend, tensors):
        with torch.no_grad():
            return _step_torch(pos, vel, force, c, opts)
    contacts = torch.empty(pos.shape[:2], dtype=torch.int32)

    def arg(value: object) -> object:
        if isinstance(value, torch.Tensor):
            return value.detach().contiguous().numpy()
        return value

    load_extension().particle_step(
        pos.detach().numpy(),
        vel.detach().numpy(),
        force.detach().numpy(),
        contacts.numpy(),
        radius=arg(opts.radius),
        mass=float(mass),
        drag=float(drag),
        dt=float(dt),
        substeps=int(substeps),
        stiffness=float(stiffness),
        half_extent=float(half_extent),
        max_speed=arg(opts.max_speed),
        active=arg(opts.active),
        landmarks=arg(opts.landmarks),
        landmark_radius=arg(opts.landmark_radius),
    )
    return contacts


def particle_step_torch(
    pos: torch.Tensor,
    vel: torch.Tensor,
    force: torch.Tensor,
    *,
    radius: PerAgent,
    mass: float,
    drag: float,
    dt: float,
    substeps: int,
    stiffness: float,
    half_extent: float,
    max_speed: PerAgent | None = None,
    active: torch.Tensor | None = None,
    landmarks: torch.Tensor | None = None,
    landmark_radius: PerAgent | None = None,
) -> torch.Tensor:
    """The torch twin of :func:`particle_step` (any device, tensors need not be contiguous).

    Same arguments (``pos``, ``vel``, ``force``: ``[E, N, 2]`` float32 on one device) and result
    (``[E, N]`` int32 contacts, on that device); pair forces are dense ``[E, N, N]`` tensors
    (``[E, N, N + M]`` with landmarks), so memory grows with ``N^2``.
    """
    fn = "particle_step"
    params = dict(mass=mass, drag=drag, dt=dt, substeps=substeps, stiffness=stiffness)
    params["half_extent"] = half_extent
    opts_in = dict(
        radius=radius,
        max_speed=max_speed,
        active=active,
        landmarks=landmarks,
        landmark_radius=landmark_radius,
    )
    c, opts = _prepare_step(fn, pos, vel, force, params, opts_in, contiguous=False)
    with torch.no_grad():
        return _step_torch(pos, vel, force, c, opts)


def _prepare_knn(
    fn: str, pos: object, k: object, radius: object, active: object, contiguous: bool
) -> tuple[int, float, torch.Tensor | None]:
    pos_t = _check_state(fn, "pos", pos, None, contiguous=contiguous)
    k_int = check_int("k", k, owner=fn)
    radius = check_real("radius", radius, low=None, finite=False, owner=fn)
    radius2 = _knn_radius2(fn, k_int, pos_t.shape[1], radius)
    act = None
    if active is not None:
        shape = (pos_t.shape[0], pos_t.shape[1])
        act = _check_tensor(fn, "active", active, torch.bool, "[E, N]", shape, pos_t, False)
    return k_int, radius2, act


def knn(
    pos: torch.Tensor,
    k: int,
    *,
    radius: float = math.inf,
    active: torch.Tensor | None = None,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` nearest other agents of every agent, within ``radius``.

    Neighbours are ordered by squared distance (float32 ``rx * rx + ry * ry``), ties by the
    smaller index; only active agents with ``d2 <= float32(radius)**2`` qualify. The C++ kernel
    searches a uniform grid in growing rings of cells (O(N k) per environment, also with an
    infinite radius) and returns exactly what the brute force returns.

    Args:
        pos: ``[E, N, 2]`` float32, contiguous; agent centres.
        k: neighbours per agent, ``0 <= k <= N - 1``.
        radius: the search radius, ``> 0`` (``math.inf``: no limit).
        active: ``[E, N]`` bool; inactive agents are nobody's neighbour and get empty rows.
            ``None`` (default): every agent is active.
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
    k_int, radius2, act = _prepare_knn(fn, pos, k, radius, active, contiguous=True)
    e, n = pos.shape[0], pos.shape[1]
    if not _use_native(fn, backend, (pos, act)):
        with torch.no_grad():
            return _knn_torch(pos, k_int, radius2, act)
    rel = torch.empty((e, n, k_int, 2), dtype=torch.float32)
    idx = torch.empty((e, n, k_int), dtype=torch.int64)
    load_extension().knn(
        pos.detach().numpy(),
        k_int,
        float(radius),
        rel.numpy(),
        idx.numpy(),
        active=None if act is None else act.contiguous().numpy(),
    )
    return rel, idx


def knn_torch(
    pos: torch.Tensor,
    k: int,
    *,
    radius: float = math.inf,
    active: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch twin of :func:`knn` (any device; ``pos`` ``[E, N, 2]`` float32).

    Returns ``rel`` ``[E, N, k, 2]`` float32 and ``idx`` ``[E, N, k]`` int64 on ``pos``'s device,
    from a dense ``[E, N, N]`` squared-distance tensor and a stable sort.
    """
    k_int, radius2, act = _prepare_knn("knn", pos, k, radius, active, contiguous=False)
    with torch.no_grad():
        return _knn_torch(pos, k_int, radius2, act)
