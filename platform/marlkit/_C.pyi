"""Type stub of the compiled extension ``marlkit._C`` (see csrc/bindings.cpp)."""

import numpy as np
from numpy.typing import NDArray

ABI_VERSION: int
SOURCE_HASH: str

def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
def set_min_work_per_thread(units: int) -> None: ...
def get_min_work_per_thread() -> int: ...

# particles (csrc/include/marlkit/particles.h): arrays C-contiguous, written in place, no copies.
# O(N) per environment through uniform grids; results do not depend on the grid or the threads.
def particle_step(
    pos: NDArray[np.float32],  # [E, N, 2], updated in place
    vel: NDArray[np.float32],  # [E, N, 2], updated in place
    force: NDArray[np.float32],  # [E, N, 2]
    contacts_out: NDArray[np.int32],  # [E, N], written
    *,
    radius: float | NDArray[np.float32],  # a number or [N]
    mass: float,
    drag: float,
    dt: float,
    substeps: int,
    stiffness: float,
    half_extent: float,
    max_speed: float | NDArray[np.float32] | None = None,  # a number or [N]; None: no limit
    active: NDArray[np.bool_] | None = None,  # [E, N]; None: all active
    landmarks: NDArray[np.float32] | None = None,  # [E, M, 2]
    landmark_radius: float | NDArray[np.float32] | None = None,  # a number or [M]
) -> None: ...
def knn(
    pos: NDArray[np.float32],  # [E, N, 2]
    k: int,
    radius: float,
    rel_out: NDArray[np.float32],  # [E, N, k, 2], written
    idx_out: NDArray[np.int64],  # [E, N, k], written
    *,
    active: NDArray[np.bool_] | None = None,  # [E, N]; None: all active
) -> None: ...

# lidar (csrc/include/marlkit/lidar.h; Python face: marlkit.native.lidar): VMAS's Lidar against
# the other agents' discs, O(N R) per environment through the uniform grid.
def lidar(
    pos: NDArray[np.float32],  # [E, N, 2], finite
    angles: NDArray[np.float32],  # [R], finite
    max_range: float,  # > 0
    radius: float,  # > 0, every agent's
    out: NDArray[np.float32],  # [E, N, R], written: min(max_range, nearest hit)
) -> None: ...

# render (csrc/include/marlkit/render.h; Python face: marlkit.native.render). Returns uint8
# [batch, height, width, 3]. A layer is (centers [M, 2] or [batch, M, 2] float64 world
# coordinates, radius [M] float64 world units, colors [M, 3] ints in [0, 255], filled,
# line_width in pixels). ValueError on bad shapes, non-finite values, size or half_extent <= 0.
def render_frames(
    batch: int,
    height: int,
    width: int,
    half_extent: float,
    layers: list[tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64], bool, float]],
    background: tuple[int, int, int],
    border: tuple[int, int, int],
    border_width: int,
    antialias: bool,
) -> NDArray[np.uint8]: ...

# segment_tree (csrc/include/marlkit/segment_tree.h; Python face: marlkit.native.segment_tree).
# Arrays are 1-D of exactly the dtype shown (TypeError otherwise, ValueError for another ndim).
# IndexError for an index outside [0, capacity); ValueError for a negative, NaN or infinite
# value; every batch is checked whole before anything is written.
SEGMENT_TREE_MAX_CAPACITY: int

class SumSegmentTreeFp32:
    def __init__(self, capacity: int) -> None: ...  # leaves start at 0
    @property
    def capacity(self) -> int: ...
    @property
    def nbytes(self) -> int: ...  # leaves + tree nodes
    def __len__(self) -> int: ...
    def update(self, indices: NDArray[np.int64], values: NDArray[np.float32]) -> None: ...
    def get(self, indices: NDArray[np.int64]) -> NDArray[np.float32]: ...
    def query(self, start: int, end: int) -> float: ...  # sum over [start, end)
    def total(self) -> float: ...
    def scan_lower_bound(self, values: NDArray[np.float32]) -> NDArray[np.int64]: ...

class SumSegmentTreeFp64:
    def __init__(self, capacity: int) -> None: ...  # leaves start at 0
    @property
    def capacity(self) -> int: ...
    @property
    def nbytes(self) -> int: ...  # leaves + tree nodes
    def __len__(self) -> int: ...
    def update(self, indices: NDArray[np.int64], values: NDArray[np.float64]) -> None: ...
    def get(self, indices: NDArray[np.int64]) -> NDArray[np.float64]: ...
    def query(self, start: int, end: int) -> float: ...
    def total(self) -> float: ...
    def scan_lower_bound(self, values: NDArray[np.float64]) -> NDArray[np.int64]: ...

