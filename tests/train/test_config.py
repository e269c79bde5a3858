"""``marlkit.train.config``: the shared sections of the scripts' schemas, their range checks,
and :func:`check_config`, which names a key in full."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from marlkit.train.config import (
    ActorCriticRunConfig,
    ConfigError,
    EvalConfig,
    QLearningRunConfig,
    TargetLossConfig,
    check_choice,
    check_config,
    check_fraction,
    check_int,
    check_real,
    env_config,
    register_schema,
)

#: A composed config of ActorCriticRunConfig, as YAML would give it.
VALUES = {
    "algorithm": "mine",
    "seed": 0,
    "run_dir": "runs/mine",
    "env": {"name": "navigation", "num_envs": 4, "max_steps": 10, "kwargs": {"n_agents": 2}},
    "collector": {"kind": "single", "frames_per_batch": 40, "total_frames": 80},
    "policy": {"share_params": True, "depth": 1, "num_cells": 8},
    "critic": {"share_params": True, "depth": 1, "num_cells": 8, "centralised": True},
    "train": {"minibatch_size": 20, "lr": 1e-3, "max_grad_norm": 1.0},
    "eval": {"every": 0, "num_envs": 2, "video": False, "video_envs": 1, "fps": 10},
    "checkpoint": {"every": 1, "keep": 1},
    "logger": {"backends": ["csv"], "project": "marlkit"},
}


def _config(schema=ActorCriticRunConfig, **changes):
    cfg = OmegaConf.merge(OmegaConf.structured(schema), VALUES)
    for key, value in changes.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return cfg


def test_a_composed_config_passes():
    cfg = _config()
    check_config(cfg)
    assert cfg.eval.exploration == "deterministic" and cfg.threads is None
    env = env_config(cfg.env)  # the keys an env file leaves out: their defaults
    assert (env.imports, env.eval_kwargs, env.actions) == ([], {}, None)
    assert env.kwargs == {"n_agents": 2}
    assert cfg.collector.num_workers == 1
    # the networks' activation: marlkit's Tanh where a file leaves it out (issue 37)
    assert cfg.policy.activation == cfg.critic.activation == "tanh"
    check_config(_config(policy__activation="relu", critic__activation="leaky_relu"))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("seed", -1, "seed must be an int >= 0, got -1"),  # the root: no prefix
        ("train__minibatch_size", 0, "train.minibatch_size must be an int >= 1, got 0"),
        ("critic__depth", -1, "critic.depth must be an int >= 0, got -1"),  # inherited checks
        ("eval__fps", float("nan"), "eval.fps must be a finite number > 0, got nan"),
        ("eval__exploration", "greedy", "eval.exploration must be one of"),
        ("logger__backends", "csv", "logger.backends must be auto or a list of"),
        ("collector__kind", "multi", "collector.kind must be one of ['single', 'multisync'"),
        ("env__max_steps", 0, "env.max_steps must be an int >= 1, got 0"),
        ("policy__activation", "relo", "policy.activation must be one of ['tanh', 'relu', "),
        ("critic__activation", "gelu", "critic.activation must be one of ['tanh', 'relu', "),
    ],
)
def test_a_value_out_of_range_is_named_in_full(key, value, message):
    with pytest.raises(ConfigError) as refused:
        check_config(_config(**{key: value}))
    assert str(refused.value).startswith(message)


def test_a_value_of_the_wrong_type_is_refused_as_it_is_set():
    cfg = _config()
    with pytest.raises(ValidationError, match=r"full_key: train\.lr"):
        cfg.train.lr = "abc"
    with pytest.raises(ValidationError, match="is not a valid bool"):
        cfg.critic.centralised = "maybe"
    cfg.critic.centralised = "no"  # the bug the old rules guarded against: no reads false
    assert cfg.critic.centralised is False


def test_the_env_is_checked_as_an_env_config():
    cfg = _config()
    cfg.env.num_envs = "abc"  # a mapping while composing ('~env.kwargs' replaces its kwargs)
    with pytest.raises(ConfigError, match=r"env\.num_envs: Value 'abc' of type 'str' could not"):
        check_config(cfg)
    cfg = _config()
    OmegaConf.update(cfg, "env.seed", 1, force_add=True)
    with pytest.raises(ConfigError, match=r"env\.seed: Key 'seed' not in 'EnvConfig'"):
        check_config(cfg)


def test_cross_section_checks_name_both_keys():
    values = {
        "exploration": {"eps_init": 0.3, "eps_end": 0.0, "annealing_fraction": 0.5},
        "buffer": {"capacity": 10},
        "train": {"epochs": 1},
        "loss": {"gamma": 0.9, "tau": 0.005, "loss_function": "l2", "double_dqn": False},
    }
    cfg = OmegaConf.merge(OmegaConf.structured(QLearningRunConfig), _without("critic"), values)
    with pytest.raises(ConfigError) as refused:
        check_config(cfg)
    assert str(refused.value) == (
        "train.minibatch_size (20) is larger than buffer.capacity (10): a minibatch is drawn "
        "from the buffer"
    )


def _without(key: str) -> dict:
    return {k: v for k, v in VALUES.items() if k != key}


def test_the_helpers_raise_config_errors():
    message = r"^epochs must be an int >= 1, got float: 1.5$"  # check_int's TypeError
    with pytest.raises(ConfigError, match=message):
        check_int("epochs", 1.5, low=1)
    with pytest.raises(ConfigError, match=r"^lr must be a finite number > 0, got -1"):
        check_real("lr", -1.0)
    assert check_choice("mixer", "vdn", ("qmix", "vdn")) == "vdn"
    with pytest.raises(ConfigError, match=r"^gamma must be a finite number in \[0, 1\], got 2.0"):
        check_fraction("gamma", 2)
    with pytest.raises(ConfigError, match=r"^tau must be a finite number in \(0, 1\], got 0.0"):
        check_fraction("tau", 0, strict=True)
    with pytest.raises(ConfigError, match=r"^every must be an int >= 0, got -1$"):
        EvalConfig(every=-1, num_envs=1, video=False, video_envs=1, fps=1.0)
    TargetLossConfig(gamma=1.0, tau=1.0, loss_function="smooth_l1")  # the bounds themselves


@dataclasses.dataclass
class _Loss(TargetLossConfig):
    coef: float = 0.5
    """A weight of a loss term of mine."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_real("coef", self.coef, low=0.0, strict=False)


