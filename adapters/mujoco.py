"""Multi-agent MuJoCo: a Gymnasium MuJoCo robot whose actuated joints are split among agents.

``marlkit.make("mujoco/ant_2x4", num_envs=64, agent_obsk=1, seed=0)`` builds ``num_envs`` copies
of Gymnasium's Ant (its MJCF file is read from the installed ``gymnasium`` package), stepped
together: one ``MjModel``, one ``MjData`` per env, and a pool of threads that each run
``mujoco.mj_step`` (which releases the GIL) over a contiguous slice of the batch, so the envs of
a batch advance in parallel on the CPU cores. Every env computes exactly what Gymnasium's
single-agent env computes (``mj_step(nstep=frame_skip)``, then ``mj_rnePostConstraint`` for the
contact forces), so rewards and terminations match ``gymnasium.make("Ant-v5")`` step for step.

Keys (group ``"agents"`` by default; any group map over ``agent_0..`` works)::

    (group, "observation")      [*B, n, obs_dim] float32: own joints' qpos, qvel (+ limb
                                contact forces), neighbours' qpos up to ``agent_obsk`` hops,
                                the root's pose and velocity (global part, always last;
                                shorter agents of a group are zero-padded before it)
    (group, "action")           [*B, n, act_dim] in each actuator's ctrlrange ([-1, 1])
    ("next", group, "reward")   [*B, n, 1] the team reward (Gymnasium v5's), same for all
    ("next", group, "terminated")  [*B, n, 1] Ant: unhealthy (torso z outside the range)
    "state"                     [*B, state_dim] the Gymnasium v5 observation (Ant: 105,
                                HalfCheetah: 17)

Episodes never truncate here: add ``StepCounter(max_steps=1000)`` for Gymnasium's time limit.

Rendering is headless: unless ``MUJOCO_GL`` is already set, this module sets it to ``egl`` and
creates MuJoCo's context for that backend itself, so it works even when ``mujoco`` was imported
earlier (when ``mujoco.Renderer`` would already have settled on a display). EGL needs
``libegl1 libgl1 libopengl0 libegl-mesa0 libgl1-mesa-dri`` on Debian (Mesa's llvmpipe renders
without a GPU); ``make system-deps`` installs them.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, TypeGuard

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from marlkit._checks import check_flag, check_int, check_kwargs, did_you_mean, keyword_names
from marlkit._utils import get_logger, import_optional
from marlkit.adapters._mujoco_partitions import PARTITIONS, Layout, Partition, build_layout
from marlkit.adapters._spaces import check_steppable
from marlkit.data.composite import Composite
from marlkit.data.group_map import GroupMapLike, make_group_map
from marlkit.data.keys import ACTION, OBSERVATION, REWARD, STATE, TERMINATED, TRUNCATED
from marlkit.data.specs import Bounded, Unbounded
from marlkit.envs import EnvBase, make_done_spec, make_reward_spec
from marlkit.envs._memory import check_on_probe
from marlkit.envs.registry import UnknownEnvError

__all__ = ["PARTITIONS", "MultiAgentMujocoEnv", "accepted_kwargs", "list_scenarios", "make_env"]

_log = get_logger("adapters.mujoco")


def _import_mujoco() -> ModuleType:
    """Import MuJoCo for headless use: ``MUJOCO_GL=egl`` unless the user chose a backend."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    return import_optional("mujoco", extra="mujoco", purpose="the multi-agent MuJoCo adapter")


def _asset_path(xml_file: str) -> Path:
    gymnasium = import_optional("gymnasium", extra="mujoco", purpose="the MuJoCo robot models")
    path = Path(str(gymnasium.__file__)).parent / "envs" / "mujoco" / "assets" / xml_file
    if not path.is_file():
        raise FileNotFoundError(
            f"gymnasium {gymnasium.__version__} ships no {xml_file} at {path}; "
            "install gymnasium>=1.0 (pip install 'marlkit[mujoco]')"
        )
    return path


