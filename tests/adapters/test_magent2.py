"""The MAgent2 adapter against the real magent2 package, on small maps."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import marlkit
from marlkit.envs import InvalidActionError, accepted_kwargs, check_env_specs
from marlkit.testing import AdapterCheckError, check_adapter

magent2 = pytest.importorskip("magent2")

BATTLE = "magent2/battle_v4"

#: Each task at its smallest map: its groups, and each group's agents and observation shape.
TASKS = {
    "battle_v4": (12, {"red": (2, (13, 13, 5)), "blue": (2, (13, 13, 5))}),
    "adversarial_pursuit_v4": (9, {"predator": (1, (10, 10, 5)), "prey": (2, (9, 9, 5))}),
    "tiger_deer_v4": (10, {"deer": (5, (3, 3, 5)), "tiger": (1, (9, 9, 5))}),
    "gather_v5": (16, {"omnivore": (28, (15, 15, 5))}),
    "combined_arms_v6": (
        16,
        {g: (3, (13, 13, 9)) for g in ("redmelee", "redranged", "bluemelee", "blueranged")},
    ),
}


def battle(**kwargs):
    return marlkit.make(BATTLE, **{"map_size": 12, "num_envs": 2, "seed": 0, **kwargs})


# battle's actions: 13 moves (cells within distance 2), then 8 attacks (the neighbouring cells),
# each in row-major order of (dy, dx); an observation is [dy + 6, dx + 6, channel], where
# channel 3 shows enemies.
_NEAR = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0)]
_MOVES = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3) if abs(dy) + abs(dx) <= 2]
_OFFSET = torch.arange(13) - 6


def _fight(observation: torch.Tensor, forward: int) -> torch.Tensor:
    """``[..., 13, 13, 5]`` -> ``[...]``: attack an adjacent enemy, else step towards the
    nearest one in view, else step ``forward`` along x (towards the other team)."""
    enemy = observation[..., 3] > 0
    flat = enemy.reshape(-1, 13, 13)
    actions = torch.full(flat.shape[:1], _MOVES.index((0, forward)), dtype=torch.long)
    distance = torch.maximum(_OFFSET.abs()[:, None], _OFFSET.abs()[None, :])
    for i, seen in enumerate(flat):
        if seen.any():
            nearest = int(torch.where(seen, distance, 99).argmin())
            dy, dx = int(_OFFSET[nearest // 13]), int(_OFFSET[nearest % 13])
            if max(abs(dy), abs(dx)) == 1:
                actions[i] = 13 + _NEAR.index((dy, dx))
            else:
                actions[i] = _MOVES.index((int(np.sign(dy)), int(np.sign(dx))))
    return actions.reshape(enemy.shape[:-2])


def fight(td):
    for group, forward in (("red", 1), ("blue", -1)):  # red starts on the left
        td[group, "action"] = _fight(td[group, "observation"], forward)
    return td


# ---------------------------------------------------------------------- the registered tasks
@pytest.mark.parametrize("task", sorted(TASKS))
def test_tasks_group_by_team_and_their_specs_hold(task):
    map_size, groups = TASKS[task]
    env = marlkit.make(f"magent2/{task}", map_size=map_size, num_envs=2, seed=0)
    assert list(env.group_map) == list(groups)
    for group, (n, shape) in groups.items():
        spec = env.observation_spec[group, "observation"]
        assert spec.shape == (2, n, *shape) and spec.dtype == torch.float32
        assert env.group_map[group] == [f"{group}_{i}" for i in range(n)]
    assert env.state_spec["state"].shape[:3] == (2, map_size, map_size)
    check_env_specs(env)
    out = env.rollout(3, break_when_any_done=False)
    for group, (n, shape) in groups.items():
        assert out[group, "observation"].shape == (2, 3, n, *shape)  # images, as MAgent2 gives
    env.close()


def test_minimap_and_extra_features_stay_within_their_specs():
    env = battle(minimap_mode=True, extra_features=True, max_cycles=10)
    spec = env.observation_spec["red", "observation"]
    assert spec.shape == (2, 2, 13, 13, 41)  # 5 view channels, then the features, tiled
    check_env_specs(env)
    out = env.rollout(12, break_when_any_done=False)
    for key in (("red", "observation"), ("next", "red", "observation")):
        low, high = spec.low.unsqueeze(1), spec.high.unsqueeze(1)  # [B, 1, n, ...]
        assert ((out[key] >= low) & (out[key] <= high)).all()


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_conformance_kit_passes(task):
    env = marlkit.make(f"magent2/{task}", map_size=TASKS[task][0], num_envs=2, seed=0)
    check_adapter(env, steps=6)
    env.close()


def test_registry_lists_the_tasks_and_their_options():
    entry = marlkit.envs.registered_adapters()["magent2"]
    assert entry.available and entry.extra == "magent2"
    assert sorted(TASKS) == entry.list_scenarios()
    names = accepted_kwargs(BATTLE)
    assert names[:4] == ["map_size", "max_cycles", "minimap_mode", "extra_features"]
    assert "attack_opponent_reward" in names and "tiger_step_recover" not in names
    assert "tiger_step_recover" in accepted_kwargs("magent2/tiger_deer_v4")


def test_a_missing_magent2_is_named_with_its_extra(monkeypatch):
    from marlkit.adapters.magent2 import make_env
    from marlkit.envs import registry

    monkeypatch.setattr(registry, "has_module", lambda name: name != "magent2")
    with pytest.raises(registry.AdapterUnavailableError, match=r"pip install 'marlkit\[magent2\]'"):
        marlkit.make(BATTLE)
    monkeypatch.setitem(sys.modules, "magent2", None)  # import magent2 fails
    with pytest.raises(ImportError, match=r"pip install 'marlkit\[magent2\]'"):
        make_env("battle_v4")


def test_map_size_sets_the_number_of_agents():
    assert sum(map(len, battle(map_size=16).group_map.values())) == 12
    assert sum(map(len, battle(map_size=20).group_map.values())) == 24
    gather = marlkit.make("magent2/gather_v5", map_size=24)  # MAgent2 fixes 200 for gather
    assert gather.state_spec["state"].shape == (1, 24, 24, 5)
    assert len(gather.group_map["omnivore"]) == 57


def test_bad_options_are_refused_with_what_is_accepted():
    with pytest.raises(ValueError, match="map_size must be an int >= 12, got 8"):
        battle(map_size=8)
    with pytest.raises(ValueError, match=">= 9"):  # below 9 it has no predator
        marlkit.make("magent2/adversarial_pursuit_v4", map_size=8)
    with pytest.raises(TypeError, match=r"'attack_oponent_reward' \(did you mean 'attack_oppo"):
        battle(attack_oponent_reward=1.0)
    with pytest.raises(KeyError, match="Did you mean: battle_v4"):
        marlkit.make("magent2/batle_v4")


# ---------------------------------------------------------------------- data
def test_data_match_magent2_under_the_same_actions():
    """Instance 0 seeded ``s`` is MAgent2 reset with ``s + 1``: the same observations,
    rewards, state and deaths under the same actions."""
    from magent2.environments import battle_v4

    env = battle(num_envs=1, max_cycles=30)
    raw = battle_v4.parallel_env(map_size=12, max_cycles=30)
    td = env.reset()
    raw_obs, _ = raw.reset(seed=1)
    for _ in range(15):
        fight(td)
        actions = {
            agent: int(td[group, "action"][0, i])
            for group, agents in env.group_map.items()
            for i, agent in enumerate(agents)
            if td[group, "mask"][0, i]
        }
        raw_obs, rewards, terms, _, _ = raw.step(actions)
        td = env.step(td)["next"]
        for group, agents in env.group_map.items():
            for i, agent in enumerate(agents):
                if agent in raw_obs:
                    assert np.array_equal(td[group, "observation"][0, i].numpy(), raw_obs[agent])
                    assert td[group, "reward"][0, i, 0].item() == pytest.approx(rewards[agent])
                    assert td[group, "terminated"][0, i, 0].item() == terms[agent]
                assert td[group, "mask"][0, i].item() == (agent in raw.agents)
        if all(len(raw.env.get_pos(team)) for team in raw.env.get_handles()):
            assert np.array_equal(td["state"][0].numpy(), raw.state())  # see the next test
        if td["done"].item():
            break
    assert not raw.agents and td["terminated"].item()  # a team was wiped out


def test_agents_that_die_in_battle_leave_the_game():
    env = battle(max_cycles=60)
    out = env.rollout(60, fight, break_when_any_done=False)
    mask, nxt = out["red", "mask"], out["next", "red"]
    for group in ("red", "blue"):
        mask, nxt = out[group, "mask"], out["next", group]
        died = mask & ~nxt["mask"]
        assert died.any() and nxt["terminated"][..., 0][died].all()
        gone = ~mask  # not in the game when the step was taken
        assert (nxt["reward"][..., 0][gone] == 0).all() and nxt["done"][..., 0][gone].all()
        assert (nxt["observation"][gone] == 0).all() and not nxt["mask"][gone].any()
    early = (~out["red", "mask"]).any(-1) & ~out["next", "done"][..., 0]
    assert early.any(), "no red agent died before its episode ended"
    assert not any(torch.isnan(v).any() for v in out.values(True, True) if v.is_floating_point())


def test_the_state_holds_when_a_team_is_wiped_out():
    """MAgent2 ends a battle when a team has no agent left; its own state() then fails on the
    empty team (``zip(*[])``), the adapter's gives the map."""
    env = battle(num_envs=1, max_cycles=60)
    out = env.rollout(60, fight)  # stops at the first done
    assert out["next", "terminated"][0, -1].item()
    wiped = [g for g in ("red", "blue") if not out["next", g, "mask"][0, -1].any()]
    assert wiped and out["next", "state"][0, -1].sum() > 0  # the survivors and the walls
    sim = env.simulators[0]
    with pytest.raises(ValueError, match="not enough values to unpack"):
        type(sim).state(sim)


