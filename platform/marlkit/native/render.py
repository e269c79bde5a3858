"""Software renderer for the native 2-D scenarios: uint8 RGB frames of circles, fast in C++.

A scene is a list of :class:`Circles` layers drawn in order over a background and the world
bounds: agents as filled circles coloured by group, goals as rings (or smaller filled circles
in a lighter shade), landmarks as grey filled circles. The world is the square
``[-half_extent, half_extent]^2`` with y pointing up; it maps onto the centred
``side x side`` pixel square of the frame, ``side = min(height, width)``.

Two backends draw the same bytes: the C++ kernel ``marlkit._C.render_frames`` (frames of a
batch spread over threads) and :func:`_render_numpy`, a NumPy twin that follows it operation by
operation, used when the extension is not built and as the oracle of the agreement tests.

Example:
    >>> import numpy as np
    >>> from marlkit.native.render import Circles, GROUP_COLORS, lighten, render_frame
    >>> agents = np.array([[-0.5, 0.0], [0.5, 0.5]])
    >>> goals = np.array([[0.5, -0.5], [-0.5, 0.5]])
    >>> frame = render_frame(
    ...     [Circles(goals, 0.08, lighten(GROUP_COLORS[0]), filled=False),
    ...      Circles(agents, 0.05, GROUP_COLORS[0], name="agents")],
    ...     half_extent=1.0, size=128)
    >>> frame.shape, frame.dtype
    ((128, 128, 3), dtype('uint8'))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import NDArray

from marlkit._checks import check_flag, check_int, check_ints, check_one_of, check_real
from marlkit.native._loader import load_extension, native_or_fallback

__all__ = [
    "GROUP_COLORS",
    "LANDMARK_COLOR",
    "Backend",
    "Circles",
    "Color",
    "group_color",
    "lighten",
    "render_frame",
    "render_frames",
    "tile_frames",
]

Color = tuple[int, int, int]
Backend = Literal["auto", "native", "numpy"]

#: Ten distinct colours (the "tab10" palette) to colour agent groups by index.
GROUP_COLORS: tuple[Color, ...] = (
    (31, 119, 180),  # blue
    (255, 127, 14),  # orange
    (44, 160, 44),  # green
    (214, 39, 40),  # red
    (148, 103, 189),  # purple
    (140, 86, 75),  # brown
    (227, 119, 194),  # pink
    (127, 127, 127),  # grey
    (188, 189, 34),  # olive
    (23, 190, 207),  # cyan
)

#: Default colour of landmarks (obstacles and other static circles).
LANDMARK_COLOR: Color = (150, 150, 150)

_BACKENDS = ("auto", "native", "numpy")
_auto_native: bool | None = None


@dataclass(frozen=True)
class Circles:
    """One layer of circles, drawn in index order (later circles cover earlier ones).

    Attributes:
        centers: world coordinates, ``[M, 2]`` (the same in every frame) or ``[*B, M, 2]``
            (one set per frame, :func:`render_frames` only); any real dtype, NumPy array or
            torch tensor (any device; moved to CPU).
        radius: world units, a number or ``[M]``; finite and ``>= 0``. A circle whose pixel
            radius is below 1 still shows as one pixel.
        color: ``(r, g, b)`` integers in ``[0, 255]``, or ``[M, 3]`` for one colour per circle.
        filled: a filled disc (agents, landmarks) or a ring (goals).
        line_width: ring thickness in pixels, measured inwards from ``radius``; unused when
            filled.
        name: shown in error messages (e.g. ``"agents"``, ``"goals"``).
    """

    centers: Any
    radius: Any
    color: Any
    filled: bool = True
    line_width: float = 1.5
    name: str = ""


class _Layer(NamedTuple):
    """A checked layer: float64 centres ``[M, 2]`` or ``[N, M, 2]``, radius ``[M]``, colours
    int64 ``[M, 3]``."""

    centers: NDArray[np.float64]
    radius: NDArray[np.float64]
    colors: NDArray[np.int64]
    filled: bool
    line_width: float


def group_color(index: int) -> Color:
    """Colour of group ``index`` (wraps around :data:`GROUP_COLORS`)."""
    return GROUP_COLORS[check_int("group index", index) % len(GROUP_COLORS)]


def lighten(color: Sequence[int], amount: float = 0.5) -> Color:
    """Mix ``color`` towards white: ``amount=0`` keeps it, ``amount=1`` gives white.

    Used for goals drawn in a lighter shade of their agent's colour.
    """
    rgb = _rgb(color, "color")
    a = check_real("amount", amount, strict=False, high=1.0)
    r, g, b = (math.floor(c + (255 - c) * a + 0.5) for c in rgb)
    return (r, g, b)


def render_frame(
    layers: Sequence[Circles],
    *,
    half_extent: float,
    size: int | tuple[int, int] = 256,
    background: Sequence[int] = (255, 255, 255),
    border: Sequence[int] = (0, 0, 0),
    border_width: int = 2,
    antialias: bool = True,
    backend: Backend = "auto",
) -> NDArray[np.uint8]:
    """Render one frame of circle layers; returns ``uint8 [H, W, 3]``.

    Args:
        layers: :class:`Circles` drawn in list order; every ``centers`` is ``[M, 2]``.
        half_extent: ``L`` of the world square ``[-L, L]^2``; finite and ``> 0``.
        size: ``S`` for an ``S x S`` frame, or ``(height, width)``.
        background: RGB of the empty world.
        border: RGB of the world bounds, drawn ``border_width`` pixels thick inside them.
        border_width: pixels, ``>= 0`` (``0``: no border).
        antialias: one-pixel coverage anti-aliasing of circle edges.
        backend: ``"native"`` (C++), ``"numpy"`` (the twin) or ``"auto"`` (native when built).

    Raises:
        TypeError: a layer, array or option of the wrong type.
        ValueError: wrong shapes, non-finite centres or radii (the message names the layer),
            colours outside ``[0, 255]``, ``size <= 0``, ``half_extent <= 0``.
    """
    for i, layer in enumerate(_check_layer_list(layers)):
        ndim = getattr(layer.centers, "ndim", None)
        if ndim is None:
            ndim = np.ndim(layer.centers)
        if ndim > 2:
            raise ValueError(
                f"{_label(i, layer)}: centers must have shape [M, 2] in render_frame, got "
                f"{tuple(np.shape(layer.centers))}; use render_frames for a batch [*B, M, 2]"
            )
    return render_frames(
        layers,
        half_extent=half_extent,
        size=size,
        batch_shape=(),
        background=background,
        border=border,
        border_width=border_width,
        antialias=antialias,
        backend=backend,
    )


def render_frames(
    layers: Sequence[Circles],
    *,
    half_extent: float,
    size: int | tuple[int, int] = 256,
    batch_shape: int | Sequence[int] | None = None,
    background: Sequence[int] = (255, 255, 255),
    border: Sequence[int] = (0, 0, 0),
    border_width: int = 2,
    antialias: bool = True,
    backend: Backend = "auto",
) -> NDArray[np.uint8]:
    """Render a batch of frames; returns ``uint8 [*B, H, W, 3]``.

    Each layer's ``centers`` is ``[*B, M, 2]`` (one set per frame, e.g. the env batch of a
    scenario) or ``[M, 2]`` (the same in every frame, e.g. fixed landmarks). ``B`` comes from the
    batched layers; ``batch_shape`` gives it when no layer is batched (and is checked against
    them otherwise). The native backend spreads frames over the kernel threads.

    Args:
        layers: :class:`Circles` drawn in list order.
        half_extent, size, background, border, border_width, antialias, backend: as in
            :func:`render_frame`.
        batch_shape: ``B`` (an int or a tuple of ints), or ``None`` to infer it.

    Raises:
        TypeError, ValueError: as in :func:`render_frame`; also batched layers whose leading
            dims disagree, or no batch shape to infer.
    """
    height, width = _parse_size(size)
    extent = _parse_half_extent(half_extent)
    bg = _rgb(background, "background")
    bd = _rgb(border, "border")
    bw = check_int("border_width", border_width, low=0)
    aa = check_flag("antialias", antialias)
    use_native = _resolve_backend(backend)
    prepared, shape = _prepare_layers(_check_layer_list(layers), batch_shape)
    count = math.prod(shape)
    if use_native:
        native_layers = [tuple(layer) for layer in prepared]
        out = load_extension().render_frames(
            count, height, width, extent, native_layers, bg, bd, bw, aa
        )
    else:
        out = _render_numpy(count, height, width, extent, prepared, bg, bd, bw, aa)
    return out.reshape((*shape, height, width, 3))


def tile_frames(
    frames: Sequence[Any] | Any,
    cols: int | None = None,
    pad: int = 2,
    pad_color: Sequence[int] = (64, 64, 64),
) -> NDArray[np.uint8]:
    """Arrange frames in a grid, row by row; returns ``uint8 [H', W', 3]``.

    Args:
        frames: ``K`` frames, ``uint8 [K, H, W, 3]`` (array or tensor) or a sequence of
            ``uint8 [H, W, 3]``, all the same size.
        cols: grid columns; ``None`` gives a near-square grid (``ceil(sqrt(K))``). There are
            ``rows = ceil(K / cols)`` rows; cells left over are ``pad_color``.
        pad: pixels between tiles and around the grid, ``>= 0``.
        pad_color: RGB of the padding (dark grey by default).

    Returns:
        ``[rows * H + (rows + 1) * pad, cols * W + (cols + 1) * pad, 3]`` uint8.
    """
    stack = _stack_frames(frames)
    k, h, w, _ = stack.shape
    cols = check_int("cols", cols, low=1, allow_none=True)
    pad = check_int("pad", pad, low=0)
    if cols is None:
        cols = math.ceil(math.sqrt(k))
    rows = math.ceil(k / cols)
    grid = np.empty((rows * h + (rows + 1) * pad, cols * w + (cols + 1) * pad, 3), np.uint8)
    grid[...] = _rgb(pad_color, "pad_color")
    for idx in range(k):
        r, c = divmod(idx, cols)
        top = pad + r * (h + pad)
        left = pad + c * (w + pad)
        grid[top : top + h, left : left + w] = stack[idx]
    return grid


# --- input checks ------------------------------------------------------------------------------


def _label(index: int, layer: Circles) -> str:
    return f"layer {index} ({layer.name!r})" if layer.name else f"layer {index}"


def _as_array(value: Any, what: str) -> np.ndarray:
    """A NumPy view of an array, a torch tensor (any device, moved to CPU) or a nested list."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor, duck-typed
        tensor = value.detach().cpu()
        try:
            return np.asarray(tensor.numpy())
        except TypeError:  # bfloat16 and other dtypes NumPy lacks
            return np.asarray(tensor.double().numpy())
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{what} must be an array, got {type(value).__name__} ({err})") from err


