"""SMAX kernels: StarCraft-style unit micromanagement (JaxMARL's SMAX rules), batched over envs.

Three kernels, each with a torch twin that does the same float32 maths in the same order (the
fallback on other devices and the oracle of the agreement tests):

* :func:`world_ticks`: ``ticks`` world ticks of movement, attacks, wall deaths and pushing;
* :func:`observe`: the unit-list observations, action masks and world state;
* :func:`heuristic_actions`: SMAX's scripted enemy.

Randomness (the cooldown jitter, the heuristic's choice of a visible target) is drawn by the
caller and passed in, so both backends, and JaxMARL given the same draws, compute the same step.

Units are indexed allies first (``0 .. A-1``), then enemies (``A .. N-1``). As in SMAX, a unit of
the second team sees and attacks the others in reverse index order: its own team first (highest
index first), then the first team from ``A-1`` down to ``0``; attack ``5 + k`` of an ally hits
enemy ``A + k``, of an enemy hits ally ``A - 1 - k``.

Shapes: ``E`` environments, ``N = A + M`` units (``A`` allies, ``M`` enemies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from marlkit.native._loader import load_extension, native_or_fallback

__all__ = [
    "N_MOVES",
    "OWN_FEATURES",
    "UNIT_FEATURES",
    "UNIT_SHORTHANDS",
    "UNIT_STATS",
    "UNIT_TYPES",
    "HeuristicState",
    "SmaxRules",
    "SmaxWorld",
    "heuristic_actions",
    "observe",
    "other_order",
    "push_apart",
    "world_ticks",
]

Backend = Literal["auto", "native", "torch"]

#: Unit types, in SMAX's order (the index is the type id and the one-hot position).
UNIT_TYPES = ("marine", "marauder", "stalker", "zealot", "zergling", "hydralisk")
UNIT_SHORTHANDS = ("m", "M", "s", "Z", "z", "h")
#: Per type: speed, damage, attack range, sight range, radius, health, weapon cooldown (SMAX's).
UNIT_STATS = (
    (3.15, 9.0, 5.0, 9.0, 0.375, 45.0, 0.61),
    (2.25, 10.0, 6.0, 10.0, 0.5625, 125.0, 1.07),
    (4.13, 13.0, 6.0, 10.0, 0.625, 160.0, 1.87),
    (3.15, 8.0, 2.0, 9.0, 0.5, 150.0, 0.86),
    (4.13, 5.0, 2.0, 8.0, 0.375, 35.0, 0.5),
    (3.15, 12.0, 5.0, 9.0, 0.625, 80.0, 0.59),
)
SPEED, DAMAGE, RANGE, SIGHT, RADIUS, HEALTH, COOLDOWN = range(7)
#: Moves 0..3 (+y, +x, -y, -x), 4 stops, ``5 + k`` attacks the k-th unit of the other team.
N_MOVES = 5
#: Features of another unit in an observation: health / max, relative position / own sight (2),
#: its last move (2), its last action / its largest action, weapon cooldown / max (clipped to
#: [0, 1]), one-hot type (6).
UNIT_FEATURES = 7 + len(UNIT_TYPES)
#: Own features: health / max, position / map size (2), cooldown / max (clipped), one-hot type.
OWN_FEATURES = 4 + len(UNIT_TYPES)


@dataclass(frozen=True)
class SmaxRules:
    """The fixed rules of one SMAX battle (SMAX's defaults).

    Attributes:
        n_allies, n_enemies: units of the first and second team.
        map_width, map_height: the map is ``[0, W] x [0, H]``.
        ticks: world ticks per env step, each ``dt`` long.
        walls_cause_death: a unit at or beyond the map's edge dies.
        see_enemy_actions: observations show the other team's last actions too.
        unit_stats: ``UNIT_STATS``-shaped table (6 rows of 7 values).
    """

    n_allies: int
    n_enemies: int
    map_width: float = 32.0
    map_height: float = 32.0
    ticks: int = 8
    dt: float = 1.0 / 16.0
    walls_cause_death: bool = True
    see_enemy_actions: bool = True
    unit_stats: tuple[tuple[float, ...], ...] = UNIT_STATS

    @property
    def n_units(self) -> int:
        return self.n_allies + self.n_enemies

    @property
    def obs_dim(self) -> int:
        """``13 (N - 1) + 10``: every other unit, then the unit itself."""
        return UNIT_FEATURES * (self.n_units - 1) + OWN_FEATURES

    @property
    def state_dim(self) -> int:
        """``12 N``: per unit its 10 world features, then every unit's team and type."""
        return (OWN_FEATURES + 2) * self.n_units


@dataclass
class SmaxWorld:
    """The state of ``E`` battles (tensors on one device, updated in place by the kernels).

    Attributes:
        pos: ``[E, N, 2]`` float32 unit positions.
        health: ``[E, N]`` float32 hit points (0 once dead).
        cooldown: ``[E, N]`` float32 weapon cooldown (keeps falling below 0 while idle).
        alive: ``[E, N]`` bool.
        types: ``[E, N]`` int64 unit type ids.
        prev_move: ``[E, N, 2]`` float32 the last move vector.
        prev_attack: ``[E, N]`` int64 the last attack action (``5 + k``), 0 when it moved.
    """

    pos: torch.Tensor
    health: torch.Tensor
    cooldown: torch.Tensor
    alive: torch.Tensor
    types: torch.Tensor
    prev_move: torch.Tensor
    prev_attack: torch.Tensor

    @classmethod
    def empty(cls, num_envs: int, n_units: int, device: torch.device) -> SmaxWorld:
        e, n = num_envs, n_units
        return cls(
            pos=torch.zeros(e, n, 2, device=device),
            health=torch.zeros(e, n, device=device),
            cooldown=torch.zeros(e, n, device=device),
            alive=torch.zeros(e, n, dtype=torch.bool, device=device),
            types=torch.zeros(e, n, dtype=torch.int64, device=device),
            prev_move=torch.zeros(e, n, 2, device=device),
            prev_attack=torch.zeros(e, n, dtype=torch.int64, device=device),
        )

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (
            self.pos,
            self.health,
            self.cooldown,
            self.alive,
            self.types,
            self.prev_move,
            self.prev_attack,
        )


@dataclass
class HeuristicState:
    """The scripted enemy's memory, per enemy unit.

    Attributes:
        target: ``[E, M, 2]`` float32 where it heads when it sees nobody (``(0, 0)`` until its
            first step, then its start position mirrored through the map's centre).
        last: ``[E, M]`` int64 the slot it attacked last while that one stays shootable, else -1.
    """

    target: torch.Tensor
    last: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))

    @classmethod
    def initial(cls, num_envs: int, n_enemies: int, device: torch.device) -> HeuristicState:
        return cls(
            target=torch.zeros(num_envs, n_enemies, 2, device=device),
            last=torch.full((num_envs, n_enemies), -1, dtype=torch.int64, device=device),
        )


