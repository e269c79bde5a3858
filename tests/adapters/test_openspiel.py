"""The OpenSpiel adapter against the real open_spiel and shimmy packages."""

from __future__ import annotations

import functools
import sys

import numpy as np
import pytest
import torch

import marlkit
from marlkit.envs import InvalidActionError, accepted_kwargs, check_env_specs
from marlkit.testing import check_adapter

pyspiel = pytest.importorskip("pyspiel")
shimmy = pytest.importorskip("shimmy")

#: The issue's games: parameters that keep them short, observation shape, number of moves.
GAMES = {
    "tic_tac_toe": ({}, (3, 3, 3), 9),
    "connect_four": ({}, (3, 6, 7), 7),
    "leduc_poker": ({}, (16,), 3),
    "goofspiel": ({"num_cards": 4}, (38,), 4),
}
OBS, MASK, ACTING = ("agents", "observation"), ("agents", "action_mask"), ("agents", "acting")


def game(name, **kwargs):
    params, _, _ = GAMES[name]
    return marlkit.make(f"openspiel/{name}", **{"num_envs": 2, "seed": 0, **params, **kwargs})


def legal_taken(td):
    """Whether each move taken was legal for the player whose turn it was."""
    action, acting = td["agents", "action"], td[ACTING]
    legal = td[MASK].gather(-1, action.unsqueeze(-1)).squeeze(-1)
    return legal[acting]


# ---------------------------------------------------------------------- the games
@pytest.mark.parametrize("name", sorted(GAMES))
def test_specs_turns_and_masks(name):
    _, shape, moves = GAMES[name]
    env = game(name)
    assert env.api == "aec" and env.group_map == {"agents": ["player_0", "player_1"]}
    assert env.observation_spec[OBS].shape == (2, 2, *shape)
    assert env.observation_spec[OBS].dtype == torch.float32
    assert env.observation_spec[MASK].shape == (2, 2, moves)
    assert env.action_spec["agents", "action"].n == moves
    assert env.render_modes == ()  # OpenSpiel's games are text
    check_env_specs(env)
    out = env.rollout(30, break_when_any_done=False)
    assert (out[ACTING].sum(-1) == 1).all() and legal_taken(out).all()
    assert out["next", "done"].any() and not out["next", "truncated"].any()
    check_adapter(env, steps=10)
    env.close()


@pytest.mark.parametrize("name", sorted(GAMES))
def test_rewards_add_up_to_what_openspiel_returns(name):
    env = game(name, num_envs=1, seed=4)
    for _ in range(3):
        out = env.rollout(100)  # stops at the end of the game
        assert out["next", "done"][0, -1].item() and out["next", "terminated"][0, -1].item()
        state = env.simulators[0].game_state
        assert state.is_terminal()
        total = out["next", "agents", "reward"][0].sum(0)[:, 0]
        assert total.tolist() == pytest.approx(state.returns())


def test_games_end_when_terminal_and_are_never_truncated():
    """shimmy truncates once its count of nodes, chance nodes included, passes OpenSpiel's
    ``max_game_length``, which counts moves: every goofspiel game ends early there."""
    raw = shimmy.OpenSpielCompatibilityV0(game_name="goofspiel")
    raw.reset(seed=0)
    while not any(raw.truncations.values()):
        _, _, _, _, info = raw.last()
        raw.step(int(np.flatnonzero(info["action_mask"])[0]))
    assert not raw.game_state.is_terminal()  # upstream: cut short
    env = marlkit.make("openspiel/goofspiel", seed=0)  # 13 cards: 12 rounds of 2 moves
    out = env.rollout(24)
    assert out["next", "terminated"][0, -1].item() and not out["next", "truncated"].any()
    assert out.batch_size == (1, 24) and env.simulators[0].game_state.is_terminal()


def test_a_simultaneous_round_takes_one_move_per_player():
    env = game("goofspiel", num_envs=1)
    td = env.reset()
    sim = env.simulators[0]
    for _ in range(3):  # 4 cards: 3 rounds, the last card is forced
        assert td[ACTING][0].tolist() == [True, False]
        bids = np.flatnonzero(td[MASK][0, 0].numpy())
        td["agents", "action"] = torch.tensor([[int(bids[0]), 0]])
        history, seen = list(sim.game_state.history()), td[OBS].clone()
        td = env.step(td)["next"]
        assert sim.game_state.history() == history  # stored: the round is not complete
        assert torch.equal(td[OBS], seen)  # player_1 does not see player_0's bid
        assert td[ACTING][0].tolist() == [False, True] and (td["agents", "reward"] == 0).all()
        bids = np.flatnonzero(td[MASK][0, 1].numpy())
        td["agents", "action"] = torch.tensor([[0, int(bids[-1])]])
        td = env.step(td)["next"]
        assert len(sim.game_state.history()) >= len(history) + 2  # both bids (and a card)
    assert td["done"].item() and sim.game_state.is_terminal()


