"""Typed configs of the training scripts of ``sota-implementations/``: Hydra structured configs.

A script's config is a dataclass whose fields are the config's sections, each a dataclass with
a docstring per field. The script stores it in Hydra's ConfigStore as a *schema*
(:func:`register_schema`) and its YAML file lists that schema first in its defaults, so that
Hydra composes the YAML files into it:

* OmegaConf checks the **types** while composing, before the script runs: an ``int`` key
  refuses ``1.5`` and ``abc``, a ``float`` key refuses ``abc``, a ``bool`` key reads ``no`` as
  false (YAML 1.2 leaves ``no`` a string, which Python's ``bool()`` reads as true) and refuses
  ``maybe``, and a key the schema does not declare (``train.lrr=1``) is refused; the message
  names the key (``full_key: train.lr``);
* each section's ``__post_init__`` checks the **ranges** (``>= 1``, ``> 0``, finite, one of the
  choices) and raises :class:`ConfigError`; :func:`check_config`, called by
  :func:`marlkit.train.scripts.start`, runs them on a composed config and names the key in
  full: ``train.epochs must be an int >= 1, got 0``. It also refuses the keys Hydra lets
  ``+train.lrr=1`` add, and checks ``env``, a mapping while composing (so that ``~env.kwargs``
  can replace the env's keyword arguments), as an :class:`EnvConfig` (:func:`env_config`).

The sections every script shares live here (:class:`RunConfig`: ``seed``, ``threads``,
``resume``, ``run_dir``, :class:`EnvConfig`, :class:`CollectorConfig`, :class:`PolicyConfig`,
:class:`EvalConfig`, :class:`CheckpointConfig`, :class:`LoggerConfig`, :class:`TrainConfig`),
with those of the actor-critic scripts (:class:`CriticConfig`), of the off-policy ones
(:class:`OffPolicyRunConfig`: replay and updates per batch) and of the Q-learning procedure
of IQL, QMIX and VDN (:class:`QLearningRunConfig`); a script adds its own sections (its loss,
its exploration) in a small dataclass next to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, get_args

import torch

from marlkit import _checks
from marlkit._utils import import_optional
from marlkit.collectors import CollectorKind
from marlkit.envs.transforms import make_transforms
from marlkit.modules.activations import ACTIVATIONS
from marlkit.record.loggers import Backend
from marlkit.train.evaluation import EVAL_EXPLORATIONS
from marlkit.train.precision import PRECISIONS

__all__ = [
    "ActorCriticRunConfig",
    "BufferConfig",
    "CheckpointConfig",
    "CollectorConfig",
    "ConfigError",
    "CriticConfig",
    "EnvConfig",
    "EpochsTrainConfig",
    "EpsilonGreedyConfig",
    "EvalConfig",
    "LoggerConfig",
    "OffPolicyCollectorConfig",
    "OffPolicyRunConfig",
    "OffPolicyTrainConfig",
    "PolicyConfig",
    "QLearningRunConfig",
    "QLossConfig",
    "ReplayConfig",
    "RunConfig",
    "TargetLossConfig",
    "TrainConfig",
    "check_choice",
    "check_config",
    "check_device",
    "check_fraction",
    "check_int",
    "check_not_above",
    "check_real",
    "env_config",
    "register_resolvers",
    "register_schema",
    "run_folder",
]

#: A key the YAML files must set (OmegaConf's ``???``): the schema holds types, not values.
MISSING: Any = "???"


class ConfigError(ValueError):
    """A config value of the wrong type or range; the message names its key."""


def check_int(
    key: str, value: Any, *, low: int, high: int | None = None, allow_none: bool = False
) -> Any:
    """:func:`marlkit._checks.check_int` for a config key: an ``int >= low`` (and ``<= high``
    when given; or ``None`` with ``allow_none``), never a bool or a float.

    Raises:
        ConfigError: e.g. ``"epochs must be an int >= 1, got 0"``.

    Examples:
        >>> check_int("epochs", 0, low=1)
        Traceback (most recent call last):
        ...
        marlkit.train.config.ConfigError: epochs must be an int >= 1, got 0
    """
    try:
        return _checks.check_int(key, value, low=low, high=high, allow_none=allow_none)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None


def check_real(
    key: str, value: Any, *, low: float = 0.0, strict: bool = True, below: float | None = None
) -> float:
    """:func:`marlkit._checks.check_real` for a config key: a finite number ``> low``
    (``>= low`` when not ``strict``; ``< below`` when given).

    Raises:
        ConfigError: e.g. ``"lr must be a finite number > 0, got -1.0"``.
    """
    try:
        return _checks.check_real(key, value, low=low, strict=strict, below=below)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None


def check_choice(key: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` when it is one of ``choices``.

    Raises:
        ConfigError: e.g. ``"mixer must be one of ['qmix', 'vdn'], got 'qmx'"``.
    """
    if value not in choices:
        raise ConfigError(f"{key} must be one of {list(choices)}, got {value!r}")
    return value