# ---------------------------------------------------------------------- shared helpers
def _table(rules: SmaxRules, device: torch.device) -> torch.Tensor:
    return torch.tensor(rules.unit_stats, dtype=torch.float32, device=device)


def _norm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``sqrt(x * x + y * y)`` in float32, the root correctly rounded (through float64 on the
    CPU, where torch's float32 ``sqrt`` is not; the C++ kernels' ``std::sqrt`` is)."""
    s = x * x + y * y
    if s.device.type == "cpu":
        return s.double().sqrt().float()
    return s.sqrt()


def other_order(n_allies: int, n_enemies: int, device: torch.device | None = None) -> torch.Tensor:
    """``[N, N - 1]`` int64: the other units in the order unit ``i`` observes them (SMAX's
    unit list): ascending for an ally, descending for an enemy, ``i`` itself left out."""
    n = n_allies + n_enemies
    rows = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        rows.append(others if i < n_allies else others[::-1])
    if n == 1:
        return torch.zeros(1, 0, dtype=torch.int64, device=device)
    return torch.tensor(rows, dtype=torch.int64, device=device)


def _use_native(backend: Backend, device: torch.device) -> bool:
    if backend == "torch":
        return False
    if backend == "native":
        if device.type != "cpu":
            raise ValueError(f"backend='native' runs on cpu only, the tensors are on {device}")
        load_extension()
        return True
    return device.type == "cpu" and native_or_fallback("smax")


def _native_smax() -> Any:
    return load_extension()


def _np(t: torch.Tensor) -> object:
    return t.detach().numpy()


# ---------------------------------------------------------------------- world ticks
def decode_actions(
    actions: torch.Tensor, rules: SmaxRules
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SMAX's discrete actions ``[E, N]`` as the move ``[E, N, 2]`` (moves 0..3 are +y, +x, -y,
    -x; the rest stand still), whether it attacks ``[E, N]`` and the unit it attacks ``[E, N]``
    (itself when it does not)."""
    dev = actions.device
    n, a = rules.n_units, rules.n_allies
    # SMAX writes each move as a diagonal unit vector rotated by 45 degrees; rounded in float32
    # that is (0, 1), (1, 0), (0, -1), (-1, 0) up to an ulp, which these keep.
    c = 1.0 / torch.tensor(2.0).sqrt()  # float32, as jnp computes it
    diag = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, -1.0], [-1.0, 1.0]]) * c
    moves = torch.stack([c * diag[:, 0] + -c * diag[:, 1], c * diag[:, 0] + c * diag[:, 1]], 1)
    moves = torch.cat([moves, torch.zeros(2, 2)]).to(dev)
    move = moves[actions.clamp(max=N_MOVES)]
    attack = actions >= N_MOVES
    own = torch.arange(n, device=dev)
    k = actions - N_MOVES
    target = torch.where(own < a, k + a, a - 1 - k)
    target = torch.where(attack, target, own).clamp(0, n - 1)
    return move, attack, target