def test_bad_actions_are_refused_naming_the_key():
    env = battle()
    td = env.reset()
    before = env.simulators[0].state().copy()
    td["red", "action"] = torch.zeros(2, 2, dtype=torch.long)
    with pytest.raises(InvalidActionError, match=r"\('blue', 'action'\) is missing"):
        env.step(td)
    td["blue", "action"] = torch.full((2, 2), 21)  # 21 moves and attacks: classes 0..20
    with pytest.raises(InvalidActionError, match=r"\('blue', 'action'\).*class 21"):
        env.step(td)
    assert np.array_equal(env.simulators[0].state(), before)


# ---------------------------------------------------------------------- seeding
def test_seeding_repeats_rollouts_and_instances_differ():
    env = marlkit.make("magent2/adversarial_pursuit_v4", map_size=12, num_envs=2, seed=3)
    first = env.rollout(10, break_when_any_done=False)
    env.set_seed(3)
    second = env.rollout(10, break_when_any_done=False)
    assert (first == second).all()
    prey = first["prey", "observation"]
    assert not torch.equal(prey[0], prey[1])  # random maps: each instance its own


def test_magent2_takes_seeds_0_and_1_as_one_seed_and_the_kit_says_so():
    """Upstream: MAgent2's generator (std::minstd_rand0) makes seed 0 into 1, so the plain
    PettingZoo path (instance i reset with seed + i) gives instances 0 and 1 one game; the
    MAgent2 adapter resets instance i with seed + i + 1."""
    from magent2.environments import adversarial_pursuit_v4

    def positions(seed):
        raw = adversarial_pursuit_v4.parallel_env(map_size=12)
        raw.reset(seed=seed)
        return [raw.env.get_pos(h).tolist() for h in raw.env.get_handles()]

    assert positions(0) == positions(1) != positions(2)
    with pytest.raises(ValueError, match=r"seeds below 2\*\*31 - 2 here"):
        battle(seed=2**31 - 2)  # seed + i + 1 would wrap round in MAgent2's C int
    plain = marlkit.make(
        "pettingzoo/magent2.environments.adversarial_pursuit_v4",
        map_size=12,
        num_envs=2,
        seed=0,
        group_map="by_type",
    )
    with pytest.raises(AdapterCheckError, match=r"instances \[0\] and \[1\] of the batch replay"):
        check_adapter(plain, steps=4, check_partial_reset=False)
    check_adapter(marlkit.make("magent2/adversarial_pursuit_v4", map_size=12, num_envs=2), steps=4)


