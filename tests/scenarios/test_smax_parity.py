"""``smax/*`` against JaxMARL's SMAX: one step from the same random states and actions.

The random parts are aligned by construction: the cooldown jitter and the heuristic enemies'
choice of a target are drawn from the keys JaxMARL's step splits, and replayed through
:meth:`SmaxEnv._step_draws`; spawns are compared in distribution. Every step function is jitted
(and vmapped over states) once per scenario and module.
"""

from __future__ import annotations

import functools
import os
import pathlib

import numpy as np
import pytest
import torch

from marlkit.native.smax import N_MOVES, UNIT_STATS, HeuristicState, SmaxWorld
from marlkit.scenarios.smax import ALLY, ENEMY, SCENARIOS, WON, SmaxEnv

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
smax_mod = pytest.importorskip("jaxmarl.environments.smax")
smax_env_mod = pytest.importorskip("jaxmarl.environments.smax.smax_env")
heuristic_mod = pytest.importorskip("jaxmarl.environments.smax.heuristic_enemy")

jax.config.update("jax_platform_name", "cpu")
# Compiling JaxMARL's step takes 20-40 s a scenario on 2 cores: keep the executables between runs.
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get("MARLKIT_JAX_CACHE", str(pathlib.Path.home() / ".cache" / "marlkit-jax")),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
# Every test here compiles JaxMARL (tens of seconds the first time): slow. The C++ kernel and its
# torch twin are checked against each other in test_smax.py, in the fast suite.
pytestmark = pytest.mark.slow

FAST = ("3m", "2s3z", "5m_vs_6m", "smacv2_5_units")
SLOW = tuple(name for name in SCENARIOS if name not in FAST)
BATCH = 48
TICKS = 8


