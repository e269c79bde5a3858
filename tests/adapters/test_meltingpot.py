"""The MeltingPot adapter against the real dm-meltingpot package (substrates on dmlab2d)."""

from __future__ import annotations

from importlib.metadata import version

import numpy as np
import pytest
import torch

import marlkit
from marlkit._utils import has_module
from marlkit.envs import InvalidActionError, UnknownEnvError, accepted_kwargs, check_env_specs
from marlkit.testing import check_adapter
from marlkit.testing.conformance import _class_name

pytestmark = pytest.mark.skipif(
    not (has_module("meltingpot") and has_module("dmlab2d")),
    reason="dm-meltingpot is not installed (make install installs it; see docs/adapters.md)",
)

#: Two players, a 40x40 view, every kind of vector MeltingPot gives; builds in about 0.2 s.
PD = "meltingpot/prisoners_dilemma_in_the_matrix__repeated"
PD_VECTORS = {"READY_TO_SHOOT": (), "INVENTORY": (2,), "INTERACTION_INVENTORIES": (2, 2)}


def pd(**kwargs):
    return marlkit.make(PD, **{"num_envs": 2, "seed": 0, **kwargs})


def _meltingpot_substrate():
    from marlkit.adapters.meltingpot import _meltingpot

    return _meltingpot("substrate")


def test_registered_with_every_substrate():
    from marlkit.adapters import meltingpot

    substrates = _meltingpot_substrate().SUBSTRATES
    assert meltingpot.list_scenarios() == sorted(substrates)
    assert len(substrates) == 49  # dm-meltingpot 2.4.1
    assert "max_episode_steps" in accepted_kwargs(PD)


def test_specs_and_keys_follow_meltingpot():
    env = pd()
    try:
        raw = env.simulators[0]._env  # the substrate the adapter built
        spec = raw.observation_spec()[0]
        observation = env.observation_spec["agents", "observation"]
        assert set(observation.keys()) == set(spec) - {"WORLD.RGB"}
        assert set(observation.keys()) == {"RGB", "COLLECTIVE_REWARD", *PD_VECTORS}
        assert observation["RGB"].shape == (2, 2, 40, 40, 3)
        assert observation["RGB"].dtype == torch.uint8
        for key, shape in PD_VECTORS.items():
            assert observation[key].shape == (2, 2, *shape)
            assert observation[key].dtype == torch.float32
        assert env.state_spec["state"].shape == (2, *spec["WORLD.RGB"].shape)
        assert env.state_spec["state"].dtype == torch.uint8
        assert env.action_spec["agents", "action"].n == raw.action_spec()[0].num_values == 8
        assert env.render_modes == ("rgb_array",)
        check_env_specs(env)
    finally:
        env.close()


def test_substrate_built_as_meltingpot_builds_it():
    # The adapter builds the wrapper chain itself (to pass env_seed): the same specs as
    # meltingpot.substrate.build.
    substrate = _meltingpot_substrate()
    name = PD.split("/")[1]
    upstream = substrate.build(name, roles=substrate.get_config(name).default_player_roles)
    env = pd(num_envs=1)
    try:
        ours = env.simulators[0]._env
        assert ours.observation_spec() == upstream.observation_spec()
        assert ours.action_spec() == upstream.action_spec()
        assert ours.reward_spec() == upstream.reward_spec()
    finally:
        upstream.close()
        env.close()


def test_values_are_meltingpots_timestep():
    env = pd()
    try:
        td = env.reset()
        for _ in range(3):
            action = torch.randint(0, 8, (2, 2))
            td["agents", "action"] = action
            td = env.step(td)["next"]
            for i, sim in enumerate(env.simulators):
                timestep = sim.timestep
                for p in range(2):
                    obs = timestep.observation[p]
                    for key in ("RGB", "COLLECTIVE_REWARD", *PD_VECTORS):
                        ours = td["agents", "observation", key][i, p].numpy()
                        np.testing.assert_array_equal(ours, np.asarray(obs[key], ours.dtype))
                    assert td["agents", "reward"][i, p, 0] == float(timestep.reward[p])
                np.testing.assert_array_equal(td["state"][i].numpy(), obs["WORLD.RGB"])
                np.testing.assert_array_equal(env.render(i), obs["WORLD.RGB"])
    finally:
        env.close()


def test_check_adapter_meltingpot_does_not_replay_a_seed():
    env = pd()
    try:
        # MeltingPot does not replay a seed (below): seeded rollouts are not compared.
        check_adapter(env, steps=3, check_seeding=False)
        # Where the kit finds the seed not replayed (now and then: some builds agree), it names
        # the culprit: MeltingPot's own substrate, under the adapter's shim.
        assert _class_name(env.simulators[0]) == (
            "_Substrate, marlkit's shim around meltingpot.utils.substrates.substrate.Substrate "
            f"of dm-meltingpot {version('dm-meltingpot')}"
        )
    finally:
        env.close()


