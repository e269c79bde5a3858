"""``smax/<scenario>``: StarCraft-style micromanagement, JaxMARL's SMAX rules, batched over envs.

Two teams of units (marines, marauders, stalkers, zealots, zerglings, hydralisks; their stats in
:data:`~marlkit.native.smax.UNIT_STATS`) fight on a 32 x 32 map. Each env step is 8 world ticks
of 1/16 s (:func:`~marlkit.native.smax.world_ticks`: moves clipped to the map, attacks on live
targets in range once the cooldown is spent, damage summed per target, cooldown reset with
SMAX's jitter, death at the walls, overlapping units pushed apart). The allies are the agents;
the enemies follow SMAX's heuristic (:func:`~marlkit.native.smax.heuristic_actions`), or are a
second group of agents in self-play (``enemy="self_play"``). An episode ends when a team is
wiped out, and is truncated after ``max_steps`` (100) steps.

Scenarios (:data:`SCENARIOS`): SMAX's table, ``3m``, ``8m``, ``25m``, ``2s3z``, ``3s5z``,
``5m_vs_6m``, ``10m_vs_11m``, ``27m_vs_30m``, ``3s5z_vs_3s6z``, ``3s_vs_5z``, ``6h_vs_8z``,
SMACv2-style random teams and start positions ``smacv2_5_units``, ``smacv2_10_units``,
``smacv2_20_units``, and ``custom`` (``allies=`` and ``enemies=``: a number of marines, or a
``{unit type: count}`` dict; hundreds a side are fine).

Keys (``A`` allies, ``M`` enemies, ``N = A + M``; group ``"ally"``, and ``"enemy"`` in self-play
with ``A`` and ``M`` swapped in its shapes)::

    ("ally", "observation")  [E, A, 13 (N - 1) + 10]  SMAX's unit list: per other unit (allies
                             first, in index order) health / max, position relative to self over
                             own sight range (2), last move (2), last attack / largest action,
                             cooldown / max (clipped to [0, 1]), one-hot type (6): 0 unless both
                             are alive and it is in sight; then own health / max, position / 32
                             (2), cooldown / max, one-hot type (0 once dead)
    ("ally", "entities")     [E, A, N - 1, 13]  the same per-unit features, unflattened
    ("ally", "entity_mask")  [E, A, N - 1] bool which entity slots hold a seen unit
    ("ally", "own")          [E, A, 10]     the own features, the observation's last 10 (with
                             ``entities`` and ``entity_mask``, what an entity encoder reads:
                             ``model.inputs=[entities, own]``, docs/models.md)
    ("ally", "action_mask")  [E, A, 5 + M] bool  moves (+y, +x, -y, -x) while alive, stop always,
                             attack enemy k while both are alive and it is in attack range
    ("ally", "mask")         [E, A] bool   alive (dead allies stay in the group)
    ("ally", "action")       [E, A] in {0 .. 4 + M}
    ("next", "ally", "reward") [E, A, 1]   the enemy team's health lost this step as a fraction
                             of its units' maximum, averaged over the team, plus 1 on a win
                             (every ally alike, dead ones too)
    "state"                  [E, 12 N]     per unit health / max, position, cooldown, one-hot
                             type (0 once dead); every unit's team, every unit's type id
    "won"                    [E, 1] bool   the allies wiped out the enemy with one of them alive

The enemy team sees its own units first and both teams in descending index order, and its
attack ``5 + k`` hits ally ``A - 1 - k`` (SMAX's convention).

Where this differs from JaxMARL's ``SMAX``: JaxMARL checks its time limit before counting the
step, so its episodes run ``max_steps + 1`` steps; here ``max_steps`` steps. Everything else,
step for step, agrees (``tests/scenarios/test_smax_parity.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch
from tensordict import TensorDictBase

from marlkit._checks import check_flag, check_int, check_one_of, check_real, did_you_mean
from marlkit.data._fast import unchecked_tensordict
from marlkit.data.composite import Composite
from marlkit.data.keys import (
    ACTION,
    ACTION_MASK,
    MASK,
    OBSERVATION,
    REWARD,
    STATE,
    TERMINATED,
    TRUNCATED,
)
from marlkit.data.specs import Binary, Categorical, Unbounded
from marlkit.envs import EnvBase, make_done_spec, make_reward_spec
from marlkit.envs._memory import reward_done_bytes
from marlkit.native.render import Circles, lighten, render_frame
from marlkit.native.smax import (
    HEALTH,
    N_MOVES,
    OWN_FEATURES,
    RADIUS,
    UNIT_FEATURES,
    UNIT_STATS,
    UNIT_TYPES,
    HeuristicState,
    SmaxRules,
    SmaxWorld,
    heuristic_actions,
    observe,
    push_apart,
    world_ticks,
)
from marlkit.scenarios._homogeneous import check_memory, resolve_backend

__all__ = [
    "ENTITIES",
    "ENTITY_MASK",
    "OWN",
    "SCENARIOS",
    "WON",
    "SmaxEnv",
    "accepted_kwargs",
    "make_smax",
    "scenario_names",
]

Backend = Literal["auto", "native", "torch"]
#: What observe() returns: observations, visibility, action masks, state.
Views = tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], torch.Tensor]
Enemy = Literal["heuristic", "self_play"]

ENTITIES = "entities"
ENTITY_MASK = "entity_mask"
OWN = "own"
WON = "won"
ALLY, ENEMY = "ally", "enemy"

_m, _s, _z, _h = 0, 2, 3, 5
#: SMAX's scenarios: ally types, enemy types, SMACv2 random teams and positions.
SCENARIOS: dict[str, tuple[tuple[int, ...], tuple[int, ...], bool]] = {
    "3m": ((_m,) * 3, (_m,) * 3, False),
    "8m": ((_m,) * 8, (_m,) * 8, False),
    "25m": ((_m,) * 25, (_m,) * 25, False),
    "2s3z": ((_s,) * 2 + (_z,) * 3, (_s,) * 2 + (_z,) * 3, False),
    "3s5z": ((_s,) * 3 + (_z,) * 5, (_s,) * 3 + (_z,) * 5, False),
    "5m_vs_6m": ((_m,) * 5, (_m,) * 6, False),
    "10m_vs_11m": ((_m,) * 10, (_m,) * 11, False),
    "27m_vs_30m": ((_m,) * 27, (_m,) * 30, False),
    "3s5z_vs_3s6z": ((_s,) * 3 + (_z,) * 5, (_s,) * 3 + (_z,) * 6, False),
    "3s_vs_5z": ((_s,) * 3, (_z,) * 5, False),
    "6h_vs_8z": ((_h,) * 6, (_z,) * 8, False),
    "smacv2_5_units": ((_m,) * 5, (_m,) * 5, True),
    "smacv2_10_units": ((_m,) * 10, (_m,) * 10, True),
    "smacv2_20_units": ((_m,) * 20, (_m,) * 20, True),
}
CUSTOM = "custom"
#: Colours by team (allies blue, enemies red); a unit's fill fades with its health.
TEAM_COLORS = ((40, 100, 220), (210, 50, 40))
ATTACK_COLOR = (250, 200, 40)
#: The dot at a unit's centre, by type: marine, marauder, stalker, zealot, zergling, hydralisk.
TYPE_COLORS = (
    (255, 255, 255),
    (30, 30, 30),
    (0, 200, 200),
    (230, 120, 0),
    (150, 0, 200),
    (90, 200, 40),
)


def scenario_names() -> list[str]:
    """Every ``smax/<name>``: SMAX's scenarios and ``custom``."""
    return [*SCENARIOS, CUSTOM]