def _check_layer_list(layers: Sequence[Circles]) -> Sequence[Circles]:
    if isinstance(layers, Circles) or not isinstance(layers, Sequence):
        raise TypeError(
            f"layers must be a sequence (list or tuple) of Circles, got {type(layers).__name__}"
        )
    for i, layer in enumerate(layers):
        if not isinstance(layer, Circles):
            raise TypeError(f"layer {i} must be a Circles, got {type(layer).__name__}")
    return layers


def _rgb(value: Any, what: str) -> Color:
    arr = _as_array(value, what)
    if arr.shape != (3,) or arr.dtype.kind not in "iu":
        raise TypeError(
            f"{what} must be 3 integers (r, g, b) in [0, 255], got {value!r} "
            f"(shape {tuple(arr.shape)}, dtype {arr.dtype})"
        )
    if arr.min() < 0 or arr.max() > 255:
        raise ValueError(f"{what} components must lie in [0, 255], got {value!r}")
    r, g, b = (int(c) for c in arr)
    return (r, g, b)


def _parse_size(size: int | tuple[int, int]) -> tuple[int, int]:
    height, width = check_ints("size", size, low=1, length=2)
    return height, width


def _parse_half_extent(half_extent: float) -> float:
    return check_real("half_extent", half_extent)


def _resolve_backend(backend: str) -> bool:
    """Whether to use the native kernel; ``"native"`` raises ExtensionError when it is missing."""
    global _auto_native
    check_one_of("backend", backend, _BACKENDS)
    if backend == "native":
        load_extension()
        return True
    if backend == "numpy":
        return False
    if _auto_native is None:  # decided once: frames are rendered many times
        _auto_native = native_or_fallback("the renderer")
    return _auto_native


