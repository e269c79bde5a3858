"""OpenSpiel games as marlkit envs, through shimmy and the PettingZoo AEC adapter.

``marlkit.make("openspiel/leduc_poker", num_envs=4, seed=0)`` builds ``num_envs`` instances of
the OpenSpiel game (``pip install 'marlkit[openspiel]'``) in shimmy's
``OpenSpielCompatibilityV0``, a PettingZoo AEC env, and wraps them in
:class:`~marlkit.adapters.pettingzoo.PettingZooEnv`: one marlkit step is the move of the player
whose turn it is (``(group, "acting")``), ``(group, "action_mask")`` holds the legal moves, and
the keys, rewards and checks are the AEC adapter's. Every other keyword is a game parameter
(``marlkit.make("openspiel/goofspiel", num_cards=4)``), checked against the game's own.

Players ``player_0``, ``player_1``, ... share their spaces, so they form the group ``"agents"``.
Observations are the game's observation tensor (shimmy's choice: else its information-state
tensor), as float32 ``[*B, n, ...]`` (OpenSpiel's doubles hold small integers: no precision is
lost, and every marlkit module computes in float32). Games that offer only strings are refused.

Simultaneous-move games (``goofspiel``): shimmy collects the players' moves one at a time, the
game moving on when the last one is in, so one marlkit step takes one player's move, in turn;
a player does not see the moves already chosen in the same round (OpenSpiel's state does not
change until the round is complete).

Where shimmy's env needs mending, :func:`game_class` does it (each is tested):

* A game ends when OpenSpiel says it is terminal, and is never truncated: shimmy truncates
  when its count of nodes, chance nodes included, passes the game's ``max_game_length`` (which
  counts moves), so it cuts a leduc_poker game with many bets, and every goofspiel game, short,
  and marks a full tic-tac-toe board truncated.
* A reset without a seed draws its seed from the last seeded reset's generator, so a seeded
  rollout repeats across episodes (shimmy reseeds each unseeded reset from the OS).
* A move that is only stored (a simultaneous round not yet complete) earns nothing; shimmy would
  hand out the last round's rewards again.
* The final observation of a game is of its terminal state (shimmy keeps the one before).

OpenSpiel draws nothing: its games are text (``str(env.simulators[i].game_state)``), so these
envs declare no render mode and ``marlkit record`` has no frames to film.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import numpy as np
import torch

from marlkit._checks import check_kwargs, did_you_mean, keyword_names
from marlkit._utils import has_module, import_optional
from marlkit.adapters._dict_env import IllegalActions
from marlkit.adapters.pettingzoo import PettingZooEnv
from marlkit.data.group_map import GroupMapLike
from marlkit.envs.registry import UnknownEnvError

__all__ = ["accepted_kwargs", "game_class", "list_scenarios", "make_env"]

#: Games tested here (any OpenSpiel game with an observation or information-state tensor works:
#: ``marlkit.make("openspiel/<short name>")``); goofspiel moves simultaneously.
GAMES = (
    "connect_four",
    "goofspiel",
    "kuhn_poker",
    "leduc_poker",
    "liars_dice",
    "tic_tac_toe",
)


def list_scenarios() -> list[str]:
    """The games listed in :data:`GAMES` (when OpenSpiel and shimmy are installed)."""
    return list(GAMES) if has_module("pyspiel") and has_module("shimmy") else []


def _pyspiel() -> Any:
    return import_optional("pyspiel", extra="openspiel", purpose="the OpenSpiel adapter")


def _load(scenario: str, params: dict[str, Any] | None = None) -> Any:
    """The OpenSpiel game ``scenario`` with ``params``, or an error saying what is wrong."""
    pyspiel = _pyspiel()
    names = pyspiel.registered_names()
    if scenario not in names:
        hint = did_you_mean(scenario, names, n=3, cutoff=0.6)
        raise UnknownEnvError(
            f"no OpenSpiel game {scenario!r}.{hint} Tested here: {', '.join(GAMES)}; "
            "pyspiel.registered_names() lists them all"
        )
    try:
        return pyspiel.load_game(scenario, params or {})
    except pyspiel.SpielError as err:
        raise ValueError(f"OpenSpiel refused game {scenario!r} with {params}: {err}") from err


def _options() -> list[str]:
    """The keywords :func:`make_env` takes itself (every other one is a game parameter)."""
    return keyword_names(make_env, skip=("scenario",), partial=True) or []


def accepted_kwargs(scenario: str) -> list[str]:
    """The keywords ``marlkit.make(f"openspiel/{scenario}")`` takes: the game's parameters
    (``num_cards`` for goofspiel), then :func:`make_env`'s own.

    Raises:
        UnknownEnvError: no such OpenSpiel game (a ``KeyError``).
    """
    return [*_load(scenario).get_parameters(), *_options()]


class _Mends:
    """What :func:`game_class` adds to shimmy's ``OpenSpielCompatibilityV0`` (a mixin placed
    before it): the mends listed in this module's docstring."""

    # shimmy's attributes, read and written here
    game_state: Any
    game_type: Any
    agents: list[str]
    possible_agents: list[str]
    agent_ids: list[int]
    observations: dict[str, np.ndarray]
    observation_spaces: dict[str, Any]
    action_spaces: dict[str, Any]
    rewards: dict[str, float]
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    simultaneous_actions: dict[str, Any]

    def __init__(self, game_name: str, config: dict[str, Any] | None = None) -> None:
        self._seeds: np.random.Generator | None = None
        super().__init__(game_name=game_name, config=config or None)  # type: ignore[call-arg]

    def _update_observation_spaces(self) -> None:
        # The spaces of a loaded game never change: made once, in float32 (shimmy remakes them
        # at every move).
        if self.observation_spaces:
            return
        super()._update_observation_spaces()  # type: ignore[misc]
        box = importlib.import_module("gymnasium.spaces").Box
        for agent, space in self.observation_spaces.items():
            if isinstance(space, box):
                self.observation_spaces[agent] = box(-np.inf, np.inf, space.shape, np.float32)

    def _update_action_spaces(self) -> None:
        if not self.action_spaces:
            super()._update_action_spaces()  # type: ignore[misc]

    def _update_observations(self) -> None:
        state = self.game_state
        if self.game_type.provides_observation_tensor:
            tensor = state.observation_tensor
        elif self.game_type.provides_information_state_tensor:
            tensor = state.information_state_tensor
        else:
            super()._update_observations()  # type: ignore[misc]
            return
        try:  # also at the terminal state (shimmy keeps the last one before it)
            self.observations = {
                agent: np.asarray(tensor(i), np.float32).reshape(
                    self.observation_spaces[agent].shape
                )
                for i, agent in zip(self.agent_ids, self.possible_agents)
            }
        except _pyspiel().SpielError:  # a game that cannot observe its terminal state
            if not state.is_terminal():
                raise

    def _update_rewards(self) -> None:
        if self.simultaneous_actions:  # a move stored, the round not complete: no reward
            self.rewards = dict.fromkeys(self.agents, 0.0)
        else:
            super()._update_rewards()  # type: ignore[misc]

    def _update_termination_truncation(self) -> None:
        over = bool(self.game_state.is_terminal())
        self.terminations = {a: over or self.terminations[a] for a in self.agents}
        self.truncations = {a: self.truncations[a] for a in self.agents}

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None:
            self._seeds = np.random.default_rng(seed)
        elif self._seeds is not None:
            seed = int(self._seeds.integers(2**31))
        super().reset(seed=seed, options=options)  # type: ignore[misc]


