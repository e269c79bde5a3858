"""What every training script of ``sota-implementations/`` does around its algorithm, from its
Hydra config: checks and thread settings, the env factory, the collector, the run folder, the
end of the run, and a trained policy read back from a run folder.

The config these read is a composed config of a :class:`~marlkit.train.config.RunConfig`
schema (``sota-implementations/configs/``): ``seed``, ``threads``, ``run_dir``, ``resume``,
``env`` (an :class:`~marlkit.train.config.EnvConfig`), ``collector.{kind, frames_per_batch,
total_frames, num_workers}``, ``eval.{every, num_envs, video, video_envs, fps, exploration}``,
``checkpoint.{every, keep}``, ``logger.{backends, project}``.
"""

from __future__ import annotations

import functools
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from marlkit._utils import import_optional
from marlkit.collectors import CollectorBase, make_collector
from marlkit.data.exploration import Exploration, set_exploration
from marlkit.envs import EnvBase, InitTracker, ParallelEnv, TransformedEnv
from marlkit.envs.registry import accepted_kwargs
from marlkit.native import set_threads
from marlkit.replay import GroupReplayBuffers, ReplayBuffer, Sampler, TensorStorage
from marlkit.train.builders import make_env
from marlkit.train.callbacks import check_callbacks, make_callbacks
from marlkit.train.checkpoint import Checkpointer
from marlkit.train.config import ConfigError, check_config, env_config
from marlkit.train.run import TrainingRun

__all__ = [
    "EVAL_SEED_OFFSET",
    "env_factory",
    "finish",
    "group_buffers",
    "load_policy",
    "loss_keys",
    "make_config_collector",
    "open_run",
    "start",
    "to_training_device",
]

#: The evaluation envs' seed is the run's seed plus this: apart from the training envs'
#: seeds (``seed``, ``seed + 1``, ...).
EVAL_SEED_OFFSET = 10_000


def _plain(node: Any) -> Any:
    """A config node as plain containers (resolved), whatever its kind."""
    omegaconf = import_optional("omegaconf", extra="train", purpose="the training scripts")
    if isinstance(node, omegaconf.Container):
        return omegaconf.OmegaConf.to_container(node, resolve=True)
    return node


def start(cfg: Any) -> Callable[[], EnvBase]:
    """Check the ranges of ``cfg``, a config composed into a script's schema (Hydra checked its
    types; :func:`~marlkit.train.config.check_config`), set the threads (``threads``: torch's
    and the native kernels'; null: the defaults) and seed torch (``seed``); returns the factory
    of the training envs.

    Raises:
        ConfigError: the first key whose value is out of range, named in full; a device this
            machine lacks (``device=cuda`` without CUDA); a callback that does not resolve or
            whose arguments do not fit it.
    """
    check_config(cfg)
    check_callbacks(_plain(cfg.get("callbacks", [])))
    set_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    return env_factory(cfg, cfg.env.num_envs, cfg.seed)


def env_factory(
    cfg: Any, num_envs: int, seed: int, *, evaluation: bool = False
) -> Callable[[], EnvBase]:
    """A picklable factory of the configured env (``make_episodic``: episodes cut at
    ``env.max_steps``, rewards summed, the actions of ``env.actions`` asked for and checked;
    then the observation transforms of ``env.transforms``: :func:`.builders.make_env`);
    the evaluation env adds ``env.eval_kwargs``. With ``model.memory`` other than ``none`` (a
    network with memory), an :class:`~marlkit.envs.InitTracker` flags episode starts.

    ``env.max_steps`` is the one episode length of a config: it cuts the episodes and sets
    how long an evaluation runs. The factory's own arguments (``num_envs``, ``max_steps``,
    ``seed``, ``imports``, ``actions``, ``transforms``) cannot also come from ``env.kwargs`` or
    ``env.eval_kwargs``; an env's own ``max_steps`` keeps its default (set ``env.max_steps``
    at or below it).

    Raises:
        ConfigError: ``env.kwargs`` or ``env.eval_kwargs`` sets one of those arguments; the
            message names both keys (``env.kwargs.max_steps`` and ``env.max_steps``).
    """
    env = env_config(_plain(cfg.env))
    for section, given in (("kwargs", env.kwargs), ("eval_kwargs", env.eval_kwargs)):
        _refuse_own_arguments(section, given)
    kwargs = {**env.kwargs, **(env.eval_kwargs if evaluation else {})}
    kwargs.update(_env_device(env.name, env.device, kwargs))
    make: Callable[..., TransformedEnv] = make_env  # make_episodic, then env.transforms
    if str(_plain(cfg).get("model", {}).get("memory", "none")) != "none":
        make = functools.partial(_flag_episode_starts, make_env)
    workers = 1 if evaluation else env.workers
    one = functools.partial(
        make,
        env.name,
        transforms=list(env.transforms),
        num_envs=num_envs // workers,
        max_steps=env.max_steps,
        seed=seed if workers == 1 else None,  # the workers: seeded together below
        imports=list(env.imports),
        actions=env.actions,  # checked by EnvConfig
        **kwargs,
    )
    if workers == 1:
        return one
    return functools.partial(_parallel_envs, workers, one, seed)


