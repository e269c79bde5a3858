"""``smax/*``: the env contract, the rules on hand-made battles, bad input, and the C++ kernels
against their torch twin (JaxMARL parity: test_smax_parity.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import marlkit
from marlkit.envs import check_env_specs
from marlkit.native import extension_available
from marlkit.native.smax import (
    N_MOVES,
    UNIT_STATS,
    HeuristicState,
    SmaxRules,
    SmaxWorld,
    heuristic_actions,
    observe,
    world_ticks,
)
from marlkit.scenarios.smax import SCENARIOS, SmaxEnv, scenario_names

native = pytest.mark.skipif(not extension_available(), reason="marlkit._C is not built")
BACKENDS = ["torch", pytest.param("native", marks=native)]


@pytest.mark.parametrize("name", scenario_names())
def test_every_scenario_resets_and_steps(name: str) -> None:
    kwargs = {"allies": {"stalker": 2, "zealot": 1}, "enemies": 4} if name == "custom" else {}
    env = marlkit.make(f"smax/{name}", num_envs=3, seed=0, **kwargs)
    td = env.reset()
    a, m = env.rules.n_allies, env.rules.n_enemies
    if name in SCENARIOS:
        assert (a, m) == (len(SCENARIOS[name][0]), len(SCENARIOS[name][1]))
    assert td["ally", "observation"].shape == (3, a, 13 * (a + m - 1) + 10)
    assert td["ally", "entities"].shape == (3, a, a + m - 1, 13)
    assert td["ally", "action_mask"].shape == (3, a, 5 + m)
    assert td["state"].shape == (3, 12 * (a + m))
    # Start positions inside the map (SMACv2's surround may start a unit past an edge: not here
    # with seed 0, which the wall rule would kill on the first tick).
    td = env.rand_action(td)
    out = env.step(td)
    assert out["next", "ally", "reward"].shape == (3, a, 1)


@pytest.mark.parametrize("enemy", ["heuristic", "self_play"])
def test_specs_hold_over_a_rollout(enemy: str) -> None:
    env = SmaxEnv("2s3z", 4, enemy=enemy, seed=1)
    check_env_specs(env)
    assert env.groups == (["ally"] if enemy == "heuristic" else ["ally", "enemy"])


@pytest.mark.parametrize("enemy", ["heuristic", "self_play"])
def test_the_conformance_kit_passes(enemy: str) -> None:
    from marlkit.testing import check_adapter

    check_adapter(SmaxEnv("2s3z", 3, enemy=enemy, seed=0))


def test_entities_are_the_observation_unflattened() -> None:
    env = SmaxEnv("3s5z", 2, seed=0)
    td = env.reset()
    k = env.rules.n_units - 1
    obs, ent = td["ally", "observation"], td["ally", "entities"]
    torch.testing.assert_close(ent.reshape(2, 8, -1), obs[..., : k * 13])
    assert torch.equal(td["ally", "entity_mask"], ent[..., 0] > 0)  # health > 0 iff seen
    torch.testing.assert_close(td["ally", "own"], obs[..., k * 13 :])
    assert td["ally", "own"].shape == (2, 8, 10)


def _battle(env: SmaxEnv, pos: list[tuple[float, float]], health: list[float]) -> None:
    """Place every unit of env 0 and set its health (dead at 0)."""
    w = env.world
    w.pos[0] = torch.tensor(pos)
    w.health[0] = torch.tensor(health)
    w.alive[0] = w.health[0] > 0
    w.cooldown[0] = 0.0


def test_focused_fire_kills_and_wins() -> None:
    """Three marines shooting the last enemy marine (15 hp) kill it in one tick: the step pays
    its health fraction over the team plus the win bonus, sets won, terminates everyone."""
    env = SmaxEnv("3m", 1, enemy="self_play", seed=0, backend="torch")
    td = env.reset()
    _battle(env, [(10, 16), (10, 17), (10, 15), (13, 16), (30, 2), (30, 30)], [45] * 3 + [15, 0, 0])
    td = env._output(None)
    assert td["ally", "action_mask"][0, :, N_MOVES:].tolist() == [[True, False, False]] * 3
    td["ally", "action"] = torch.full((1, 3), N_MOVES)  # attack enemy 0 (unit 3)
    td["enemy", "action"] = torch.full((1, 3), 4)
    nxt = env.step(td)["next"]
    assert nxt["won"].item() and nxt["done"].item() and nxt["terminated"].item()
    torch.testing.assert_close(nxt["ally", "reward"][0, :, 0], torch.full((3,), 15 / 45 / 3 + 1))
    assert nxt["enemy", "reward"].abs().sum() == 0
    assert nxt["ally", "mask"].all() and not nxt["enemy", "mask"].any()


def test_dead_allies_stay_masked_and_may_only_stop() -> None:
    env = SmaxEnv("3m", 1, seed=0)
    env.reset()
    _battle(env, [(8, 16), (8, 17), (8, 15), (24, 16), (24, 17), (24, 15)], [45, 0, 45] + [45] * 3)
    td = env._output(None)
    assert td["ally", "mask"].tolist() == [[True, False, True]]
    assert td["ally", "action_mask"][0, 1].tolist() == [False] * 4 + [True] + [False] * 3
    assert td["ally", "observation"][0, 1].abs().sum() == 0
    td["ally", "action"] = torch.tensor([[0, 0, 0]])
    with pytest.raises(ValueError, match=r"masked out by \('ally', 'action_mask'\)"):
        env.step(td)


def test_walls_kill_and_units_push_apart() -> None:
    env = SmaxEnv("3m", 1, enemy="self_play", seed=0, backend="torch")
    env.reset()
    _battle(env, [(0.05, 16), (8, 16), (8.1, 16), (24, 16), (24, 17), (24, 15)], [45.0] * 6)
    td = env._output(None)
    td["ally", "action"] = torch.tensor([[3, 4, 4]])  # unit 0 walks into the left wall
    td["enemy", "action"] = torch.full((1, 3), 4)
    nxt = env.step(td)["next"]
    assert nxt["ally", "mask"].tolist() == [[False, True, True]]
    gap = (env.world.pos[0, 2] - env.world.pos[0, 1]).norm().item()
    assert gap == pytest.approx(0.75, abs=0.02)  # two marine radii


def test_seeded_runs_repeat() -> None:
    def run() -> torch.Tensor:
        env = SmaxEnv("smacv2_5_units", 8, seed=7)
        td = env.reset()
        for _ in range(10):
            td = env.rand_action(td)
            _, td = env.step_and_maybe_reset(td)
        return td["state"]

    torch.testing.assert_close(run(), run(), rtol=0, atol=0)


def test_truncated_after_max_steps() -> None:
    env = SmaxEnv("3m", 2, seed=0, max_steps=3)
    td = env.reset()
    for i in range(3):
        td["ally", "action"] = torch.full((2, 3), 4)
        td = env.step(td)
        assert bool(td["next", "truncated"].all()) == (i == 2)
        td = env._step_mdp(td)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scenario": "5m_vs_6n"}, r"unknown SMAX scenario '5m_vs_6n'. Did you mean: 5m_vs_6m"),
        ({"scenario": "custom"}, r"smax/custom needs allies= and enemies="),
        ({"scenario": "custom", "allies": {"marin": 2}, "enemies": 2}, r"Did you mean: marine"),
        ({"scenario": "custom", "allies": {}, "enemies": 2}, r"allies must hold at least one"),
        ({"scenario": "3m", "allies": 3}, r"allies= and enemies= are for smax/custom"),
        ({"scenario": "3m", "enemy": "scripted"}, r"enemy"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SmaxEnv(num_envs=1, **kwargs)


def test_bad_actions_are_named() -> None:
    env = SmaxEnv("5m_vs_6m", 2, seed=0)
    td = env.reset()
    td["ally", "action"] = torch.full((2, 5), 11)
    with pytest.raises(ValueError, match=r"\('ally', 'action'\)"):
        env.step(td)
    td["ally", "action"] = torch.zeros(2, 5)  # float, not int64
    with pytest.raises(ValueError, match=r"\('ally', 'action'\).*dtype"):
        env.step(td)


def test_custom_hundreds_a_side() -> None:
    env = marlkit.make("smax/custom", num_envs=2, allies=256, enemies=256, seed=0)
    td = env.reset()
    assert td["ally", "observation"].shape == (2, 256, 13 * 511 + 10)
    td = env.rand_action(td)
    env.step(td)


# ---------------------------------------------------------------------- C++ against the twin
def _random_world(rules: SmaxRules, batch: int, seed: int) -> tuple[SmaxWorld, HeuristicState]:
    g = np.random.default_rng(seed)
    n, a, m = rules.n_units, rules.n_allies, rules.n_enemies
    stats = np.asarray(UNIT_STATS, dtype=np.float32)
    types = g.integers(0, 6, (batch, n))
    spread = 2.0 + 0.6 * np.sqrt(n)
    pos = g.uniform(16 - spread, 16 + spread, (batch, n, 2)).astype(np.float32)
    edge = g.random((batch, n)) < 0.05
    pos[edge] = g.uniform(0.0, 0.3, (int(edge.sum()), 2))
    health = (stats[types, 5] * g.uniform(0.05, 1.0, (batch, n))).astype(np.float32)
    health[g.random((batch, n)) < 0.15] = 0.0
    world = SmaxWorld(
        pos=torch.from_numpy(pos),
        health=torch.from_numpy(health),
        cooldown=torch.from_numpy(g.uniform(-0.4, 1.2, (batch, n)).astype(np.float32)),
        alive=torch.from_numpy(health > 0),
        types=torch.from_numpy(types),
        prev_move=torch.zeros(batch, n, 2),
        prev_attack=torch.zeros(batch, n, dtype=torch.int64),
    )
    target = torch.from_numpy(g.uniform(0, 32, (batch, m, 2)).astype(np.float32))
    target[torch.from_numpy(g.random((batch, m)) < 0.3)] = 0.0
    policy = HeuristicState(target=target, last=torch.from_numpy(g.integers(-1, a, (batch, m))))
    return world, policy


def _clone(world: SmaxWorld) -> SmaxWorld:
    return SmaxWorld(*(t.clone() for t in world.tensors()))


@native
@pytest.mark.parametrize(("a", "m"), [(3, 3), (5, 6), (27, 30), (8, 1)])
def test_native_matches_the_torch_twin(a: int, m: int) -> None:
    """Six steps of heuristic and random actions from random battles: the C++ kernels and the
    torch twin agree on every state array, observation, mask, state and heuristic choice."""
    rules = SmaxRules(n_allies=a, n_enemies=m)
    batch = 256 // (a + m)
    worlds = {b: _random_world(rules, batch, seed=a * 100 + m) for b in ("native", "torch")}
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        u = torch.rand(batch, m, generator=g)
        jitter = torch.rand(batch, rules.ticks, a + m, generator=g) * 0.1875 - 0.0625
        ally = (torch.rand(batch, a, generator=g) * (N_MOVES + m)).long()
        results = {}
        for b, (world, policy) in worlds.items():
            enemy = heuristic_actions(world, policy, u, rules, backend=b)  # type: ignore[arg-type]
            world_ticks(world, torch.cat([ally, enemy], 1), jitter, rules, backend=b)  # type: ignore[arg-type]
            results[b] = (enemy, *observe(world, rules, a + m, backend=b))  # type: ignore[arg-type]
        (wn, pn), (wt, pt) = worlds["native"], worlds["torch"]
        for x, y in zip((*wn.tensors(), pn.target, pn.last), (*wt.tensors(), pt.target, pt.last)):
            # Pushes sum 3 or more overlaps in another order: positions differ by float32 ulps.
            torch.testing.assert_close(x, y, rtol=2e-5, atol=1e-5)
        (en, on, vn, mn, sn), (et, ot, vt, mt, st) = results["native"], results["torch"]
        assert torch.equal(en, et)
        torch.testing.assert_close(on, ot, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(sn, st, rtol=1e-6, atol=1e-5)
        assert torch.equal(vn, vt) and all(torch.equal(x, y) for x, y in zip(mn, mt))


@native
def test_native_kernels_name_bad_input() -> None:
    rules = SmaxRules(n_allies=3, n_enemies=3)
    world, _ = _random_world(rules, 2, 0)
    jitter = torch.zeros(2, 8, 6)
    with pytest.raises(ValueError, match=r"actions\[0, 0\] must be in \[0, 7\], got 9"):
        world_ticks(world, torch.full((2, 6), 9), jitter, rules, backend="native")
    world.types[0, 0] = 6
    with pytest.raises(ValueError, match=r"types must be unit type ids in \[0, 5\], got 6"):
        world_ticks(world, torch.zeros(2, 6, dtype=torch.int64), jitter, rules, backend="native")


def test_partial_resets_observe_like_a_full_observe() -> None:
    """A reset of some envs re-observes only those (from 24 units); the result equals
    observing them all."""
    env = SmaxEnv("smacv2_20_units", 16, seed=3)
    td = env.reset()
    resets = 0
    for _ in range(120):
        td = env.rand_action(td)
        step, td = env.step_and_maybe_reset(td)
        resets += int(step["next", "done"].sum())
        obs, visible, masks, state = observe(env.world, env.rules, 20)
        torch.testing.assert_close(td["ally", "observation"], obs, rtol=0, atol=0)
        assert torch.equal(td["ally", "action_mask"], masks[0])
        assert torch.equal(td["ally", "entity_mask"], visible)
        torch.testing.assert_close(td["state"], state, rtol=0, atol=0)
    assert 0 < resets < 16 * 120


def test_render_shows_teams_types_and_shots() -> None:
    from marlkit.scenarios.smax import ATTACK_COLOR, TEAM_COLORS, TYPE_COLORS

    env = SmaxEnv("3s_vs_5z", 1, enemy="self_play", seed=0, render_size=128)
    td = env.reset()
    _battle(
        env,
        [(14, 16), (14, 17), (14, 15), (18, 16), (18, 17), (18, 15), (30, 30), (2, 2)],
        [160.0] * 3 + [150.0] * 3 + [0.0, 0.0],
    )
    td = env._output(None)
    td["ally", "action"] = torch.full((1, 3), N_MOVES)  # stalkers shoot the 1st zealot they see
    td["enemy", "action"] = torch.full((1, 5), 4)
    env.step(td)
    frame = env.render(0)
    assert frame.shape == (128, 128, 3) and frame.dtype == np.uint8
    colors = {tuple(c) for c in frame.reshape(-1, 3).tolist()}
    for color in (ATTACK_COLOR, TEAM_COLORS[0], TYPE_COLORS[2], TYPE_COLORS[3]):
        assert tuple(color) in colors, color


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torch_twin_on_cuda_matches_cpu() -> None:
    """The twin on a GPU: the same step as on the CPU from the same battles and draws, and the
    env runs there end to end."""
    rules = SmaxRules(n_allies=5, n_enemies=6)
    cpu_world, cpu_policy = _random_world(rules, 32, seed=4)
    gpu_world = SmaxWorld(*(t.cuda() for t in cpu_world.tensors()))
    gpu_policy = HeuristicState(cpu_policy.target.cuda(), cpu_policy.last.cuda())
    g = torch.Generator().manual_seed(0)
    u = torch.rand(32, 6, generator=g)
    jitter = torch.rand(32, 8, 11, generator=g) * 0.1875 - 0.0625
    ally = (torch.rand(32, 5, generator=g) * 11).long()
    out = {}
    for name, world, policy, dev in (
        ("cpu", cpu_world, cpu_policy, "cpu"),
        ("cuda", gpu_world, gpu_policy, "cuda"),
    ):
        enemy = heuristic_actions(world, policy, u.to(dev), rules, backend="torch")
        world_ticks(
            world, torch.cat([ally.to(dev), enemy], 1), jitter.to(dev), rules, backend="torch"
        )
        obs, _visible, _masks, state = observe(world, rules, 11, backend="torch")
        out[name] = (enemy, obs, state, world.pos, world.health)
    for x, y in zip(out["cpu"], out["cuda"]):
        torch.testing.assert_close(x, y.cpu(), rtol=1e-5, atol=1e-5)
    env = SmaxEnv("3s5z", 16, device="cuda", seed=0)
    check_env_specs(env)


@native
def test_native_results_do_not_depend_on_the_threads() -> None:
    """Split over 1, 2 or 3 threads (small calls forced onto every thread), the kernels give
    the same bits."""
    from marlkit.native import get_min_work_per_thread, set_min_work_per_thread, set_num_threads

    rules = SmaxRules(n_allies=5, n_enemies=6)
    g = torch.Generator().manual_seed(1)
    u = torch.rand(40, 6, generator=g)
    jitter = torch.rand(40, 8, 11, generator=g) * 0.1875 - 0.0625
    ally = (torch.rand(40, 5, generator=g) * 11).long()
    default = get_min_work_per_thread()
    results = []
    try:
        set_min_work_per_thread(1)
        for threads in (1, 2, 3):
            set_num_threads(threads)
            world, policy = _random_world(rules, 40, seed=9)
            enemy = heuristic_actions(world, policy, u, rules, backend="native")
            world_ticks(world, torch.cat([ally, enemy], 1), jitter, rules, backend="native")
            obs, visible, masks, state = observe(world, rules, 11, backend="native")
            results.append((enemy, *world.tensors(), obs, visible, *masks, state))
    finally:
        set_num_threads(0)
        set_min_work_per_thread(default)
    for other in results[1:]:
        assert all(torch.equal(x, y) for x, y in zip(results[0], other))