def _load_model(mujoco: ModuleType, path: Path) -> Any:
    """Compile an MJCF file; MuJoCo's compiler warnings go to the log, not to stdout."""
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(lambda msg: _log.debug("MuJoCo (%s): %s", path.name, msg))
    try:
        return mujoco.MjModel.from_xml_path(str(path))
    finally:
        mujoco.set_mju_user_warning(previous)


# ---------------------------------------------------------------------------- option checks
def _is_int(value: object) -> TypeGuard[int | np.integer]:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _real(name: str, value: object, *, nonnegative: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}: {value!r}")
    out = float(value)
    if not math.isfinite(out) or (nonnegative and out < 0):
        kind = "a finite number >= 0" if nonnegative else "a finite number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return out


def _range(name: str, value: object) -> tuple[float, float]:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        raise TypeError(f"{name} must be a pair (low, high), got {value!r}")
    low, high = _real(f"{name}[0]", value[0]), _real(f"{name}[1]", value[1])
    if not low < high:
        raise ValueError(f"{name} must have low < high, got {value!r}")
    return low, high


def _render_size(value: object) -> tuple[int, int]:
    size = (value, value) if _is_int(value) else value
    if not isinstance(size, Sequence) or len(size) != 2 or not all(map(_is_int, size)):
        raise TypeError(f"render_size must be an int or (height, width) ints, got {value!r}")
    if min(size) < 16:
        raise ValueError(f"render_size must be at least 16 pixels, got {value!r}")
    return int(size[0]), int(size[1])


def _robot_options(partition: Partition, given: dict[str, Any]) -> dict[str, Any]:
    """The robot's Gymnasium defaults updated with the options given (``None`` = default)."""
    robot = partition.robot
    out = dict(robot.defaults)
    for name, value in given.items():
        if value is None:
            continue
        if name not in out:
            why = "contact forces" if name.startswith("contact") else "healthy terms"
            raise ValueError(
                f"{name}={value!r} does not apply to {partition.name}: the {robot.name} has no "
                f"{why} in {robot.gymnasium_id}"
            )
        out[name] = value
    out["frame_skip"] = check_int("frame_skip", out["frame_skip"], low=1)
    weights = ("forward_reward_weight", "ctrl_cost_weight", "contact_cost_weight", "healthy_reward")
    for name in weights:
        if name in out:
            out[name] = _real(name, out[name])
    out["reset_noise_scale"] = _real(
        "reset_noise_scale", out["reset_noise_scale"], nonnegative=True
    )
    for name in ("contact_force_range", "healthy_z_range"):
        if name in out:
            out[name] = _range(name, out[name])
    if "terminate_when_unhealthy" in out:
        check_flag("terminate_when_unhealthy", out["terminate_when_unhealthy"])
    return out


# ---------------------------------------------------------------------------- batched physics
def _default_threads(num_envs: int) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(num_envs, cpus))


def _chunks(items: np.ndarray, parts: int) -> list[np.ndarray]:
    return [c for c in np.array_split(items, min(parts, max(1, len(items)))) if len(c)]


