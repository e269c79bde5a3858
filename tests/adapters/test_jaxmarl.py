"""The JaxMARL adapter against the real jaxmarl package (CPU jax), on small batches.

Every env here compiles its jitted step and reset on first use (seconds each on CPU), so the
tests share module-scoped envs where they can; the other families are marked slow.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import marlkit
from marlkit.envs import InvalidActionError, UnknownEnvError, accepted_kwargs, check_env_specs
from marlkit.testing import check_adapter

pytest.importorskip("jaxmarl")
jax = pytest.importorskip("jax")

SPREAD = "jaxmarl/MPE_simple_spread_v3"


@pytest.fixture(scope="module")
def spread():
    env = marlkit.make(SPREAD, num_envs=4, seed=0)
    yield env
    env.close()


@pytest.fixture(scope="module")
def smax():
    env = marlkit.make("jaxmarl/SMAX", map_name="3m", num_envs=3, seed=0)
    yield env
    env.close()


def test_registered_and_listed():
    names = marlkit.list_envs() if hasattr(marlkit, "list_envs") else None
    from marlkit.adapters.jaxmarl import list_scenarios

    scenarios = list_scenarios()
    for name in ("MPE_simple_spread_v3", "SMAX", "overcooked", "hanabi", "storm_2p", "coin_game"):
        assert name in scenarios
    assert "ant_4x2" not in scenarios or names is not None  # MABrax only with brax
    assert "map_name" in accepted_kwargs("jaxmarl/SMAX")
    assert "max_steps" in accepted_kwargs(SPREAD)


def test_unknown_names_and_kwargs_are_refused():
    with pytest.raises(UnknownEnvError, match="MPE_simple_spread_v3"):
        marlkit.make("jaxmarl/MPE_simple_sprad_v3")
    with pytest.raises(TypeError, match="max_stepz"):
        marlkit.make(SPREAD, max_stepz=3)
    with pytest.raises(ValueError, match="SMAX has no map '3x'"):
        marlkit.make("jaxmarl/SMAX", map_name="3x")
    with pytest.raises(TypeError, match="map_name is a SMAX option"):
        marlkit.make(SPREAD, map_name="3m")
    with pytest.raises(ValueError, match="num_envs"):
        marlkit.make(SPREAD, num_envs=0)


def test_specs_and_a_batched_rollout(spread):
    assert spread.group_map == {"agents": ["agent_0", "agent_1", "agent_2"]}
    assert spread.observation_spec["agents", "observation"].shape == (4, 3, 18)
    assert spread.action_spec["agents", "action"].n == 5
    assert not spread.state_spec.keys()
    check_env_specs(spread)
    td = spread.rollout(30, break_when_any_done=False)
    assert td.batch_size == (4, 30)
    assert td["next", "agents", "reward"].shape == (4, 30, 3, 1)
    done = td["next", "done"][..., 0]
    # MPE's episodes end at its step limit, in every env at once: truncated, then a reset.
    (ends,) = done[0].nonzero(as_tuple=True)
    assert ends.tolist() == [spread.jaxmarl_env.max_steps]  # JaxMARL's own count
    assert td["next", "truncated"][:, ends].all() and not td["next", "terminated"].any()
    assert torch.equal(done, done[:1].expand_as(done))


def test_the_last_observation_is_the_true_one(spread):
    """JaxMARL's step would return the next episode's first observation at the end; the
    adapter returns the episode's last one, and the reset's observation after it."""
    td = spread.rollout(30, break_when_any_done=False)
    end = int(td["next", "done"][0, :, 0].nonzero()[0])
    last = td["next", "agents", "observation"][:, end]
    first = td["agents", "observation"][:, end + 1]
    # MPE observes an agent's velocity first: at the last step it moves, after a reset not.
    assert not torch.equal(last, first)
    assert (first[..., :2] == 0).all()


def test_done_envs_restart_from_the_state_they_report(spread):
    """The resets of done envs come from the step that ended them (no call of their own): the
    observation reported after the reset is JaxMARL's observation of the state the env goes on
    from, and the jitted functions are not compiled again."""
    env = spread.jaxmarl_env
    td = spread._step_mdp(spread.step(spread.rand_action(spread.reset())))  # both compiled
    sizes = (spread._batch._step_fn._cache_size(), spread._batch._reset_fn._cache_size())
    for _ in range(27):
        transition, td = spread.step_and_maybe_reset(spread.rand_action(td))
        if transition["next", "done"].any():
            break
    assert transition["next", "done"].all() and spread._batch.deferred.all()
    obs = jax.vmap(env.get_obs)(spread.jax_state)
    want = np.stack([np.asarray(obs[a]) for a in env.agents], 1)
    np.testing.assert_array_equal(td["agents", "observation"].numpy(), want)
    td = spread.step(spread.rand_action(td))  # the first step of the new episodes
    assert not spread._batch.deferred.any()
    assert (np.asarray(spread.jax_state.step) == 1).all()
    assert sizes == (spread._batch._step_fn._cache_size(), spread._batch._reset_fn._cache_size())


def test_parity_with_jaxmarl_step(spread):
    """The adapter's step is JaxMARL's: from the same state and actions, ``env.step`` gives
    the same observations and rewards (MPE's step draws nothing at random)."""
    env = spread.jaxmarl_env
    td = spread.reset()
    state = spread.jax_state
    td = spread.rand_action(td)
    actions = td["agents", "action"].to(torch.int32).numpy()
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    acts = {a: actions[:, i] for i, a in enumerate(env.agents)}
    obs, _, rew, _, _ = jax.jit(jax.vmap(env.step))(keys, state, acts)
    out = spread.step(td)["next"]
    want = np.stack([np.asarray(obs[a]) for a in env.agents], 1)
    np.testing.assert_array_equal(out["agents", "observation"].numpy(), want)
    want_rew = np.stack([np.asarray(rew[a]) for a in env.agents], 1)[..., None]
    np.testing.assert_array_equal(out["agents", "reward"].numpy(), want_rew)


def test_outputs_cross_to_torch_without_a_copy(spread):
    td = spread.step(spread.rand_action(spread.reset()))
    obs = td["next", "agents", "observation"]
    kept = spread._batch.last["agents"]["observation"]  # the JAX array of that output
    assert obs.data_ptr() == kept.unsafe_buffer_pointer()
    # and actions go the other way without one when they are int32 already
    actions = spread._actions(td)["agents"]
    assert actions.dtype == np.int32


def test_bad_actions_are_refused_with_the_key_named(spread):
    td = spread.rand_action(spread.reset())
    before = spread.jax_state.p_pos.copy()
    for bad in [
        torch.full((4, 3), 5),  # out of range
        torch.zeros(4, 3, 1, dtype=torch.long),  # a wrong shape
        torch.zeros(4, 3, dtype=torch.float32),  # a wrong dtype
        torch.full((4, 3), -1),  # out of range
    ]:
        with pytest.raises(InvalidActionError, match=r"'agents', 'action'"):
            spread.step(td.clone().set(("agents", "action"), bad))
    with pytest.raises(InvalidActionError, match="missing"):
        spread.step(td.clone().exclude(("agents", "action")))
    assert np.array_equal(np.asarray(spread.jax_state.p_pos), np.asarray(before))


def test_seeds_replay_and_differ(spread):
    spread.set_seed(3)
    a = spread.rollout(5)
    spread.set_seed(3)
    b = spread.rollout(5)
    spread.set_seed(4)
    c = spread.rollout(5)
    assert torch.equal(a["agents", "observation"], b["agents", "observation"])
    assert torch.equal(a["next", "agents", "reward"], b["next", "agents", "reward"])
    assert not torch.equal(a["agents", "observation"], c["agents", "observation"])
    # every env of the batch draws its own start
    first = a["agents", "observation"][:, 0]
    assert len({tuple(x.flatten().tolist()) for x in first}) == 4


def test_partial_reset_keeps_the_other_envs(spread):
    td = spread.reset()
    for _ in range(3):
        td = spread._step_mdp(spread.step(spread.rand_action(td)))
    mask = torch.tensor([[False], [True], [False], [False]])
    td["_reset"] = mask
    out = spread.reset(td)
    keep = ~mask[:, 0]
    assert torch.equal(out["agents", "observation"][keep], td["agents", "observation"][keep])
    assert not torch.equal(out["agents", "observation"][1], td["agents", "observation"][1])


def test_check_adapter(spread):
    check_adapter(spread)


def test_step_before_reset_is_refused():
    env = marlkit.make(SPREAD, num_envs=4, seed=0)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.action_spec.zero())


