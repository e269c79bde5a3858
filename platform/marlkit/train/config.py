"""Checks of a training script's config before anything runs.

Hydra reads an override as YAML: ``train.lr=abc`` arrives as the string ``"abc"``, and
``critic.centralised=no`` as the string ``"no"``, which Python reads as true. Unchecked, the
first fails deep in torch after the first batch was collected, with a message that names no
config key, and the second silently trains MAPPO for an IPPO run. :func:`check_config` checks
every value a script reads against a rule and names the key at fault::

    check_config(cfg, {"train.lr": number(), "critic.centralised": flag()})
    # ConfigError: train.lr must be a number, got str: 'abc'

:data:`COMMON_RULES` holds the keys every script of ``sota-implementations/`` shares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from marlkit._utils import check_flag, check_int, check_real, import_optional

__all__ = [
    "COMMON_RULES",
    "CRITIC_RULES",
    "OFF_POLICY_RULES",
    "ConfigError",
    "Rule",
    "check_config",
    "check_not_above",
    "flag",
    "integer",
    "number",
    "one_of",
    "register_resolvers",
    "run_folder",
]

#: A rule checks one value: ``rule(key, value)`` raises ``TypeError``/``ValueError`` naming
#: ``key`` when the value does not fit.
Rule = Callable[[str, Any], Any]


class ConfigError(ValueError):
    """A config value of the wrong type or range; the message names its key."""


def integer(low: int = 1, *, allow_none: bool = False) -> Rule:
    """An ``int >= low`` (``None`` too when ``allow_none``); never a bool or a float."""

    def rule(key: str, value: Any) -> Any:
        return check_int(key, value, low=low, allow_none=allow_none)

    return rule


def number(low: float = 0.0, *, strict: bool = True, below: float | None = None) -> Rule:
    """A finite number ``> low`` (``>= low`` when not ``strict``; ``< below`` when given)."""

    def rule(key: str, value: Any) -> Any:
        return check_real(key, value, low=low, strict=strict, below=below)

    return rule


def one_of(*choices: str) -> Rule:
    """One of the strings ``choices``."""

    def rule(key: str, value: Any) -> Any:
        if value not in choices:
            raise ValueError(f"{key} must be one of {list(choices)}, got {value!r}")
        return value

    return rule


def flag() -> Rule:
    """``true`` or ``false``: not the strings ``"no"`` or ``"yes"``, which YAML 1.2 leaves as
    strings and Python reads as true."""
    return check_flag


def _lookup(cfg: Mapping[str, Any], key: str) -> Any:
    value: Any = cfg
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(value, Mapping):  # a group replaced by a value (`loss=vdn`)
            group = ".".join(parts[:depth])
            raise ConfigError(
                f"{group} is a group of settings ({key}, ...), got {group}={value!r}; set its "
                f"keys one by one ({key}=...)"
            )
        if part not in value:
            raise ConfigError(f"the config has no key {key!r}")
        value = value[part]
    return value


def check_config(cfg: Mapping[str, Any], rules: Mapping[str, Rule]) -> None:
    """Check each dotted ``key`` of ``cfg`` (a ``DictConfig`` or any nested mapping) against its
    rule.

    Raises:
        ConfigError: the first key that is missing or whose value does not fit its rule, e.g.
            ``"train.epochs must be an int >= 1, got 0"``.

    Examples:
        >>> check_config({"train": {"epochs": 3}}, {"train.epochs": integer(1)})
        >>> check_config({"train": {"epochs": 1.5}}, {"train.epochs": integer(1)})
        Traceback (most recent call last):
        ...
        marlkit.train.config.ConfigError: train.epochs must be an int >= 1, got float: 1.5
    """
    for key, rule in rules.items():
        value = _lookup(cfg, key)
        try:
            rule(key, value)
        except (TypeError, ValueError) as err:
            raise ConfigError(str(err)) from None


def check_not_above(cfg: Mapping[str, Any], key: str, limit: str, why: str) -> None:
    """Refuse a value of ``key`` above the value of the key ``limit`` (both numbers, checked
    first by :func:`check_config`); ``why`` ends the message.

    Raises:
        ConfigError: e.g. ``"train.minibatch_size (400) is larger than buffer.capacity (50):
            ..."``.
    """
    value, bound = _lookup(cfg, key), _lookup(cfg, limit)
    if value > bound:
        raise ConfigError(f"{key} ({value}) is larger than {limit} ({bound}): {why}")


def run_folder(resume: Any, default: Any) -> Any:
    """A script's ``run_dir`` (the config's ``${run_folder:${resume},runs/...}``): the folder
    ``resume`` names, else ``default`` (a new, time-stamped folder).

    Raises:
        ConfigError: ``resume`` is not a folder name (``resume=true``: Hydra would have made a
            folder ``True/`` for the run before the script could say so).
    """
    if resume is None:
        return default
    if isinstance(resume, bool) or not isinstance(resume, str) or not resume.strip():
        raise ConfigError(
            "resume takes the folder of the run to go on with (resume=runs/<algorithm>/<stamp>),"
            f" got {type(resume).__name__}: {resume!r}"
        )
    return resume


def register_resolvers() -> None:
    """Register the resolvers the scripts' configs use, with OmegaConf (``hydra-core``):
    ``run_folder`` (:func:`run_folder`) and ``if_none`` (``${if_none:a,b,c}``: ``b`` when ``a``
    is null, else ``c``; a resumed run keeps the first run's ``.hydra/`` and writes its own
    config next to it)."""
    omegaconf = import_optional("omegaconf", extra="train", purpose="the training scripts' config")
    register = omegaconf.OmegaConf.register_new_resolver
    register("run_folder", run_folder, replace=True)
    register("if_none", lambda a, b, c: b if a is None else c, replace=True)


#: Keys that every training script of ``sota-implementations/`` reads.
COMMON_RULES: dict[str, Rule] = {
    "seed": integer(0),
    "threads": integer(1, allow_none=True),
    "collector.frames_per_batch": integer(1),
    "collector.total_frames": integer(1),  # a training run ends: no -1 ("never stop") here
    "policy.share_params": flag(),
    "policy.depth": integer(0),
    "train.minibatch_size": integer(1),
    "train.lr": number(),
    "train.max_grad_norm": number(),  # a negative norm would flip every update
    "eval.every": integer(0),
    "eval.num_envs": integer(1),
    "eval.video": flag(),
    "eval.video_envs": integer(1),
    "eval.fps": number(),
    "checkpoint.every": integer(1),
    "checkpoint.keep": integer(1),
}

#: The critic's keys of the actor-critic scripts (MAPPO/IPPO, MADDPG/IDDPG, MASAC/ISAC).
CRITIC_RULES: dict[str, Rule] = {
    "critic.centralised": flag(),
    "critic.share_params": flag(),
    "critic.depth": integer(0),
}

#: The replay keys of the off-policy actor-critic scripts (MADDPG/IDDPG, MASAC/ISAC).
OFF_POLICY_RULES: dict[str, Rule] = {
    "train.num_updates": integer(1),  # 0 trained nothing, without a word
    "collector.init_random_frames": integer(0),
    "buffer.size": integer(1),
}