def _team(name: str, value: object) -> tuple[int, ...]:
    """A team from a number of marines or a ``{unit type: count}`` mapping."""
    if isinstance(value, Mapping):
        types: list[int] = []
        for unit, count in value.items():
            if unit not in UNIT_TYPES:
                hint = did_you_mean(str(unit), UNIT_TYPES)
                raise ValueError(
                    f"{name}: unknown unit type {unit!r}.{hint} Types: {', '.join(UNIT_TYPES)}"
                )
            types += [UNIT_TYPES.index(unit)] * check_int(f"{name}[{unit!r}]", count, low=0)
        if not types:
            raise ValueError(f"{name} must hold at least one unit, got {dict(value)}")
        return tuple(types)
    return (0,) * check_int(name, value, low=1)


class SmaxEnv(EnvBase):
    """``num_envs`` SMAX battles of one scenario, stepped together.

    Args:
        scenario: a name of :data:`SCENARIOS`, or ``"custom"`` (then ``allies`` and
            ``enemies``).
        num_envs: battles stepped together (the env batch ``B = [num_envs]``).
        allies, enemies: for ``"custom"``: a number of marines or a ``{unit type: count}`` dict.
        random_teams: SMACv2's random unit types (the allies' drawn uniformly, mirrored by the
            enemies); default: the scenario's.
        random_positions: SMACv2's random starts (surrounded or reflected); default: the
            scenario's. Otherwise each team starts around its quarter of the map's midline.
        enemy: ``"heuristic"`` (SMAX's scripted enemy) or ``"self_play"`` (a second group).
        device: where the battles live; the C++ kernels serve cpu, the torch twin the rest.
        seed: seed for resets, jitter and the heuristic (``None``: nondeterministic).
        max_steps: steps before an episode is truncated.
        won_bonus: reward for a win (SMAX's ``won_battle_bonus``).
        self_play_reward: SMAX's zero-sum reward: only ``+won_bonus`` / ``-won_bonus``.
        walls_cause_death: units at the map's edge die (SMAX's default).
        see_enemy_actions: observations show the other team's last moves and attacks.
        backend: ``"auto"`` (C++ on cpu when built, else torch), ``"native"`` or ``"torch"``.
        validate_actions: check actions in ``step`` (masked-out actions raise).
        render_size: side in pixels of the frames :meth:`render` returns.

    Example:
        >>> import marlkit
        >>> env = marlkit.make("smax/3m", num_envs=4, seed=0)
        >>> td = env.reset()
        >>> td["ally", "observation"].shape, td["ally", "action_mask"].shape
        (torch.Size([4, 3, 75]), torch.Size([4, 3, 8]))
    """

    render_modes = ("rgb_array",)

    def __init__(
        self,
        scenario: str = "3m",
        num_envs: int = 32,
        *,
        allies: int | Mapping[str, int] | None = None,
        enemies: int | Mapping[str, int] | None = None,
        random_teams: bool | None = None,
        random_positions: bool | None = None,
        enemy: Enemy = "heuristic",
        device: str | torch.device = "cpu",
        seed: int | None = None,
        max_steps: int = 100,
        won_bonus: float = 1.0,
        self_play_reward: bool = False,
        walls_cause_death: bool = True,
        see_enemy_actions: bool = True,
        backend: Backend = "auto",
        validate_actions: bool = True,
        render_size: int = 256,
    ):
        ally_types, enemy_types, smacv2 = self._scenario(scenario, allies, enemies)
        num_envs = check_int("num_envs", num_envs, low=1)
        super().__init__(batch_size=(num_envs,), device=device, validate_actions=validate_actions)
        self.scenario, self.num_envs = scenario, num_envs
        self.enemy: Enemy = check_one_of("enemy", enemy, ("heuristic", "self_play"))
        self.random_teams = (
            smacv2 if random_teams is None else check_flag("random_teams", random_teams)
        )
        self.random_positions = (
            smacv2 if random_positions is None else check_flag("random_positions", random_positions)
        )
        self.max_steps = check_int("max_steps", max_steps, low=1)
        self.won_bonus = check_real("won_bonus", won_bonus, strict=False)
        self.self_play_reward = check_flag("self_play_reward", self_play_reward)
        self.rules = SmaxRules(
            n_allies=len(ally_types),
            n_enemies=len(enemy_types),
            walls_cause_death=check_flag("walls_cause_death", walls_cause_death),
            see_enemy_actions=check_flag("see_enemy_actions", see_enemy_actions),
        )
        self.backend = resolve_backend(backend, self.device)
        self.render_size = check_int("render_size", render_size, low=1)
        a, m = self.rules.n_allies, self.rules.n_enemies
        self._n_obs = a if self.enemy == "heuristic" else a + m
        check_memory(
            self, f"SmaxEnv({scenario!r}, {a} vs {m})", self._spec_bytes(), a + m, 0, self.backend
        )
        dev = self.device
        self._types = torch.tensor(ally_types + enemy_types, dtype=torch.int64, device=dev)
        self._table = torch.tensor(UNIT_STATS, dtype=torch.float32, device=dev)
        self.group_map = {ALLY: [f"ally_{i}" for i in range(a)]}
        if self.enemy == "self_play":
            self.group_map[ENEMY] = [f"enemy_{i}" for i in range(m)]
        self._build_specs()
        self.world = SmaxWorld.empty(num_envs, a + m, dev)
        self.policy = HeuristicState.initial(num_envs, m, dev)
        self._steps = torch.zeros(num_envs, dtype=torch.int64, device=dev)
        self._last_actions = torch.zeros(num_envs, a + m, dtype=torch.int64, device=dev)
        self._views: Views | None = None  # the last observe(): patched by partial resets
        self._gen = torch.Generator(device=dev)
        self._gen.seed()
        if seed is not None:
            self.set_seed(seed)

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _scenario(
        scenario: object, allies: object, enemies: object
    ) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
        if scenario == CUSTOM:
            if allies is None or enemies is None:
                raise ValueError(
                    "smax/custom needs allies= and enemies= (a number of marines or a "
                    "{unit type: count} dict), e.g. allies=256, enemies={'zealot': 40}"
                )
            return _team("allies", allies), _team("enemies", enemies), False
        if not isinstance(scenario, str) or scenario not in SCENARIOS:
            hint = did_you_mean(str(scenario), scenario_names())
            names = ", ".join(scenario_names())
            raise ValueError(f"unknown SMAX scenario {scenario!r}.{hint} Scenarios: {names}")
        if allies is not None or enemies is not None:
            raise ValueError(
                f"allies= and enemies= are for smax/custom; {scenario!r} fixes its teams"
            )
        return SCENARIOS[scenario]

    def _spec_bytes(self) -> int:
        rules, f32 = self.rules, torch.float32.itemsize
        per_group = 0
        for n, other in ((rules.n_allies, rules.n_enemies), (rules.n_enemies, rules.n_allies)):
            k = rules.n_units - 1
            per_agent = (rules.obs_dim + k * UNIT_FEATURES + OWN_FEATURES) * f32
            per_agent += k + N_MOVES + other + 9
            per_group += n * per_agent
            if self.enemy == "heuristic":
                break
        return per_group + rules.state_dim * f32 + reward_done_bytes(self._n_obs) + 1

    def _build_specs(self) -> None:
        b, dev, rules = self.batch_size, self.device, self.rules
        k = rules.n_units - 1
        obs, act = Composite(shape=b, device=dev), Composite(shape=b, device=dev)
        sizes = {}
        for g, agents in self.group_map.items():
            n = len(agents)
            other = rules.n_enemies if g == ALLY else rules.n_allies
            lead = (*b, n)
            obs[g] = Composite(
                {
                    OBSERVATION: Unbounded((*lead, rules.obs_dim), device=dev),
                    ENTITIES: Unbounded((*lead, k, UNIT_FEATURES), device=dev),
                    ENTITY_MASK: Binary(k, (*lead, k), dtype=torch.bool, device=dev),
                    OWN: Unbounded((*lead, OWN_FEATURES), device=dev),
                    ACTION_MASK: Binary(
                        N_MOVES + other, (*lead, N_MOVES + other), dtype=torch.bool, device=dev
                    ),
                    MASK: Categorical(2, lead, dtype=torch.bool, device=dev),
                },
                shape=lead,
                device=dev,
            )
            act[g] = Composite(
                {ACTION: Categorical(N_MOVES + other, lead, device=dev)}, shape=lead, device=dev
            )
            sizes[g] = n
        obs[WON] = Categorical(2, (*b, 1), dtype=torch.bool, device=dev)
        self.observation_spec = obs
        self.action_spec = act
        self.state_spec = Composite(
            {STATE: Unbounded((*b, rules.state_dim), device=dev)}, shape=b, device=dev
        )
        self.reward_spec = make_reward_spec(b, sizes, device=dev)
        self.done_spec = make_done_spec(b, sizes, device=dev)

    # ------------------------------------------------------------------ hooks
    def _set_seed(self, seed: int) -> None:
        # Offset so that resets and the base class's random actions draw different streams.
        self._gen.manual_seed(seed + 5_000_011)

    def _uniform(self, *shape: int, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        u = torch.rand(*shape, generator=self._gen, device=self.device)
        return u * (high - low) + low

    def _spawn_types(self, count: int) -> torch.Tensor:
        """Unit types ``[count, N]``: the scenario's, or SMACv2's random teams (allies uniform
        over the 6 types, the enemies copying them, extra enemies marines as in JaxMARL)."""
        a, m = self.rules.n_allies, self.rules.n_enemies
        if not self.random_teams:
            return self._types.expand(count, -1).clone()
        allies = torch.randint(len(UNIT_TYPES), (count, a), generator=self._gen, device=self.device)
        enemies = torch.zeros(count, m, dtype=torch.int64, device=self.device)
        shared = min(a, m)
        enemies[:, :shared] = allies[:, :shared]
        return torch.cat([allies, enemies], 1)

    def _spawn_positions(self, count: int) -> torch.Tensor:
        """Start positions ``[count, N, 2]`` (before units are pushed apart)."""
        rules = self.rules
        w, h, a, m = rules.map_width, rules.map_height, rules.n_allies, rules.n_enemies
        dev = self.device
        if not self.random_positions:
            centre = torch.tensor([[w / 4, h / 2]] * a + [[w / 4 * 3, h / 2]] * m, device=dev)
            return centre + self._uniform(count, a + m, 2, low=-2.0, high=2.0)
        return torch.where(
            (self._uniform(count) < 0.5)[:, None, None],
            self._surround(count),
            self._reflect(count),
        )

    def _surround(self, count: int) -> torch.Tensor:
        """SMACv2's surround start: one team around the centre, the other in 4 groups each
        somewhere between the centre and a corner."""
        rules = self.rules
        w, h, a, m = rules.map_width, rules.map_height, rules.n_allies, rules.n_enemies
        dev = self.device
        centre = torch.tensor([w / 2, h / 2], device=dev)
        corners = torch.tensor([[0.0, 0.0], [0.0, h], [w, 0.0], [w, h]], device=dev)

        def outside(n: int) -> torch.Tensor:
            group = torch.randint(4, (count, n), generator=self._gen, device=dev)
            t = self._uniform(count, 4, 1)
            spots = t * centre + (1 - t) * corners  # [count, 4, 2]
            picked = torch.gather(spots, 1, group[..., None].expand(-1, -1, 2))
            return picked + self._uniform(count, n, 2, low=-2.0, high=2.0)

        def inside(n: int) -> torch.Tensor:
            return centre + self._uniform(count, n, 2, low=-2.0, high=2.0)

        allies_in = torch.cat([inside(a), outside(m)], 1)
        enemies_in = torch.cat([outside(a), inside(m)], 1)
        pick = (self._uniform(count) < 0.5)[:, None, None]
        return torch.where(pick, allies_in, enemies_in)

    def _reflect(self, count: int) -> torch.Tensor:
        """SMACv2's reflect start: allies uniform on the left half, enemies their mirror images
        (extra enemies uniform on the right half)."""
        rules = self.rules
        w, h, a, m = rules.map_width, rules.map_height, rules.n_allies, rules.n_enemies
        scale = torch.tensor([w / 2, h], device=self.device)
        allies = self._uniform(count, a, 2) * scale
        mirror = torch.stack([w - allies[..., 0], allies[..., 1]], -1)[:, : min(a, m)]
        parts = [allies, mirror]
        if m > a:
            extra = self._uniform(count, m - a, 2) * scale + torch.tensor(
                [w / 2, 0.0], device=self.device
            )
            parts.append(extra)
        return torch.cat(parts, 1)

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        idx = (
            torch.arange(self.num_envs, device=self.device)
            if env_mask is None
            else env_mask.nonzero().squeeze(-1)
        )
        count = idx.numel()
        types = self._spawn_types(count)
        fresh = SmaxWorld.empty(count, self.rules.n_units, self.device)
        fresh.types = types
        fresh.pos = self._spawn_positions(count)
        fresh.health = self._table[types, HEALTH]
        fresh.alive.fill_(True)
        push_apart(fresh, self._table[types, RADIUS])
        world = self.world
        for name, value in zip(
            ("pos", "health", "cooldown", "alive", "types", "prev_move", "prev_attack"),
            fresh.tensors(),
        ):
            getattr(world, name)[idx] = value
        self.policy.target[idx] = 0.0
        self.policy.last[idx] = -1
        self._steps[idx] = 0
        self._last_actions[idx] = 0
        views = None
        if env_mask is not None and self._views is not None and self.rules.n_units >= 24:
            # Only the reset envs changed since the last output: observe those, copy the rest.
            # The copy moves as many bytes as observing every env writes, so it pays only where
            # observing costs more than its writes: from about 24 units (1,024 envs, 1 thread:
            # 2.8 ms against 0.9 for 5m_vs_6m, 130 ms against 300 for 27m_vs_30m).
            sub = SmaxWorld(*(t[idx] for t in world.tensors()))
            obs, visible, masks, state = observe(sub, self.rules, self._n_obs, backend=self.backend)
            last_obs, last_visible, last_masks, last_state = self._views
            views = (
                _patch(last_obs, obs, idx),
                _patch(last_visible, visible, idx),
                [_patch(old, new, idx) for old, new in zip(last_masks, masks)],
                _patch(last_state, state, idx),
            )
        return self._output(None, views)

    def _step_draws(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The uniform ``[0, 1)`` draws one step uses: the cooldown jitter's ``[E, ticks, N]``
        and the heuristic enemies' choice of an ally to chase ``[E, M]`` (the parity tests
        replay JaxMARL's draws through this hook)."""
        rules, e = self.rules, self.num_envs
        jitter = torch.rand(e, rules.ticks, rules.n_units, generator=self._gen, device=self.device)
        if self.enemy == "self_play":
            return jitter, jitter.new_empty(e, 0)
        choice = torch.rand(e, rules.n_enemies, generator=self._gen, device=self.device)
        return jitter, choice

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        rules = self.rules
        jitter_u, choice_u = self._step_draws()
        ally = tensordict.get((ALLY, ACTION)).long()
        if self.enemy == "self_play":
            enemy = tensordict.get((ENEMY, ACTION)).long()
        else:
            enemy = heuristic_actions(
                self.world, self.policy, choice_u, rules, backend=self.backend
            )
        actions = torch.cat([ally, enemy], 1).contiguous()
        before = self.world.health.clone()
        # SMAX's jitter: uniform in [-dt, 2 dt), as jax.random.uniform scales its draws.
        dt = rules.dt
        jitter = (jitter_u * (2 * dt - -dt) + -dt).clamp(min=-dt)
        world_ticks(self.world, actions, jitter, rules, backend=self.backend)
        self._steps += 1
        self._last_actions = actions
        lost = (before - self.world.health) / self._table[self.world.types, HEALTH]
        return self._output(lost)

    # ------------------------------------------------------------------ outputs
    def _team_rewards(
        self, lost: torch.Tensor, alive_a: torch.Tensor, alive_m: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each team's reward ``[E]`` and whether the allies won, SMAX's rule."""
        a = self.rules.n_allies
        won_a, won_m = ~alive_m & alive_a, ~alive_a & alive_m
        bonus = self.won_bonus
        if self.self_play_reward:
            r_a = bonus * won_a.float() - bonus * (~alive_a & ~won_a).float()
            r_m = bonus * won_m.float() - bonus * (~alive_m & ~won_m).float()
        else:
            r_a = lost[:, a:].sum(-1).abs() / self.rules.n_enemies + bonus * won_a.float()
            r_m = lost[:, :a].sum(-1).abs() / a + bonus * won_m.float()
        return r_a, r_m, won_a

    def _output(self, lost: torch.Tensor | None, views: Views | None = None) -> TensorDictBase:
        """What ``_reset`` (``lost=None``) or ``_step`` returns (``views``: what
        :func:`~marlkit.native.smax.observe` gives now, when already known)."""
        rules, e = self.rules, self.num_envs
        a, n, k = rules.n_allies, rules.n_units, rules.n_units - 1
        if views is None:
            views = observe(self.world, rules, self._n_obs, backend=self.backend)
        self._views = views
        obs, visible, masks, state = views
        alive = self.world.alive
        alive_a, alive_m = alive[:, :a].any(-1), alive[:, a:].any(-1)
        root: dict[str, object] = {STATE: state}
        if lost is not None:
            r_a, r_m, won = self._team_rewards(lost, alive_a, alive_m)
            terminal = ~alive_a | ~alive_m
            truncated = (self._steps >= self.max_steps) & ~terminal
        else:
            won = torch.zeros(e, dtype=torch.bool, device=self.device)
        root[WON] = won[:, None]
        spans = {ALLY: (0, a, masks[0]), ENEMY: (a, n, masks[-1])}
        for g in self.group_map:
            lo, hi, mask = spans[g]
            size = hi - lo
            o = obs[:, lo:hi]
            entries = {
                OBSERVATION: o,
                ENTITIES: o[..., : k * UNIT_FEATURES].unflatten(-1, (k, UNIT_FEATURES)),
                ENTITY_MASK: visible[:, lo:hi],
                OWN: o[..., k * UNIT_FEATURES :],
                ACTION_MASK: mask,
                MASK: alive[:, lo:hi].clone(),
            }
            if lost is not None:
                reward = r_a if g == ALLY else r_m
                entries[REWARD] = reward[:, None, None].expand(e, size, 1).clone()
                dead = ~alive[:, lo:hi]
                entries[TERMINATED] = (dead | terminal[:, None])[..., None]
                entries[TRUNCATED] = truncated[:, None, None].expand(e, size, 1).clone()
            root[g] = unchecked_tensordict(entries, (e, size), self.device, nested=False)
        return unchecked_tensordict(root, (e,), self.device, nested=False)

    # ------------------------------------------------------------------ rendering
    def _render(self, env_index: int) -> object:
        """The map (its middle 24 x 24 while every live unit is there): allies blue, enemies
        red, each a disc of its type's radius whose colour fades with its health, a dot of its
        type's colour (:data:`TYPE_COLORS`) at its centre; dead units are not drawn. A unit that
        attacked in the last step is ringed in yellow, with yellow shots along the line to its
        target."""
        rules = self.rules
        w = self.world
        pos = w.pos[env_index].cpu().numpy().astype(np.float64)
        alive = w.alive[env_index].cpu().numpy()
        types = w.types[env_index].cpu().numpy()
        hp = (w.health[env_index] / self._table[w.types[env_index], HEALTH]).cpu().numpy()
        radius = np.asarray(UNIT_STATS)[types, RADIUS]
        team = np.arange(rules.n_units) >= rules.n_allies
        base = np.asarray(TEAM_COLORS)[team.astype(int)]
        colors = np.array([lighten(c, 0.75 * (1 - f)) for c, f in zip(base, hp)], dtype=np.int64)
        # The middle 24 x 24 of the map while every live unit is in it, else the whole map.
        live = pos[alive]
        middle = rules.map_width * 3 / 8
        centre = np.array([rules.map_width / 2, rules.map_height / 2])
        inside = live.size == 0 or bool((np.abs(live - centre) < middle - 0.7).all())
        half = middle if inside else max(rules.map_width, rules.map_height) / 2
        centres = (pos - centre) / half
        scale = 1.0 / half
        layers = []
        actions = self._last_actions[env_index].cpu().numpy()
        shooters = alive & (actions >= N_MOVES)
        if shooters.any():
            k = actions[shooters] - N_MOVES
            own = np.flatnonzero(shooters)
            target = np.where(own < rules.n_allies, rules.n_allies + k, rules.n_allies - 1 - k)
            frac = np.array([0.3, 0.5, 0.7])[:, None, None]
            shots = (1 - frac) * centres[own] + frac * centres[target]
            layers.append(
                Circles(centres[own], radius[own] * scale * 1.4, ATTACK_COLOR, name="attackers")
            )
            layers.append(Circles(shots.reshape(-1, 2), 0.15 * scale, ATTACK_COLOR, name="shots"))
        layers.append(Circles(centres[alive], radius[alive] * scale, colors[alive], name="units"))
        dots = np.asarray(TYPE_COLORS)[types[alive]]
        layers.append(Circles(centres[alive], radius[alive] * scale * 0.4, dots, name="types"))
        return render_frame(layers, half_extent=1.0, size=self.render_size)

    # ------------------------------------------------------------------ introspection
    @property
    def unit_types(self) -> torch.Tensor:
        """``[E, N]`` int64 type ids (allies first), a copy."""
        return self.world.types.clone()

    @property
    def steps(self) -> torch.Tensor:
        """``[E]`` steps taken in each env's episode, a copy."""
        return self._steps.clone()


def _patch(old: torch.Tensor, new: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """A copy of ``old`` with rows ``idx`` from ``new``."""
    out = old.clone()
    out[idx] = new
    return out


def make_smax(scenario: str, **kwargs: object) -> SmaxEnv:
    return SmaxEnv(scenario, **kwargs)  # type: ignore[arg-type]


def accepted_kwargs(scenario: str) -> Sequence[str]:
    """The keywords ``smax/<scenario>`` takes."""
    import inspect

    names = [p for p in inspect.signature(SmaxEnv).parameters if p != "scenario"]
    if scenario != CUSTOM:
        names = [p for p in names if p not in ("allies", "enemies")]
    return names