def check_fraction(key: str, value: Any, *, strict: bool = False) -> float:
    """``value`` as a finite number in ``[0, 1]`` (a discount, a probability; ``(0, 1]`` when
    ``strict``).

    Raises:
        ConfigError: e.g. ``"gamma must be a finite number in [0, 1], got 1.5"``.
    """
    interval = f"{'(' if strict else '['}0, 1]"
    try:
        number = _checks.check_real(key, value, low=0.0, strict=strict)
    except TypeError as err:
        raise ConfigError(str(err)) from None
    except ValueError:  # below 0, or not finite
        number = math.nan
    if not number <= 1:
        raise ConfigError(f"{key} must be a finite number in {interval}, got {float(value)!r}")
    return number


def check_not_above(key: str, value: int, limit: str, bound: int, why: str) -> None:
    """Refuse ``value`` (of ``key``) above ``bound`` (the value of ``limit``); ``why`` ends the
    message.

    Raises:
        ConfigError: e.g. ``"train.minibatch_size (400) is larger than buffer.capacity (50):
            a minibatch is drawn from the buffer"``.
    """
    if value > bound:
        raise ConfigError(f"{key} ({value}) is larger than {limit} ({bound}): {why}")


def check_device(key: str, value: Any, *, allow_none: bool = False) -> Any:
    """``value`` when it names a torch device this machine has (``cpu``, ``cuda``,
    ``cuda:1``, ``mps``); ``None`` with ``allow_none``.

    Raises:
        ConfigError: not a device (``"device must be a torch device (cpu, cuda, cuda:<index>,
            mps), got 'gpu'"``), ``cuda`` without CUDA (``"device=cuda: CUDA is not available
            on this machine (torch.cuda.is_available() is False): use device=cpu"``), a CUDA
            index past the devices, ``mps`` where it is not available, ``meta`` (no data).
    """
    if value is None and allow_none:
        return None
    where = f"{key}={value}"
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a device name (a str), got {type(value).__name__}")
    try:
        device = torch.device(value)
    except RuntimeError:
        raise ConfigError(
            f"{key} must be a torch device (cpu, cuda, cuda:<index>, mps), got {value!r}"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"{where}: CUDA is not available on this machine (torch.cuda.is_available() is "
                f"False; torch {torch.__version__}, built for CUDA {torch.version.cuda}): use "
                f"{key}=cpu"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{where}: this machine has {count} CUDA device(s), cuda:0 up")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{where}: MPS is not available on this machine: use {key}=cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{where}: training and simulation run on cpu, cuda or mps")
    return value


