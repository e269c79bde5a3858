"""make_episodic: a registered env with its episodes cut and summed."""

from __future__ import annotations

import functools
import pickle
import sys

import pytest
import torch

from marlkit.envs import make_episodic


def test_episodes_are_cut_and_summed():
    env = make_episodic("navigation", num_envs=2, max_steps=4, seed=0, n_agents=2)
    rollout = env.rollout(6, break_when_any_done=False)
    assert rollout["next", "step_count"][0, :, 0].tolist() == [1, 2, 3, 4, 1, 2]
    assert rollout["next", "done"][:, 3].all()
    reward = rollout["next", "agents", "reward"]
    torch.testing.assert_close(
        rollout["next", "agents", "episode_reward"][:, 3], reward[:, :4].sum(1)
    )


def test_a_partial_of_it_pickles_and_imports_first(tmp_path, monkeypatch):
    from marlkit.envs import registry

    # The env this test registers must not outlive it (the conformance suite checks that the
    # registry holds exactly the shipped scenarios and adapters).
    registry.registered()  # built-ins and plug-ins loaded before the snapshot
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.delitem(sys.modules, "my_registering_module", raising=False)
    (tmp_path / "my_registering_module.py").write_text(
        "import marlkit\n"
        "marlkit.register('episodic_test_env', lambda num_envs=1, seed=None: "
        "marlkit.make('navigation', num_envs=num_envs, seed=seed, n_agents=2), override=True)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    factory = functools.partial(
        make_episodic,
        "episodic_test_env",
        num_envs=2,
        max_steps=3,
        imports=["my_registering_module"],
    )
    env = pickle.loads(pickle.dumps(factory))()
    assert env.batch_size == (2,)


def test_bad_arguments():
    with pytest.raises(TypeError, match="imports must be a sequence of module names"):
        make_episodic("navigation", num_envs=1, max_steps=3, imports="my_module")
    with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
        make_episodic("navigation", num_envs=1, max_steps=3, imports=["no_such_module_here"])
    with pytest.raises(ValueError, match="max_steps must be"):
        make_episodic("navigation", num_envs=1, max_steps=0)


def test_actions_are_asked_of_envs_with_the_option_and_checked_on_all():
    def kind(env):
        return type(env.action_spec["agents", "action"]).__name__

    nav = make_episodic("navigation", num_envs=1, max_steps=3, n_agents=2, actions="discrete")
    assert kind(nav) == "Categorical"
    mpe = make_episodic(
        "pettingzoo/mpe2.simple_spread_v3", num_envs=1, max_steps=3, actions="continuous"
    )
    assert kind(mpe) == "Bounded"  # MPE's default is discrete
    # the caller's own setting wins, and a mismatch names it
    own = make_episodic("navigation", num_envs=1, max_steps=3, continuous_actions=False)
    assert kind(own) == "Categorical"
    with pytest.raises(ValueError, match=r"\(continuous_actions=True in its keyword arguments\)"):
        make_episodic(
            "navigation", num_envs=1, max_steps=3, continuous_actions=True, actions="discrete"
        )
    # an env without the option is built as it is, and refused when its actions do not fit
    message = (
        r"discrete actions are needed, but group 'agents' of env 'mujoco/ant_2x4' has Bounded "
        r"actions, and the env has no continuous_actions option: train it with an algorithm for "
        r"continuous actions"
    )
    with pytest.raises(ValueError, match=message):
        make_episodic("mujoco/ant_2x4", num_envs=1, max_steps=3, actions="discrete")
    ant = make_episodic("mujoco/ant_2x4", num_envs=1, max_steps=3, actions="continuous")
    assert kind(ant) == "Bounded"
    with pytest.raises(ValueError, match="actions must be 'discrete', 'continuous' or None"):
        make_episodic("navigation", num_envs=1, max_steps=3, actions="Discrete")
