"""Robots, their partitions into agents, and the observation layout of each agent.

Private to :mod:`marlkit.adapters.mujoco`. A *robot* is a Gymnasium MuJoCo model (its MJCF file
is read from the installed ``gymnasium`` package, never copied) with a joint graph and its
Gymnasium v5 reward defaults; a *partition* splits the robot's actuated joints among agents.
Every agent drives the actuators of its joints.

Observation of one agent (a flat vector, float32), in this order:

1. ``qpos`` then ``qvel`` of its own joints, in partition order;
2. robots with contact forces (Ant): the clipped ``cfrc_ext`` (6 per body) of the bodies of its
   limbs: the bodies its joints move, plus the jointless bodies that attach them to the root;
3. ``qpos`` of the joints at graph distance ``1..agent_obsk`` from its own (nearest first,
   then in model order);
4. the global part every agent sees: the root's ``qpos`` (without the leading coordinates
   Gymnasium leaves out, x and y for the Ant), the root's ``qvel`` and, with contact forces,
   the root body's clipped ``cfrc_ext``.

Agents of one group whose vectors differ in length (a foot has fewer neighbours than a shin)
are zero-padded between the local part (1-3) and the global part (4), so the global part always
ends the vector.

All features are gathered from one flat vector per env,
``f = [qpos (nq) | qvel (nv) | clip(cfrc_ext) (6 * nbody) | 0]``, whose last slot is the zero used
for padding: an agent's observation is ``f[index]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

__all__ = ["PARTITIONS", "ROBOTS", "Layout", "Partition", "Robot", "build_layout"]


@dataclass(frozen=True)
class Robot:
    """A Gymnasium MuJoCo model as a graph of actuated joints, with its v5 reward defaults.

    Attributes:
        name: short name (``"ant"``).
        xml_file: file under ``gymnasium/envs/mujoco/assets/``.
        gymnasium_id: the single-agent Gymnasium env whose rewards are reproduced.
        root_joints: unactuated joints that carry the root (its global pose).
        excluded_positions: leading root ``qpos`` entries left out of every observation.
        edges: hyperedges of the joint graph: joints in one edge are neighbours.
        contact_forces: observe and penalise clipped ``cfrc_ext`` (Ant-v5's default).
        forward: how the x-velocity is measured: the main body's ``xpos`` (``"body"``) or
            ``qpos[0]`` (``"qpos"``), as the Gymnasium env does.
        main_body: the body tracked by ``"body"`` forward velocity and by the camera.
        healthy: whether the robot has healthy terms (reward and termination).
        defaults: Gymnasium v5 constructor defaults of the reward and reset options.
    """

    name: str
    xml_file: str
    gymnasium_id: str
    root_joints: tuple[str, ...]
    excluded_positions: int
    edges: tuple[tuple[str, ...], ...]
    contact_forces: bool
    forward: Literal["body", "qpos"]
    main_body: str
    healthy: bool
    defaults: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Partition:
    """Actuated joints split among agents: ``agents[i]`` are the joints of ``agent_i``."""

    name: str
    robot: Robot
    agents: tuple[tuple[str, ...], ...]
    description: str


_ANT = Robot(
    name="ant",
    xml_file="ant.xml",
    gymnasium_id="Ant-v5",
    root_joints=("root",),
    excluded_positions=2,
    # Each hip is linked to its ankle; the four hips meet at the torso.
    edges=(
        ("hip_1", "ankle_1"),
        ("hip_2", "ankle_2"),
        ("hip_3", "ankle_3"),
        ("hip_4", "ankle_4"),
        ("hip_1", "hip_2", "hip_3", "hip_4"),
    ),
    contact_forces=True,
    forward="body",
    main_body="torso",
    healthy=True,
    defaults={
        "frame_skip": 5,
        "forward_reward_weight": 1.0,
        "ctrl_cost_weight": 0.5,
        "contact_cost_weight": 5e-4,
        "contact_force_range": (-1.0, 1.0),
        "healthy_reward": 1.0,
        "terminate_when_unhealthy": True,
        "healthy_z_range": (0.2, 1.0),
        "reset_noise_scale": 0.1,
    },
)

_HALF_CHEETAH = Robot(
    name="halfcheetah",
    xml_file="half_cheetah.xml",
    gymnasium_id="HalfCheetah-v5",
    root_joints=("rootx", "rootz", "rooty"),
    excluded_positions=1,
    # A chain from the back foot to the front foot.
    edges=(
        ("bfoot", "bshin"),
        ("bshin", "bthigh"),
        ("bthigh", "fthigh"),
        ("fthigh", "fshin"),
        ("fshin", "ffoot"),
    ),
    contact_forces=False,
    forward="qpos",
    main_body="torso",
    healthy=False,
    defaults={
        "frame_skip": 5,
        "forward_reward_weight": 1.0,
        "ctrl_cost_weight": 0.1,
        "reset_noise_scale": 0.1,
    },
)

ROBOTS: dict[str, Robot] = {r.name: r for r in (_ANT, _HALF_CHEETAH)}

PARTITIONS: dict[str, Partition] = {
    p.name: p
    for p in (
        Partition(
            "ant_2x4",
            _ANT,
            (("hip_1", "ankle_1", "hip_2", "ankle_2"), ("hip_3", "ankle_3", "hip_4", "ankle_4")),
            "Ant, 2 agents of 4 joints: the front legs (1, 2) and the back legs (3, 4)",
        ),
        Partition(
            "ant_4x2",
            _ANT,
            (
                ("hip_1", "ankle_1"),
                ("hip_2", "ankle_2"),
                ("hip_3", "ankle_3"),
                ("hip_4", "ankle_4"),
            ),
            "Ant, 4 agents of 2 joints: one leg (hip and ankle) each",
        ),
        Partition(
            "ant_2x4d",
            _ANT,
            (("hip_1", "ankle_1", "hip_3", "ankle_3"), ("hip_2", "ankle_2", "hip_4", "ankle_4")),
            "Ant, 2 agents of 4 joints: diagonal pairs of legs (1, 3) and (2, 4)",
        ),
        Partition(
            "halfcheetah_2x3",
            _HALF_CHEETAH,
            (("bthigh", "bshin", "bfoot"), ("fthigh", "fshin", "ffoot")),
            "HalfCheetah, 2 agents of 3 joints: the back leg and the front leg",
        ),
        Partition(
            "halfcheetah_6x1",
            _HALF_CHEETAH,
            (("bthigh",), ("bshin",), ("bfoot",), ("fthigh",), ("fshin",), ("ffoot",)),
            "HalfCheetah, 6 agents of 1 joint each (the feet have fewer neighbours: padded)",
        ),
    )
}


@dataclass
class Layout:
    """Where each agent's observation and action live, for one model and ``agent_obsk``.

    Attributes:
        feature_size: length of the flat feature vector ``f`` (padding slot included).
        agent_index: per agent, int64 indices into ``f`` (unpadded).
        agent_labels: per agent, a name for each entry (``"qpos:hip_1"``, ...).
        agent_actuators: per agent, the actuator ids it drives (one per joint, in order).
        state_index: indices into ``f`` of the Gymnasium observation (the global ``"state"``).
        main_body: id of the tracked body.
        global_size: length of the global part that ends every agent's observation.
    """

    feature_size: int
    agent_index: list[np.ndarray]
    agent_labels: list[list[str]]
    agent_actuators: list[np.ndarray]
    state_index: np.ndarray
    main_body: int
    global_size: int

    @property
    def pad_index(self) -> int:
        """The slot of ``f`` that is always zero."""
        return self.feature_size - 1

    def padded(self, agents: Sequence[int]) -> np.ndarray:
        """Indices ``[len(agents), max_len]`` for a group: the local parts padded with
        :attr:`pad_index` up to the longest, then the global part."""
        width = max(len(self.agent_index[a]) for a in agents)
        g = self.global_size
        out = np.full((len(agents), width), self.pad_index, dtype=np.int64)
        for row, a in enumerate(agents):
            index = self.agent_index[a]
            out[row, : len(index) - g] = index[: len(index) - g]
            out[row, width - g :] = index[len(index) - g :]
        return out


def _ids(model: Any, kind: Any, names: Sequence[str], what: str) -> list[int]:
    import mujoco

    ids = []
    for name in names:
        i = mujoco.mj_name2id(model, kind, name)
        if i < 0:
            raise ValueError(f"the model has no {what} named {name!r}")
        ids.append(int(i))
    return ids


def _distances(agent: Sequence[str], edges: Sequence[Sequence[str]], k: int) -> list[list[str]]:
    """Joints at graph distance ``1..k`` from ``agent``'s joints, one list per distance."""
    seen, frontier, rings = set(agent), set(agent), []
    for _ in range(k):
        nxt = {j for e in edges if frontier & set(e) for j in e} - seen
        seen |= nxt
        frontier = nxt
        rings.append(sorted(nxt))
    return rings


def _body_name(model: Any, body: int) -> str:
    import mujoco

    return mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, body) or f"body{body}"