class MinSegmentTreeFp32:
    def __init__(self, capacity: int) -> None: ...  # leaves start at +inf
    @property
    def capacity(self) -> int: ...
    @property
    def nbytes(self) -> int: ...  # leaves + tree nodes
    def __len__(self) -> int: ...
    def update(self, indices: NDArray[np.int64], values: NDArray[np.float32]) -> None: ...
    def get(self, indices: NDArray[np.int64]) -> NDArray[np.float32]: ...
    def query(self, start: int, end: int) -> float: ...  # min over [start, end)
    def min(self) -> float: ...

class MinSegmentTreeFp64:
    def __init__(self, capacity: int) -> None: ...  # leaves start at +inf
    @property
    def capacity(self) -> int: ...
    @property
    def nbytes(self) -> int: ...  # leaves + tree nodes
    def __len__(self) -> int: ...
    def update(self, indices: NDArray[np.int64], values: NDArray[np.float64]) -> None: ...
    def get(self, indices: NDArray[np.int64]) -> NDArray[np.float64]: ...
    def query(self, start: int, end: int) -> float: ...
    def min(self) -> float: ...

# prioritized replay (one call per step on a sum/min pair of one dtype; GIL released)
def prioritized_update(
    total: SumSegmentTreeFp32 | SumSegmentTreeFp64,
    lowest: MinSegmentTreeFp32 | MinSegmentTreeFp64,
    indices: NDArray[np.int64],
    priorities: NDArray[np.float32] | NDArray[np.float64],
    length: int,
    eps: float,
    alpha: float,
) -> float: ...  # the batch's largest priority
def prioritized_sample(
    total: SumSegmentTreeFp32 | SumSegmentTreeFp64,
    lowest: MinSegmentTreeFp32 | MinSegmentTreeFp64,
    uniforms: NDArray[np.float32] | NDArray[np.float64],
    beta: float,
) -> tuple[NDArray[np.int64], NDArray[np.float32]]: ...  # indices [B], weights [B]

# rows and memory (csrc/include/marlkit/gather.h, memory.h)
def gather_rows(
    sources: list[np.ndarray], index: NDArray[np.int64], outputs: list[np.ndarray]
) -> None: ...  # outputs[k][i] = sources[k][index[i]], rows as bytes
def advise_huge_pages(array: np.ndarray) -> int: ...  # bytes advised (MADV_HUGEPAGE)
def huge_zeros(nbytes: int) -> NDArray[np.uint8]: ...  # its own 2 MiB-aligned mapping (Linux)

# SMAX battles (csrc/include/marlkit/smax.h; world arrays: pos f32 [E, N, 2], health, cooldown
# f32 [E, N], alive bool [E, N], types i64 [E, N], prev_move f32 [E, N, 2], prev_attack i64 [E, N])
def smax_ticks(
    pos: NDArray[np.float32],
    health: NDArray[np.float32],
    cooldown: NDArray[np.float32],
    alive: NDArray[np.bool_],
    types: NDArray[np.int64],
    prev_move: NDArray[np.float32],
    prev_attack: NDArray[np.int64],
    actions: NDArray[np.int64],  # [E, N]
    jitter: NDArray[np.float32],  # [E, T, N]
    table: NDArray[np.float32],  # [6, 7]
    *,
    n_allies: int,
    map_width: float,
    map_height: float,
    dt: float,
    walls_cause_death: bool,
) -> None: ...  # the world arrays updated in place
def smax_observe(
    pos: NDArray[np.float32],
    health: NDArray[np.float32],
    cooldown: NDArray[np.float32],
    alive: NDArray[np.bool_],
    types: NDArray[np.int64],
    prev_move: NDArray[np.float32],
    prev_attack: NDArray[np.int64],
    table: NDArray[np.float32],
    obs_out: NDArray[np.float32],  # [E, n_obs, 13 (N - 1) + 10]
    visible_out: NDArray[np.bool_],  # [E, n_obs, N - 1]
    ally_mask_out: NDArray[np.bool_],  # [E, A, 5 + M]
    enemy_mask_out: NDArray[np.bool_] | None,  # [E, M, 5 + A]; given: n_obs = N, else A
    state_out: NDArray[np.float32],  # [E, 12 N]
    *,
    n_allies: int,
    map_width: float,
    map_height: float,
    see_enemy_actions: bool,
) -> None: ...
def smax_heuristic(
    pos: NDArray[np.float32],
    health: NDArray[np.float32],
    cooldown: NDArray[np.float32],
    alive: NDArray[np.bool_],
    types: NDArray[np.int64],
    prev_move: NDArray[np.float32],
    prev_attack: NDArray[np.int64],
    target: NDArray[np.float32],  # [E, M, 2], updated
    last: NDArray[np.int64],  # [E, M], updated
    u: NDArray[np.float32],  # [E, M]
    table: NDArray[np.float32],
    out: NDArray[np.int64],  # [E, M], written
    *,
    n_allies: int,
    map_width: float,
    map_height: float,
) -> None: ...