def test_rendering_mpe(spread):
    assert spread.render_modes == ("rgb_array",)
    spread.reset()
    frame = spread.render(1)
    assert frame.dtype == np.uint8 and frame.shape == (256, 256, 3) and frame.std() > 0


@pytest.mark.slow
def test_collector_batch(spread):
    from marlkit.collectors import Collector

    collector = Collector(spread, None, frames_per_batch=4 * 6, total_frames=48)
    batches = list(collector)
    collector.shutdown()
    assert [b.batch_size for b in batches] == [torch.Size([4, 6])] * 2
    assert batches[1]["next", "agents", "reward"].shape == (4, 6, 3, 1)


@pytest.mark.slow
def test_inside_parallel_env():
    """Workers start with "spawn" (JAX must not be forked once running); each compiles its own
    functions, so this takes a while."""
    from marlkit.envs import ParallelEnv, SerialEnv

    kwargs = {"name": SPREAD, "num_envs": 2, "max_steps": 3}
    env = ParallelEnv(2, marlkit.make, kwargs)
    try:
        assert env.batch_size == (2, 2)
        env.set_seed(0)
        out = env.rollout(5, break_when_any_done=False)
        assert out["agents", "observation"].shape == (2, 2, 5, 3, 18)
        assert out["next", "done"][..., 0].sum() == 2 * 2
    finally:
        env.close()
    serial = SerialEnv(2, marlkit.make, kwargs)
    serial.set_seed(0)
    same = serial.rollout(5, break_when_any_done=False)
    serial.close()
    assert torch.equal(same["agents", "observation"], out["agents", "observation"])