def _prepare_centers(
    raw: Any, label: str, batch_shape: tuple[int, ...] | None
) -> tuple[NDArray[np.float64], tuple[int, ...] | None]:
    """Centres as float64 ``[M, 2]`` or flattened ``[N, M, 2]``, and the batch shape seen."""
    arr = _as_array(raw, f"{label}: centers")
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{label}: centers must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim < 2 or arr.shape[-1] != 2:
        raise ValueError(f"{label}: centers must have shape [M, 2] or [*B, M, 2], got {arr.shape}")
    centers = np.ascontiguousarray(arr, dtype=np.float64)
    finite = np.isfinite(centers)
    if not finite.all():
        idx = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(
            f"{label}: centers must be finite, got {centers[idx]} at index {idx} "
            f"(shape {centers.shape})"
        )
    if centers.ndim == 2:
        return centers, batch_shape
    shape = tuple(int(d) for d in centers.shape[:-2])
    if batch_shape is not None and shape != batch_shape:
        raise ValueError(
            f"{label}: centers have batch shape {shape}, but the batch shape is {batch_shape} "
            f"(from batch_shape or an earlier layer)"
        )
    return centers.reshape(-1, *centers.shape[-2:]), shape


def _prepare_radius(raw: Any, label: str, m: int) -> NDArray[np.float64]:
    arr = _as_array(raw, f"{label}: radius")
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{label}: radius must be a real number or array, got dtype {arr.dtype}")
    if arr.ndim == 0:
        arr = np.full(m, float(arr), dtype=np.float64)
    elif arr.shape != (m,):
        raise ValueError(f"{label}: radius must be a number or have shape [{m}], got {arr.shape}")
    radius = np.ascontiguousarray(arr, dtype=np.float64)
    bad = ~(np.isfinite(radius) & (radius >= 0.0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{label}: radius must be finite and >= 0, got {radius[i]} at index {i}")
    return radius


def _prepare_colors(raw: Any, label: str, m: int) -> NDArray[np.int64]:
    arr = _as_array(raw, f"{label}: color")
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"{label}: color must be integers in [0, 255] (r, g, b) or [M, 3], got dtype "
            f"{arr.dtype}"
        )
    if arr.shape == (3,):
        arr = np.broadcast_to(arr, (m, 3))
    elif arr.shape != (m, 3):
        raise ValueError(f"{label}: color must have shape (3,) or [{m}, 3], got {arr.shape}")
    colors = np.ascontiguousarray(arr, dtype=np.int64)
    if colors.size and (colors.min() < 0 or colors.max() > 255):
        raise ValueError(f"{label}: color components must lie in [0, 255]")
    return colors


def _prepare_layers(
    layers: Sequence[Circles], batch_shape: int | Sequence[int] | None
) -> tuple[list[_Layer], tuple[int, ...]]:
    """Checked layers and the batch shape ``B`` of the frames."""
    shape: tuple[int, ...] | None = None
    if batch_shape is not None:
        shape = check_ints("batch_shape", batch_shape, low=0)
    prepared: list[_Layer] = []
    for i, layer in enumerate(layers):
        label = _label(i, layer)
        centers, shape = _prepare_centers(layer.centers, label, shape)
        m = int(centers.shape[-2])
        filled = check_flag("filled", layer.filled, owner=label)
        lw = check_real("line_width", layer.line_width, owner=label)
        prepared.append(
            _Layer(
                centers,
                _prepare_radius(layer.radius, label, m),
                _prepare_colors(layer.color, label, m),
                filled,
                lw,
            )
        )
    if shape is None:
        raise ValueError(
            "render_frames: no layer has batched centers [*B, M, 2]; pass batch_shape to say how "
            "many frames to draw"
        )
    return prepared, shape


def _stack_frames(frames: Sequence[Any] | Any) -> NDArray[np.uint8]:
    if isinstance(frames, (list, tuple)):
        if not frames:
            raise ValueError("tile_frames: got no frames")
        items = [_as_array(f, f"frame {i}") for i, f in enumerate(frames)]
        for i, item in enumerate(items):
            if item.dtype != np.uint8 or item.ndim != 3 or item.shape[-1] != 3:
                raise ValueError(
                    f"tile_frames: frame {i} must be uint8 [H, W, 3], got {item.dtype} "
                    f"{tuple(item.shape)}"
                )
            if item.shape != items[0].shape:
                raise ValueError(
                    f"tile_frames: all frames must have the same shape; frame 0 is "
                    f"{items[0].shape}, frame {i} is {item.shape}"
                )
        return np.stack(items)
    stack = _as_array(frames, "frames")
    if stack.dtype != np.uint8 or stack.ndim != 4 or stack.shape[-1] != 3:
        raise ValueError(
            f"tile_frames: frames must be uint8 [K, H, W, 3] or a sequence of uint8 [H, W, 3], "
            f"got {stack.dtype} {tuple(stack.shape)}"
        )
    if stack.shape[0] == 0:
        raise ValueError("tile_frames: got no frames (K = 0)")
    return stack


# --- the NumPy twin ----------------------------------------------------------------------------
# Mirrors csrc/include/marlkit/render.h step by step (same float64 operations in the same order,
# the same integer blend), so both backends produce identical bytes. Keep the two in step.


def _render_numpy(
    batch: int,
    height: int,
    width: int,
    half_extent: float,
    layers: Sequence[_Layer],
    background: Color,
    border: Color,
    border_width: int,
    antialias: bool,
) -> NDArray[np.uint8]:
    """NumPy twin of ``marlkit._C.render_frames``; returns ``uint8 [batch, height, width, 3]``."""
    side = min(height, width)
    scale = float(side) / (2.0 * half_extent)
    ox = float((width - side) // 2)
    oy = float((height - side) // 2)
    out = np.empty((batch, height, width, 3), np.uint8)
    for b in range(batch):
        frame = out[b]
        frame[...] = background
        _draw_border(frame, int(ox), int(oy), side, border_width, border)
        for layer in layers:
            xy = layer.centers if layer.centers.ndim == 2 else layer.centers[b]
            px = (xy[:, 0] + half_extent) * scale + ox
            py = (half_extent - xy[:, 1]) * scale + oy
            rpx = layer.radius * scale
            for m in range(px.shape[0]):
                _draw_circle(
                    frame,
                    float(px[m]),
                    float(py[m]),
                    float(rpx[m]),
                    layer.colors[m],
                    layer.filled,
                    layer.line_width,
                    antialias,
                )
    return out


def _draw_border(
    frame: NDArray[np.uint8], ox: int, oy: int, side: int, width: int, color: Color
) -> None:
    if width <= 0:
        return
    w = min(width, side)
    frame[oy : oy + w, ox : ox + side] = color
    frame[oy + side - w : oy + side, ox : ox + side] = color
    frame[oy : oy + side, ox : ox + w] = color
    frame[oy : oy + side, ox + side - w : ox + side] = color


def _draw_circle(
    frame: NDArray[np.uint8],
    cx: float,
    cy: float,
    r: float,
    color: NDArray[np.int64],
    filled: bool,
    line_width: float,
    antialias: bool,
) -> None:
    """Twin of ``marlkit::render::draw_circle`` (pixel coordinates, y down)."""
    if not (math.isfinite(cx) and math.isfinite(cy) and math.isfinite(r)):
        return
    height, width = frame.shape[0], frame.shape[1]
    r = max(r, 0.0)
    reach = r + 1.0
    x_lo, x_hi = math.floor(cx - reach), math.floor(cx + reach)
    y_lo, y_hi = math.floor(cy - reach), math.floor(cy + reach)
    if x_hi < 0 or y_hi < 0 or x_lo > width - 1 or y_lo > height - 1:
        return
    j0, j1 = max(x_lo, 0), min(x_hi, width - 1)
    i0, i1 = max(y_lo, 0), min(y_hi, height - 1)
    r_in = max(r - line_width, 0.0)
    dy = (np.arange(i0, i1 + 1, dtype=np.float64) + 0.5) - cy
    dx = (np.arange(j0, j1 + 1, dtype=np.float64) + 0.5) - cx
    d = np.sqrt((dx * dx)[None, :] + (dy * dy)[:, None])
    if antialias:
        a = (r + 0.5) - d
        if not filled:
            a = np.minimum(a, (d - r_in) + 0.5)
        alpha = np.floor(np.clip(a, 0.0, 1.0) * 255.0 + 0.5).astype(np.int64)
    else:
        inside = d <= r
        if not filled:
            inside &= d >= r_in
        alpha = np.where(inside, 255, 0).astype(np.int64)
    region = frame[i0 : i1 + 1, j0 : j1 + 1]
    a3 = alpha[..., None]
    region[...] = (color * a3 + region.astype(np.int64) * (255 - a3) + 127) // 255
    if filled or r < 1.0:
        ci, cj = math.floor(cy), math.floor(cx)
        if 0 <= ci < height and 0 <= cj < width:
            frame[ci, cj] = color
