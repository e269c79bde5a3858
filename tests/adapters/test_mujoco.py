"""Multi-agent MuJoCo adapter: conformance, parity with Gymnasium v5, batching, rendering."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import marlkit
from marlkit.data.keys import ACTION, NEXT, STATE
from marlkit.envs import InvalidActionError, MissingActionError
from marlkit.envs.registry import UnknownEnvError
from marlkit.testing import check_adapter

mujoco = pytest.importorskip("mujoco")
gymnasium = pytest.importorskip("gymnasium")

from marlkit.adapters import mujoco as mj_adapter  # noqa: E402  (after the skips)
from marlkit.adapters._mujoco_partitions import PARTITIONS, build_layout  # noqa: E402


def make(scenario: str = "ant_2x4", **kwargs: object) -> mj_adapter.MultiAgentMujocoEnv:
    kwargs.setdefault("num_envs", 3)
    kwargs.setdefault("seed", 0)
    kwargs.setdefault("render_size", 48)
    env = marlkit.make(f"mujoco/{scenario}", **kwargs)
    assert isinstance(env, mj_adapter.MultiAgentMujocoEnv)
    return env


@contextlib.contextmanager
def quiet_mujoco() -> Iterator[None]:
    """Keep MuJoCo's compiler warnings (half_cheetah.xml's settotalmass) off stdout and out of
    a MUJOCO_LOG.TXT in the working directory while Gymnasium loads its own copy."""
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(lambda msg: None)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


def actions_for(env: mj_adapter.MultiAgentMujocoEnv, ctrl: np.ndarray) -> dict[str, torch.Tensor]:
    """Split a full control vector ``[B, nu]`` into the groups' actions ``[B, n, act_dim]``."""
    return {
        group: torch.as_tensor(ctrl[:, act_index], dtype=torch.float32)
        for group, (_, act_index) in env._plans.items()
    }


# ---------------------------------------------------------------------------- conformance
@pytest.mark.parametrize(
    ("scenario", "kwargs"),
    [
        ("ant_2x4", {}),
        ("ant_4x2", {"agent_obsk": 0, "group_map": "per_agent"}),
        ("halfcheetah_2x3", {"agent_obsk": 1, "num_threads": 1}),
        ("halfcheetah_6x1", {"agent_obsk": 2}),
        ("ant_2x4d", {"group_map": {"front": ["agent_0"], "back": ["agent_1"]}}),
    ],
)
def test_check_adapter(scenario: str, kwargs: dict) -> None:
    with make(scenario, **kwargs) as env:
        check_adapter(env, steps=4)


def test_registry_lists_the_partitions() -> None:
    entry = marlkit.envs.registered_adapters()["mujoco"]
    assert entry.available
    assert set(entry.list_scenarios()) == set(PARTITIONS)
    assert {"ant_2x4", "ant_4x2", "halfcheetah_2x3"} <= set(mj_adapter.list_scenarios())


@pytest.mark.parametrize(
    ("scenario", "joints"),
    [
        (
            "ant_2x4",
            [["hip_1", "ankle_1", "hip_2", "ankle_2"], ["hip_3", "ankle_3", "hip_4", "ankle_4"]],
        ),
        ("ant_4x2", [[f"hip_{i}", f"ankle_{i}"] for i in range(1, 5)]),
        ("halfcheetah_2x3", [["bthigh", "bshin", "bfoot"], ["fthigh", "fshin", "ffoot"]]),
    ],
)
def test_each_agent_drives_the_actuators_of_its_joints(scenario: str, joints: list) -> None:
    env = make(scenario, num_envs=1)
    m = env.model
    driven = [
        [mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_JOINT, m.actuator_trnid[a, 0]) for a in acts]
        for acts in env.layout.agent_actuators
    ]
    assert driven == joints
    # every actuator belongs to exactly one agent
    assert sorted(np.concatenate(env.layout.agent_actuators).tolist()) == list(range(m.nu))