def push_apart(world: SmaxWorld, radius: torch.Tensor) -> None:
    """Push overlapping live units apart, SMAX's way (in place): every live unit moves by half
    the sum over live others of ``(p_i - p_j) * relu((r_i + r_j) / (d_ij + 1e-6) - 1)``."""
    pos, alive = world.pos, world.alive
    n = pos.shape[1]
    delta = pos[:, :, None, :] - pos[:, None, :, :]
    eye = torch.eye(n, device=pos.device)
    dist = (_norm(delta[..., 0], delta[..., 1]) + eye) + 1e-6
    rsum = radius[:, :, None] + radius[:, None, :]
    pair = alive[:, :, None] & alive[:, None, :]
    overlap = torch.where(pair, torch.relu(rsum / dist - 1.0), 0.0)
    pushed = pos + (delta * overlap[..., None]).sum(2) / 2
    world.pos = torch.where(alive[..., None], pushed, pos)


def _ticks_torch(
    world: SmaxWorld, actions: torch.Tensor, jitter: torch.Tensor, rules: SmaxRules
) -> None:
    stats = _table(rules, world.pos.device)[world.types]  # [E, N, 7]
    move, attack, target = decode_actions(actions, rules)
    size = torch.tensor([rules.map_width, rules.map_height], device=world.pos.device)
    step = move * stats[..., SPEED, None] * rules.dt
    own = torch.arange(rules.n_units, device=world.pos.device)
    last_attack = torch.where(attack, actions, 0)
    for t in range(rules.ticks):
        pos, alive = world.pos, world.alive
        moved = torch.minimum(pos + step, size).clamp(min=0.0)
        moved = torch.where(alive[..., None], moved, pos)
        tpos = torch.gather(pos, 1, target[..., None].expand(-1, -1, 2))
        d = pos - tpos
        valid = (
            attack
            & (_norm(d[..., 0], d[..., 1]) < stats[..., RANGE])
            & alive
            & torch.gather(alive, 1, target)
            & (target != own)
            & (world.cooldown <= 0.0)
        )
        damage = torch.where(valid, -stats[..., DAMAGE], 0.0)
        health = world.health.scatter_add(1, target, damage).clamp(min=0.0)
        reload = (stats[..., COOLDOWN] + jitter[:, t]) - world.cooldown
        world.cooldown = world.cooldown + torch.where(valid, reload, -rules.dt)
        world.pos = moved
        if rules.walls_cause_death:
            wall = ((moved <= 0.0) | (moved >= size)).any(-1)
            health = torch.where(wall, 0.0, health)
        world.health = health
        world.alive = health > 0.0
        push_apart(world, stats[..., RADIUS])
    world.prev_move = move
    world.prev_attack = last_attack