def _limb_bodies(model: Any, joints: Sequence[int]) -> list[int]:
    """Bodies moved by ``joints`` plus the jointless bodies attaching them below the root."""
    parent, jntnum = model.body_parentid, model.body_jntnum
    moved = {int(model.jnt_bodyid[j]) for j in joints}
    out: set[int] = set()
    for b in range(1, model.nbody):  # descendants of a moved body
        a = b
        while a > 0 and a not in moved:
            a = int(parent[a])
        if a > 0:
            out.add(b)
    for b in moved:  # jointless ancestors up to (not including) the first jointed one
        a = int(parent[b])
        while a > 0 and jntnum[a] == 0:
            out.add(a)
            a = int(parent[a])
    return sorted(out)


def _agent_features(
    model: Any, partition: Partition, joint_ids: dict[str, int], joints: Sequence[str], k: int
) -> tuple[list[int], list[str]]:
    nq, nv = model.nq, model.nv
    own = [joint_ids[j] for j in joints]
    index = [int(model.jnt_qposadr[j]) for j in own] + [nq + int(model.jnt_dofadr[j]) for j in own]
    labels = [f"qpos:{j}" for j in joints] + [f"qvel:{j}" for j in joints]
    if partition.robot.contact_forces:
        for b in _limb_bodies(model, own):
            index += [nq + nv + 6 * b + c for c in range(6)]
            labels += [f"cfrc_ext:{_body_name(model, b)}[{c}]" for c in range(6)]
    for ring in _distances(joints, partition.robot.edges, k):
        ring = sorted(ring, key=joint_ids.__getitem__)  # model order
        index += [int(model.jnt_qposadr[joint_ids[j]]) for j in ring]
        labels += [f"qpos:{j}" for j in ring]
    return index, labels