def _parallel_envs(workers: int, make: Callable[[], EnvBase], seed: int) -> ParallelEnv:
    """``env.workers`` processes of ``make()`` each, seeded from ``seed`` in a chain (worker
    ``i`` takes the seeds after worker ``i - 1``'s): the seeds one env of all their envs
    takes."""
    env = ParallelEnv(workers, make)
    env.set_seed(seed)
    return env


#: The env factory's own arguments and the config keys that set them.
_OWN_ARGUMENTS = {
    "num_envs": "env.num_envs (eval.num_envs for the evaluation env)",
    "max_steps": "env.max_steps",
    "seed": "seed",
    "imports": "env.imports",
    "actions": "env.actions",
    "transforms": "env.transforms",
}


def _refuse_own_arguments(section: str, kwargs: Mapping[str, Any]) -> None:
    """Refuse an entry of ``env.<section>`` that :func:`env_factory` sets from another key."""
    for name, key in _OWN_ARGUMENTS.items():
        if name in kwargs:
            extra = (
                " (the episode length: episodes are cut there and evaluations run that many "
                "steps); an env's own max_steps keeps its default, so keep env.max_steps at or "
                "below it"
                if name == "max_steps"
                else ""
            )
            raise ConfigError(
                f"env.{section}.{name} ({kwargs[name]!r}) collides with {key}: set it with "
                f"{key} only{extra}"
            )


def _env_device(name: str, device: str | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The ``device`` keyword argument that puts env ``name`` on ``env.device`` (``{}`` for
    null, or for ``cpu`` with an env that takes no device: it runs there anyway).

    Raises:
        ConfigError: ``env.device`` other than ``cpu`` for an env that takes no ``device``, or
            an ``env.kwargs.device`` that says otherwise.
    """
    if device is None:
        return {}
    given = kwargs.get("device")
    if given is not None and torch.device(str(given)) != torch.device(device):
        raise ConfigError(
            f"env.device={device} and env.kwargs.device={given} disagree: set env.device only"
        )
    accepted = accepted_kwargs(name)
    if accepted is not None and "device" not in accepted:
        if torch.device(device).type == "cpu":
            return {}
        raise ConfigError(
            f"env.device={device}: env {name!r} takes no device argument (it simulates on the "
            "cpu): leave env.device out (device=cuda still trains on the GPU, each batch moved "
            "there once)"
        )
    return {"device": device}


def to_training_device(cfg: Any, *modules: torch.nn.Module) -> torch.device:
    """Move ``modules`` (the policy, the losses with their networks and targets; before their
    optimisers are built) to the config's training ``device`` (``cpu`` for a config without
    one); returns it. The tensors of probabilistic modules' ``distribution_kwargs`` (a
    ``TanhNormal``'s per-agent bounds) go too: ``nn.Module.to`` does not see them."""
    device = torch.device(str(cfg.get("device", "cpu")))
    for module in modules:
        module.to(device)
        for sub in module.modules():
            fixed = getattr(sub, "distribution_kwargs", None)
            if isinstance(fixed, dict):
                for name, value in fixed.items():
                    if isinstance(value, torch.Tensor):
                        fixed[name] = value.to(device)
    return device


def _flag_episode_starts(
    make: Callable[..., TransformedEnv], *args: Any, **kwargs: Any
) -> TransformedEnv:
    """``make(*args, **kwargs)`` with an ``InitTracker`` appended (``"is_init"``, which
    recurrent modules read to zero their state)."""
    env = make(*args, **kwargs)
    return env.append_transform(InitTracker())


def make_config_collector(
    cfg: Any, env: EnvBase, env_fn: Callable[[], EnvBase], policy: Any, **kwargs: Any
) -> CollectorBase:
    """The collector of ``collector.kind`` (``single`` steps ``env``; the others make their
    envs with ``env_fn`` in their workers), seeded with ``seed``, its policy on
    ``collector.device`` (null: the policy's device); ``kwargs`` go to it
    (``init_random_frames``, ...)."""
    kind = cfg.collector.kind
    source: Any = env if kind == "single" else env_fn  # the single collector takes an env too
    return make_collector(
        kind,
        source,
        policy,
        cfg.collector.frames_per_batch,
        cfg.collector.total_frames,
        num_workers=cfg.collector.num_workers,
        seed=cfg.seed,
        **({"device": device} if (device := cfg.collector.get("device")) is not None else {}),
        **kwargs,
    )


def group_buffers(
    groups: Sequence[str], capacity: int, sampler: Callable[[], Sampler], batch_size: int
) -> GroupReplayBuffers:
    """One :class:`ReplayBuffer` per group: ``capacity`` items in memory, a new ``sampler()``
    each, samples of ``batch_size``."""
    return GroupReplayBuffers(
        groups, lambda g: ReplayBuffer(TensorStorage(capacity), sampler(), batch_size=batch_size)
    )