class ReplayedSmax(SmaxEnv):
    """SmaxEnv whose step draws are set from outside (JaxMARL's, by the test)."""

    draws: tuple[torch.Tensor, torch.Tensor]

    def _step_draws(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.draws


@functools.cache
def _jax_side(name: str, self_play: bool):
    """The jitted, vmapped JaxMARL functions for one scenario (compiled once per module)."""
    scenario = smax_mod.map_name_to_scenario(name)
    if self_play:
        env = smax_mod.SMAX(scenario=scenario)
        base = env
    else:
        env = smax_mod.HeuristicEnemySMAX(scenario=scenario)
        base = env._env
    n = base.num_agents
    ne = base.num_enemies
    dt = base.time_per_step

    def draws(key):
        """The uniforms behind SMAX's jitter ``[ticks, N]`` and the heuristic's choice ``[M]``,
        from the keys its step splits."""
        if self_play:
            world_key = key
            choice = jnp.zeros((0,))
        else:
            world_key, action_key = jax.random.split(key)
            keys = jax.random.split(action_key, ne)
            choice = jax.vmap(lambda k: jax.random.uniform(jax.random.split(k)[0]))(keys)
        us = []
        step_key = world_key
        for _ in range(TICKS):
            step_key, tick_key = jax.random.split(step_key)
            us.append(jax.vmap(jax.random.uniform)(jax.random.split(tick_key, n)))
        return jnp.stack(us), choice

    def step(key, state, actions):
        if self_play:
            decoded = base._decode_discrete_actions(actions)
            obs, new, rewards, dones, _ = base.step_env_no_decode(key, state, decoded)
            avail = base.get_avail_actions(new)
        else:
            acts = {agent: actions[i] for i, agent in enumerate(env.agents)}
            obs, new, rewards, dones, _ = env.step_env(key, state, acts)
            avail = env.get_avail_actions(new)
        return obs, new, rewards, dones, avail

    def reset(key):
        _obs, state = base.reset(key)
        return state.unit_positions, state.unit_types

    return (
        env,
        base,
        jax.jit(jax.vmap(step)),
        jax.jit(jax.vmap(draws)),
        jax.jit(jax.vmap(reset)),
        dt,
    )


def _random_states(name: str, rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    """Battles mid-fight: units clustered so that they see, shoot and push each other, some near
    the walls, some dead, cooldowns on both sides of 0, arbitrary last actions."""
    ally, enemy, random_types = SCENARIOS[name]
    a, m = len(ally), len(enemy)
    n = a + m
    types = np.tile(np.array(ally + enemy), (batch, 1))
    if random_types:
        types = rng.integers(0, 6, (batch, n))
    stats = np.asarray(UNIT_STATS, dtype=np.float32)
    spread = 2.0 + 0.6 * np.sqrt(n)
    pos = rng.uniform(16 - spread, 16 + spread, (batch, n, 2)).astype(np.float32)
    walls = rng.random((batch, n)) < 0.05
    pos[walls] = rng.uniform(0.0, 0.3, (int(walls.sum()), 2))
    health = (stats[types, 5] * rng.uniform(0.05, 1.0, (batch, n))).astype(np.float32)
    dead = rng.random((batch, n)) < 0.15
    health[dead] = 0.0
    cooldown = rng.uniform(-0.4, 1.2, (batch, n)).astype(np.float32)
    moves = np.array([[0, 1], [1, 0], [0, -1], [-1, 0], [0, 0]], dtype=np.float32)
    prev_move = moves[rng.integers(0, 5, (batch, n))]
    other = np.where(np.arange(n) < a, m, a)
    prev_attack = np.where(
        rng.random((batch, n)) < 0.5, 0, N_MOVES + rng.integers(0, 1 << 20, (batch, n)) % other
    )
    actions = rng.integers(0, 1 << 20, (batch, n)) % (N_MOVES + other)
    steps = rng.integers(0, 99, batch)
    target = rng.uniform(0, 32, (batch, m, 2)).astype(np.float32)
    target[rng.random((batch, m)) < 0.3] = 0.0
    last = rng.integers(-1, a, (batch, m))
    return {
        "pos": pos,
        "health": health,
        "alive": health > 0,
        "cooldown": cooldown,
        "types": types,
        "prev_move": prev_move,
        "prev_attack": prev_attack,
        "actions": actions,
        "steps": steps,
        "target": target,
        "last": last,
    }


def _jax_state(s: dict[str, np.ndarray], a: int, self_play: bool):
    batch, n = s["health"].shape
    teams = np.tile((np.arange(n) >= a).astype(np.float32), (batch, 1))
    state = smax_env_mod.State(
        done=jnp.zeros(batch, dtype=bool),
        step=jnp.asarray(s["steps"], dtype=jnp.int32),
        unit_positions=jnp.asarray(s["pos"]),
        unit_alive=jnp.asarray(s["alive"]),
        unit_teams=jnp.asarray(teams),
        unit_health=jnp.asarray(s["health"]),
        unit_types=jnp.asarray(s["types"], dtype=jnp.uint8),
        unit_weapon_cooldowns=jnp.asarray(s["cooldown"]),
        prev_movement_actions=jnp.asarray(s["prev_move"]),
        prev_attack_actions=jnp.asarray(s["prev_attack"], dtype=jnp.int32),
    )
    if self_play:
        return state
    policy = heuristic_mod.HeuristicPolicyState(
        default_target=jnp.asarray(s["target"]),
        last_attacked_enemy=jnp.asarray(s["last"], dtype=jnp.int32),
    )
    wrapper = smax_mod.heuristic_enemy_smax_env.State
    return wrapper(state=state, enemy_policy_state=policy)


def _marlkit_env(name: str, s: dict[str, np.ndarray], self_play: bool) -> ReplayedSmax:
    batch = s["health"].shape[0]
    env = ReplayedSmax(
        name,
        batch,
        enemy="self_play" if self_play else "heuristic",
        backend="torch",
        validate_actions=False,
        seed=0,
    )
    env.reset()
    env.world = SmaxWorld(
        pos=torch.from_numpy(s["pos"]).clone(),
        health=torch.from_numpy(s["health"]).clone(),
        cooldown=torch.from_numpy(s["cooldown"]).clone(),
        alive=torch.from_numpy(s["alive"]).clone(),
        types=torch.from_numpy(s["types"]).long(),
        prev_move=torch.from_numpy(s["prev_move"]).clone(),
        prev_attack=torch.from_numpy(s["prev_attack"]).long(),
    )
    env.policy = HeuristicState(
        target=torch.from_numpy(s["target"]).clone(), last=torch.from_numpy(s["last"]).long()
    )
    env._steps = torch.from_numpy(s["steps"]).long()
    return env


def _check_step(name: str, self_play: bool, seed: int = 0) -> None:
    _jenv, base, step, draws, _, _ = _jax_side(name, self_play)
    a, m = base.num_allies, base.num_enemies
    rng = np.random.default_rng(seed)
    s = _random_states(name, rng, BATCH)
    keys = jax.random.split(jax.random.PRNGKey(seed), BATCH)
    jitter_u, choice_u = draws(keys)
    state = _jax_state(s, a, self_play)
    actions = jnp.asarray(s["actions"], dtype=jnp.int32)
    obs, new, rewards, dones, avail = step(keys, state, actions)
    world = new if self_play else new.state

    env = _marlkit_env(name, s, self_play)
    env.draws = (torch.tensor(np.asarray(jitter_u)), torch.tensor(np.asarray(choice_u)))
    td = env.step(_inputs(env, s, a, self_play))["next"]

    w = env.world
    close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=2e-5)
    close(w.pos.numpy(), np.asarray(world.unit_positions), err_msg="positions")
    close(w.health.numpy(), np.asarray(world.unit_health), err_msg="health")
    close(w.cooldown.numpy(), np.asarray(world.unit_weapon_cooldowns), err_msg="cooldowns")
    np.testing.assert_array_equal(w.alive.numpy(), np.asarray(world.unit_alive), "alive")
    np.testing.assert_array_equal(
        w.prev_attack.numpy(), np.asarray(world.prev_attack_actions), "last attacks"
    )
    groups = {ALLY: [f"ally_{i}" for i in range(a)]}
    if self_play:
        groups[ENEMY] = [f"enemy_{i}" for i in range(m)]
    for g, agents in groups.items():
        ref_obs = np.stack([np.asarray(obs[agent]) for agent in agents], 1)
        close(td[g, "observation"].numpy(), ref_obs, err_msg=f"{g} observations")
        ref_avail = np.stack([np.asarray(avail[agent]) for agent in agents], 1).astype(bool)
        np.testing.assert_array_equal(td[g, "action_mask"].numpy(), ref_avail, f"{g} masks")
        ref_rew = np.stack([np.asarray(rewards[agent]) for agent in agents], 1)
        close(td[g, "reward"].numpy()[..., 0], ref_rew, err_msg=f"{g} rewards")
        ref_dead = np.stack([np.asarray(dones[agent]) for agent in agents], 1)
        np.testing.assert_array_equal(td[g, "mask"].numpy(), ~ref_dead, f"{g} alive")
    close(td["state"].numpy(), np.asarray(obs["world_state"]), err_msg="world state")
    # Steps are below the time limit: an episode is over exactly when a team is wiped out.
    np.testing.assert_array_equal(td["done"].numpy()[:, 0], np.asarray(dones["__all__"]), "done")
    ally_alive = np.asarray(world.unit_alive)[:, :a].any(1)
    won = ~np.asarray(world.unit_alive)[:, a:].any(1) & ally_alive
    np.testing.assert_array_equal(td[WON].numpy()[:, 0], won, "won")
    if not self_play:
        policy = new.enemy_policy_state
        np.testing.assert_array_equal(
            env.policy.last.numpy(), np.asarray(policy.last_attacked_enemy), "heuristic memory"
        )
        close(env.policy.target.numpy(), np.asarray(policy.default_target), err_msg="targets")


def _inputs(env: SmaxEnv, s: dict[str, np.ndarray], a: int, self_play: bool):
    td = env.action_spec.zero()
    actions = torch.from_numpy(s["actions"]).long()
    td[ALLY, "action"] = actions[:, :a]
    if self_play:
        td[ENEMY, "action"] = actions[:, a:]
    return td


@pytest.mark.parametrize("name", FAST)
@pytest.mark.parametrize("self_play", [False, True], ids=["heuristic", "self_play"])
def test_one_step_matches_jaxmarl(name: str, self_play: bool) -> None:
    _check_step(name, self_play)


@pytest.mark.parametrize("name", SLOW)
@pytest.mark.parametrize("self_play", [False, True], ids=["heuristic", "self_play"])
def test_one_step_matches_jaxmarl_every_scenario(name: str, self_play: bool) -> None:
    _check_step(name, self_play, seed=1)


def test_heuristic_runs_into_shootable_and_chasing_cases() -> None:
    """The random states exercise every branch of the heuristic: keep a target, pick the
    closest, chase a random visible ally, head for the mirrored start."""
    _, base, _step, draws, _, _ = _jax_side("5m_vs_6m", False)
    s = _random_states("5m_vs_6m", np.random.default_rng(0), BATCH)
    env = _marlkit_env("5m_vs_6m", s, False)
    keys = jax.random.split(jax.random.PRNGKey(0), BATCH)
    _, choice = draws(keys)
    from marlkit.native.smax import heuristic_actions

    u = torch.tensor(np.asarray(choice))
    acts = heuristic_actions(env.world, env.policy, u, env.rules, backend="torch")
    alive = env.world.alive[:, base.num_allies :]
    attacks, moves = (acts >= N_MOVES) & alive, (acts < 4) & alive
    assert int(attacks.sum()) > 10 and int(moves.sum()) > 10
    assert len(set(acts[moves].tolist())) == 4  # every direction was chosen somewhere


@pytest.mark.parametrize("name", ["3m", "3s_vs_5z", "smacv2_10_units"])
def test_spawns_match_jaxmarl_in_distribution(name: str) -> None:
    """Start positions (after pushing apart) and unit types: per unit mean and spread of 2,000
    resets agree with JaxMARL's within sampling error."""
    *_, reset, _ = _jax_side(name, True)
    count = 2000
    ref_pos, ref_types = reset(jax.random.split(jax.random.PRNGKey(3), count))
    env = SmaxEnv(name, count, enemy="self_play", seed=3, backend="torch")
    env.reset()
    pos, types = env.world.pos.numpy(), env.world.types.numpy()
    ref_pos, ref_types = np.asarray(ref_pos), np.asarray(ref_types)
    std = ref_pos.std(0)
    np.testing.assert_allclose(
        pos.mean(0), ref_pos.mean(0), atol=float(4 * std.max() / np.sqrt(count)) + 0.05
    )
    np.testing.assert_allclose(pos.std(0), std, rtol=0.1, atol=0.05)
    for t in range(6):
        freq, ref = (types == t).mean(0), (ref_types == t).mean(0)
        np.testing.assert_allclose(freq, ref, atol=0.05)


def test_jaxmarl_counts_its_time_limit_one_step_late() -> None:
    """Why ``max_steps`` is not compared: JaxMARL's episode of ``max_steps=100`` ends on its
    101st step (``is_terminal`` reads the step count before it is incremented); ours on the
    100th."""
    _, _base, step, *_ = _jax_side("3m", True)
    s = _random_states("3m", np.random.default_rng(5), BATCH)
    s["health"][:] = np.asarray(UNIT_STATS)[s["types"], 5]
    s["alive"][:] = True
    s["pos"][:, :3] = np.float32([4.0, 16.0])  # far apart: nobody dies
    s["pos"][:, 3:] = np.float32([28.0, 16.0])
    s["actions"][:] = 4
    keys = jax.random.split(jax.random.PRNGKey(0), BATCH)
    for steps, over in ((99, False), (100, True)):
        s["steps"][:] = steps
        state = _jax_state(s, 3, True)
        *_, dones, _ = step(keys, state, jnp.asarray(s["actions"], dtype=jnp.int32))
        assert (
            not np.asarray(dones["__all__"]).any()
            if not over
            else np.asarray(dones["__all__"]).all()
        )
    env = SmaxEnv("3m", 2, enemy="self_play", max_steps=100, seed=0, backend="torch")
    td = env.reset()
    for i in range(100):
        td["ally", "action"] = torch.full((2, 3), 4)
        td["enemy", "action"] = torch.full((2, 3), 4)
        td = env.step(td)
        assert bool(td["next", "truncated"].all()) == (i == 99)
        td = env._step_mdp(td)


@pytest.mark.parametrize("name", ["3m", "smacv2_5_units"])
def test_random_play_episodes_match_jaxmarl_in_distribution(name: str) -> None:
    """Whole episodes (spawns, heuristic choices, resets): random valid allies against the
    heuristic for 120 steps of 256 battles end as many episodes, as long, as often won, in
    both (measured: 3m 4,101 against 4,102 episodes of 17.6 and 17.7 steps at 512 x 150)."""
    envs, steps = 256, 120
    env = SmaxEnv(name, envs, seed=0, validate_actions=False)
    td = env.reset()
    g = torch.Generator().manual_seed(0)
    lengths, wins = [], 0
    for _ in range(steps):
        mask = td["ally", "action_mask"]
        td["ally", "action"] = torch.where(mask, torch.rand(mask.shape, generator=g), -1.0).argmax(
            -1
        )
        before = env.steps
        out, td = env.step_and_maybe_reset(td)
        done = out["next", "done"].squeeze(-1)
        lengths += (before[done] + 1).tolist()
        wins += int(out["next", "won"].squeeze(-1)[done].sum())

    jenv = smax_mod.HeuristicEnemySMAX(scenario=smax_mod.map_name_to_scenario(name))
    agents = jenv.agents

    def avail_of(state):
        masks = jax.vmap(jenv.get_avail_actions)(state)
        return jnp.stack([masks[a] for a in agents], 1) > 0

    def step(carry, _):
        key, state, avail = carry
        key, k_act, k_step = jax.random.split(key, 3)
        act = jax.random.categorical(k_act, jnp.where(avail, 0.0, -jnp.inf))
        acts = {a: act[:, i] for i, a in enumerate(agents)}
        _, new, rew, dones, _ = jax.vmap(jenv.step)(jax.random.split(k_step, envs), state, acts)
        return (key, new, avail_of(new)), (dones["__all__"], rew[agents[0]], state.state.step)

    key = jax.random.PRNGKey(0)
    _, state = jax.vmap(jenv.reset)(jax.random.split(key, envs))
    run = jax.jit(lambda carry: jax.lax.scan(step, carry, None, length=steps))
    _, (done, reward, count) = run((key, state, avail_of(state)))
    done, reward, count = (np.asarray(x) for x in (done, reward, count))
    ref_lengths = count[done] + 1
    assert len(lengths) == pytest.approx(len(ref_lengths), rel=0.05)
    # Mean lengths within 4 standard errors (about 0.7 steps for smacv2_5_units).
    ours = np.asarray(lengths, dtype=np.float64)
    error = np.sqrt(ours.var() / ours.size + ref_lengths.var() / ref_lengths.size)
    assert abs(ours.mean() - ref_lengths.mean()) < 4 * error
    ref_wins = int((reward[done] >= 1.0).sum())
    assert abs(wins - ref_wins) <= 3 + 0.2 * max(wins, ref_wins)