@dataclasses.dataclass
class _Mine(ActorCriticRunConfig):
    loss: _Loss = dataclasses.field(default_factory=lambda: _Loss(0.9, 0.01, "l2"))
    """My loss."""


def test_a_registered_schema_types_a_yaml_file(tmp_path):
    register_schema("_test_mine_schema", _Mine)
    assert ConfigStore.instance().load("_test_mine_schema.yaml").node is not None
    (tmp_path / "mine.yaml").write_text(
        "defaults:\n  - _test_mine_schema\n  - _self_\n" + OmegaConf.to_yaml(VALUES)
    )
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        cfg = compose("mine", overrides=["loss.coef=2", "critic.centralised=no"])
        check_config(cfg)
        assert (cfg.loss.coef, cfg.loss.gamma, cfg.critic.centralised) == (2.0, 0.9, False)
        with pytest.raises(Exception) as refused:
            compose("mine", overrides=["loss.coeff=2"])
        assert "Key 'coeff' not in '_Loss'" in str(refused.value.__cause__)
        with pytest.raises(ConfigError, match=r"^loss.coef must be a finite number >= 0"):
            check_config(compose("mine", overrides=["loss.coef=-1"]))
    with pytest.raises(TypeError, match="schema must be a dataclass"):
        register_schema("_test_bad", dict)


def test_the_modules_examples_run():
    import doctest

    import marlkit.train.config

    failed, tried = doctest.testmod(marlkit.train.config, optionflags=doctest.ELLIPSIS)
    assert tried >= 4 and failed == 0
