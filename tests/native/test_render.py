"""The software renderer: C++ kernel vs its NumPy twin, geometry, batching, tiling, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marlkit.native import get_num_threads, load_extension, set_num_threads
from marlkit.native.render import (
    GROUP_COLORS,
    LANDMARK_COLOR,
    Circles,
    group_color,
    lighten,
    render_frame,
    render_frames,
    tile_frames,
)

WHITE = (255, 255, 255)
RED = (200, 30, 30)
BLUE = (30, 60, 200)


def _scene(rng: np.random.Generator, n: int = 64, spread: float = 1.0) -> list[Circles]:
    """Landmarks, goal rings and agents of two groups in [-spread, spread]^2 (L = 1)."""
    colors = np.array([GROUP_COLORS[i % 2] for i in range(n)])
    goal_colors = np.array([lighten(GROUP_COLORS[i % 2]) for i in range(n)])
    return [
        Circles(rng.uniform(-spread, spread, (3, 2)), 0.15, LANDMARK_COLOR, name="landmarks"),
        Circles(
            rng.uniform(-spread, spread, (n, 2)),
            0.06,
            goal_colors,
            filled=False,
            line_width=1.5,
            name="goals",
        ),
        Circles(
            rng.uniform(-spread, spread, (n, 2)),
            rng.uniform(0.0, 0.08, n),
            colors,
            name="agents",
        ),
    ]


def _both(layers: list[Circles], **kwargs: object) -> tuple[np.ndarray, np.ndarray]:
    native = render_frame(layers, backend="native", **kwargs)  # type: ignore[arg-type]
    twin = render_frame(layers, backend="numpy", **kwargs)  # type: ignore[arg-type]
    return native, twin


# --- native vs NumPy twin ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("size", [256, (96, 160), (161, 77)])
def test_native_matches_numpy_twin_exactly(
    seed: int, antialias: bool, size: int | tuple[int, int]
) -> None:
    # Both backends run the same float64 operations and the same integer blend: identical bytes.
    layers = _scene(np.random.default_rng(seed), spread=1.3)  # some circles leave the frame
    native, twin = _both(layers, half_extent=1.0, size=size, antialias=antialias)
    assert native.dtype == np.uint8
    expected_shape = (size, size, 3) if isinstance(size, int) else (*size, 3)
    assert native.shape == expected_shape
    np.testing.assert_array_equal(native, twin)


def test_native_matches_twin_for_batches_with_a_shared_layer() -> None:
    rng = np.random.default_rng(7)
    agents = Circles(rng.uniform(-2, 2, (2, 3, 10, 2)), 0.1, BLUE, name="agents")
    goals = Circles(rng.uniform(-2, 2, (10, 2)), 0.15, RED, filled=False)  # shared by all frames
    kwargs = {"half_extent": 2.0, "size": (64, 80)}
    native = render_frames([goals, agents], backend="native", **kwargs)  # type: ignore[arg-type]
    twin = render_frames([goals, agents], backend="numpy", **kwargs)  # type: ignore[arg-type]
    assert native.shape == (2, 3, 64, 80, 3)
    np.testing.assert_array_equal(native, twin)


def test_thread_count_does_not_change_frames() -> None:
    rng = np.random.default_rng(3)
    layers = [Circles(rng.uniform(-1, 1, (17, 20, 2)), 0.07, RED)]
    before = get_num_threads()
    try:
        set_num_threads(1)
        one = render_frames(layers, half_extent=1.0, size=64, backend="native")
        set_num_threads(0)
        many = render_frames(layers, half_extent=1.0, size=64, backend="native")
    finally:
        set_num_threads(before)
    np.testing.assert_array_equal(one, many)


# --- geometry ----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_circle_lands_where_expected_with_y_up(backend: str) -> None:
    size, half = 200, 5.0
    frame = render_frame(
        [Circles(np.array([[0.0, 0.8 * half]]), 0.5, RED)],
        half_extent=half,
        size=size,
        border_width=0,
        backend=backend,  # type: ignore[arg-type]
    )
    # World (0, 0.8 L) -> pixel x = 100, y = (L - 0.8 L) * 20 = 20 (row 20 from the top).
    assert tuple(frame[20, 100]) == RED
    assert tuple(frame[size - 1, size - 1]) == WHITE
    assert tuple(frame[0, 0]) == WHITE
    painted = np.argwhere((frame != 255).any(axis=-1))
    assert painted[:, 0].max() < size // 2  # only the top half is touched
    # Radius 0.5 world units = 10 px around (100, 20): a 21-22 px wide disc.
    rows, cols = painted[:, 0], painted[:, 1]
    assert 9 <= 20 - rows.min() <= 11 and 9 <= rows.max() - 20 <= 11
    assert 9 <= 100 - cols.min() <= 11 and 9 <= cols.max() - 100 <= 11


@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_x_points_right(backend: str) -> None:
    frame = render_frame(
        [Circles([[0.8, 0.0]], 0.05, BLUE)],
        half_extent=1.0,
        size=100,
        border_width=0,
        backend=backend,  # type: ignore[arg-type]
    )
    assert tuple(frame[50, 90]) == BLUE
    assert (frame[:, :50] == 255).all()


@pytest.mark.parametrize("backend", ["native", "numpy"])
@pytest.mark.parametrize("radius", [0.0, 1e-6, 0.004])
def test_subpixel_circle_still_draws_its_centre_pixel(backend: str, radius: float) -> None:
    frame = render_frame(
        [Circles([[0.013, -0.021]], radius, RED)],
        half_extent=1.0,
        size=100,
        border_width=0,
        backend=backend,  # type: ignore[arg-type]
    )
    # x = (0.013 + 1) * 50 = 50.65 -> column 50; y = (1 + 0.021) * 50 = 51.05 -> row 51.
    assert tuple(frame[51, 50]) == RED
    assert int((frame != 255).any(axis=-1).sum()) <= 9


@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_ring_is_hollow(backend: str) -> None:
    frame = render_frame(
        [Circles([[0.0, 0.0]], 0.5, BLUE, filled=False, line_width=2.0)],
        half_extent=1.0,
        size=101,
        border_width=0,
        antialias=False,
        backend=backend,  # type: ignore[arg-type]
    )
    # Centre (50.5, 50.5), radius 25.25 px: the ring covers distances [23.25, 25.25].
    assert tuple(frame[50, 50]) == WHITE
    assert tuple(frame[50, 50 + 24]) == BLUE
    assert tuple(frame[50, 50 + 27]) == WHITE


@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_border_marks_the_world_square(backend: str) -> None:
    grey = (90, 90, 90)
    frame = render_frame(
        [], half_extent=1.0, size=(40, 60), border=grey, border_width=2, backend=backend
    )  # type: ignore[arg-type]
    # The world square is 40 x 40, centred: columns 10..49.
    assert tuple(frame[0, 10]) == grey and tuple(frame[39, 49]) == grey
    assert tuple(frame[1, 30]) == grey and tuple(frame[2, 30]) == WHITE
    assert tuple(frame[20, 9]) == WHITE and tuple(frame[20, 50]) == WHITE  # outside the world
    none = render_frame([], half_extent=1.0, size=8, border_width=0, backend=backend)  # type: ignore[arg-type]
    assert (none == 255).all()


@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_later_circles_cover_earlier_ones(backend: str) -> None:
    frame = render_frame(
        [Circles([[0.0, 0.0], [0.05, 0.0]], 0.3, np.array([RED, BLUE]))],
        half_extent=1.0,
        size=64,
        backend=backend,  # type: ignore[arg-type]
    )
    assert tuple(frame[32, 33]) == BLUE


@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_circles_outside_or_huge_are_clipped_safely(backend: str) -> None:
    layers = [
        Circles([[1.05, 0.0], [-1.2, -1.2], [1e6, 3.0], [-1e30, 1e30], [0.0, 0.0]], 0.3, RED),
        Circles([[0.0, 0.0]], 50.0, BLUE, filled=False),  # ring far larger than the frame
        Circles([[3.0, 3.0]], 10.0, (0, 200, 0)),  # centre outside, disc covers the frame
    ]
    frame = render_frame(layers, half_extent=1.0, size=32, backend=backend)  # type: ignore[arg-type]
    assert frame.shape == (32, 32, 3)
    assert (frame == np.array([0, 200, 0], np.uint8)).all()
    np.testing.assert_array_equal(
        frame, render_frame(layers, half_extent=1.0, size=32, backend="numpy")
    )


# --- inputs ------------------------------------------------------------------------------------


def test_torch_tensors_and_float32_give_the_same_frame() -> None:
    rng = np.random.default_rng(11)
    xy = rng.uniform(-1, 1, (20, 2)).astype(np.float32)
    radius = rng.uniform(0.02, 0.1, 20).astype(np.float32)
    colors = np.array([group_color(i) for i in range(20)], np.uint8)
    from_numpy = render_frame([Circles(xy, radius, colors)], half_extent=1.0, size=64)
    tensor_xy = torch.from_numpy(xy).requires_grad_(True)
    from_torch = render_frame(
        [Circles(tensor_xy, torch.from_numpy(radius), torch.from_numpy(colors))],
        half_extent=1.0,
        size=64,
    )
    np.testing.assert_array_equal(from_numpy, from_torch)


def test_render_frames_matches_render_frame_per_frame() -> None:
    rng = np.random.default_rng(5)
    xy = torch.as_tensor(rng.uniform(-1, 1, (4, 6, 2)))
    frames = render_frames([Circles(xy, 0.1, RED)], half_extent=1.0, size=48)
    assert frames.shape == (4, 48, 48, 3)
    for b in range(4):
        single = render_frame([Circles(xy[b], 0.1, RED)], half_extent=1.0, size=48)
        np.testing.assert_array_equal(frames[b], single)


def test_render_frames_batch_shape() -> None:
    shared = [Circles([[0.0, 0.0]], 0.1, RED)]
    frames = render_frames(shared, half_extent=1.0, size=16, batch_shape=3)
    assert frames.shape == (3, 16, 16, 3)
    assert render_frames(shared, half_extent=1.0, size=16, batch_shape=0).shape == (0, 16, 16, 3)
    with pytest.raises(ValueError, match="pass batch_shape"):
        render_frames(shared, half_extent=1.0, size=16)
    batched = Circles(np.zeros((2, 5, 2)), 0.1, RED, name="agents")
    with pytest.raises(ValueError, match=r"layer 0 \('agents'\): centers have batch shape \(2,\)"):
        render_frames([batched], half_extent=1.0, size=16, batch_shape=3)
    other = Circles(np.zeros((3, 5, 2)), 0.1, RED)
    with pytest.raises(ValueError, match=r"layer 1: centers have batch shape \(3,\)"):
        render_frames([batched, other], half_extent=1.0, size=16)


def test_palette_and_lighten() -> None:
    assert len(GROUP_COLORS) == 10 and len(set(GROUP_COLORS)) == 10
    assert group_color(12) == GROUP_COLORS[2]
    assert lighten((0, 100, 255), 0.5) == (128, 178, 255)
    assert lighten((10, 20, 30), 0.0) == (10, 20, 30)
    with pytest.raises(ValueError, match=r"amount must be a finite number in \[0, 1\], got 1\.5"):
        lighten((10, 20, 30), 1.5)


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["native", "numpy"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_centers_name_the_layer(backend: str, bad: float) -> None:
    xy = np.zeros((4, 2))
    xy[2, 1] = bad
    layers = [Circles(np.zeros((1, 2)), 0.1, RED), Circles(xy, 0.1, BLUE, name="agents")]
    with pytest.raises(ValueError, match=r"layer 1 \('agents'\): centers must be finite.*\(2, 1\)"):
        render_frame(layers, half_extent=1.0, backend=backend)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"size": 0}, ValueError, "size must be an int or a sequence of 2 ints >= 1, got 0$"),
        ({"size": (10, -2)}, ValueError, r"size must be .* 2 ints >= 1, got \(10, -2\)"),
        ({"size": 2.5}, TypeError, "size must be an int or a sequence of 2 ints >= 1, got float"),
        ({"size": (1, 2, 3)}, ValueError, r"size must be .* 2 ints >= 1, got \(1, 2, 3\)"),
        ({"half_extent": 0.0}, ValueError, "half_extent must be a finite number > 0, got 0.0"),
        ({"half_extent": -1.0}, ValueError, "half_extent must be a finite number > 0"),
        ({"half_extent": float("nan")}, ValueError, "half_extent must be a finite number > 0"),
        ({"half_extent": "1"}, TypeError, "half_extent must be a number, got str: '1'"),
        ({"background": (0, 0, 256)}, ValueError, r"background components must lie in \[0, 255\]"),
        ({"border": (0.0, 0.0, 0.0)}, TypeError, r"border must be 3 integers"),
        ({"border_width": -1}, ValueError, "border_width must be an int >= 0, got -1"),
        ({"antialias": "yes"}, TypeError, "antialias must be a bool, got str: 'yes'"),
        ({"backend": "cuda"}, ValueError, r"backend must be one of \['auto', 'native', 'numpy'\]"),
    ],
)
def test_bad_options(kwargs: dict, error: type[Exception], match: str) -> None:
    options = {"half_extent": 1.0, "size": 16, **kwargs}
    with pytest.raises(error, match=match):
        render_frame([Circles([[0.0, 0.0]], 0.1, RED)], **options)


@pytest.mark.parametrize(
    ("layer", "error", "match"),
    [
        (Circles(np.zeros((3, 3)), 0.1, RED), ValueError, r"centers must have shape \[M, 2\]"),
        (Circles(np.zeros(2), 0.1, RED), ValueError, r"centers must have shape \[M, 2\]"),
        (Circles(np.zeros((3, 2), bool), 0.1, RED), TypeError, "centers must be a real numeric"),
        (Circles(np.zeros((3, 2), complex), 0.1, RED), TypeError, "dtype complex128"),
        (Circles(np.zeros((3, 2)), [0.1, 0.2], RED), ValueError, r"radius must be a number or"),
        (Circles(np.zeros((3, 2)), -0.1, RED), ValueError, "radius must be finite and >= 0"),
        (Circles(np.zeros((3, 2)), float("nan"), RED), ValueError, "radius must be finite"),
        (Circles(np.zeros((3, 2)), 0.1, (1.0, 0.5, 0.0)), TypeError, r"color must be integers"),
        (Circles(np.zeros((3, 2)), 0.1, (0, 300, 0)), ValueError, r"color components must lie"),
        (Circles(np.zeros((3, 2)), 0.1, np.zeros((2, 3), int)), ValueError, r"\(3,\) or \[3, 3\]"),
        (Circles(np.zeros((3, 2)), 0.1, RED, filled=1), TypeError, "filled must be a bool"),  # type: ignore[arg-type]
        (Circles(np.zeros((3, 2)), 0.1, RED, line_width=0.0), ValueError, "line_width must be"),
    ],
)
def test_bad_layers(layer: Circles, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        render_frame([layer], half_extent=1.0, size=16)


def test_bad_layer_containers() -> None:
    with pytest.raises(TypeError, match="layers must be a sequence"):
        render_frame(Circles([[0.0, 0.0]], 0.1, RED), half_extent=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="layer 0 must be a Circles, got tuple"):
        render_frame([((0.0, 0.0), 0.1, RED)], half_extent=1.0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="use render_frames for a batch"):
        render_frame([Circles(np.zeros((2, 3, 2)), 0.1, RED)], half_extent=1.0)


def test_kernel_checks_its_own_input() -> None:
    # The binding refuses bad arrays even when called directly, past the Python checks.
    ext = load_extension()
    ok = (np.zeros((2, 2)), np.full(2, 0.1), np.zeros((2, 3), np.int64), True, 1.5)
    frames = ext.render_frames(1, 8, 8, 1.0, [ok], (255, 255, 255), (0, 0, 0), 1, True)
    assert frames.shape == (1, 8, 8, 3)
    nan = (np.array([[0.0, np.nan]]), np.full(1, 0.1), np.zeros((1, 3), np.int64), True, 1.5)
    with pytest.raises(ValueError, match="layer 0: centers contain a non-finite value"):
        ext.render_frames(1, 8, 8, 1.0, [nan], (255, 255, 255), (0, 0, 0), 1, True)
    wrong_batch = (np.zeros((3, 2, 2)), np.full(2, 0.1), np.zeros((2, 3), np.int64), True, 1.5)
    with pytest.raises(ValueError, match=r"centers must have shape \[M, 2\] or \[2, M, 2\]"):
        ext.render_frames(2, 8, 8, 1.0, [wrong_batch], (255, 255, 255), (0, 0, 0), 1, True)
    with pytest.raises(ValueError, match="colors must lie in"):
        bad_color = (np.zeros((1, 2)), np.full(1, 0.1), np.full((1, 3), 256, np.int64), True, 1.0)
        ext.render_frames(1, 8, 8, 1.0, [bad_color], (255, 255, 255), (0, 0, 0), 1, True)
    with pytest.raises(ValueError, match="half_extent must be finite and > 0"):
        ext.render_frames(1, 8, 8, 0.0, [], (255, 255, 255), (0, 0, 0), 1, True)
    with pytest.raises(ValueError, match="height and width must be > 0"):
        ext.render_frames(1, 0, 8, 1.0, [], (255, 255, 255), (0, 0, 0), 1, True)


# --- tiling ------------------------------------------------------------------------------------


def test_tile_frames_shapes_and_layout() -> None:
    frames = np.stack([np.full((10, 12, 3), i * 20, np.uint8) for i in range(5)])
    grid = tile_frames(frames)  # near-square: 3 columns, 2 rows
    assert grid.shape == (2 * 10 + 3 * 2, 3 * 12 + 4 * 2, 3)
    assert grid.dtype == np.uint8
    assert (grid[2:12, 2:14] == 0).all()  # frame 0 at the top left
    assert (grid[14:24, 16:28] == 80).all()  # frame 4: row 1, column 1
    assert (grid[14:24, 30:42] == 64).all()  # the empty sixth cell is padding
    assert tuple(grid[0, 0]) == (64, 64, 64)
    assert tile_frames(list(frames), cols=5, pad=0).shape == (10, 60, 3)
    assert tile_frames(torch.from_numpy(frames), cols=1, pad=1).shape == (56, 14, 3)
    one = tile_frames(frames[:1], pad=0)
    np.testing.assert_array_equal(one, frames[0])


def test_tile_frames_bad_input() -> None:
    frame = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="got no frames"):
        tile_frames([])
    with pytest.raises(ValueError, match="got no frames"):
        tile_frames(np.zeros((0, 4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match=r"frame 1 is \(5, 4, 3\)"):
        tile_frames([frame, np.zeros((5, 4, 3), np.uint8)])
    with pytest.raises(ValueError, match=r"frame 0 must be uint8 \[H, W, 3\], got float64"):
        tile_frames([np.zeros((4, 4, 3))])
    with pytest.raises(ValueError, match=r"frames must be uint8 \[K, H, W, 3\]"):
        tile_frames(np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="cols must be an int >= 1 or None, got 0"):
        tile_frames([frame], cols=0)
    with pytest.raises(ValueError, match="pad must be an int >= 0, got -1"):
        tile_frames([frame], pad=-1)