def world_ticks(
    world: SmaxWorld,
    actions: torch.Tensor,
    jitter: torch.Tensor,
    rules: SmaxRules,
    *,
    backend: Backend = "auto",
) -> None:
    """Advance every battle by ``rules.ticks`` world ticks (in place), SMAX's rules.

    Per tick, from the state at its start, for every unit at once: a live unit moves by
    ``move * speed * dt``, clipped to the map; an attack lands when the attacker and its target
    are alive, the target is closer than the attack range and the attacker's cooldown is
    ``<= 0``; damage is summed per target and health floored at 0; an attacker that fired reloads
    to ``cooldown + jitter``, every other unit's cooldown falls by ``dt``. Then units at or past
    the map's edge die (``walls_cause_death``), units with no health die, and live units that
    overlap are pushed apart (:func:`push_apart`). The last move and attack are recorded.

    Args:
        world: the battles, updated in place.
        actions: ``[E, N]`` int64 discrete actions (``0 .. 4 + other team's size``).
        jitter: ``[E, ticks, N]`` float32 cooldown jitter (SMAX draws it uniform in
            ``[-dt, 2 dt)``), per tick and unit.
        rules: the battle's rules.
        backend: ``"auto"`` (C++ on cpu when built), ``"native"`` or ``"torch"``.
    """
    with torch.no_grad():
        if not _use_native(backend, world.pos.device):
            _ticks_torch(world, actions, jitter, rules)
            return
        _native_smax().smax_ticks(
            *(_np(t) for t in world.tensors()),
            _np(actions.contiguous()),
            _np(jitter.contiguous()),
            _np(_table(rules, torch.device("cpu"))),
            n_allies=rules.n_allies,
            map_width=float(rules.map_width),
            map_height=float(rules.map_height),
            dt=float(rules.dt),
            walls_cause_death=bool(rules.walls_cause_death),
        )


# ---------------------------------------------------------------------- observations
def _observe_torch(
    world: SmaxWorld, rules: SmaxRules, n_obs: int
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], torch.Tensor]:
    dev = world.pos.device
    e, n, a = world.pos.shape[0], rules.n_units, rules.n_allies
    stats = _table(rules, dev)[world.types]
    onehot = torch.nn.functional.one_hot(world.types, len(UNIT_TYPES)).to(torch.float32)
    cd = (world.cooldown / stats[..., COOLDOWN]).clamp(0.0, 1.0)
    hp = world.health / stats[..., HEALTH]
    team = torch.arange(n, device=dev) >= a
    largest = torch.where(team, float(a + N_MOVES - 1), float(rules.n_enemies + N_MOVES - 1))
    last = world.prev_attack.to(torch.float32) / largest
    zeros = torch.zeros(e, n, 2, device=dev)
    unit = torch.cat([hp[..., None], zeros, world.prev_move, last[..., None], cd[..., None]], -1)
    unit = torch.cat([unit, onehot], -1)  # [E, N, 13]
    order = other_order(a, rules.n_enemies, dev)[:n_obs]  # [n, N - 1]
    k = order.shape[1]
    seen = unit.index_select(1, order.reshape(-1)).view(e, n_obs, k, UNIT_FEATURES)
    pos_j = world.pos.index_select(1, order.reshape(-1)).view(e, n_obs, k, 2)
    delta = pos_j - world.pos[:, :n_obs, None, :]
    sight = stats[:, :n_obs, SIGHT]
    rel = delta / sight[..., None, None]
    seen = torch.cat([seen[..., :1], rel, seen[..., 3:]], -1)
    if not rules.see_enemy_actions:
        other_team = team[order] != team[:n_obs, None]  # [n, N - 1]
        hide = torch.ones(UNIT_FEATURES, dtype=torch.bool, device=dev)
        hide[3:6] = False
        seen = torch.where(other_team[..., None] & ~hide, 0.0, seen)
    alive_j = world.alive.index_select(1, order.reshape(-1)).view(e, n_obs, k)
    visible = (
        (_norm(delta[..., 0], delta[..., 1]) < sight[..., None])
        & world.alive[:, :n_obs, None]
        & alive_j
    )
    seen = torch.where(visible[..., None], seen, 0.0)
    size = torch.tensor([rules.map_width, rules.map_height], device=dev)
    own = torch.cat([hp[..., None], world.pos / size, cd[..., None], onehot], -1)
    own = torch.where(world.alive[..., None], own, 0.0)
    obs = torch.cat([seen.reshape(e, n_obs, k * UNIT_FEATURES), own[:, :n_obs]], -1)
    # Action masks: stop always, moves while alive, attacks on live others in range.
    masks = []
    for lo, hi, targets in ((0, a, slice(a, n)), (a, n, None)):
        hi = min(hi, n_obs)
        if hi <= lo:
            continue
        tpos = world.pos[:, a:] if targets else world.pos[:, :a].flip(1)
        talive = world.alive[:, a:] if targets else world.alive[:, :a].flip(1)
        d = tpos[:, None, :, :] - world.pos[:, lo:hi, None, :]
        me = world.alive[:, lo:hi]
        shoot = (_norm(d[..., 0], d[..., 1]) < stats[:, lo:hi, RANGE, None]) & talive[:, None]
        shoot &= me[..., None]
        head = torch.cat(
            [me[..., None].expand(-1, -1, N_MOVES - 1), torch.ones_like(me)[..., None]], -1
        )
        masks.append(torch.cat([head, shoot], -1))
    world_feats = torch.cat([hp[..., None], world.pos, world.cooldown[..., None], onehot], -1)
    world_feats = torch.where(world.alive[..., None], world_feats, 0.0).reshape(e, -1)
    state = torch.cat(
        [world_feats, team.to(torch.float32).expand(e, n), world.types.to(torch.float32)], -1
    )
    return obs, visible, masks, state