class _Batch:
    """``num_envs`` ``MjData`` of one ``MjModel``, stepped by a pool of threads.

    Each thread runs ``mj_step`` (GIL released) over a contiguous slice of the envs and copies
    the results into batched NumPy arrays, so one call advances the whole batch.
    """

    def __init__(
        self,
        mujoco: ModuleType,
        model: Any,
        num_envs: int,
        *,
        frame_skip: int,
        contact_forces: bool,
        forward_body: int | None,
        num_threads: int,
    ):
        self.mujoco, self.model = mujoco, model
        self.datas = [mujoco.MjData(model) for _ in range(num_envs)]
        self.frame_skip, self.contact_forces = frame_skip, contact_forces
        self.forward_body = forward_body
        self.num_threads = num_threads
        self.qpos = np.zeros((num_envs, model.nq))
        self.qvel = np.zeros((num_envs, model.nv))
        self.cfrc_ext = np.zeros((num_envs, model.nbody, 6))
        self.x_before = np.zeros(num_envs)
        self.x_after = np.zeros(num_envs)
        self._all = _chunks(np.arange(num_envs), num_threads)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = -1
        # Per env, NumPy views of the MjData fields a step reads and writes, made once: each
        # attribute access on an MjData builds a new view (~1 us), and the per-env Python work
        # of a step runs under the GIL, serialised across the threads.
        self._views = [(d, d.ctrl, d.qpos, d.qvel, d.cfrc_ext, d.xpos) for d in self.datas]
        for i in range(num_envs):
            mujoco.mj_forward(model, self.datas[i])
            self._read(i)

    def _x(self, i: int) -> float:
        _, _, qpos, _, _, xpos = self._views[i]
        return float(xpos[self.forward_body, 0] if self.forward_body is not None else qpos[0])

    def _read(self, i: int) -> None:
        _, _, qpos, qvel, cfrc_ext, _ = self._views[i]
        self.qpos[i] = qpos
        self.qvel[i] = qvel
        if self.contact_forces:
            self.cfrc_ext[i] = cfrc_ext

    def _run(self, fn: Callable[[np.ndarray], None], chunks: list[np.ndarray]) -> None:
        if len(chunks) <= 1:
            for chunk in chunks:
                fn(chunk)
            return
        if self._pool is None or self._pool_pid != os.getpid():  # threads do not survive fork
            self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="marlkit-mujoco")
            self._pool_pid = os.getpid()
        for future in [self._pool.submit(fn, chunk) for chunk in chunks]:
            future.result()

    def _step_envs(self, ids: np.ndarray, ctrl: np.ndarray) -> None:
        mj_step, rne = self.mujoco.mj_step, self.mujoco.mj_rnePostConstraint
        m, n = self.model, self.frame_skip
        views, contact_forces = self._views, self.contact_forces
        for i in ids.tolist():
            d, d_ctrl = views[i][:2]
            self.x_before[i] = self._x(i)
            d_ctrl[:] = ctrl[i]
            mj_step(m, d, nstep=n)
            if contact_forces:
                rne(m, d)
            self.x_after[i] = self._x(i)
            self._read(i)

    def step(self, ctrl: np.ndarray) -> None:
        """Apply ``ctrl`` ``[B, nu]`` and advance every env by ``frame_skip`` physics steps."""
        self._run(lambda ids: self._step_envs(ids, ctrl), self._all)

    def _reset_envs(self, rows: np.ndarray, ids: np.ndarray, qpos: Any, qvel: Any) -> None:
        m = self.model
        for row in rows.tolist():
            i = int(ids[row])
            d = self.datas[i]
            self.mujoco.mj_resetData(m, d)
            d.qpos[:] = qpos[row]
            d.qvel[:] = qvel[row]
            self.mujoco.mj_forward(m, d)
            self._read(i)

    def reset(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        """Reset envs ``ids`` (``[k]``) to ``qpos`` ``[k, nq]``, ``qvel`` ``[k, nv]`` as Gymnasium
        does: ``mj_resetData``, set the state, ``mj_forward``."""
        rows = _chunks(np.arange(len(ids)), self.num_threads)
        self._run(lambda r: self._reset_envs(r, ids, qpos, qvel), rows)

    def close(self) -> None:
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = None
        self.datas = []


# ---------------------------------------------------------------------------- rendering
def _gl_context_class() -> Any:
    """MuJoCo's GL context class for ``MUJOCO_GL``, whichever backend ``import mujoco`` chose.

    ``mujoco.Renderer`` fixes its backend when ``mujoco`` is first imported: if that happened
    before ``MUJOCO_GL`` was set, it would reach for a display. This picks the context itself.
    """
    backend = os.environ.get("MUJOCO_GL", "egl").strip().lower()
    module = {"egl": "mujoco.egl", "osmesa": "mujoco.osmesa"}.get(backend, "mujoco.glfw")
    return importlib.import_module(module).GLContext


class _OffscreenRenderer:
    """Headless frames of one model: a GL context, an offscreen buffer and a tracking camera."""

    def __init__(
        self, mujoco: ModuleType, model: Any, height: int, width: int, body: int, effects: bool
    ):
        self._mj, self._model, self._shape = mujoco, model, (height, width, 3)
        vis = model.vis.global_
        vis.offwidth, vis.offheight = max(vis.offwidth, width), max(vis.offheight, height)
        try:
            self._context = _gl_context_class()(width, height)
            self._context.make_current()
            self._mjr = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150.value)
        except Exception as err:  # each GL backend fails in its own way: name the fix
            raise RuntimeError(
                f"MuJoCo could not create an OpenGL context (MUJOCO_GL="
                f"{os.environ.get('MUJOCO_GL')!r}): {type(err).__name__}: {err}. Headless "
                "rendering needs the EGL libraries (Debian: libegl1 libgl1 libopengl0 "
                "libegl-mesa0 libgl1-mesa-dri, which `make system-deps` installs), or "
                "MUJOCO_GL=osmesa with libosmesa6"
            ) from err
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._mjr)
        self._scene = mujoco.MjvScene(model, maxgeom=1000)
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION):
            self._scene.flags[flag] = effects  # each costs several times the rest in software GL
        self._option = mujoco.MjvOption()
        self._rect = mujoco.MjrRect(0, 0, width, height)
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING
        self._camera.trackbodyid = body
        self._camera.distance, self._camera.elevation, self._camera.azimuth = 4.0, -20.0, 90.0

    def render(self, data: Any) -> np.ndarray:
        """The scene of ``data``: ``uint8 [H, W, 3]``, top row first."""
        mj = self._mj
        self._context.make_current()
        everything = mj.mjtCatBit.mjCAT_ALL.value
        mj.mjv_updateScene(
            self._model, data, self._option, None, self._camera, everything, self._scene
        )
        mj.mjr_render(self._rect, self._scene, self._mjr)
        pixels = np.empty(self._shape, dtype=np.uint8)
        mj.mjr_readPixels(pixels, None, self._rect, self._mjr)
        return np.ascontiguousarray(pixels[::-1])  # OpenGL's first row is the bottom one

    def close(self) -> None:
        """Free the MuJoCo render context while its GL context is current, then the GL one."""
        if self._mjr is None:
            return
        self._context.make_current()
        self._mjr.free()
        self._context.free()
        self._mjr = None

    def __del__(self) -> None:  # an env dropped without close(): free in the right order
        with contextlib.suppress(Exception):
            self.close()