# --------------------------------------------------------------------- the shared sections
@dataclass
class EnvConfig:
    """``env``: the env a run trains on (a file of ``configs/env/``)."""

    name: str = MISSING
    """The registered env (``marlkit.make``'s name): ``navigation``, ``vmas/balance``, ..."""
    num_envs: int = MISSING
    """Envs a training batch steps (the evaluation env has ``eval.num_envs``)."""
    max_steps: int = MISSING
    """Episode length: episodes are cut there (a ``StepCounter``)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The env's keyword arguments (``env.kwargs.n_agents=4``)."""
    imports: list[str] = field(default_factory=list)
    """Modules to import first, in the script and its workers: ones that register envs."""
    eval_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the evaluation env only (``render_mode``, say)."""
    actions: str | None = None
    """The kind of actions the algorithm needs: ``discrete``, ``continuous`` or null (either);
    set in the script's file, checked on the env before anything trains."""
    transforms: list[Any] = field(default_factory=list)
    """Observation transforms applied to the env, in order, by name or as ``{name: ...,
    **arguments}``: ``[flatten_observation]`` (image or grid observations for an MLP),
    ``[concat_observation]`` (a dict observation into one vector), ``[{name: pixels, layout:
    CHW}]`` (``uint8`` ``HWC`` to ``float`` ``CHW``), ``[agent_id]`` (each agent's one-hot
    index in its group appended to its observation, EPyMARL's ``obs_agent_id``); see
    :mod:`marlkit.envs.transforms.named`."""
    device: str | None = None
    """Where the env simulates (its ``device`` argument: VMAS and the native scenarios' torch
    twins on ``cuda``); null: the env's default (cpu). An env without a ``device`` argument
    runs on the cpu only."""
    workers: int = 1
    """Worker processes stepping the training envs (a :class:`~marlkit.envs.ParallelEnv` of
    ``num_envs / workers`` envs each, seeded as the one env of ``num_envs`` would be), for
    simulators stepped in Python (LBF, RWARE, MPE): their steps run side by side while this
    process waits; 1: in the training process. The evaluation env stays in this process."""

    def __post_init__(self) -> None:
        check_int("num_envs", self.num_envs, low=1)
        check_int("max_steps", self.max_steps, low=1)
        check_int("workers", self.workers, low=1)
        if self.num_envs % self.workers:
            raise ConfigError(
                f"num_envs ({self.num_envs}) must be a multiple of workers ({self.workers}): "
                "each worker steps num_envs / workers envs"
            )
        check_device("device", self.device, allow_none=True)
        check_choice("actions", self.actions, ("discrete", "continuous", None))
        try:  # names and arguments checked now, not in the first worker that builds the env
            make_transforms(self.transforms)
        except (TypeError, ValueError) as err:
            raise ConfigError(str(err)) from None


@dataclass
class CollectorConfig:
    """``collector``: how batches are collected (a file of ``configs/collector/`` sets
    ``kind`` and ``num_workers``)."""

    kind: str = MISSING
    """``single`` (in the training process), ``multisync``, ``multiasync`` (worker processes),
    ``ray``, ``ray_async`` (Ray actors)."""
    frames_per_batch: int = MISSING
    """Frames (env steps x envs) of each training batch."""
    total_frames: int = MISSING
    """Frames of the whole run: a training run ends (no -1)."""
    num_workers: int = 1
    """Worker processes or actors of the multi-worker kinds."""
    device: str | None = None
    """Where the collector runs the policy (a copy, kept in step after each update); null: the
    policy's own device (the training ``device``). Batches are stored on the env's device and
    moved to the training device once each."""

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, get_args(CollectorKind))
        check_device("device", self.device, allow_none=True)
        check_int("frames_per_batch", self.frames_per_batch, low=1)
        check_int("total_frames", self.total_frames, low=1)
        check_int("num_workers", self.num_workers, low=1)


@dataclass
class PolicyConfig:
    """``policy``: the policy's network, one MLP over the agents of a group."""

    share_params: bool = MISSING
    """One network for every agent of a group (true) or one each."""
    depth: int = MISSING
    """Hidden layers."""
    num_cells: int = MISSING
    """Units of each hidden layer."""
    activation: str = "tanh"
    """The activation after each hidden layer: ``tanh`` (marlkit's
    :class:`~marlkit.modules.Tanh`), ``relu`` (EPyMARL's agents and critics), ``elu`` or
    ``leaky_relu`` (:func:`marlkit.modules.activation_class`)."""

    def __post_init__(self) -> None:
        check_int("depth", self.depth, low=0)
        check_int("num_cells", self.num_cells, low=1)
        check_choice("activation", self.activation, ACTIVATIONS)


@dataclass
class CriticConfig(PolicyConfig):
    """``critic``: the critic's network (MAPPO/IPPO, MADDPG/IDDPG, MASAC/ISAC)."""

    centralised: bool = MISSING
    """Every agent's observation (MAPPO, MADDPG, MASAC; with the actions for a Q-critic), or
    the agent's own (false: IPPO, IDDPG, ISAC)."""