@pytest.mark.parametrize(
    ("scenario", "k", "obs_dim", "state_dim"),
    [
        ("ant_2x4", 0, 61, 105),  # 4 qpos + 4 qvel + 2 limbs x 3 bodies x 6 + global 17
        ("ant_2x4", 1, 63, 105),  # + the other pair's 2 hips
        ("ant_4x2", 1, 42, 105),  # 2 + 2 + 18 + 3 hips + 17
        ("halfcheetah_2x3", 0, 11, 17),  # 3 + 3 + global (rootz, rooty, 3 root qvel)
        ("halfcheetah_2x3", 1, 12, 17),  # + the other thigh
    ],
)
def test_observation_sizes(scenario: str, k: int, obs_dim: int, state_dim: int) -> None:
    env = make(scenario, agent_obsk=k, num_envs=2)
    n = len(PARTITIONS[scenario].agents)
    td = env.reset()
    assert td["agents", "observation"].shape == (2, n, obs_dim)
    assert td[STATE].shape == (2, state_dim)
    labels = env.observation_labels
    assert all(len(v) == obs_dim for v in labels.values())  # no padding needed here
    if k == 1 and scenario == "ant_2x4":
        assert labels["agent_0"][44:46] == ["qpos:hip_3", "qpos:hip_4"]


def test_padding_keeps_the_global_part_last() -> None:
    env = make("halfcheetah_6x1", agent_obsk=1, num_envs=2)
    labels = env.observation_labels
    # the feet have one neighbour, the others two: feet are padded with one zero
    assert len(labels["agent_2"]) == len(labels["agent_1"]) - 1
    obs = env.reset()["agents", "observation"]
    g = env.layout.global_size
    assert obs.shape == (2, 6, len(labels["agent_1"]))
    assert torch.equal(obs[:, 2, 3], torch.zeros(2))  # bfoot: 3 local entries, then the pad
    assert torch.equal(obs[:, 2, -g:], obs[:, 0, -g:])  # global part aligned for everyone
    layout = build_layout(env.model, PARTITIONS["halfcheetah_6x1"], 1)
    assert layout.padded([0, 2]).shape == (2, len(labels["agent_0"]))


def test_state_is_the_gymnasium_observation() -> None:
    env = make("ant_2x4", num_envs=1)
    td = env.reset()
    qpos, qvel = env.qpos[0], env.qvel[0]
    expected = torch.cat([qpos[2:], qvel, torch.zeros(13 * 6, dtype=torch.float64)])
    assert torch.equal(td[STATE][0], expected.float())  # no contact forces right after reset


# ---------------------------------------------------------------------------- parity
def _gym_rollout_parity(
    gym_id: str, scenario: str, steps: int, qpos_edit: dict[int, float], **options: float
) -> tuple[list[bool], list[bool]]:
    with quiet_mujoco():
        genv = gymnasium.make(gym_id, **options)
    obs, _ = genv.reset(seed=5)
    data = genv.unwrapped.data
    qpos = data.qpos.copy()
    for i, v in qpos_edit.items():
        qpos[i] = v
    genv.unwrapped.set_state(qpos, data.qvel.copy())
    obs = genv.unwrapped._get_obs()
    env = make(scenario, num_envs=2, **options)
    td = env.set_state(np.stack([qpos, qpos]), np.stack([data.qvel, data.qvel]))
    np.testing.assert_allclose(td[STATE][1].numpy(), obs, rtol=1e-6, atol=1e-6)
    rng = np.random.default_rng(1)
    gym_terms, ours = [], []
    for _ in range(steps):
        ctrl = rng.uniform(-1, 1, size=env.model.nu).astype(np.float32)
        obs, reward, terminated, truncated, _ = genv.step(ctrl)
        for group, action in actions_for(env, np.stack([ctrl, ctrl])).items():
            td[group, ACTION] = action
        td = env.step(td)
        nxt = td[NEXT]
        np.testing.assert_allclose(nxt[STATE][1].numpy(), obs, rtol=1e-5, atol=1e-5)
        rewards = nxt["agents", "reward"]
        np.testing.assert_allclose(rewards[1, :, 0].numpy(), reward, rtol=1e-5, atol=1e-5)
        assert torch.equal(rewards, rewards[:, :1].expand_as(rewards))  # the team reward
        gym_terms.append(bool(terminated))
        ours.append(bool(nxt["terminated"][1, 0]))
        assert bool(nxt["agents", "terminated"][1].all()) == ours[-1]
        assert not truncated and not bool(nxt["truncated"].any())
        if terminated:
            break
        td = env._step_mdp(td)
    np.testing.assert_array_equal(env.qpos[1].numpy(), genv.unwrapped.data.qpos)  # bit for bit
    genv.close()
    return gym_terms, ours


