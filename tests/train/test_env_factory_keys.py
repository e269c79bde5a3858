"""``env.kwargs`` cannot set what the env factory takes from other keys: ``env.kwargs.max_steps``
beside ``env.max_steps`` (the episode length) is refused with both keys named, instead of
Python's ``TypeError: got multiple values``."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from marlkit.train.config import ConfigError
from marlkit.train.scripts import env_factory


def cfg(**env):
    base = {"name": "smax/3m", "num_envs": 2, "max_steps": 20, "kwargs": {}}
    return OmegaConf.create({"seed": 0, "env": {**base, **env}})


def test_env_max_steps_is_the_episode_length_and_the_envs_other_kwargs_pass():
    env = env_factory(cfg(kwargs={"won_bonus": 2.0}), 2, seed=0)()
    assert env.base_env.won_bonus == 2.0
    assert env.transform[0].max_steps == 20  # the StepCounter of env.max_steps


@pytest.mark.parametrize("section", ["kwargs", "eval_kwargs"])
def test_max_steps_in_env_kwargs_is_refused_naming_both_keys(section):
    with pytest.raises(
        ConfigError,
        match=rf"env\.{section}\.max_steps \(50\) collides with env\.max_steps: set it with "
        r"env\.max_steps only \(the episode length",
    ):
        env_factory(cfg(**{section: {"max_steps": 50}}), 2, seed=0)


@pytest.mark.parametrize(
    ("name", "key"), [("num_envs", "env.num_envs"), ("seed", "seed"), ("actions", "env.actions")]
)
def test_other_arguments_of_the_factory_in_env_kwargs_are_refused(name, key):
    with pytest.raises(ConfigError, match=rf"env\.kwargs\.{name} \(1\) collides with {key}"):
        env_factory(cfg(kwargs={name: 1}), 2, seed=0)