@pytest.mark.slow
def test_smax_masks_and_state(smax):
    assert smax.group_map == {
        "ally": ["ally_0", "ally_1", "ally_2"],
        "enemy": ["enemy_0", "enemy_1", "enemy_2"],
    }
    assert smax.state_spec["state"].shape[0] == 3
    smax.set_seed(0)
    td = smax.rollout(120, break_when_any_done=False)
    for group in ("ally", "enemy"):
        mask = td[group, "action_mask"]
        assert mask.dtype == torch.bool and mask.shape[-1] == 8
        alive = td[group, "mask"]
        assert alive[:, 0].all()  # every unit alive at the start
        acted = td[group, "action"]
        assert mask.gather(-1, acted.unsqueeze(-1)).all()  # random actions honour the masks
        # a dead unit (mask false) can only do nothing: JaxMARL's no-op (action 0 stop... )
        dead = ~alive
        if dead.any():
            assert (mask[dead].sum(-1) == 1).all()
    # a unit that dies is terminated at that step and masked out afterwards
    died = td["next", "ally", "terminated"][..., 0] & ~td["next", "done"]
    assert died.any() or td["next", "done"].any()
    assert td["next", "done"].any()  # 3m episodes end within 100 steps (SMAX's max_steps)
    ended = td["next", "done"][..., 0]
    wiped = td["next", "terminated"][..., 0]
    assert torch.equal(ended, wiped | td["next", "truncated"][..., 0])


@pytest.mark.slow
def test_smax_check_adapter_and_masked_actions(smax):
    check_adapter(smax)
    td = smax.reset()
    mask = td["ally", "action_mask"]
    td = smax.rand_action(td)
    banned = (~mask).float().argmax(-1)  # a class the mask forbids (an attack, at the start)
    td["ally", "action"] = banned
    with pytest.raises(InvalidActionError, match="masked out"):
        smax.step(td)
    frame = smax.render(0)
    assert frame.dtype == np.uint8 and frame.std() > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "kwargs", "groups", "obs", "renders"),
    [
        ("MPE_simple_tag_v3", {}, {"adversary": 3, "agent": 1}, None, True),
        ("overcooked", {}, {"agents": 2}, (4, 5, 26), False),
        ("hanabi", {}, {"agents": 2}, (658,), False),
        ("storm_2p", {}, {"agents": 2}, None, True),
        ("storm_np", {}, {"agents": 2}, (5, 5, 14), False),
        ("coin_game", {}, {"agents": 2}, (36,), False),
    ],
)
def test_families(name, kwargs, groups, obs, renders):
    if name == "overcooked":  # JaxMARL points to its OvercookedV2 when the first is built
        with pytest.warns(DeprecationWarning, match="OvercookedV2"):
            env = marlkit.make(f"jaxmarl/{name}", num_envs=2, seed=0, **kwargs)
    else:
        env = marlkit.make(f"jaxmarl/{name}", num_envs=2, seed=0, **kwargs)
    assert {g: len(a) for g, a in env.group_map.items()} == groups
    group = next(iter(groups))
    if obs is not None:
        assert env.observation_spec[group, "observation"].shape[2:] == obs
    check_adapter(env, check_render=renders)
    if not renders:
        with pytest.raises(NotImplementedError, match="does not render"):
            env.render(0)
    env.close()