@dataclass
class TrainConfig:
    """``train``: the optimiser's settings."""

    minibatch_size: int = MISSING
    """Items of each minibatch."""
    lr: float = MISSING
    """Adam's learning rate."""
    adam_eps: float = 1e-8
    """Adam's ``eps`` (torch's default 1e-8, which EPyMARL's learners keep; CleanRL's and
    JaxMARL's PPO use 1e-5, which damps the steps of parameters whose gradients are rare or
    small)."""
    max_grad_norm: float = MISSING
    """Gradients are clipped to this norm (a negative one would flip every update)."""
    precision: str = "fp32"
    """``fp32`` or ``bf16``: the networks' forward passes in the gradient steps under bf16
    autocast, weights, optimiser and loss maths in fp32 (:mod:`marlkit.train.precision`);
    fp32 with a warning where the hardware has no bf16."""

    def __post_init__(self) -> None:
        check_int("minibatch_size", self.minibatch_size, low=1)
        check_real("lr", self.lr)
        check_real("adam_eps", self.adam_eps)
        check_real("max_grad_norm", self.max_grad_norm)
        check_choice("precision", self.precision, PRECISIONS)


@dataclass
class EpochsTrainConfig(TrainConfig):
    """``train`` of the scripts that pass over each batch in epochs (PPO, IQL, QMIX/VDN)."""

    epochs: int = MISSING
    """Passes over the buffer per batch, in ``buffer // minibatch_size`` minibatches."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("epochs", self.epochs, low=1)


@dataclass
class EvalConfig:
    """``eval``: the periodic evaluations, on an env of their own (``seed + 10000``)."""

    every: int = MISSING
    """Iterations between evaluations; 0: only at the end."""
    num_envs: int = MISSING
    """Envs of the evaluation env: one episode each."""
    video: bool = MISSING
    """Film each evaluation into ``videos/`` (the first ``video_envs``, tiled)."""
    video_envs: int = MISSING
    """Envs filmed."""
    fps: float = MISSING
    """The videos' frames per second."""
    exploration: str = "deterministic"
    """How the evaluated policy acts: ``deterministic`` (greedy), ``random`` (as while
    collecting) or ``both`` (the deterministic one reported first)."""

    def __post_init__(self) -> None:
        check_int("every", self.every, low=0)
        check_int("num_envs", self.num_envs, low=1)
        check_int("video_envs", self.video_envs, low=1)
        check_real("fps", self.fps)
        check_choice("exploration", self.exploration, EVAL_EXPLORATIONS)


@dataclass
class CheckpointConfig:
    """``checkpoint``: when checkpoints are written (the last iteration always is)."""

    every: int = MISSING
    """Iterations between checkpoints."""
    keep: int = MISSING
    """Checkpoints kept (the oldest are deleted)."""

    def __post_init__(self) -> None:
        check_int("every", self.every, low=1)
        check_int("keep", self.keep, low=1)


@dataclass
class LoggerConfig:
    """``logger``: where the metrics go (``metrics.csv`` always)."""

    backends: Any = MISSING
    """``auto`` (CSV, and TensorBoard and wandb, offline, when installed) or a list of
    ``csv``, ``tensorboard``, ``wandb``."""
    project: str = MISSING
    """The wandb project."""

    def __post_init__(self) -> None:
        names = get_args(Backend)
        if self.backends == "auto":
            return
        if not isinstance(self.backends, list) or not self.backends:
            raise ConfigError(
                f"backends must be auto or a list of {list(names)}, got {self.backends!r}"
            )
        for name in self.backends:
            check_choice("backends", name, names)