def test_ant_parity_with_gymnasium() -> None:
    gym_terms, ours = _gym_rollout_parity("Ant-v5", "ant_2x4", 25, {})
    assert gym_terms == ours


def test_ant_termination_parity_with_gymnasium() -> None:
    # torso above healthy_z_range's 1.0: unhealthy, no healthy reward, terminated at once
    gym_terms, ours = _gym_rollout_parity("Ant-v5", "ant_4x2", 3, {2: 1.2})
    assert gym_terms == ours == [True]


def test_stepping_before_a_reset_or_past_a_termination_is_refused() -> None:
    # as the Gymnasium and PettingZoo adapters: it stepped from the model's initial state, and
    # stepped a fallen ant on (Gymnasium's own Ant asserts a reset after termination)
    env = make("ant_2x4", num_envs=2)
    action = env.rand_action()
    with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
        env.step(action)
    qpos, qvel = env.model.qpos0.copy(), np.zeros(env.model.nv)
    qpos[2] = 1.2  # above healthy_z_range: terminated at the first step
    healthy = env.model.qpos0.copy()
    td = env.set_state(np.stack([qpos, healthy]), np.stack([qvel, qvel]))
    td.update(env.rand_action(td))
    td = env.step(td)
    assert td["next", "terminated"][:, 0].tolist() == [True, False]
    with pytest.raises(RuntimeError, match=r"env\(s\) \[0\] terminated at the last step"):
        env.step(env.rand_action(env._step_mdp(td)))
    root = env._step_mdp(td)
    root["_reset"] = root["terminated"].clone()  # env 0 only
    root.update(env.reset(root))
    assert env.step(env.rand_action(root))["next", "terminated"].shape == (2, 1)


def test_ant_parity_with_options() -> None:
    options = {"frame_skip": 2, "ctrl_cost_weight": 0.1, "contact_cost_weight": 1e-3}
    gym_terms, ours = _gym_rollout_parity("Ant-v5", "ant_2x4", 10, {}, **options)
    assert gym_terms == ours


def test_halfcheetah_parity_with_gymnasium() -> None:
    gym_terms, ours = _gym_rollout_parity("HalfCheetah-v5", "halfcheetah_2x3", 25, {})
    assert gym_terms == ours == [False] * 25


# ---------------------------------------------------------------------------- batching
def test_batched_stepping_equals_single_env_stepping() -> None:
    batched = make("ant_2x4", num_envs=4, num_threads=2, seed=3)
    td = batched.reset()
    qpos0, qvel0 = batched.qpos.numpy(), batched.qvel.numpy()
    singles = [make("ant_2x4", num_envs=1, num_threads=1) for _ in range(4)]
    single_tds = [s.set_state(qpos0[i : i + 1], qvel0[i : i + 1]) for i, s in enumerate(singles)]
    rng = np.random.default_rng(0)
    for _ in range(5):
        ctrl = rng.uniform(-1, 1, size=(4, batched.model.nu))
        for group, action in actions_for(batched, ctrl).items():
            td[group, ACTION] = action
        td = batched.step(td)
        for i, single in enumerate(singles):
            for group, action in actions_for(single, ctrl[i : i + 1]).items():
                single_tds[i][group, ACTION] = action
            out = single.step(single_tds[i])[NEXT]
            assert torch.equal(out[STATE][0], td[NEXT, STATE][i])
            assert torch.equal(out["agents", "reward"][0], td[NEXT, "agents", "reward"][i])
            single_tds[i] = single._step_mdp(single_tds[i])
        td = batched._step_mdp(td)
    for i, single in enumerate(singles):
        assert torch.equal(single.qpos[0], batched.qpos[i])
        assert torch.equal(single.qvel[0], batched.qvel[i])