# ---------------------------------------------------------------------- refusals
def test_illegal_and_out_of_range_moves_are_refused_naming_the_key():
    env = game("tic_tac_toe")
    td = env.reset()
    td["agents", "action"] = torch.tensor([[4, 0], [4, 0]])
    td = env.step(td)["next"]  # player_0 takes the centre in both games
    before = [str(sim.game_state) for sim in env.simulators]
    td["agents", "action"] = torch.tensor([[0, 4], [0, 0]])
    with pytest.raises(InvalidActionError, match=r"masked out by \('agents', 'action_mask'\)"):
        env.step(td)
    td["agents", "action"] = torch.tensor([[0, 9], [0, 0]])
    with pytest.raises(InvalidActionError, match=r"\('agents', 'action'\).*class 9"):
        env.step(td)
    assert [str(sim.game_state) for sim in env.simulators] == before
    masked = game("tic_tac_toe", illegal_actions="mask")
    td = masked.reset()
    td["agents", "action"] = torch.tensor([[4, 0], [4, 0]])
    td = masked.step(td)["next"]
    td["agents", "action"] = torch.tensor([[0, 4], [0, 4]])
    masked.step(td)  # replaced by player_1's first legal move, square 0
    assert str(masked.simulators[0].game_state).startswith("o..")


def test_make_errors_say_what_is_wrong():
    with pytest.raises(KeyError, match="Did you mean: tic_tac_toe"):
        marlkit.make("openspiel/tic_tac_to")
    with pytest.raises(TypeError, match=r"'num_card' \(did you mean 'num_cards'\?\)"):
        marlkit.make("openspiel/goofspiel", num_card=4)
    with pytest.raises(ValueError, match="OpenSpiel refused game 'goofspiel'"):
        marlkit.make("openspiel/goofspiel", num_cards="four")
    with pytest.raises(TypeError, match="observes through strings only"):
        marlkit.make("openspiel/coin_game")
    assert accepted_kwargs("openspiel/goofspiel")[:3] == ["egocentric", "imp_info", "num_cards"]
    entry = marlkit.envs.registered_adapters()["openspiel"]
    assert entry.extra == "openspiel" and set(GAMES) <= set(entry.list_scenarios())


def test_a_missing_openspiel_is_named_with_its_extra(monkeypatch):
    from marlkit.adapters.openspiel import game_class, make_env
    from marlkit.envs import registry

    monkeypatch.setattr(registry, "has_module", lambda name: name != "pyspiel")
    with pytest.raises(registry.AdapterUnavailableError, match=r"'marlkit\[openspiel\]'"):
        marlkit.make("openspiel/tic_tac_toe")
    monkeypatch.setitem(sys.modules, "pyspiel", None)  # import pyspiel fails
    with pytest.raises(ImportError, match=r"pip install 'marlkit\[openspiel\]'"):
        make_env("tic_tac_toe")
    monkeypatch.setitem(sys.modules, "shimmy", None)
    game_class.cache_clear()  # the class is made on first use
    with pytest.raises(ImportError, match=r"'shimmy'.*pip install 'marlkit\[openspiel\]'"):
        game_class()


# ---------------------------------------------------------------------- seeding
def test_seeded_rollouts_repeat_across_episodes():
    """shimmy reseeds every reset without a seed from the OS; here such a reset draws its seed
    from the last seeded one, so the deals of later hands repeat too."""
    env = game("leduc_poker", num_envs=3, seed=7)
    first = env.rollout(40, break_when_any_done=False)  # about 8 hands per instance
    assert first["next", "done"].sum() > 3 * 4
    env.set_seed(7)
    second = env.rollout(40, break_when_any_done=False)
    assert (first == second).all()
    cards = first[OBS][:, :, 0, :6]  # player_0's private card, one-hot
    assert not torch.equal(cards[0], cards[1])

    def hands(env):  # the plain shimmy env: instance 0's deals after its first hand
        env.set_seed(7)
        return env.rollout(40, break_when_any_done=False)[OBS][0, :, 0, :6]

    from marlkit.adapters.pettingzoo import PettingZooEnv

    plain = PettingZooEnv(
        functools.partial(shimmy.OpenSpielCompatibilityV0, game_name="leduc_poker"), seed=7
    )
    assert not all(torch.equal(hands(plain), hands(plain)) for _ in range(3))


# ---------------------------------------------------------------------- batching, collecting
def test_inside_parallel_env_and_a_collector():
    from marlkit.collectors import Collector
    from marlkit.envs import ParallelEnv

    kwargs = {"name": "openspiel/tic_tac_toe", "num_envs": 2}
    env = ParallelEnv(2, marlkit.make, kwargs, start_method="forkserver")
    try:
        assert env.batch_size == (2, 2)
        check_adapter(env, steps=12)
        out = env.rollout(12, break_when_any_done=False)
        assert out[MASK].shape == (2, 2, 12, 2, 9) and legal_taken(out).all()
    finally:
        env.close()
    collector = Collector(game("leduc_poker"), None, frames_per_batch=2 * 10, total_frames=40)
    batches = list(collector)
    collector.shutdown()
    assert [b.batch_size for b in batches] == [torch.Size([2, 10])] * 2
    assert all(legal_taken(b).all() for b in batches)