@dataclass
class RunConfig:
    """The keys every script reads: ``configs/run.yaml`` (``seed``, ``threads``, ``resume``,
    ``run_dir``, ``eval``, ``checkpoint``, ``logger``), the env and collector groups, the
    policy's network and the optimiser; a script's schema adds its own sections."""

    algorithm: str = MISSING
    """The recipe's name (the config file's), in ``summary.json`` and the default run folder."""
    seed: int = MISSING
    """Seeds torch, the training envs (``seed``, ``seed + 1``, ...) and the evaluation env."""
    threads: int | None = None
    """Torch's and the native kernels' threads; null keeps their defaults."""
    resume: Any = None
    """A run folder: go on from its latest checkpoint, in that folder (the ``run_folder``
    resolver refuses anything but a folder name, before Hydra makes a folder)."""
    run_dir: str = MISSING
    """Where the run writes ``metrics.csv``, ``checkpoints/``, ``videos/``, ``summary.json``."""
    env: dict[str, Any] = MISSING
    """The env (``env=<file of configs/env/>``): an :class:`EnvConfig`, kept a mapping while
    Hydra composes so that ``'~env.kwargs' '+env.kwargs={g: 9.81}'`` can replace the env's
    keyword arguments (a dataclass's key cannot be deleted); :func:`check_config` checks it
    (:func:`env_config`), types included."""
    collector: CollectorConfig = MISSING
    """The collector (``collector=<file of configs/collector/>``) and the run's frames."""
    policy: PolicyConfig = MISSING
    """The policy's network."""
    train: TrainConfig = MISSING
    """The optimiser's settings."""
    eval: EvalConfig = MISSING
    """The evaluations."""
    checkpoint: CheckpointConfig = MISSING
    """The checkpoints."""
    logger: LoggerConfig = MISSING
    """The loggers."""
    device: str = "cpu"
    """Where training happens: modules, losses, optimisers, replay buffers; each batch is
    moved there once (``cuda``, ``cuda:1``, ``cpu``)."""
    callbacks: list[Any] = field(default_factory=list)
    """The run's callbacks (:mod:`marlkit.train.callbacks`): dotted names or ``{_target_:
    <dotted name>, **arguments}``; ``EarlyStopping`` and ``MetricRatio`` by their bare names."""

    def __post_init__(self) -> None:
        check_int("seed", self.seed, low=0)
        check_int("threads", self.threads, low=1, allow_none=True)
        check_device("device", self.device)
        env = env_config(self.env)
        kind = getattr(self.collector, "kind", "single")
        if env.workers > 1 and kind != "single":
            raise ConfigError(
                f"env.workers ({env.workers}) needs collector.kind=single, got {kind!r}: the "
                "multi-worker collectors already step their envs in worker processes "
                "(collector.num_workers)"
            )
        if env.workers > 1 and env.device not in (None, "cpu"):
            raise ConfigError(
                f"env.workers ({env.workers}) steps CPU envs in worker processes; env.device is "
                f"{env.device!r}: an env on an accelerator steps its batch in one process "
                "(env.workers=1)"
            )


@dataclass
class ActorCriticRunConfig(RunConfig):
    """The actor-critic scripts' keys: a :class:`CriticConfig` too."""

    critic: CriticConfig = MISSING
    """The critic's network."""


# --------------------------------------------------------- losses with soft-updated targets
@dataclass
class TargetLossConfig:
    """``loss`` of a loss with target networks (DDPG, SAC, DQN, QMIX)."""

    gamma: float = MISSING
    """The discount."""
    tau: float = MISSING
    """Soft update of the target networks after every gradient step: ``target += tau *
    (online - target)``."""
    loss_function: str = MISSING
    """The value loss: ``l2``, ``smooth_l1`` or ``l1``."""

    def __post_init__(self) -> None:
        check_fraction("gamma", self.gamma)
        check_fraction("tau", self.tau, strict=True)
        check_choice("loss_function", self.loss_function, ("l2", "smooth_l1", "l1"))


# -------------------------------------------------------------------------- off-policy
@dataclass
class OffPolicyCollectorConfig(CollectorConfig):
    """``collector`` of the off-policy scripts (MADDPG/IDDPG, MASAC/ISAC)."""

    init_random_frames: int = MISSING
    """Frames collected with uniformly random actions first (whole batches)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("init_random_frames", self.init_random_frames, low=0)


@dataclass
class ReplayConfig:
    """``buffer`` of the off-policy scripts: one replay buffer per group."""

    size: int = MISSING
    """Transitions each group's buffer holds (the oldest are overwritten)."""

    def __post_init__(self) -> None:
        check_int("size", self.size, low=1)


