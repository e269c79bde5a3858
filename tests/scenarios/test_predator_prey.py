"""The native predator_prey scenario: conformance over group maps and action kinds, C++ vs torch
agreement, heterogeneous specs, catches (done, mask, reward, inactive until reset), truncation,
partial resets, rendering and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import marlkit
from marlkit.cli import main
from marlkit.data.specs import Bounded, Categorical
from marlkit.envs import (
    InvalidActionError,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
    check_env_specs,
)
from marlkit.native import extension_available
from marlkit.native.render import LANDMARK_COLOR, lighten
from marlkit.scenarios import PredatorPreyEnv
from marlkit.scenarios.predator_prey import PREDATOR_COLOR, PREY_COLOR, PREY_DIRECTIONS
from marlkit.testing import check_adapter

needs_ext = pytest.mark.skipif(not extension_available(), reason="marlkit._C not built")
BACKENDS = ["torch", pytest.param("native", marks=needs_ext)]
GROUPS = ("predator", "prey")


def _rollout_with(env: PredatorPreyEnv, actions: list[dict[str, torch.Tensor]]) -> dict:
    """Step with the given actions; returns every output leaf stacked over time."""
    td = env.reset()
    outs = []
    for action in actions:
        for g, value in action.items():
            td[g, "action"] = value
        td = env.step(td)
        outs.append(td["next"].clone())
        td = env._step_mdp(td)
    stacked = torch.stack(outs)
    return {k: stacked[k] for k in stacked.keys(True, True)}


def _still(env: PredatorPreyEnv) -> dict[str, torch.Tensor]:
    """Zero actions (continuous) for both groups."""
    return {
        "predator": torch.zeros(env.num_envs, env.n_predators, 2),
        "prey": torch.zeros(env.num_envs, env.n_prey, 2),
    }


def _step(env: PredatorPreyEnv, td, actions: dict[str, torch.Tensor] | None = None):
    for g, value in (actions or _still(env)).items():
        td[g, "action"] = value
    out = env.step(td)
    return out, env._step_mdp(out)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"continuous_actions": False},
        {"group_map": "per_agent", "n_predators": 2, "n_prey": 2},
        {
            "group_map": {
                "hunters": ["predator_2", "predator_0"],
                "scout": ["predator_1"],
                "prey": ["prey_1", "prey_0"],
            },
            "continuous_actions": False,
        },
        {"n_predators": 1, "n_prey": 1, "n_landmarks": 0},
        {"k_nearest_prey": 0, "k_nearest_predators": 0, "max_steps": None},
        {"backend": "torch", "max_steps": 3, "world_size": 0.4},  # crowded: catches and resets
    ],
)
def test_conformance(kwargs: dict) -> None:
    env = marlkit.make("predator_prey", **{"num_envs": 3, "seed": 0, **kwargs})
    check_env_specs(env, steps=8)
    check_adapter(env, steps=8)


@needs_ext
@pytest.mark.parametrize("continuous", [True, False])
def test_native_and_torch_agree_over_100_steps(continuous: bool) -> None:
    kwargs = dict(
        num_envs=16, n_predators=4, n_prey=4, continuous_actions=continuous, seed=2,
        world_size=0.7, max_steps=None,
    )  # fmt: skip
    native = PredatorPreyEnv(**kwargs, backend="native")
    twin = PredatorPreyEnv(**kwargs, backend="torch")
    gen = torch.Generator().manual_seed(1)
    actions = [
        {g: native.action_spec[g, "action"].rand(generator=gen) for g in GROUPS} for _ in range(100)
    ]
    a, b = _rollout_with(native, actions), _rollout_with(twin, actions)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-5, msg=str(key))
    caught = a["prey", "terminated"]
    assert caught.any() and not caught[-1].all(), "the test should see catches, not only them"


def test_same_seed_same_rollout_and_other_seeds_differ() -> None:
    def run(seed: int):
        return PredatorPreyEnv(num_envs=4, seed=seed).rollout(30, break_when_any_done=False)

    one, two, other = run(5), run(5), run(6)
    for key in one.keys(True, True):
        assert torch.equal(one[key], two[key]), key
    assert not torch.equal(one["next", "state"], other["next", "state"])


def test_heterogeneous_specs_really_differ() -> None:
    env = PredatorPreyEnv(num_envs=2, n_predators=3, n_prey=2, n_landmarks=2)
    pred_obs = env.observation_spec["predator", "observation"]
    prey_obs = env.observation_spec["prey", "observation"]
    assert pred_obs.shape == (2, 3, 4 + 2 * 2 + 5 * 2)
    assert prey_obs.shape == (2, 2, 4 + 4 * 3 + 2 * 2)
    assert ("prey", "mask") in env.observation_spec.keys(True, True)
    assert ("predator", "mask") not in env.observation_spec.keys(True, True)
    pred_act, prey_act = (env.action_spec[g, "action"] for g in GROUPS)
    assert isinstance(pred_act, Bounded) and isinstance(prey_act, Bounded)
    assert float(pred_act.high.max()) == 3.0 and float(prey_act.high.max()) == 4.0
    discrete = PredatorPreyEnv(num_envs=2, continuous_actions=False)
    pred_act, prey_act = (discrete.action_spec[g, "action"] for g in GROUPS)
    assert isinstance(pred_act, Categorical) and isinstance(prey_act, Categorical)
    assert (pred_act.n, prey_act.n) == (5, 9)
    assert env.state_spec["state"].shape == (2, 4 * 5 + 2 + 2 * 2)


def test_observation_layout() -> None:
    env = PredatorPreyEnv(num_envs=3, n_predators=3, n_prey=4, n_landmarks=2, k_nearest_prey=2)
    td = env.reset()
    pred, prey = env.predator_positions, env.prey_positions
    obs = td["predator", "observation"]  # vel 2, pos 2, 2 others 4, 2 prey: rel 4, vel 4, flag 2
    assert obs.shape == (3, 3, 18)
    torch.testing.assert_close(obs[..., 2:4], pred)
    assert not obs[..., 0:2].any()  # at rest after a reset
    d_pp = torch.cdist(pred, pred) + torch.eye(3) * 1e9
    nearest_other = torch.gather(pred, 1, d_pp.argmin(-1, keepdim=True).expand(-1, -1, 2))
    torch.testing.assert_close(obs[..., 4:6], nearest_other - pred)
    d = torch.cdist(pred, prey)  # [E, P, Q]
    order = d.argsort(-1)
    first = torch.gather(prey, 1, order[..., :1].expand(-1, -1, 2))
    torch.testing.assert_close(obs[..., 8:10], first - pred)
    assert torch.equal(obs[..., 16:18], torch.ones(3, 3, 2))
    pobs = td["prey", "observation"]  # vel 2, pos 2, 3 predators: rel 6, vel 6, landmarks 4
    assert pobs.shape == (3, 4, 20)
    torch.testing.assert_close(pobs[..., 2:4], prey)
    closest = torch.gather(pred, 1, d.argmin(1)[..., None].expand(-1, -1, 2))
    torch.testing.assert_close(pobs[..., 4:6], closest - prey)
    lm = env.landmarks
    torch.testing.assert_close(pobs[..., 16:18], lm[:, None, 0] - prey)
    torch.testing.assert_close(pobs[..., 18:20], lm[:, None, 1] - prey)
    assert td["prey", "mask"].all() and td["prey", "mask"].shape == (3, 4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_catch_masks_the_prey_until_its_env_resets(backend: str) -> None:
    env = PredatorPreyEnv(num_envs=2, n_predators=2, n_prey=2, n_landmarks=0, backend=backend)
    td = env.reset()
    far = torch.tensor([[[-0.8, -0.8], [-0.8, 0.8]]]).repeat(2, 1, 1)
    prey = torch.tensor([[[0.8, 0.8], [0.8, -0.8]]]).repeat(2, 1, 1)
    predators = far.clone()
    predators[0, 0] = torch.tensor([0.75, 0.8])  # env 0: predator_0 overlaps prey_0
    env.place(predators=predators, prey=prey)
    out, td = _step(env, td)
    nxt = out["next"]
    assert nxt["prey", "done"][..., 0].tolist() == [[True, False], [False, False]]
    assert torch.equal(nxt["prey", "terminated"], nxt["prey", "done"])
    assert nxt["prey", "mask"].tolist() == [[False, True], [True, True]]
    assert not nxt["done"].any() and not nxt["predator", "done"].any()  # one prey is left
    assert not nxt["prey", "observation"][0, 0].any()
    torch.testing.assert_close(
        nxt["prey", "reward"][..., 0], torch.tensor([[-10, 0.1], [0.1, 0.1]])
    )
    # Every predator of env 0 gets the catch reward, minus 0.1 x the distance to prey_1.
    dist = torch.linalg.vector_norm(env.predator_positions - env.prey_positions[:, 1:], dim=-1)
    expected = torch.tensor([[10.0, 10.0], [0.0, 0.0]]) - 0.1 * dist[:, :2]
    expected[1] = -0.1 * torch.cdist(env.predator_positions[1], env.prey_positions[1]).amin(-1)
    torch.testing.assert_close(nxt["predator", "reward"][..., 0], expected)
    assert nxt["predator", "observation"][0, :, -2:].tolist() == [[1.0, 0.0], [1.0, 0.0]]
    # The caught prey is inactive: it ignores its action, nobody collides with it, nobody sees
    # it; it stays done with reward 0 and observation 0.
    caught_at = env.prey_positions[0, 0]
    predators = env.predator_positions
    predators[0, 0] = far[0, 0]
    predators[0, 1] = caught_at  # predator_1 sits on the caught prey: no contact force
    env.place(predators=predators)
    actions = _still(env)
    actions["prey"][0, 0] = torch.tensor([4.0, -4.0])
    for _ in range(3):
        out, td = _step(env, td, actions)
    nxt = out["next"]
    assert torch.equal(env.prey_positions[0, 0], caught_at)
    assert torch.equal(env.predator_positions[0, 1], caught_at)
    assert nxt["prey", "done"][0, 0, 0] and not nxt["prey", "mask"][0, 0]
    assert nxt["prey", "reward"][0, 0, 0] == 0.0 and not nxt["prey", "observation"][0, 0].any()
    assert nxt["predator", "observation"][0, :, -1].eq(0).all()  # the second prey slot: empty
    # Catching the last prey of env 0 ends its episode: root and predators done, terminated.
    predators[0, 0] = env.prey_positions[0, 1]
    env.place(predators=predators)
    out, td = _step(env, td)
    nxt = out["next"]
    assert nxt["terminated"][:, 0].tolist() == [True, False]
    assert nxt["done"][:, 0].tolist() == [True, False] and not nxt["truncated"].any()
    assert nxt["predator", "done"][..., 0].tolist() == [[True, True], [False, False]]
    assert nxt["prey", "done"][0].all() and nxt["prey", "reward"][0, :, 0].tolist() == [0, -10]
    torch.testing.assert_close(nxt["predator", "reward"][0], torch.full((2, 1), 10.0))
    # Resetting env 0 alone brings its prey back; env 1 is untouched.
    positions = env.prey_positions
    td["_reset"] = torch.tensor([[True], [False]])
    after = env.reset(td)
    assert after["prey", "mask"].all() and not after["prey", "done"].any()
    assert not after["done"].any() and after["prey", "observation"][0].any(-1).all()
    assert env.alive.all()
    assert torch.equal(env.prey_positions[1], positions[1])
    assert not torch.equal(env.prey_positions[0], positions[0])


def test_a_prey_caught_before_truncation_stays_done_and_the_rest_truncate() -> None:
    env = PredatorPreyEnv(num_envs=1, n_predators=1, n_prey=2, n_landmarks=0, max_steps=2)
    td = env.reset()
    env.place(predators=torch.tensor([[[0.0, 0.0]]]), prey=torch.tensor([[[0.1, 0.0], [0.9, 0.9]]]))
    out, td = _step(env, td)
    assert out["next", "prey", "done"][0, :, 0].tolist() == [True, False]
    out, td = _step(env, td)
    nxt = out["next"]
    assert nxt["truncated"].all() and nxt["done"].all() and not nxt["terminated"].any()
    assert nxt["prey", "truncated"].all() and nxt["predator", "truncated"].all()
    assert nxt["prey", "terminated"][0, :, 0].tolist() == [True, False]


def test_truncation_after_max_steps_and_partial_reset_restarts_the_count() -> None:
    env = PredatorPreyEnv(num_envs=4, n_prey=1, max_steps=3, seed=1, catch_distance=1e-6)
    out = env.rollout(7, break_when_any_done=False)
    truncated = out["next", "truncated"][..., 0]  # [E, T]
    assert truncated[:, [2, 5]].all() and truncated.sum() == 8
    for g in GROUPS:
        assert torch.equal(out["next", g, "truncated"].all(-2), out["next", "truncated"])
    assert not out["next", "terminated"].any()
    root = env._step_mdp(env.rollout(2, break_when_any_done=False)[..., -1])
    root["_reset"] = torch.tensor([[True], [False], [False], [True]])
    env.reset(root)
    assert env._steps.tolist() == [0, 2, 2, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_speeds_radii_and_landmarks_differ_by_type(backend: str) -> None:
    env = PredatorPreyEnv(num_envs=1, n_predators=1, n_prey=1, n_landmarks=1, backend=backend)
    td = env.reset()
    env.place(
        predators=torch.tensor([[[-0.5, -0.5]]]),
        prey=torch.tensor([[[-0.5, 0.5]]]),
        landmarks=torch.tensor([[[0.9, 0.0]]]),
    )
    full = {"predator": torch.tensor([[[3.0, 0.0]]]), "prey": torch.tensor([[[4.0, 0.0]]])}
    for _ in range(8):
        _, td = _step(env, td, full)
    speed = [td[g, "observation"][0, 0, :2].norm().item() for g in GROUPS]
    assert speed == pytest.approx([1.0, 1.3])  # at their speed limits: prey are faster
    for _ in range(20):
        _, td = _step(env, td, full)
    # Both ended against the right wall; each type is clamped at L - its own radius.
    assert env.predator_positions[0, 0, 0] == pytest.approx(1.0 - 0.075)
    assert env.prey_positions[0, 0, 0] == pytest.approx(1.0 - 0.05)
    # The landmark at (0.9, 0) pushes an agent away.
    env.place(predators=torch.tensor([[[0.8, 0.0]]]))
    _step(env, td)
    assert env.predator_positions[0, 0, 0] < 0.8


def test_render_draws_types_in_their_colours() -> None:
    env = PredatorPreyEnv(
        num_envs=2, n_predators=1, n_prey=2, n_landmarks=1, render_size=64, predator_radius=0.2,
        prey_radius=0.2, landmark_radius=0.2, catch_distance=0.5,
    )  # fmt: skip
    td = env.reset()
    env.place(
        predators=torch.tensor([[-0.5, 0.0]]).expand(2, 1, 2),
        prey=torch.tensor([[0.5, 0.0], [-0.5, 0.45]]).expand(2, 2, 2),
        landmarks=torch.tensor([[0.0, -0.5]]).expand(2, 1, 2),
    )
    _step(env, td)  # prey_1 is within 0.5 of the predator (not touching): caught
    frame = env.render(1)
    assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8
    assert env.alive[1].tolist() == [True, False]
    # Pixel centres (y up): predator (-0.5, 0), prey (0.5, 0), landmark (0, -0.5).
    assert tuple(frame[32, 16]) == PREDATOR_COLOR
    assert tuple(frame[32, 48]) == PREY_COLOR
    assert tuple(frame[48, 32]) == LANDMARK_COLOR
    faded = frame[14, 16]  # the caught prey, above the predator and drawn under it
    assert tuple(faded) == lighten(PREY_COLOR, 0.7)


def test_composes_with_serial_env_and_transforms() -> None:
    make = {"name": "predator_prey", "num_envs": 2, "world_size": 0.5}
    batched = SerialEnv(2, marlkit.make, make)
    check_adapter(batched, steps=6)
    env = TransformedEnv(
        marlkit.make("predator_prey", num_envs=3, world_size=0.5, seed=0),
        [StepCounter(max_steps=5), RewardSum()],
    )
    check_adapter(env, steps=12)
    out = env.rollout(12, break_when_any_done=False)
    assert out["next", "prey", "episode_reward"].shape == (3, 12, 2, 1)
    assert out["next", "truncated"][:, 4].all()  # StepCounter truncates every level at 5


def test_registry_and_cli_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert "predator_prey" in marlkit.list_envs()
    args = ["run", "predator_prey", "--envs", "4", "--steps", "20", "--no-progress"]
    assert main([*args, "--discrete"]) == 0
    out = capsys.readouterr().out
    assert "mean episode reward [predator]" in out and "mean episode reward [prey]" in out


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_predators": 0}, ValueError, "n_predators must be an int >= 1, got 0"),
        ({"n_prey": 1.0}, TypeError, "n_prey must be an int >= 1, got float: 1.0"),
        ({"n_landmarks": -1}, ValueError, "n_landmarks must be an int >= 0"),
        ({"num_envs": True}, TypeError, "num_envs must be an int >= 1, got bool: True"),
        ({"k_nearest_prey": -1}, ValueError, "k_nearest_prey must be an int >= 0"),
        ({"max_steps": 0}, ValueError, r"max_steps must be an int >= 1 or None, got 0"),
        ({"prey_radius": 0.0}, ValueError, r"prey_radius must be a finite number > 0"),
        ({"predator_max_speed": math.nan}, ValueError, "predator_max_speed must be a finite"),
        ({"prey_max_force": "fast"}, TypeError, "prey_max_force must be a number, got str"),
        ({"drag": 1.0}, ValueError, r"drag must be a finite number in \[0, 1\), got 1.0"),
        ({"catch_penalty": -1.0}, ValueError, "catch_penalty must be a finite number >= 0"),
        ({"world_size": 0.1}, ValueError, r"world_size 0.1 must exceed every radius"),
        ({"backend": "gpu"}, ValueError, "backend must be"),
        ({"continuous_actions": 1}, TypeError, "continuous_actions must be a bool, got int"),
        ({"group_map": "agents"}, ValueError, r"group 'agents' mixes predators and prey"),
        (
            {"group_map": {"a": ["predator_0", "prey_0"], "b": ["predator_1", "prey_1"]}},
            ValueError,
            r"group 'a' mixes predators and prey \(\['predator_0', 'prey_0'\]\)",
        ),
        ({"group_map": {"predator": ["predator_0"]}}, ValueError, "in no group"),
    ],
)
def test_bad_construction(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PredatorPreyEnv(**{"num_envs": 2, "n_predators": 2, "n_prey": 2, **kwargs})


def test_bad_actions_rejected_per_group_spec_with_state_untouched() -> None:
    env = PredatorPreyEnv(num_envs=2, n_predators=2, n_prey=2, seed=0)
    td = env.reset()
    pos = env.prey_positions
    good = _still(env)
    # 3.5 is a legal prey force but not a legal predator force.
    for group, bad, match in [
        ("predator", torch.full((2, 2, 2), 3.5), r"'predator', 'action'.*outside \[-3.0, 3.0\]"),
        ("prey", torch.full((2, 2, 2), 4.5), r"'prey', 'action'.*outside \[-4.0, 4.0\]"),
        ("prey", torch.full((2, 2, 2), math.nan), r"non-finite value nan"),
        ("prey", torch.zeros(2, 2, 3), r"shape"),
    ]:
        td.update({(g, "action"): v for g, v in good.items()})
        td[group, "action"] = bad
        with pytest.raises(InvalidActionError, match=match):
            env.step(td)
    assert torch.equal(env.prey_positions, pos)
    td["prey", "action"] = torch.full((2, 2, 2), 3.5)
    env.step(td)  # accepted for prey
    discrete = PredatorPreyEnv(num_envs=2, n_predators=2, n_prey=2, continuous_actions=False)
    td = discrete.reset()
    td["predator", "action"] = torch.zeros(2, 2, dtype=torch.int64)
    td["prey", "action"] = torch.full((2, 2), len(PREY_DIRECTIONS) - 1)
    discrete.step(td)  # 8: a prey diagonal
    td["predator", "action"] = torch.full((2, 2), 8)
    with pytest.raises(InvalidActionError, match=r"'predator', 'action'"):
        discrete.step(td)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"prey": [[0.0, 0.0]]}, TypeError, "place\\(\\): prey must be a tensor, got list"),
        ({"predators": torch.zeros(2, 3, 2)}, ValueError, r"predators must have shape \[2, 2, 2\]"),
        ({"landmarks": torch.full((2, 2, 2), math.inf)}, ValueError, "non-finite position"),
    ],
)
def test_bad_place(kwargs: dict, error: type, match: str) -> None:
    env = PredatorPreyEnv(num_envs=2, n_predators=2, n_prey=2, n_landmarks=2)
    env.reset()
    with pytest.raises(error, match=match):
        env.place(**kwargs)


def test_place_takes_positions_without_their_autograd_history() -> None:
    env = PredatorPreyEnv(num_envs=2, n_predators=2, n_prey=2, n_landmarks=0, seed=0)
    td = env.reset()
    env.place(predators=torch.zeros(2, 2, 2, requires_grad=True))
    out = env.step(env.rand_action(td))["next"]
    assert not any(v.requires_grad for v in out.values(True, True))