@functools.cache
def game_class() -> type:
    """shimmy's ``OpenSpielCompatibilityV0`` with the mends listed in this module's docstring
    (made on first use: shimmy is optional)."""
    shimmy = import_optional("shimmy", extra="openspiel", purpose="the OpenSpiel adapter")
    _pyspiel()
    return type("OpenSpielGame", (_Mends, shimmy.OpenSpielCompatibilityV0), {})


def _make_game(scenario: str, params: dict[str, Any]) -> Any:
    return game_class()(scenario, params)


def make_env(
    scenario: str,
    *,
    num_envs: int = 1,
    group_map: GroupMapLike | None = None,
    seed: int | None = None,
    illegal_actions: IllegalActions = "raise",
    device: str | torch.device = "cpu",
    validate_actions: bool = True,
    **game_params: Any,
) -> PettingZooEnv:
    """Build ``openspiel/<scenario>``: ``scenario`` is an OpenSpiel game's short name
    (``"tic_tac_toe"``, ``"leduc_poker"``); ``game_params`` are its parameters.

    Args:
        others: see :class:`~marlkit.adapters.pettingzoo.PettingZooEnv`.

    Raises:
        UnknownEnvError: no such game (a ``KeyError``; the message suggests close names).
        TypeError: a keyword that is neither an option here nor a parameter of the game (the
            message suggests the closest ones and lists them all), or a game that offers only
            string observations.
        ValueError: OpenSpiel refuses a parameter's value.
    """
    check_kwargs(f"env 'openspiel/{scenario}'", game_params, accepted_kwargs(scenario))
    game = _load(scenario, game_params)
    kind = game.get_type()
    if not (kind.provides_observation_tensor or kind.provides_information_state_tensor):
        raise TypeError(
            f"OpenSpiel game {scenario!r} observes through strings only (no observation or "
            "information-state tensor), which marlkit cannot hold as tensors"
        )
    return PettingZooEnv(
        functools.partial(_make_game, scenario, dict(game_params)),
        num_envs=num_envs,
        api="aec",
        group_map=group_map,
        illegal_actions=illegal_actions,
        seed=seed,
        device=device,
        validate_actions=validate_actions,
    )