def loss_keys(losses: Iterable[Any]) -> list[Any]:
    """The keys the ``losses`` read (their ``in_keys``, in order, once each): what a buffer
    stores of a batch (``batch.select(*keys, strict=False)``: optional keys, masks or
    per-agent rewards, kept where the env has them; not the simulator's info, episode
    statistics or the policy's outputs that the losses recompute)."""
    return list(dict.fromkeys(key for loss in losses for key in loss.in_keys))


def open_run(cfg: Any) -> TrainingRun:
    """The :class:`TrainingRun` of the config: its folder (``run_dir``; ``resume`` goes on with
    it), the evaluation env (``eval.num_envs`` envs with ``env.eval_kwargs``, seeded apart from
    the training envs, the same episodes at every evaluation), the evaluation, checkpoint and
    logger settings, the config itself (saved with each checkpoint), the training ``device``
    (each batch moved there once) and the ``callbacks``."""
    eval_seed = cfg.seed + EVAL_SEED_OFFSET
    return TrainingRun(
        cfg.run_dir,
        resume=cfg.resume,
        eval_env=env_factory(cfg, cfg.eval.num_envs, eval_seed, evaluation=True)(),
        eval_seed=eval_seed,
        eval_steps=cfg.env.max_steps,
        eval_every=cfg.eval.every,
        eval_exploration=cfg.eval.exploration,
        video=cfg.eval.video,
        video_envs=cfg.eval.video_envs,
        fps=cfg.eval.fps,
        checkpoint_every=cfg.checkpoint.every,
        keep=cfg.checkpoint.keep,
        backends=_plain(cfg.logger)["backends"],
        project=cfg.logger.project,
        config=_plain(cfg),
        device=str(cfg.get("device", "cpu")),
        callbacks=make_callbacks(_plain(cfg.get("callbacks", []))),
    )


def finish(
    run: TrainingRun, policy: Any, collector: CollectorBase, info: Mapping[str, Any]
) -> list[str]:
    """End the run: its summary (the trained policy next to a random one, the curve, the
    video, ``summary.json``) with ``info`` and the frames collected, then shut the collector
    and the evaluation env down. Returns the lines to print."""
    import json

    summary = run.finish(policy, info={**info, "frames": collector.frames})
    collector.shutdown()
    run.eval_env.close()
    sampled = summary.get("trained_random")  # eval.exploration=both
    return [
        f"{json.dumps(summary['trained'])} random: {json.dumps(summary['random'])}",
        *([f"sampling its actions: {json.dumps(sampled)}"] if sampled is not None else []),
        f"outputs in {run.run_dir}/ ({', '.join(summary['files'])})",
    ]


def load_policy(
    run_dir: str | os.PathLike[str],
    env: EnvBase,
    build: Callable[[EnvBase, Any], torch.nn.Module],
    exploration: Exploration = "deterministic",
) -> torch.nn.Module:
    """The policy of the run in ``run_dir`` (its latest checkpoint's ``"policy"``), for
    ``env`` (an env of the run's kind; its batch size may differ): ``build(env, cfg)`` makes
    the script's policy from the checkpoint's config, which then takes the saved weights.
    Every call runs with ``exploration`` (``"deterministic"``: the greedy or mean action;
    ``"random"``: sampled, as while collecting).

    Raises:
        FileNotFoundError: no checkpoint in ``run_dir``.
        KeyError: a checkpoint without a policy (written before marlkit saved one).
        ValueError: ``env`` is not of the run's kind; the message names the run's env and its
            keyword arguments.
    """
    omegaconf = import_optional("omegaconf", extra="train", purpose="a run's config")
    state = Checkpointer(pathlib.Path(run_dir) / "checkpoints").load(map_location="cpu")
    if "policy" not in state:
        raise KeyError(
            f"the checkpoint of {str(run_dir)!r} holds no 'policy' (it holds {sorted(state)}): "
            "it was written before marlkit saved policies; resume the run for one iteration "
            "to write one"
        )
    cfg = omegaconf.OmegaConf.create(state["config"])
    policy = build(env, cfg)
    try:
        policy.load_state_dict(state["policy"])
    except RuntimeError as err:  # other groups or sizes: another env
        transforms = _plain(cfg.env.get("transforms", []))
        wrapped = (
            f" and the observation transforms {transforms} (env.transforms: "
            "marlkit.train.builders.make_env(name, transforms=...) applies them)"
            if transforms
            else ""
        )
        raise ValueError(
            f"the run in {str(run_dir)!r} trained on {cfg.env.name} with "
            f"{_plain(cfg.env.get('kwargs', {}))} (env.kwargs of its config){wrapped}: make the "
            "env with those; "
            f"this one does not fit its policy ({str(err).splitlines()[-1].strip()})"
        ) from None
    return set_exploration(exploration)(policy)
