"""The PettingZoo adapter on real PettingZoo envs (small sizes): MPE (``mpe2``) parallel envs,
classic AEC games with action masks, and knights-archers-zombies, whose agents die mid-episode.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import marlkit
from marlkit.adapters.pettingzoo import PettingZooEnv, list_scenarios
from marlkit.data import Bounded, Categorical, Unbounded
from marlkit.envs import InvalidActionError, accepted_kwargs, check_env_specs
from marlkit.testing import check_adapter

pytest.importorskip("mpe2")
pettingzoo = pytest.importorskip("pettingzoo")

SPREAD = "pettingzoo/mpe2.simple_spread_v3"
TTT = "pettingzoo/pettingzoo.classic.tictactoe_v3"
OBS = ("agents", "observation")


def spread(**kwargs):
    kwargs = {"N": 3, "max_cycles": 5, "seed": 0, **kwargs}
    return marlkit.make(SPREAD, **kwargs)


# ---------------------------------------------------------------------- parallel (MPE)
def test_simple_spread_conformance_and_specs():
    env = spread(num_envs=2)
    assert env.api == "parallel" and env.group_map == {"agents": ["agent_0", "agent_1", "agent_2"]}
    assert env.observation_spec[OBS] == Unbounded((2, 3, 18))
    assert env.state_spec["state"] == Unbounded((2, 54))
    assert env.action_spec["agents", "action"] == Categorical(5, (2, 3))
    # max_cycles=5: episodes end (PettingZoo empties its agent list) and restart within the kit
    check_adapter(env, steps=12)


def test_continuous_actions():
    env = spread(N=2, num_envs=2, continuous_actions=True)
    assert env.action_spec["agents", "action"] == Bounded(0.0, 1.0, (2, 2, 5))
    check_adapter(env, steps=6)


def test_parity_with_the_raw_parallel_env():
    from mpe2 import simple_spread_v3

    env = spread(seed=7)
    raw = simple_spread_v3.parallel_env(N=3, max_cycles=5)
    raw_obs, _ = raw.reset(seed=7)
    td = env.reset()
    agents = list(raw.agents)
    assert np.array_equal(td[OBS][0].numpy(), np.stack([raw_obs[a] for a in agents]))
    gen = torch.Generator().manual_seed(0)
    for t in range(5):
        action = torch.randint(0, 5, (1, 3), generator=gen)
        td["agents", "action"] = action
        out = env.step(td)["next"]
        raw_obs, rew, _, _, _ = raw.step(dict(zip(agents, action[0].tolist())))
        assert np.array_equal(out[OBS][0].numpy(), np.stack([raw_obs[a] for a in agents]))
        assert np.allclose(out["agents", "reward"][0, :, 0].numpy(), [rew[a] for a in agents])
        assert np.array_equal(out["state"][0].numpy(), raw.state())
        last = t == 4
        assert bool(out["done"]) == last == bool(out["truncated"]) and not out["terminated"].any()
        assert out["agents", "mask"].all() == (not last)  # the agent list empties at the end
        assert out["agents", "truncated"].all() == last
        td = out


def test_state_is_what_the_env_reports_and_can_be_left_out():
    env = spread(num_envs=2)
    td = env.reset()
    # simple_spread's state() concatenates every agent's observation
    assert torch.equal(td["state"], td[OBS].reshape(2, -1))
    lean = spread(num_envs=2, state=False)
    assert "state" not in lean.reset() and lean.state_spec.is_empty()


def test_simple_tag_groups_by_type():
    env = marlkit.make("pettingzoo/mpe2.simple_tag_v3", num_envs=2, max_cycles=5, seed=0)
    assert env.group_map == {
        "adversary": ["adversary_0", "adversary_1", "adversary_2"],
        "agent": ["agent_0"],
    }
    assert env.observation_spec["adversary", "observation"].shape == (2, 3, 16)
    assert env.observation_spec["agent", "observation"].shape == (2, 1, 14)
    check_adapter(env, steps=8)
    with pytest.raises(ValueError, match="'adversary_0' and 'agent_0' of group 'agents' have"):
        marlkit.make("pettingzoo/mpe2.simple_tag_v3", group_map="agents")


def test_seeding_repeats_rollouts():
    def run(seed: int) -> torch.Tensor:
        env = spread(num_envs=2, seed=seed)
        return env.rollout(8, break_when_any_done=False)["next", "agents", "observation"]

    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))


def test_partial_reset_of_a_batch():
    env = spread(num_envs=3, max_cycles=25)
    td = env.reset()
    for _ in range(3):
        _, td = env.step_and_maybe_reset(env.rand_action(td))
    td["_reset"] = torch.tensor([[False], [True], [False]])
    out = env.reset(td)
    for e in (0, 2):
        assert torch.equal(out[OBS][e], td[OBS][e]) and torch.equal(out["state"][e], td["state"][e])
    assert not torch.equal(out[OBS][1], td[OBS][1])
    assert (out[OBS][1, :, :2] == 0).all()  # a fresh episode: velocities are zero


def test_a_first_reset_with_a_mask_resets_every_env():
    # No env has an episode to keep before the first reset: all start one, as with a full reset
    mask = torch.tensor([[False], [True], [False]])
    out = spread(num_envs=3).reset(TensorDict({"_reset": mask}, batch_size=[3]))
    full = spread(num_envs=3).reset()
    assert torch.equal(out[OBS], full[OBS]) and torch.equal(out["state"], full["state"])
    env = spread(num_envs=3)
    td = env.reset(TensorDict({"_reset": mask}, batch_size=[3]))
    assert env.step(env.rand_action(td))["next", OBS].shape == (3, 3, 18)


@pytest.mark.parametrize(
    ("continuous", "value", "match"),
    [
        (False, None, r"the action \('agents', 'action'\) is missing"),
        (False, torch.zeros(1, 3, 2, dtype=torch.long), r"shape \[1, 3, 2\] != spec shape"),
        (False, torch.zeros(1, 3), "dtype float32 != spec dtype int64"),
        (False, torch.full((1, 3), 5), r"class 5 at index \[0, 0\] is outside \[0, 5\)"),
        (True, torch.full((1, 3, 5), float("nan")), "non-finite value nan"),
        (True, torch.full((1, 3, 5), 2.0), "outside"),
    ],
)
def test_bad_actions_are_refused_before_the_simulator_moves(continuous, value, match):
    env = spread(continuous_actions=continuous)
    td = env.reset()
    before = env.simulators[0].state().copy()
    if value is not None:
        td["agents", "action"] = value
    with pytest.raises(InvalidActionError, match=match):
        env.step(td)
    assert np.array_equal(env.simulators[0].state(), before)


# ---------------------------------------------------------------------- agents dying (KAZ)
def test_agents_that_die_leave_the_game_until_the_episode_ends():
    env = marlkit.make(
        "pettingzoo/knights_archers_zombies_v11",
        num_envs=2,
        seed=0,
        num_archers=1,
        num_knights=2,
        line_death=True,  # random walkers hit the walls and die: deaths come early
        spawn_delay=5,
        max_cycles=300,
    )
    rollout = env.rollout(300)
    mask, nxt = rollout["agents", "mask"], rollout["next", "agents"]
    early = (~mask).any(-1) & ~rollout["next", "done"][..., 0]  # someone gone, episode on
    assert early.any(), "no agent died before its episode ended; change the seed"
    gone = ~mask  # not in the game when the step was taken
    assert (nxt["reward"][..., 0][gone] == 0).all() and nxt["done"][..., 0][gone].all()
    assert (nxt["observation"][gone] == 0).all() and not nxt["mask"][gone].any()
    died = mask & ~nxt["mask"]  # the step at which each agent left: done, final observation
    assert nxt["terminated"][..., 0][died].all()
    # the episode is over exactly when nobody is left
    assert torch.equal(rollout["next", "done"][..., 0], (~nxt["mask"]).all(-1))


# ---------------------------------------------------------------------- AEC (classic games)
def test_tictactoe_conformance_turns_and_legal_random_moves():
    env = marlkit.make(TTT, num_envs=3, seed=0)
    assert env.api == "aec"
    spec = env.observation_spec["agents"]
    assert spec["action_mask"].shape == (3, 2, 9) and spec["acting"].shape == (3, 2)
    check_adapter(env, steps=12)
    rollout = env.rollout(60, break_when_any_done=False)
    acting, amask = rollout["agents", "acting"], rollout["agents", "action_mask"]
    assert (acting.sum(-1) == 1).all()  # exactly one player acts at every step
    action = rollout["agents", "action"]
    legal = amask.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    assert legal[acting].all()  # the random policy never plays an occupied square
    assert amask[~acting].all()  # the idle player's action is ignored: anything goes
    over = rollout["next", "done"][..., 0]
    reward = rollout["next", "agents", "reward"][..., 0]
    assert over.any() and (reward[~over] == 0).all()
    assert (reward[over].sum(-1) == 0).all()  # zero-sum: +1/-1 or a draw
    assert rollout["next", "terminated"][..., 0][over].all()


def _play(env, moves: list[int]):
    td = env.reset()
    outs = []
    for move in moves:
        td["agents", "action"] = torch.tensor([[move, move]])
        td = env.step(td)
        outs.append(td["next"])
        td = td["next"]
    return outs


def test_tictactoe_rewards_add_up_to_what_pettingzoo_hands_out():
    env = marlkit.make(TTT, seed=0)
    moves = [0, 3, 1, 4, 2]  # player_1 completes the top row
    outs = _play(env, moves)
    last = outs[-1]
    assert last["agents", "reward"][0, :, 0].tolist() == [1.0, -1.0]
    assert bool(last["done"]) and bool(last["terminated"]) and not last["agents", "mask"].any()
    totals = torch.stack([o["agents", "reward"][0, :, 0] for o in outs]).sum(0)
    # PettingZoo's own accounting: last() at every turn, then at the end for each agent
    raw = env.simulators[0]
    raw.reset(seed=0)
    seen = dict.fromkeys(raw.possible_agents, 0.0)
    for move in [*moves, None, None]:
        _, reward, term, trunc, _ = raw.last()
        seen[raw.agent_selection] += reward
        raw.step(None if (term or trunc) else move)
    assert totals.tolist() == [seen["player_1"], seen["player_2"]]


def test_tictactoe_illegal_moves_raise_or_are_masked():
    env = marlkit.make(TTT, seed=0)
    td = env.step(_set(env.reset(), 4))["next"]  # player_1 takes the centre
    before = td.clone()
    with pytest.raises(InvalidActionError, match="masked out"):
        env.step(_set(td.clone(), 4))  # player_2 plays the centre again
    env.validate_actions = False  # the adapter refuses it before PettingZoo sees it
    with pytest.raises(InvalidActionError, match=r"action 4 of agent 'player_2' \(env 0\)"):
        env.step(_set(td.clone(), 4))
    out = env.step(_set(before, 0))["next"]  # the game was untouched: a legal move works
    assert out[OBS][0, 1, 0, 0, 0] == 1  # player_2's own plane shows its mark on square 0

    masked = marlkit.make(TTT, seed=0, illegal_actions="mask")
    td = masked.step(_set(masked.reset(), 0))["next"]
    out = masked.step(_set(td, 0))["next"]  # square 0 is taken: replaced by square 1
    board = out[OBS][0, 0]  # player_1's view: plane 0 its marks, plane 1 the opponent's
    assert board[0, 0, 0] == 1 and board[0, 1, 1] == 1


def test_the_masking_policy_holds_through_wrappers():
    # The regression: inside TransformedEnv(..., StepCounter(10)) the outer layer validated with
    # its own rule and refused the move that the bare env replaces.
    from marlkit.envs import StepCounter, TransformedEnv

    env = TransformedEnv(marlkit.make(TTT, seed=0, illegal_actions="mask"), StepCounter(10))
    assert env.illegal_actions == "mask"
    td = env._step_mdp(env.step(_set(env.reset(), 0)))
    out = env.step(_set(td, 0))["next"]  # square 0 is taken: replaced by square 1, not refused
    board = out[OBS][0, 0]
    assert board[0, 0, 0] == 1 and board[0, 1, 1] == 1
    assert out["step_count"].item() == 2
    strict = TransformedEnv(marlkit.make(TTT, seed=0), StepCounter(10))
    td = strict._step_mdp(strict.step(_set(strict.reset(), 0)))
    with pytest.raises(InvalidActionError, match="masked out"):
        strict.step(_set(td, 0))


def _set(td, move: int):
    td["agents", "action"] = torch.full((1, 2), move)
    return td


def test_aec_partial_reset_restarts_one_board():
    env = marlkit.make(TTT, num_envs=3, seed=0)
    td = env.reset()
    for _ in range(3):
        _, td = env.step_and_maybe_reset(env.rand_action(td))
    td["_reset"] = torch.tensor([[False], [True], [False]])
    out = env.reset(td)
    assert (out[OBS][1] == 0).all() and out["agents", "acting"][1].tolist() == [True, False]
    for e in (0, 2):
        assert torch.equal(out[OBS][e], td[OBS][e])
        assert torch.equal(out["agents", "acting"][e], td["agents", "acting"][e])


def test_go_boolean_board_planes():
    env = marlkit.make("pettingzoo/go_v5", board_size=5, num_envs=2, seed=0)
    assert env.observation_spec[OBS].dtype == torch.bool
    check_env_specs(env, steps=10)


def test_forcing_aec_on_a_parallel_env():
    env = spread(N=2, max_cycles=2, api="aec", num_envs=2)
    assert env.api == "aec" and ("agents", "acting") in env.observation_spec.keys(True)
    rollout = env.rollout(4, break_when_any_done=False)
    assert rollout["agents", "acting"][0].tolist() == [[True, False], [False, True]] * 2
    check_adapter(env, steps=6)


# ---------------------------------------------------------------------- construction
def test_env_objects_factories_and_short_names():
    from mpe2 import simple_spread_v3

    env = PettingZooEnv(simple_spread_v3.parallel_env(N=2, max_cycles=3), seed=0)
    assert env.batch_size == (1,) and env.api == "parallel"
    check_adapter(env, steps=4)
    with pytest.raises(ValueError, match="pass a factory"):
        PettingZooEnv(simple_spread_v3.parallel_env(N=2), num_envs=2)
    batched = PettingZooEnv(lambda: simple_spread_v3.env(N=2), num_envs=2, api="parallel")
    assert batched.api == "parallel" and batched.batch_size == (2,)
    assert marlkit.make("pettingzoo/tictactoe_v3").api == "aec"


def test_make_errors_say_what_is_wrong():
    with pytest.raises(KeyError, match=r"Did you mean: mpe2\.simple_spread_v3"):
        marlkit.make("pettingzoo/mpe2.simple_sprad_v3")
    with pytest.raises(ValueError, match="has no parallel_env"):
        marlkit.make(TTT, api="parallel")
    with pytest.raises(
        TypeError, match=r"simple_spread_v3' got an unexpected keyword argument 'bogus'"
    ):
        marlkit.make(SPREAD, N=3, bogus=1)
    with pytest.raises(ValueError, match="num_envs must be an int >= 1"):
        marlkit.make(SPREAD, num_envs=0)
    with pytest.raises(ValueError, match="api must be"):
        marlkit.make(SPREAD, api="turns")
    with pytest.raises(ValueError, match="render_mode must be None or 'rgb_array'"):
        marlkit.make(SPREAD, render_mode="human")
    fresh = spread(num_envs=2)
    with pytest.raises(RuntimeError, match=r"envs \[0, 1\] were never reset"):
        fresh.step(fresh.rand_action())


def test_unknown_constructor_arguments_suggest_the_constructors_own() -> None:
    # Read from raw_env's signature: mpe2's env and parallel_env only take **kwargs.
    expected = (
        r"env 'pettingzoo/mpe2.simple_spread_v3' got an unexpected keyword argument 'n' "
        r"\(did you mean 'N'\?\); it accepts: N, local_ratio, max_cycles"
    )
    with pytest.raises(TypeError, match=expected):
        marlkit.make(SPREAD, n=3)
    with pytest.raises(TypeError, match=r"'num_env' \(did you mean 'num_envs'\?\)"):
        marlkit.make(SPREAD, num_env=2)
    with pytest.raises(TypeError, match=r"'screen_heigth' \(did you mean 'screen_height'\?\)"):
        marlkit.make(TTT, screen_heigth=100)  # an AEC-only env: its env() hands on to raw_env
    names = accepted_kwargs(SPREAD)
    assert names[:2] == ["N", "local_ratio"] and "num_envs" in names
    assert names.count("render_mode") == 1


def test_constructor_without_a_readable_signature_checks_its_own_arguments() -> None:
    # pursuit's raw_env takes (*args, **kwargs): its constructor refuses what it does not take.
    pursuit = "pettingzoo/pettingzoo.sisl.pursuit_v5"
    assert accepted_kwargs(pursuit) is None
    with pytest.raises(TypeError, match=r"pursuit_v5\.parallel_env\(\) rejected the arguments"):
        marlkit.make(pursuit, bogus=1)
    env = marlkit.make(pursuit, n_evaders=3, max_cycles=5)
    assert env.batch_size == (1,)


#: Scenarios whose simulator cannot repeat a seeded episode (PettingZoo's own behaviour).
UNSEEDABLE = {"pettingzoo.butterfly.knights_archers_zombies_v11"}


@pytest.mark.parametrize("name", list_scenarios())
def test_every_listed_scenario_passes_the_kit(name: str):
    env = marlkit.make(f"pettingzoo/{name}", num_envs=2, seed=0)
    check_adapter(env, steps=4, check_seeding=name not in UNSEEDABLE)
    env.close()


def test_list_scenarios_and_the_registry():
    names = set(list_scenarios())
    assert {
        "mpe2.simple_spread_v3",
        "mpe2.simple_tag_v3",
        "pettingzoo.classic.tictactoe_v3",
    } <= names
    assert ("pettingzoo.classic.chess_v6" in names) == marlkit._utils.has_module("chess")
    entry = marlkit.envs.registered_adapters()["pettingzoo"]
    assert entry.available and "mpe2.simple_spread_v3" in entry.list_scenarios()


# ---------------------------------------------------------------------- rendering
def test_rendering_headless():
    env = spread(num_envs=2, render_mode="rgb_array")
    assert os.environ.get("SDL_VIDEODRIVER")
    with pytest.raises(RuntimeError, match=r"call reset\(\) before render\(\)"):
        env.render(1)  # PettingZoo's own error is a bare AssertionError
    env.reset()
    frame = env.render(1)
    assert frame.shape == (700, 700, 3) and frame.dtype == np.uint8 and frame.std() > 0
    check_adapter(env, steps=4)
    board = marlkit.make(TTT, render_mode="rgb_array", screen_height=120)
    board.reset()
    assert board.render().shape == (120, 120, 3)
    with pytest.raises(NotImplementedError, match="does not render"):
        spread().render()


def test_inside_parallel_env_with_partial_resets() -> None:
    """A batch of PettingZoo instances spread over worker processes: the conformance kit's
    partial-reset, seeding and done checks hold across the process boundary."""
    from marlkit.envs import ParallelEnv
    from marlkit.testing import check_adapter

    kwargs = {"name": "pettingzoo/mpe2.simple_spread_v3", "N": 3, "num_envs": 2, "max_cycles": 4}
    env = ParallelEnv(2, marlkit.make, kwargs, start_method="forkserver")  # imports done
    try:
        assert env.batch_size == (2, 2)
        check_adapter(env)
        out = env.rollout(9, break_when_any_done=False)  # episodes of 4 steps: resets inside
        assert out["next", "done"].sum() == 2 * 2 * 2
    finally:
        env.close()