# ---------------------------------------------------------------------- batching, collecting
def test_batched_rollout_with_state_or_without():
    env = battle(num_envs=3, max_cycles=5)
    out = env.rollout(7, break_when_any_done=False)  # episodes of 5 steps, then a reset
    assert out["red", "observation"].shape == (3, 7, 2, 13, 13, 5)
    assert out["state"].shape == (3, 7, 12, 12, 5)
    assert out["next", "truncated"][:, 4].all() and not out["next", "done"][:, 5].any()
    lean = battle(state=False)
    assert "state" not in lean.state_spec and "state" not in lean.reset()


def test_inside_parallel_env_and_a_collector():
    from marlkit.collectors import Collector
    from marlkit.envs import ParallelEnv

    kwargs = {"name": BATTLE, "map_size": 12, "num_envs": 2, "max_cycles": 4}
    env = ParallelEnv(2, marlkit.make, kwargs, start_method="forkserver")
    try:
        assert env.batch_size == (2, 2)
        out = env.rollout(6, break_when_any_done=False)
        assert out["blue", "observation"].shape == (2, 2, 6, 2, 13, 13, 5)
        assert out["next", "done"].sum() == 2 * 2
    finally:
        env.close()
    collector = Collector(battle(max_cycles=4), None, frames_per_batch=2 * 6, total_frames=24)
    batches = list(collector)
    collector.shutdown()
    assert [b.batch_size for b in batches] == [torch.Size([2, 6])] * 2
    assert batches[1]["next", "red", "reward"].shape == (2, 6, 2, 1)


def test_rendering_headless():
    env = battle(render_mode="rgb_array")
    assert env.render_modes == ("rgb_array",)
    env.reset()
    frame = env.render(1)
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[-1] == 3
    assert frame.std() > 0
    check_adapter(env, steps=3)
    with pytest.raises(ValueError, match="render_mode must be None or 'rgb_array'"):
        battle(render_mode="human")