@dataclass
class OffPolicyTrainConfig(TrainConfig):
    """``train`` of the off-policy scripts."""

    num_updates: int = MISSING
    """Gradient steps per batch, each on a uniform sample (with replacement)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_updates", self.num_updates, low=1)


@dataclass
class OffPolicyRunConfig(ActorCriticRunConfig):
    """The off-policy actor-critic scripts' keys (MADDPG/IDDPG, MASAC/ISAC)."""

    collector: OffPolicyCollectorConfig = MISSING
    """The collector, with random frames first."""
    buffer: ReplayConfig = MISSING
    """The replay buffers."""
    train: OffPolicyTrainConfig = MISSING
    """The optimiser's settings and the gradient steps per batch."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_not_above(
            "train.minibatch_size",
            self.train.minibatch_size,
            "buffer.size",
            self.buffer.size,
            "a minibatch is drawn from the buffer",
        )


# ---------------------------------------------------------- Q-learning (IQL, QMIX, VDN)
@dataclass
class EpsilonGreedyConfig:
    """``exploration`` of the Q-learning scripts: epsilon-greedy while collecting, greedy in
    evaluation."""

    eps_init: float = MISSING
    """The probability of a random action at the start."""
    eps_end: float = MISSING
    """The probability once annealed."""
    annealing_fraction: float = MISSING
    """eps reaches ``eps_end`` after this fraction of ``collector.total_frames``."""

    def __post_init__(self) -> None:
        check_fraction("eps_init", self.eps_init)
        check_fraction("eps_end", self.eps_end)
        check_real("annealing_fraction", self.annealing_fraction, low=0.0, strict=False)


@dataclass
class QLossConfig(TargetLossConfig):
    """``loss`` of the Q-learning scripts."""

    double_dqn: bool = MISSING
    """The target's action from the online network (argmax), its value from the target
    network; false: both from the target network (TorchRL's default)."""
    standardise_rewards: bool = False
    """Rewards standardised by their running mean and variance over the minibatches trained
    on (EPyMARL's ``standardise_rewards``, on in its QMIX, VDN and IQL configs)."""
    hard_update_interval: int = 0
    """0: the target networks follow the online ones by soft updates (``tau``) after every
    gradient step; N >= 1: they are copies of the online networks refreshed every N gradient
    steps, ``tau`` unused (PyMARL's and EPyMARL's ``target_update_interval``, 200 episodes
    in EPyMARL's QMIX/VDN/IQL, where one gradient step follows each episode)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("hard_update_interval", self.hard_update_interval, low=0)


@dataclass
class BufferConfig:
    """``buffer`` of the Q-learning scripts: one buffer per group, sampled without
    replacement."""

    capacity: int = MISSING
    """Transitions each group's buffer holds (one batch: overwritten by the next)."""

    def __post_init__(self) -> None:
        check_int("capacity", self.capacity, low=1)


@dataclass
class QLearningRunConfig(RunConfig):
    """The keys of :func:`marlkit.train.q_learning.train_q_learning` (IQL, QMIX, VDN); a
    script adds its ``loss`` (a :class:`QLossConfig`)."""

    exploration: EpsilonGreedyConfig = MISSING
    """Epsilon-greedy exploration."""
    buffer: BufferConfig = MISSING
    """The replay buffers."""
    train: EpochsTrainConfig = MISSING
    """The optimiser's settings and the epochs per batch."""
    loss: QLossConfig = MISSING
    """The Q-learning loss."""
    seeds_in_process: int = 1
    """Train this many seeds' runs in this one process (``seed``, ``seed + w``, ...: see
    :func:`marlkit.train.seeds.run_seeds`), their networks stacked, each in
    ``<run_dir>/seed_<s>/`` as its own run would train; 1: one run, in ``run_dir``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("seeds_in_process", self.seeds_in_process, low=1)
        check_not_above(
            "train.minibatch_size",
            self.train.minibatch_size,
            "buffer.capacity",
            self.buffer.capacity,
            "a minibatch is drawn from the buffer",
        )


# ------------------------------------------------------------------------ registration
def register_schema(name: str, schema: type) -> None:
    """Store ``schema`` (a dataclass) in Hydra's ConfigStore as ``name``, the first entry of the
    defaults of a script's YAML file, and register the configs' resolvers
    (:func:`register_resolvers`). A script calls it at import, before ``hydra.main`` composes.
    """
    if not is_dataclass(schema):
        raise TypeError(f"schema must be a dataclass, got {schema!r}")
    config_store = import_optional(
        "hydra.core.config_store", extra="train", purpose="the training scripts' configs"
    )
    config_store.ConfigStore.instance().store(name=name, node=schema)
    register_resolvers()


def check_config(cfg: Any) -> None:
    """Run the range checks (``__post_init__``) of every section of a composed config (a
    ``DictConfig`` of a schema), and refuse the keys a section's dataclass lacks (Hydra lets
    ``+train.lrr=1`` add one); a section's message gets the section's key path.

    Raises:
        ConfigError: the first value out of range, named in full, e.g. ``"train.epochs must be
            an int >= 1, got 0"`` or ``"train.minibatch_size (400) is larger than
            buffer.capacity (50): a minibatch is drawn from the buffer"``.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.merge(
        ...     OmegaConf.structured(EpochsTrainConfig),
        ...     {"minibatch_size": 400, "lr": 3e-4, "max_grad_norm": 1.0, "epochs": 10},
        ... )
        >>> check_config(OmegaConf.create({"train": cfg}))
        >>> cfg.epochs = 0
        >>> check_config(OmegaConf.create({"train": cfg}))
        Traceback (most recent call last):
        ...
        marlkit.train.config.ConfigError: train.epochs must be an int >= 1, got 0
    """
    omegaconf = import_optional("omegaconf", extra="train", purpose="the training scripts")
    _check_node(omegaconf, cfg, "")


def _check_node(omegaconf: Any, node: Any, path: str) -> None:
    """The sections under ``node`` first (with their key paths), then ``node`` itself: a
    parent's checks see children already checked, so what it raises is its own."""
    for key in node:
        child = node._get_node(key)
        if isinstance(child, omegaconf.DictConfig) and not (
            child._is_none() or child._is_missing() or child._is_interpolation()
        ):
            _check_node(omegaconf, child, f"{path}{key}.")
    schema = omegaconf.OmegaConf.get_type(node)
    if isinstance(schema, type) and is_dataclass(schema):
        names = [f.name for f in fields(schema)]
        for key in node:  # added with + on the command line (force_add) past the schema
            if key not in names:
                raise ConfigError(
                    f"{path}{key} is not a key of {schema.__name__} (its keys: {', '.join(names)})"
                )
        try:
            omegaconf.OmegaConf.to_object(node)
        except ConfigError as err:
            # a section's check names its key relative to the section ("epochs must be ...")
            # or, where it names keys of other sections too, in full ("loss.clip_value ...")
            message = str(err)
            raise ConfigError(message if message.startswith(path) else path + message) from None


def env_config(env: Any) -> EnvConfig:
    """The ``env`` section of a config (a mapping while Hydra composes, see
    :attr:`RunConfig.env`) as an :class:`EnvConfig`: its keys and their types checked (as
    OmegaConf checks the other sections while composing), its ranges, the defaults of the keys
    it leaves out (``kwargs``, ``imports``, ``eval_kwargs``, ``actions``).

    Raises:
        ConfigError: a key ``EnvConfig`` does not have, a value of the wrong type or range,
            e.g. ``"env.num_envs: Value 'abc' of type 'str' could not be converted to
            Integer"``, ``"env.num_envs must be an int >= 1, got 0"``.
    """
    omegaconf = import_optional("omegaconf", extra="train", purpose="the training scripts")
    try:
        node = omegaconf.OmegaConf.merge(omegaconf.OmegaConf.structured(EnvConfig), env)
        checked: EnvConfig = omegaconf.OmegaConf.to_object(node)
    except ConfigError as err:
        raise ConfigError(f"env.{err}") from None
    except omegaconf.errors.OmegaConfBaseException as err:
        where = f"env.{err.full_key}" if getattr(err, "full_key", None) else "env"
        raise ConfigError(f"{where}: {str(err).splitlines()[0]}") from None
    return checked


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