def _global_features(model: Any, robot: Robot, main_body: int) -> tuple[list[int], list[str]]:
    import mujoco

    roots = _ids(model, mujoco.mjtObj.mjOBJ_JOINT, robot.root_joints, "joint")
    entries: dict[str, list[tuple[int, str]]] = {"qpos": [], "qvel": []}
    for name, j in zip(robot.root_joints, roots):
        for kind, adr, end in (
            ("qpos", int(model.jnt_qposadr[j]), _next_adr(model, j, "qpos")),
            ("qvel", int(model.jnt_dofadr[j]), _next_adr(model, j, "dof")),
        ):
            size = end - adr
            entries[kind] += [
                (a, name if size == 1 else f"{name}[{a - adr}]") for a in range(adr, end)
            ]
    qpos = entries["qpos"][robot.excluded_positions :]
    index = [a for a, _ in qpos] + [model.nq + a for a, _ in entries["qvel"]]
    labels = [f"qpos:{n}" for _, n in qpos] + [f"qvel:{n}" for _, n in entries["qvel"]]
    if robot.contact_forces:
        index += [model.nq + model.nv + 6 * main_body + c for c in range(6)]
        labels += [f"cfrc_ext:{_body_name(model, main_body)}[{c}]" for c in range(6)]
    return index, labels


def _next_adr(model: Any, joint: int, kind: Literal["qpos", "dof"]) -> int:
    adr = model.jnt_qposadr if kind == "qpos" else model.jnt_dofadr
    total = model.nq if kind == "qpos" else model.nv
    return int(adr[joint + 1]) if joint + 1 < model.njnt else total


def build_layout(model: Any, partition: Partition, agent_obsk: int) -> Layout:
    """Observation and action indices of every agent of ``partition`` on ``model``.

    Raises:
        ValueError: a joint of the partition is missing from the model, is not a hinge or a
            slide, or drives no (or several) actuators.
    """
    import mujoco

    robot = partition.robot
    edge_joints = {j for edge in robot.edges for j in edge}
    names = sorted({j for agent in partition.agents for j in agent} | edge_joints)
    names += list(robot.root_joints)
    joint_ids = dict(zip(names, _ids(model, mujoco.mjtObj.mjOBJ_JOINT, names, "joint")))
    main_body = _ids(model, mujoco.mjtObj.mjOBJ_BODY, [robot.main_body], "body")[0]
    scalar = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
    actuator_of: dict[int, list[int]] = {}
    for a in range(model.nu):
        if model.actuator_trntype[a] == mujoco.mjtTrn.mjTRN_JOINT:
            actuator_of.setdefault(int(model.actuator_trnid[a, 0]), []).append(a)
    glob_index, glob_labels = _global_features(model, robot, main_body)
    agent_index, agent_labels, agent_actuators = [], [], []
    for joints in partition.agents:
        acts = []
        for j in joints:
            jid = joint_ids[j]
            if int(model.jnt_type[jid]) not in scalar:
                raise ValueError(f"joint {j!r} of {partition.name} is not a hinge or a slide")
            found = actuator_of.get(jid, [])
            if len(found) != 1:
                raise ValueError(f"joint {j!r} of {partition.name} drives {len(found)} actuators")
            acts.append(found[0])
        index, labels = _agent_features(model, partition, joint_ids, joints, agent_obsk)
        agent_index.append(np.asarray(index + glob_index, dtype=np.int64))
        agent_labels.append(labels + glob_labels)
        agent_actuators.append(np.asarray(acts, dtype=np.int64))
    nq, nv = model.nq, model.nv
    state = list(range(robot.excluded_positions, nq)) + list(range(nq, nq + nv))
    if robot.contact_forces:  # Gymnasium leaves out the world body
        state += list(range(nq + nv + 6, nq + nv + 6 * model.nbody))
    return Layout(
        feature_size=nq + nv + 6 * model.nbody + 1,
        agent_index=agent_index,
        agent_labels=agent_labels,
        agent_actuators=agent_actuators,
        state_index=np.asarray(state, dtype=np.int64),
        main_body=main_body,
        global_size=len(glob_index),
    )