def test_same_env_seed_differs_upstream():
    # Upstream: three builds of the substrate with the same env_seed start from states that are
    # not all the same (dm-meltingpot 2.4.1). When they are, MeltingPot replays seeds: turn
    # check_seeding on above.
    from marlkit.adapters.meltingpot import _meltingpot

    builder = _meltingpot("utils.substrates.builder")
    config = _meltingpot_substrate().get_config("commons_harvest__open")
    settings = config.lab2d_settings_builder(roles=config.default_player_roles, config=config)
    worlds = []
    for _ in range(3):
        raw = builder.builder(settings, env_seed=5)
        worlds.append(raw.reset().observation["WORLD.RGB"].copy())
        raw.close()
    assert not all(np.array_equal(worlds[0], world) for world in worlds[1:])


def test_step_limit_truncates():
    env = pd(max_episode_steps=4)
    try:
        out = env.rollout(4, break_when_any_done=False)
        done = out["next", "done"][:, :, 0]
        assert done[:, :3].sum() == 0 and bool(done[:, 3].all())
        assert bool(out["next", "truncated"][:, 3].all())
        assert not bool(out["next", "terminated"][:, 3].any())
        assert bool(out["next", "agents", "truncated"][:, 3].all())
        env.reset()  # a new episode after the limit
    finally:
        env.close()


def test_groups_by_role():
    name = "meltingpot/bach_or_stravinsky_in_the_matrix__repeated"
    env = marlkit.make(name, group_map="by_role", state=False)
    try:
        assert env.group_map == {"bach_fan": ["player_0"], "stravinsky_fan": ["player_1"]}
        assert env.roles == ("bach_fan", "stravinsky_fan")
        assert "state" not in env.state_spec
        out = env.rollout(2)
        assert out["next", "stravinsky_fan", "reward"].shape == (1, 2, 1, 1)
    finally:
        env.close()
    env = marlkit.make(name, roles=["bach_fan"] * 3)  # three players, one role: one group
    try:
        assert env.group_map == {"agents": ["player_0", "player_1", "player_2"]}
    finally:
        env.close()


def test_bad_input_is_refused_with_the_key_named():
    env = pd()
    try:
        td = env.reset()
        for bad in (8, -1):  # 8 actions: 0..7
            td["agents", "action"] = torch.full((2, 2), bad)
            with pytest.raises(InvalidActionError, match=rf"'action'\): class {bad} at"):
                env.step(td)
        td["agents", "action"] = torch.zeros(2, 2, dtype=torch.float32)
        with pytest.raises(InvalidActionError, match="dtype float32 != spec dtype int64"):
            env.step(td)
        td["agents", "action"] = torch.zeros(2, 2, dtype=torch.int64)
        env.step(td)  # the refusals left the envs able to step
    finally:
        env.close()
    with pytest.raises(UnknownEnvError, match="Did you mean: prisoners_dilemma_in_the_matrix"):
        marlkit.make("meltingpot/prisoners_dilema_in_the_matrix__repeated")
    with pytest.raises(UnknownEnvError, match=r"scenario.*TensorFlow"):
        marlkit.make("meltingpot/commons_harvest__open_0")
    with pytest.raises(ValueError, match=r"roles \['pirate'\]"):
        marlkit.make(PD, roles=["default", "pirate"])
    with pytest.raises(TypeError, match="roles must be a sequence"):
        marlkit.make(PD, roles="default")
    with pytest.raises(TypeError, match="max_episode_step"):
        marlkit.make(PD, max_episode_step=4)
    with pytest.raises(ValueError, match="max_episode_steps"):
        marlkit.make(PD, max_episode_steps=0)
    with pytest.raises(ValueError, match="seed"):
        marlkit.make(PD, seed=-1)
    with pytest.raises(TypeError, match="seed"):
        marlkit.make(PD, seed="0")


@pytest.mark.slow
def test_inside_parallel_env_and_a_collector():
    from marlkit.collectors import Collector
    from marlkit.envs import ParallelEnv

    kwargs = {"name": PD, "num_envs": 2, "max_episode_steps": 3}
    env = ParallelEnv(2, marlkit.make, kwargs, start_method="forkserver")
    try:
        assert env.batch_size == (2, 2)
        out = env.rollout(5, break_when_any_done=False)
        assert out["agents", "observation", "RGB"].shape == (2, 2, 5, 2, 40, 40, 3)
        assert out["next", "done"].sum() == 2 * 2
    finally:
        env.close()
    collector = Collector(pd(max_episode_steps=3), None, frames_per_batch=2 * 4, total_frames=16)
    batches = list(collector)
    collector.shutdown()
    assert [b.batch_size for b in batches] == [torch.Size([2, 4])] * 2
    assert batches[1]["next", "agents", "reward"].shape == (2, 4, 2, 1)