def _mjdata_bytes(env: MultiAgentMujocoEnv) -> int:
    """The bytes an env's ``MjData`` holds: its buffer and the part of its arena it used."""
    data = env._sim.datas[0]
    return int(data.nbuffer) + int(data.maxuse_arena)


# ---------------------------------------------------------------------------- the env
class MultiAgentMujocoEnv(EnvBase):
    """A batch of a Gymnasium MuJoCo robot whose actuated joints are split among agents.

    Args:
        scenario: a partition: ``"ant_2x4"``, ``"ant_4x2"`` or ``"halfcheetah_2x3"``.
        num_envs: envs stepped together (the env batch ``B = [num_envs]``).
        agent_obsk: an agent also observes the ``qpos`` of the joints up to this many hops away
            in the robot's joint graph (``0``: its own joints only).
        group_map: ``"agents"`` (one group), ``"per_agent"`` or an explicit map over
            ``agent_0..``. Agents of one group must drive as many actuators; their observations
            are zero-padded to the longest.
        seed: seed for resets and random actions (``None``: nondeterministic).
        frame_skip: physics steps per env step (Gymnasium: 5).
        forward_reward_weight, ctrl_cost_weight: reward weights (defaults as Gymnasium v5).
        contact_cost_weight, contact_force_range: Ant only: the contact cost on clipped
            ``cfrc_ext`` (``5e-4``, ``(-1, 1)``).
        healthy_reward, terminate_when_unhealthy, healthy_z_range: Ant only (``1.0``, ``True``,
            ``(0.2, 1.0)``): the torso's z must stay in the range.
        reset_noise_scale: uniform ``qpos`` and normal ``qvel`` noise at reset (``0.1``).
        num_threads: threads stepping the batch (default: the CPU cores available, at most
            ``num_envs``; ``1`` steps on the calling thread).
        render_size: frame size, an int (square) or ``(height, width)``.
        render_effects: draw shadows and floor reflections, as Gymnasium does; off by default
            because without a GPU (Mesa's llvmpipe) they make a frame several times slower.
        device: where the output tensors live (the physics runs on the CPU).
        validate_actions: check actions in ``step`` (see :class:`~marlkit.envs.EnvBase`).
    """

    render_modes = ("rgb_array",)

    def __init__(
        self,
        scenario: str = "ant_2x4",
        num_envs: int = 1,
        *,
        agent_obsk: int = 1,
        group_map: GroupMapLike = "agents",
        seed: int | None = None,
        frame_skip: int | None = None,
        forward_reward_weight: float | None = None,
        ctrl_cost_weight: float | None = None,
        contact_cost_weight: float | None = None,
        contact_force_range: tuple[float, float] | None = None,
        healthy_reward: float | None = None,
        terminate_when_unhealthy: bool | None = None,
        healthy_z_range: tuple[float, float] | None = None,
        reset_noise_scale: float | None = None,
        num_threads: int | None = None,
        render_size: int | tuple[int, int] = 256,
        render_effects: bool = False,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
    ):
        if scenario not in PARTITIONS:
            hint = did_you_mean(scenario, PARTITIONS, n=3, cutoff=0.4)
            raise UnknownEnvError(
                f"no MuJoCo partition named {scenario!r}.{hint} Known: {', '.join(PARTITIONS)}"
            )
        num_envs = check_int("num_envs", num_envs, low=1)
        self.agent_obsk = check_int("agent_obsk", agent_obsk, low=0)
        threads = _default_threads(num_envs) if num_threads is None else num_threads
        self.num_threads = check_int("num_threads", threads, low=1)
        self.render_size = _render_size(render_size)
        self.render_effects = check_flag("render_effects", render_effects)
        self.partition = PARTITIONS[scenario]
        given: dict[str, Any] = {
            "frame_skip": frame_skip,
            "forward_reward_weight": forward_reward_weight,
            "ctrl_cost_weight": ctrl_cost_weight,
            "contact_cost_weight": contact_cost_weight,
            "contact_force_range": contact_force_range,
            "healthy_reward": healthy_reward,
            "terminate_when_unhealthy": terminate_when_unhealthy,
            "healthy_z_range": healthy_z_range,
            "reset_noise_scale": reset_noise_scale,
        }
        self.options = _robot_options(self.partition, given)
        check_on_probe(
            f"mujoco/{scenario}",
            num_envs,
            lambda: MultiAgentMujocoEnv(
                scenario,
                agent_obsk=agent_obsk,
                group_map=group_map,
                num_threads=1,
                device=device,
                validate_actions=False,
                **given,
            ),
            own_bytes=_mjdata_bytes,
            device=device,
        )
        super().__init__(batch_size=(num_envs,), device=device, validate_actions=validate_actions)
        self.num_envs = num_envs

        self._mujoco = _import_mujoco()
        robot = self.partition.robot
        self.model = _load_model(self._mujoco, _asset_path(robot.xml_file))
        self.layout: Layout = build_layout(self.model, self.partition, self.agent_obsk)
        self.dt = float(self.model.opt.timestep) * self.options["frame_skip"]
        self._sim = _Batch(
            self._mujoco,
            self.model,
            num_envs,
            frame_skip=self.options["frame_skip"],
            contact_forces=robot.contact_forces,
            forward_body=self.layout.main_body if robot.forward == "body" else None,
            num_threads=self.num_threads,
        )
        self.agent_names = [f"agent_{i}" for i in range(len(self.partition.agents))]
        # envs that must be reset before they step: all until the first reset, then the
        # terminated ones (as the Gymnasium and PettingZoo adapters)
        self._needs_reset = np.ones(num_envs, dtype=bool)
        self._never_reset = True
        self.group_map = make_group_map(self.agent_names, group_map)
        self._plans = self._group_plans()
        self._build_specs()
        self._renderer: _OffscreenRenderer | None = None
        self._np_rng = np.random.default_rng()
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ layout and specs
    def _group_plans(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per group: observation indices ``[n, obs_dim]`` and actuator ids ``[n, act_dim]``."""
        index = {name: i for i, name in enumerate(self.agent_names)}
        plans = {}
        for group, agents in self.group_map.items():
            rows = [index[a] for a in agents]
            acts = [self.layout.agent_actuators[r] for r in rows]
            if len({len(a) for a in acts}) != 1:
                sizes = {a: len(self.layout.agent_actuators[index[a]]) for a in agents}
                raise ValueError(
                    f"group {group!r} mixes agents driving different numbers of actuators "
                    f"{sizes}; put them in separate groups (group_map='per_agent')"
                )
            plans[group] = (self.layout.padded(rows), np.stack(acts))
        return plans

    def _build_specs(self) -> None:
        b, dev = self.batch_size, self.device
        ctrl_range = torch.as_tensor(self.model.actuator_ctrlrange, dtype=torch.float32)
        limited = self.model.actuator_ctrllimited.astype(bool)
        obs, act, sizes = Composite(shape=b, device=dev), Composite(shape=b, device=dev), {}
        for group, (obs_index, act_index) in self._plans.items():
            n = obs_index.shape[0]
            sizes[group] = n
            obs[group] = Composite(
                {OBSERVATION: Unbounded((*b, n, obs_index.shape[1]), device=dev)},
                shape=(*b, n),
                device=dev,
            )
            if not limited[act_index].all():
                raise ValueError(f"{self.partition.name}: every actuator needs a ctrlrange")
            bounds = ctrl_range[torch.as_tensor(act_index)]  # [n, act_dim, 2]
            leaf = Bounded(bounds[..., 0], bounds[..., 1], (*b, *act_index.shape), device=dev)
            act[group] = Composite({ACTION: leaf}, shape=(*b, n), device=dev)
        self.observation_spec = obs
        self.action_spec = act
        self.state_spec = Composite(
            {STATE: Unbounded((*b, len(self.layout.state_index)), device=dev)},
            shape=b,
            device=dev,
        )
        self.reward_spec = make_reward_spec(b, sizes, device=dev)
        self.done_spec = make_done_spec(b, sizes, device=dev)

    @property
    def observation_labels(self) -> dict[str, list[str]]:
        """What each entry of each agent's observation is (``"qpos:hip_1"``, ...), unpadded."""
        return dict(zip(self.agent_names, (list(x) for x in self.layout.agent_labels)))

    @property
    def qpos(self) -> torch.Tensor:
        """Generalised positions ``[*B, nq]`` (float64, a copy)."""
        return torch.from_numpy(self._sim.qpos.copy())

    @property
    def qvel(self) -> torch.Tensor:
        """Generalised velocities ``[*B, nv]`` (float64, a copy)."""
        return torch.from_numpy(self._sim.qvel.copy())

    # ------------------------------------------------------------------ hooks
    def _set_seed(self, seed: int) -> None:
        self._np_rng = np.random.default_rng(seed % 2**64)  # NumPy takes no negative seeds

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        if env_mask is None:
            ids = np.arange(self.num_envs)
        else:
            ids = np.flatnonzero(env_mask.detach().cpu().numpy().reshape(-1))
        scale, model = self.options["reset_noise_scale"], self.model
        qpos = model.qpos0 + self._np_rng.uniform(-scale, scale, size=(len(ids), model.nq))
        qvel = scale * self._np_rng.standard_normal((len(ids), model.nv))
        self._sim.reset(ids, qpos, qvel)
        self._needs_reset[ids] = False
        self._never_reset = False
        return self._output(None)

    def set_state(
        self,
        qpos: torch.Tensor | np.ndarray,
        qvel: torch.Tensor | np.ndarray,
        env_ids: Sequence[int] | torch.Tensor | np.ndarray | None = None,
    ) -> TensorDictBase:
        """Put envs in a given state, as Gymnasium's ``set_state`` after a reset does.

        Args:
            qpos: ``[k, nq]`` positions (``k`` = number of envs set).
            qvel: ``[k, nv]`` velocities.
            env_ids: the ``k`` envs to set (default: all, in order).

        Returns:
            The observations of the whole batch, as :meth:`reset` returns them.
        """
        self._check_open()
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids).reshape(-1)
        if ids.dtype.kind not in "iu" or ((ids < 0) | (ids >= self.num_envs)).any():
            raise IndexError(f"env_ids must be ints in [0, {self.num_envs}), got {ids.tolist()}")
        arrays = {}
        for name, value, width in (("qpos", qpos, self.model.nq), ("qvel", qvel, self.model.nv)):
            array = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value)
            if array.shape != (len(ids), width):
                raise ValueError(
                    f"{name} must have shape {[len(ids), width]} (envs, {name} size), got "
                    f"{list(array.shape)}"
                )
            if not np.isfinite(array).all():
                raise ValueError(f"{name} holds NaN or infinite values")
            arrays[name] = array.astype(np.float64)
        self._sim.reset(ids, arrays["qpos"], arrays["qvel"])
        self._needs_reset[ids] = False
        self._never_reset = False
        out = self._output(None)
        self._fill_reset_done(out, None, None)
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        check_steppable(type(self).__name__, self._never_reset, self._needs_reset, "terminated")
        ctrl = self._ctrl(tensordict)
        self._sim.step(ctrl)
        rewards, terminated = self._rewards(ctrl)
        self._needs_reset |= terminated
        return self._output((rewards, terminated))

    def _ctrl(self, tensordict: TensorDictBase) -> np.ndarray:
        """MuJoCo's controls ``[B, nu]`` from the groups' actions."""
        ctrl = np.zeros((self.num_envs, self.model.nu))
        for group, (_, act_index) in self._plans.items():
            action = tensordict.get((group, ACTION)).detach().to("cpu", torch.float64)
            ctrl[:, act_index] = action.numpy()
        return ctrl

    def _replay_simulator(self, seed: int, steps: int) -> list[np.ndarray]:
        """One run of raw MuJoCo, for :func:`~marlkit.testing.check_adapter`'s seeding
        diagnosis: a fresh ``MjData`` of the model, reset (``mj_resetData``; MuJoCo draws
        nothing, the reset noise is this adapter's), then ``steps`` steps of ``frame_skip``
        physics steps under controls drawn from the action spec by a generator seeded with
        ``seed``; ``qpos`` and ``qvel`` after the reset and after each step. This env's own
        simulators are left alone."""
        mujoco, model = self._sim.mujoco, self.model
        data = mujoco.MjData(model)
        mujoco.mj_resetData(model, data)
        mujoco.mj_forward(model, data)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        trace = [np.concatenate([data.qpos, data.qvel])]
        for _ in range(steps):
            data.ctrl[:] = self._ctrl(self.action_spec.rand(generator=generator))[0]
            mujoco.mj_step(model, data, nstep=self._sim.frame_skip)
            trace.append(np.concatenate([data.qpos, data.qvel]))
        return trace

    def _rewards(self, ctrl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gymnasium v5's reward ``[B]`` and termination ``[B]`` for actions ``ctrl``."""
        o, sim = self.options, self._sim
        forward = o["forward_reward_weight"] * ((sim.x_after - sim.x_before) / self.dt)
        costs = o["ctrl_cost_weight"] * np.square(ctrl).sum(-1)
        terminated = np.zeros(self.num_envs, dtype=bool)
        if self.partition.robot.contact_forces:
            clipped = np.clip(sim.cfrc_ext, *o["contact_force_range"])
            costs = costs + o["contact_cost_weight"] * np.square(clipped).sum((-1, -2))
        rewards = forward
        if self.partition.robot.healthy:
            low, high = o["healthy_z_range"]
            z = sim.qpos[:, 2]  # the free root's height
            finite = np.isfinite(sim.qpos).all(-1) & np.isfinite(sim.qvel).all(-1)
            healthy = finite & (low <= z) & (z <= high)
            rewards = forward + healthy * o["healthy_reward"]
            if o["terminate_when_unhealthy"]:
                terminated = ~healthy
        return rewards - costs, terminated

    # ------------------------------------------------------------------ outputs
    def _features(self) -> np.ndarray:
        """The flat feature vector ``f`` ``[B, F]`` every observation is gathered from."""
        sim, model = self._sim, self.model
        nq, nv = model.nq, model.nv
        f = np.zeros((self.num_envs, self.layout.feature_size))
        f[:, :nq] = sim.qpos
        f[:, nq : nq + nv] = sim.qvel
        if self.partition.robot.contact_forces:
            clipped = np.clip(sim.cfrc_ext, *self.options["contact_force_range"])
            f[:, nq + nv : -1] = clipped.reshape(self.num_envs, -1)
        return f

    def _tensor(self, array: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device, dtype)

    def _output(self, result: tuple[np.ndarray, np.ndarray] | None) -> TensorDictBase:
        f = self._features()
        e = self.num_envs
        groups = {}
        for group, (obs_index, _) in self._plans.items():
            n = obs_index.shape[0]
            entries = {OBSERVATION: self._tensor(f[:, obs_index])}
            if result is not None:
                reward, terminated = result
                entries[REWARD] = self._tensor(np.repeat(reward[:, None, None], n, axis=1))
                entries[TERMINATED] = self._tensor(
                    np.repeat(terminated[:, None, None], n, axis=1), torch.bool
                )
                entries[TRUNCATED] = torch.zeros(e, n, 1, dtype=torch.bool, device=self.device)
            groups[group] = TensorDict(entries, batch_size=(e, n), device=self.device)
        state = self._tensor(f[:, self.layout.state_index])
        return TensorDict({**groups, STATE: state}, batch_size=(e,), device=self.device)

    # ------------------------------------------------------------------ rendering
    def _render(self, env_index: int) -> np.ndarray:
        """Env ``env_index`` seen by a camera tracking the torso: ``uint8 [H, W, 3]``."""
        if self._renderer is None:
            self._renderer = _OffscreenRenderer(
                self._mujoco,
                self.model,
                *self.render_size,
                self.layout.main_body,
                self.render_effects,
            )
        return self._renderer.render(self._sim.datas[env_index])

    def _close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self._sim.close()


def list_scenarios() -> list[str]:
    """The shipped partitions: ``ant_2x4``, ``ant_4x2``, ``halfcheetah_2x3``."""
    return sorted(PARTITIONS)


def accepted_kwargs(scenario: str) -> list[str]:
    """The keywords ``marlkit.make(f"mujoco/{scenario}")`` takes: those of
    :class:`MultiAgentMujocoEnv` (the same for every partition; the agents are the partition's)."""
    return keyword_names(MultiAgentMujocoEnv, skip=("scenario",)) or []


def make_env(scenario: str, **kwargs: Any) -> MultiAgentMujocoEnv:
    """``marlkit.make("mujoco/<scenario>", **kwargs)``: see :class:`MultiAgentMujocoEnv`.

    Raises:
        TypeError: an option :class:`MultiAgentMujocoEnv` does not take (the message suggests
            the closest ones and lists them all).
    """
    check_kwargs(f"env 'mujoco/{scenario}'", kwargs, accepted_kwargs(scenario))
    return MultiAgentMujocoEnv(scenario, **kwargs)