def test_partial_reset_touches_only_the_masked_envs() -> None:
    env = make("ant_2x4", num_envs=3)
    td = env.rollout(3, break_when_any_done=False)[:, -1]
    root = env._step_mdp(td)
    before = env.qpos
    mask = torch.tensor([[False], [True], [False]])
    root["_reset"] = mask
    out = env.reset(root)
    after = env.qpos
    assert torch.equal(after[[0, 2]], before[[0, 2]])
    assert not torch.equal(after[1], before[1])
    assert torch.equal(out["agents", "observation"][[0, 2]], root["agents", "observation"][[0, 2]])
    assert abs(after[1, 2].item() - 0.75) <= 0.1  # torso height: qpos0 + noise in [-0.1, 0.1]


def test_reset_noise_and_seeding() -> None:
    still = make("ant_4x2", num_envs=2, reset_noise_scale=0.0)
    still.reset()
    assert torch.equal(still.qpos, torch.from_numpy(still.model.qpos0).expand(2, -1))
    assert torch.equal(still.qvel, torch.zeros(2, still.model.nv, dtype=torch.float64))
    a, b = make("ant_4x2", seed=7), make("ant_4x2", seed=7)
    assert torch.equal(a.reset()[STATE], b.reset()[STATE])
    assert not torch.equal(a.reset()[STATE], make("ant_4x2", seed=8).reset()[STATE])


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("what", "value", "error", "match"),
    [
        ("nan", float("nan"), InvalidActionError, r"non-finite value nan at index \[1, 0, 2\]"),
        ("out of ctrlrange", 1.5, InvalidActionError, r"outside \[-1.0, 1.0\]"),
        ("wrong shape", None, InvalidActionError, "shape"),
        ("wrong dtype", "float64", InvalidActionError, "dtype"),
        ("missing", "missing", MissingActionError, "is missing"),
    ],
)
def test_bad_actions_are_rejected_and_leave_the_state(
    what: str, value: object, error: type, match: str
) -> None:
    env = make("ant_2x4", num_envs=2)
    td = env.rand_action(env.reset())
    qpos, qvel = env.qpos, env.qvel
    good = td["agents", ACTION]
    if value == "missing":
        td = td.exclude(("agents", ACTION))
    elif value == "float64":
        td["agents", ACTION] = good.double()
    elif value is None:
        td["agents", ACTION] = torch.zeros(2, 2, 5)
    else:
        bad = good.clone()
        bad[1, 0, 2] = value
        td["agents", ACTION] = bad
    with pytest.raises(error, match=match):
        env.step(td)
    assert torch.equal(env.qpos, qpos) and torch.equal(env.qvel, qvel)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_envs": 0}, ValueError, "num_envs must be an int >= 1, got 0"),
        ({"agent_obsk": -1}, ValueError, "agent_obsk must be an int >= 0, got -1"),
        ({"frame_skip": 0}, ValueError, "frame_skip must be an int >= 1, got 0"),
        ({"num_threads": 0}, ValueError, "num_threads must be an int >= 1"),
        ({"ctrl_cost_weight": "big"}, TypeError, "ctrl_cost_weight must be a real number"),
        ({"reset_noise_scale": -0.1}, ValueError, "reset_noise_scale must be a finite number >= 0"),
        ({"healthy_z_range": (1.0, 0.2)}, ValueError, "healthy_z_range must have low < high"),
        ({"healthy_z_range": 0.5}, TypeError, r"healthy_z_range must be a pair \(low, high\)"),
        ({"terminate_when_unhealthy": 1}, TypeError, "terminate_when_unhealthy must be a bool"),
        ({"render_effects": "yes"}, TypeError, "render_effects must be a bool, got str: 'yes'"),
        ({"num_envs": 2.0}, TypeError, "num_envs must be an int >= 1, got float: 2.0"),
        ({"render_size": 8}, ValueError, "render_size must be at least 16 pixels, got 8"),
        ({"render_size": (32, "wide")}, TypeError, r"render_size must be an int or \(height"),
        ({"group_map": "by_colour"}, ValueError, "unknown group map 'by_colour'"),
        (
            {"colour": "red"},
            TypeError,
            r"mujoco/ant_2x4' got an unexpected keyword argument 'colour'",
        ),
        (
            {"agent_obs_k": 2},
            TypeError,
            r"'agent_obs_k' \(did you mean 'agent_obsk'\?\); it accepts: num_envs, agent_obsk",
        ),
    ],
)
def test_bad_options(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        marlkit.make("mujoco/ant_2x4", **kwargs)


def test_options_that_do_not_apply_and_unknown_partitions() -> None:
    with pytest.raises(ValueError, match=r"healthy_reward=2\.0 does not apply to halfcheetah_2x3"):
        marlkit.make("mujoco/halfcheetah_2x3", healthy_reward=2.0)
    with pytest.raises(ValueError, match=r"contact_cost_weight=0\.1 does not apply"):
        marlkit.make("mujoco/halfcheetah_2x3", contact_cost_weight=0.1)
    with pytest.raises(
        UnknownEnvError, match=r"no MuJoCo partition named 'ant_2x5'\. Did you mean"
    ):
        marlkit.make("mujoco/ant_2x5")


def test_set_state_checks_its_input() -> None:
    env = make("halfcheetah_2x3", num_envs=2)
    nq, nv = env.model.nq, env.model.nv
    with pytest.raises(ValueError, match=r"qpos must have shape \[2, 9\]"):
        env.set_state(np.zeros((2, nq + 1)), np.zeros((2, nv)))
    with pytest.raises(ValueError, match="qvel holds NaN"):
        env.set_state(np.zeros((2, nq)), np.full((2, nv), np.nan))
    with pytest.raises(IndexError, match=r"env_ids must be ints in \[0, 2\)"):
        env.set_state(np.zeros((1, nq)), np.zeros((1, nv)), env_ids=[2])
    out = env.set_state(np.zeros((1, nq)), np.zeros((1, nv)), env_ids=[1])
    assert torch.equal(env.qpos[1], torch.zeros(nq, dtype=torch.float64))
    assert not bool(out["done"].any())


# ---------------------------------------------------------------------------- rendering, close
def test_rendering_is_headless_and_follows_the_simulation() -> None:
    env = make("ant_2x4", num_envs=2, render_size=(48, 64))
    env.reset()
    first = env.render(1)
    assert first.dtype == np.uint8 and first.shape == (48, 64, 3)
    assert first.std() > 5  # not a constant image
    env.rollout(5, break_when_any_done=False)
    assert np.abs(env.render(1).astype(int) - first).mean() > 1  # the ant moved
    assert os.environ["MUJOCO_GL"]  # set by the adapter unless the user chose one
    fancy = make("ant_2x4", num_envs=2, render_size=(48, 64), render_effects=True)
    fancy.set_state(env.qpos, env.qvel)
    assert not np.array_equal(fancy.render(1), env.render(1))  # shadows and reflections
    fancy.close()
    env.close()
    with pytest.raises(RuntimeError, match="is closed"):
        env.render(0)


def test_headless_rendering_in_a_fresh_process_without_mujoco_gl() -> None:
    code = (
        "import os, marlkit; env = marlkit.make('mujoco/halfcheetah_2x3', render_size=32); "
        "frame = env.render(0); print(os.environ['MUJOCO_GL'], frame.shape, frame.dtype)"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "egl (32, 32, 3) uint8"


def test_close_releases_the_threads() -> None:
    env = make("ant_2x4", num_envs=4, num_threads=2)
    env.rollout(2)
    pool = env._sim._pool
    assert pool is not None
    env.close()
    assert env.is_closed and env._sim._pool is None
    with pytest.raises(RuntimeError, match="is closed"):
        env.reset()