def observe(
    world: SmaxWorld, rules: SmaxRules, n_obs: int, *, backend: Backend = "auto"
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """What units ``0 .. n_obs - 1`` observe, may do, and the world state (SMAX's ``unit_list``).

    Args:
        world: the battles.
        rules: their rules.
        n_obs: observe the first ``n_obs`` units: ``A`` (the allies) or ``N`` (both teams).
        backend: ``"auto"``, ``"native"`` or ``"torch"``.

    Returns:
        ``obs`` ``[E, n_obs, 13 (N - 1) + 10]`` float32: for each other unit in
        :func:`other_order`, its 13 :data:`UNIT_FEATURES` (0 unless both are alive and it is
        within the observer's sight range), then the observer's 10 :data:`OWN_FEATURES` (0 once
        dead); ``visible`` ``[E, n_obs, N - 1]`` bool, which other-unit slots are filled;
        the action masks, ``[E, A, 5 + M]`` bool for the allies (and ``[E, M, 5 + A]`` for the
        enemies when ``n_obs = N``); ``state`` ``[E, 12 N]`` float32: per unit its health
        fraction, raw position, raw cooldown and one-hot type (0 once dead), then every unit's
        team (0/1) and type id.
    """
    if n_obs not in (rules.n_allies, rules.n_units):
        raise ValueError(
            f"observe(): n_obs must be {rules.n_allies} or {rules.n_units}, got {n_obs}"
        )
    with torch.no_grad():
        if not _use_native(backend, world.pos.device):
            return _observe_torch(world, rules, n_obs)
        e, n, a, m = world.pos.shape[0], rules.n_units, rules.n_allies, rules.n_enemies
        obs = torch.empty(e, n_obs, rules.obs_dim)
        visible = torch.empty(e, n_obs, n - 1, dtype=torch.bool)
        masks = [torch.empty(e, a, N_MOVES + m, dtype=torch.bool)]
        if n_obs == n:
            masks.append(torch.empty(e, m, N_MOVES + a, dtype=torch.bool))
        state = torch.empty(e, rules.state_dim)
        _native_smax().smax_observe(
            *(_np(t) for t in world.tensors()),
            _np(_table(rules, torch.device("cpu"))),
            _np(obs),
            _np(visible),
            _np(masks[0]),
            _np(masks[1]) if len(masks) > 1 else None,
            _np(state),
            n_allies=a,
            map_width=float(rules.map_width),
            map_height=float(rules.map_height),
            see_enemy_actions=bool(rules.see_enemy_actions),
        )
        return obs, visible, masks, state


# ---------------------------------------------------------------------- heuristic enemy
def _heuristic_torch(
    world: SmaxWorld, policy: HeuristicState, u: torch.Tensor, rules: SmaxRules
) -> torch.Tensor:
    dev = world.pos.device
    a = rules.n_allies
    table = _table(rules, dev)
    alive = world.alive[:, a:]  # [E, M]
    # What the enemy's observation tells it: a dead unit sees zeros and reads its type as 0.
    types = torch.where(alive, world.types[:, a:], 0)
    sight_true = table[world.types[:, a:], SIGHT]
    sight, reach = table[types, SIGHT], table[types, RANGE]
    own = torch.where(alive[..., None], world.pos[:, a:], 0.0)
    allies = world.pos[:, :a].flip(1)  # slot k holds ally A - 1 - k
    ally_alive = world.alive[:, :a].flip(1) & (world.health[:, :a].flip(1) > 0.0)
    delta = allies[:, None, :, :] - world.pos[:, a:, None, :]  # [E, M, A, 2]
    visible = (
        (_norm(delta[..., 0], delta[..., 1]) < sight_true[..., None])
        & alive[..., None]
        & ally_alive[:, None, :]
    )
    rel = (delta / sight_true[..., None, None]) * sight[..., None, None]
    rel = torch.where(visible[..., None], rel, 0.0)
    dist = _norm(rel[..., 0], rel[..., 1])
    shootable = (dist < reach[..., None]) & visible
    can_shoot = shootable.any(-1)
    far = math.sqrt(rules.map_width**2 + rules.map_height**2)
    closest = torch.where(shootable, dist, far).argmin(-1)
    last = policy.last
    keep = (last != -1) & shootable.gather(-1, last.clamp(min=0)[..., None]).squeeze(-1)
    attacked = torch.where(keep, last, closest)
    still = shootable.gather(-1, attacked[..., None]).squeeze(-1)
    # Movement: towards a random visible ally (inverse CDF of u, as jax.random.choice), else
    # to the start position mirrored through the centre.
    centre = torch.tensor([rules.map_width / 2, rules.map_height / 2], device=dev)
    initial = (policy.target == 0.0).all(-1) & (last == -1)
    mirrored = -(own - centre) + centre
    policy.target = torch.where(initial[..., None], mirrored, policy.target)
    count = visible.sum(-1, keepdim=True)
    cum = torch.cumsum(visible.to(torch.float32) / count, -1)
    r = cum[..., -1:] * (1.0 - u[..., None])
    pick = torch.searchsorted(cum.contiguous(), r.contiguous()).clamp(max=a - 1)
    chase = torch.gather(rel + own[:, :, None, :], 2, pick[..., None].expand(-1, -1, 1, 2))
    goal = torch.where(visible.any(-1)[..., None], chase[:, :, 0], policy.target)
    v = goal - own
    similarity = torch.stack([v[..., 1], v[..., 0], -v[..., 1], -v[..., 0]], -1)
    move = similarity.argmax(-1)
    policy.last = torch.where(still, attacked, -1)
    return torch.where(can_shoot, attacked + N_MOVES, move)


def heuristic_actions(
    world: SmaxWorld,
    policy: HeuristicState,
    u: torch.Tensor,
    rules: SmaxRules,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """SMAX's scripted enemy (``attack_mode="closest"``): the enemies' actions ``[E, M]`` int64.

    Each enemy keeps attacking the ally it attacked last while that one stays shootable (alive,
    seen, in attack range), else attacks the closest shootable ally (lowest slot on ties); with
    nobody to shoot it moves (the one of its 4 moves best aligned) towards an ally it sees,
    chosen uniformly by ``u``, else towards its start position mirrored through the map's
    centre. ``policy`` is updated in place.

    Args:
        world: the battles (the state the actions are chosen in).
        policy: the enemies' memory.
        u: ``[E, M]`` float32 uniform draws in ``[0, 1)`` for the choice of a visible ally.
        rules: the rules.
        backend: ``"auto"``, ``"native"`` or ``"torch"``.
    """
    with torch.no_grad():
        if not _use_native(backend, world.pos.device):
            return _heuristic_torch(world, policy, u, rules)
        out = torch.empty(world.pos.shape[0], rules.n_enemies, dtype=torch.int64)
        _native_smax().smax_heuristic(
            *(_np(t) for t in world.tensors()),
            _np(policy.target),
            _np(policy.last),
            _np(u.contiguous()),
            _np(_table(rules, torch.device("cpu"))),
            _np(out),
            n_allies=rules.n_allies,
            map_width=float(rules.map_width),
            map_height=float(rules.map_height),
        )
        return out
