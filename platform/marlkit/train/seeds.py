"""Many seeds in one process (``seeds_in_process=K``): ``K`` independent runs of a training
script trained together, each as it would train alone.

* **seeds**: the ``K`` runs' seeds are :func:`run_seeds`: ``seed, seed + w, seed + 2w, ...``
  with ``w`` the seeds one run's env takes (``env.num_envs`` for the Python adapters, whose
  instances are seeded ``seed + i``; 1 for the batched simulators), so that no two of the
  ``K`` runs' envs share a seed, as marlkit's batched envs chain theirs;
* **networks**: each seed's policy and critics are built under ``torch.manual_seed`` of its
  seed, exactly as its own run builds them, then stacked on a leading seed dim
  (:func:`marlkit.modules.seeds.stack_seeds`: one batched matmul per layer for every seed);
* **envs**: one env per seed (seeded as its own run's), stepped together as a
  :class:`~marlkit.envs.SerialEnv` (batch ``[K, num_envs]``); each seed's actions are drawn on
  its own random stream (:func:`~marlkit.modules.seeds.seedwise_sampling`), started where its
  own run's collector starts it;
* **updates**: one replay buffer per seed and group, each sampled by the sampler its own run
  would have (same seed), the minibatches stacked ``[K, minibatch]``; the losses keep the seed
  dim (``ClipPPOLoss``, ``QMixerLoss``, ``DQNLoss`` with ``separate_dims=1``) and their sum
  over the seeds is back-propagated, so each seed's parameters get the gradient of its own
  loss; :func:`clip_grad_norm_per_seed_` clips each seed's gradient norm on its own; Adam is
  elementwise, so one Adam over the stacked parameters keeps, in each seed's slices, the state
  that seed's own Adam would have; so are soft target updates (each seed's targets follow its
  own networks); the steps are :func:`~marlkit.train.gradient_steps`' loop;
* **runs**: :class:`SeedRuns`, one :class:`~marlkit.train.TrainingRun` per seed in
  ``<run_dir>/seed_<s>/`` (its own metrics, evaluations, checkpoints and summary, its config
  saying ``seed=<s>``): each seed's folder is a run folder as its own run would leave, which
  :func:`~marlkit.train.scripts.load_policy` reads; its checkpoints hold its share of the
  stacked state (:class:`SeedState`), and together they resume the stack.

A seed alone and the same seed inside a stack take the same first updates (tested; within
float rounding: the stacked layers run ``baddbmm`` where one network runs ``addmm``); later
they drift apart by rounding only, so the runs are identical in distribution.
"""

from __future__ import annotations

import functools
import json
import pathlib
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, cast

import torch
from tensordict import TensorDictBase
from torch import nn

from marlkit._utils import import_optional
from marlkit.collectors import CollectorBase, make_collector
from marlkit.collectors._base import seed_rngs
from marlkit.data._fast import stack_tensordicts
from marlkit.envs import EnvBase, SerialEnv
from marlkit.modules.seeds import SeedStreams, copy_seed_, seed_parameters
from marlkit.objectives import TargetNetUpdater
from marlkit.objectives.standardise import SeedRewardStandardiser
from marlkit.replay import (
    GroupReplayBuffers,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorStorage,
)
from marlkit.train.config import ConfigError
from marlkit.train.run import TrainingRun
from marlkit.train.scripts import env_factory
from marlkit.train.updates import Losses, _total, gradient_step_terms

__all__ = [
    "SEEDS_KEY",
    "SeedBuffers",
    "SeedRewardStatistics",
    "SeedRuns",
    "SeedSplit",
    "SeedState",
    "check_seeds_config",
    "clip_grad_norm_per_seed_",
    "collector_streams",
    "one_env_for_seeds",
    "run_seeds",
    "seed_config",
    "seed_env",
    "seed_gradient_steps",
    "seed_standardisers",
    "seed_width",
    "stack_collector",
    "update_seed_groups",
]

#: The config key.
SEEDS_KEY = "seeds_in_process"


def check_seeds_config(cfg: Any) -> int:
    """``seeds_in_process`` of a script's config, checked against the options a stack of seeds
    does not support yet; returns it (1: one seed, the script's usual run).

    Raises:
        ConfigError: ``seeds_in_process`` below 1 or not an int; with more than one, any of
            ``collector.kind`` other than ``single``, ``callbacks``, ``device``,
            ``env.device`` or ``collector.device`` other than ``cpu``, ``env.workers``
            other than 1,
            ``train.precision=bf16``, ``train.compile``, ``model.memory`` other than
            ``none``, ``model.kind`` other than ``mlp`` (each named with its value).
    """
    k = cfg.get(SEEDS_KEY, 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"{SEEDS_KEY} must be an int >= 1, got {k!r}")
    if k == 1:
        return k
    model = cfg.get("model") or {}
    train = cfg.get("train") or {}
    collector = cfg.get("collector") or {}
    env = cfg.get("env") or {}
    refused = [
        ("collector.kind", collector.get("kind", "single"), "single"),
        ("env.workers", env.get("workers", 1), 1),
        ("device", str(cfg.get("device", "cpu")), "cpu"),
        ("env.device", str(env.get("device") or "cpu"), "cpu"),
        ("collector.device", str(collector.get("device") or "cpu"), "cpu"),
        ("train.precision", train.get("precision", "fp32"), "fp32"),
        ("train.compile", bool(train.get("compile", False)), False),
        ("model.memory", model.get("memory", "none"), "none"),
        ("model.kind", model.get("kind", "mlp"), "mlp"),
    ]
    for key, value, supported in refused:
        if value != supported:
            raise ConfigError(
                f"{SEEDS_KEY}={k} does not support {key}={value} yet (only {key}={supported}): "
                f"run the seeds as separate runs, or leave {key} at {supported}"
            )
    if list(cfg.get("callbacks") or []):
        raise ConfigError(
            f"{SEEDS_KEY}={k} does not support callbacks yet (a callback stopping one seed "
            "would stop a slice of a stack): run the seeds as separate runs"
        )
    return k


def seed_config(cfg: Any, seed: int) -> Any:
    """The config of seed ``seed``'s run in a stack: ``cfg`` (resolved) with ``seed``, and
    ``run_dir`` and ``resume`` (when set) the folder ``seed_<seed>`` inside theirs."""
    omegaconf = import_optional("omegaconf", extra="train", purpose="the training scripts")
    plain = omegaconf.OmegaConf.to_container(cfg, resolve=True)
    plain["seed"] = seed
    plain["run_dir"] = str(pathlib.Path(plain["run_dir"]) / f"seed_{seed}")
    if plain.get("resume") is not None:
        plain["resume"] = str(pathlib.Path(plain["resume"]) / f"seed_{seed}")
    return omegaconf.OmegaConf.create(plain)


def seed_width(env: EnvBase) -> int:
    """How many seeds ``env`` (seeded) took: its ``seed_range``'s width (1 when unknown)."""
    seeds = env.seed_range
    return 1 if seeds is None else max(1, seeds[1] - seeds[0])


def run_seeds(seed: int, n_seeds: int, width: int) -> list[int]:
    """The ``n_seeds`` runs' seeds: ``seed + k * width`` (``width``: :func:`seed_width` of the
    first run's env), so that no two runs' envs share a seed."""
    return [seed + k * width for k in range(n_seeds)]


def collector_streams(seeds: Sequence[int]) -> SeedStreams:
    """Each seed's random stream where its own run's collector starts it
    (:meth:`~marlkit.collectors.CollectorBase.set_seed`: seeded from the run's seed); the
    global generators are left as they were."""
    states = []
    with torch.random.fork_rng(devices=[]):
        for seed in seeds:
            seed_rngs(seed)
            states.append(torch.get_rng_state())
    return SeedStreams(states)


def seed_env(envs: Sequence[EnvBase]) -> SerialEnv:
    """The seeds' envs (seed ``k``'s at index ``k``, each made and seeded as its own run makes
    it) stepped together: batch ``[K, *env.batch_size]``. Their seed ranges follow one another
    (:func:`run_seeds`), so :meth:`~marlkit.envs.SerialEnv.set_seed` of the first seed gives
    each its own again."""
    return SerialEnv(len(envs), [lambda env=env: env for env in envs])


def stack_collector(
    cfg: Any, envs: Sequence[EnvBase], seeds: Sequence[int], policy: nn.Module
) -> tuple[CollectorBase, bool]:
    """The single collector of a stack of seeds' ``policy`` (of :func:`stack_seeds`), each
    seed's frames per batch and total frames those of ``cfg.collector``, and whether its
    batches are ``[K * n, T]`` (``split``, for :class:`SeedRuns`).

    ``envs`` are the seeds' envs, each made and seeded as its own run makes it: stepped
    together as a :func:`seed_env` (batch ``[K, num_envs]``), or, for the Python adapters
    (:func:`one_env_for_seeds`), closed and made again as one env of ``K * num_envs``
    instances seeded with the first seed, which gives each seed's instances their own seeds
    (the policy then reads it through :class:`SeedSplit`)."""
    n_seeds = len(seeds)
    split = one_env_for_seeds(envs[0])
    if split:
        for env in envs:
            env.close()
        stack_env: EnvBase = env_factory(cfg, n_seeds * cfg.env.num_envs, seeds[0])()
    else:
        stack_env = seed_env(envs)  # [K, num_envs], each env seeded as its run's
    source: Any = stack_env  # the single collector steps an env it is given
    collector = make_collector(
        "single",
        source,
        SeedSplit(policy, n_seeds) if split else policy,
        n_seeds * cfg.collector.frames_per_batch,
        n_seeds * cfg.collector.total_frames,
        seed=cfg.seed,
    )
    return collector, split


def _seed_buffer(make: Callable[[int], ReplayBuffer], seed: int, group: str) -> ReplayBuffer:
    return make(seed)


def one_env_for_seeds(env: EnvBase) -> bool:
    """Whether the seeds' envs can be one env of ``K * num_envs`` entries seeded with the first
    seed: ``env`` (through its transforms) is a batch of separate simulators seeded ``seed +
    index`` (``seeded_per_instance``: the Python adapters), so entries ``k * n`` to
    ``(k + 1) * n - 1`` of it are seed ``k``'s ``n`` envs, seeded as its own run seeds them
    (:func:`run_seeds` spaces the seeds by ``n``). It saves the per-call cost of ``K`` envs."""
    while True:
        if getattr(type(env), "seeded_per_instance", False):
            return True
        inner = getattr(env, "base_env", None)
        if not isinstance(inner, EnvBase):
            return False
        env = inner


class SeedSplit(nn.Module):
    """A stacked policy (:func:`~marlkit.modules.seeds.stack_seeds`) acting in one env of the
    ``K`` seeds' envs side by side (:func:`one_env_for_seeds`): each call reads the root
    ``[K * n, ...]`` as ``[K, n, ...]`` and writes the policy's outputs back into it."""

    def __init__(self, policy: nn.Module, n_seeds: int):
        super().__init__()
        self.policy, self.n_seeds = policy, n_seeds

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        shape = tensordict.batch_size
        inner = tensordict.reshape(self.n_seeds, -1, *shape[1:])
        out = self.policy(inner)
        return tensordict.update(out.reshape(shape))


class SeedBuffers:
    """One replay buffer per seed and group, each with the sampler its seed's own run has
    (:class:`~marlkit.replay.SamplerWithoutReplacement` seeded with the seed); minibatches are
    the seeds' samples stacked ``[K, batch_size]``.

    Args:
        groups: the agent groups.
        seeds: the runs' seeds.
        capacity: items per buffer (one seed's batch).
        batch_size: items of each seed's minibatch.
    """

    def __init__(self, groups: Sequence[str], seeds: Sequence[int], capacity: int, batch_size: int):
        self.seeds = list(seeds)

        def buffer(seed: int) -> ReplayBuffer:
            sampler = SamplerWithoutReplacement(seed=seed)
            return ReplayBuffer(TensorStorage(capacity), sampler, batch_size=batch_size)

        self.buffers = [
            GroupReplayBuffers(groups, functools.partial(_seed_buffer, buffer, seed))
            for seed in self.seeds
        ]

    def empty(self) -> None:
        for buffers in self.buffers:
            buffers.empty()

    def extend(self, data: TensorDictBase) -> None:
        """Seed ``k``'s items ``data[k]`` (flattened) into seed ``k``'s buffers."""
        for k, buffers in enumerate(self.buffers):
            buffers.extend(data[k].reshape(-1))

    def sampler(self, group: str) -> Callable[[], TensorDictBase]:
        """The stacked minibatches of ``group``: ``[K, batch_size]``."""
        parts = [buffers[group] for buffers in self.buffers]
        return lambda: stack_tensordicts([part.sample() for part in parts], 0)

    def state_dict(self) -> dict[str, Any]:
        return {"samplers": [b.state_dict() for b in self.buffers]}


def clip_grad_norm_per_seed_(
    params: Sequence[torch.Tensor], n_seeds: int, max_norm: float
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for each seed on its own: the gradients of
    seed-stacked ``params`` (seed-major on their first dim) scaled so that each seed's norm is
    at most ``max_norm``. Returns each seed's norm before clipping, ``[K]``."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(n_seeds)
    norms = torch.stack(
        [
            torch.linalg.vector_norm(g.detach().unflatten(0, (n_seeds, -1)).flatten(1), dim=1)
            for g in grads
        ]
    )  # [params, K]
    total = torch.linalg.vector_norm(norms, dim=0)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.detach().unflatten(0, (n_seeds, -1)).mul_(coef.view(n_seeds, *([1] * g.dim())))
    return total


def seed_gradient_steps(
    loss: Callable[[TensorDictBase], TensorDictBase],
    optim: torch.optim.Optimizer,
    sample: Callable[[], TensorDictBase],
    steps: int,
    *,
    n_seeds: int,
    max_grad_norm: float,
    objective: Callable[[TensorDictBase], torch.Tensor],
    after_step: Callable[[], Any] | None = None,
) -> list[dict[str, float]]:
    """:func:`~marlkit.train.gradient_steps` of a stack of seeds (the same loop,
    :func:`~marlkit.train.updates.gradient_step_terms`): ``loss`` returns terms with the seed
    dim (``[K]``), their ``objective`` summed over the seeds is back-propagated, each seed's
    gradient is clipped on its own (:func:`clip_grad_norm_per_seed_`), ``optim`` steps and
    ``after_step`` (the seeds' target updates) is called. Returns, per seed, the last step's
    terms and ``"grad_norm"``."""
    terms = gradient_step_terms(
        loss,
        optim,
        sample,
        steps,
        clip=lambda params: clip_grad_norm_per_seed_(params, n_seeds, max_grad_norm),
        objective=objective,
        after_step=after_step,
    )
    out: list[dict[str, float]] = [{} for _ in range(n_seeds)]
    for name, value in terms.items():
        for k, v in enumerate(value.tolist()):
            out[k][name] = v
    return out


def update_seed_groups(
    losses: Losses,
    optims: Mapping[str, torch.optim.Optimizer],
    buffers: SeedBuffers,
    steps: int,
    *,
    max_grad_norm: float,
    objective: Callable[[TensorDictBase], torch.Tensor] = _total,
    updaters: Mapping[str, TargetNetUpdater] | None = None,
) -> list[dict[str, float]]:
    """:func:`seed_gradient_steps` of each group's loss on its stacked samples, the group's
    target update (``updaters[group].step``: elementwise, so each seed's targets move towards
    its own networks) after each of its steps; per seed, ``{"train/<group>/<term>": value}``
    as :func:`~marlkit.train.update_groups` gives one run."""
    n_seeds = len(buffers.seeds)
    metrics: list[dict[str, float]] = [{} for _ in range(n_seeds)]
    for group, loss in losses.items():
        per_seed = seed_gradient_steps(
            loss,
            optims[group],
            buffers.sampler(group),
            steps,
            n_seeds=n_seeds,
            max_grad_norm=max_grad_norm,
            objective=objective,
            after_step=None if updaters is None else updaters[group].step,
        )
        for k, terms in enumerate(per_seed):
            metrics[k].update({f"train/{group}/{name}": v for name, v in terms.items()})
    return metrics


def _seed_slice(value: torch.Tensor, like: torch.Tensor, n_seeds: int, k: int) -> torch.Tensor:
    """Seed ``k``'s slice of ``value`` when it is shaped as the parameter ``like``, else
    ``value`` (a step count)."""
    if value.shape == like.shape and value.dim() > 0:
        return value.detach().unflatten(0, (n_seeds, -1))[k].clone()
    return value.detach().clone()


def seed_standardisers(
    keys: Mapping[str, Sequence[Any]], n_seeds: int
) -> dict[str, SeedRewardStandardiser]:
    """``loss.standardise_rewards`` for a stack: per group (``keys``: its reward entries), a
    :class:`~marlkit.objectives.standardise.SeedRewardStandardiser` keeping each seed's running
    statistics of its own rewards, as its own run's standardiser would."""
    return {g: SeedRewardStandardiser(list(k), n_seeds) for g, k in keys.items()}


class SeedRewardStatistics:
    """Seed ``k``'s share of a stack's reward standardisers (:func:`seed_standardisers`), a
    checkpoint part of its run in the layout a lone run saves (``{group}.stats.mean``, ...:
    a ``ModuleDict`` of :class:`~marlkit.objectives.standardise.RewardStandardiser`)."""

    def __init__(self, standardisers: Mapping[str, SeedRewardStandardiser], k: int):
        self.standardisers, self.k = standardisers, k

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            f"{g}.{name}": value
            for g, s in self.standardisers.items()
            for name, value in s.seed_state_dict(self.k).items()
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for g, s in self.standardisers.items():
            prefix = f"{g}."
            s.load_seed_state_dict(
                self.k, {n[len(prefix) :]: v for n, v in state.items() if n.startswith(prefix)}
            )


class SeedState:
    """Seed ``k``'s share of a stack's training state, a checkpoint part (``state_dict`` /
    ``load_state_dict``) of seed ``k``'s run: its slices of the stacked modules' parameters and
    of their optimisers' state, and its random stream.

    Args:
        k: the seed's index in the stack.
        modules: the stacked modules (``{name: module}``, e.g. each group's loss).
        optims: ``{name: optimiser}`` over those modules' parameters (one per group).
        streams: the seeds' random streams.
    """

    def __init__(
        self,
        k: int,
        modules: Losses,
        optims: Mapping[str, torch.optim.Optimizer],
        streams: SeedStreams,
    ):
        self.k, self.modules, self.optims, self.streams = k, modules, optims, streams
        self.n_seeds = streams.n_seeds
        for module in modules.values():
            seed_parameters(module)  # each seed-major on its first dim

    def state_dict(self) -> dict[str, Any]:
        k, n = self.k, self.n_seeds
        params = {
            name: {pname: _seed_slice(p, p, n, k) for pname, p in module.named_parameters()}
            for name, module in self.modules.items()
        }
        optims = {}
        for name, optim in self.optims.items():
            optims[name] = [
                {key: _seed_slice(v, p, n, k) for key, v in optim.state[p].items()}
                if p in optim.state
                else {}
                for group in optim.param_groups
                for p in group["params"]
            ]
        return {"params": params, "optims": optims, "stream": self.streams.states[k].clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        k, n = self.k, self.n_seeds
        with torch.no_grad():
            for name, module in self.modules.items():
                saved = state["params"][name]
                for pname, p in module.named_parameters():
                    p.unflatten(0, (n, -1))[k].copy_(saved[pname])
        for name, optim in self.optims.items():
            params = [p for group in optim.param_groups for p in group["params"]]
            for p, saved in zip(params, state["optims"][name], strict=True):
                if not saved:
                    continue
                current = optim.state.setdefault(p, {})
                for key, value in saved.items():
                    if value.dim() > 0:
                        if key not in current:
                            current[key] = torch.zeros_like(p)
                        current[key].unflatten(0, (n, -1))[k].copy_(value)
                    else:  # the step count: every seed steps together
                        current[key] = value.clone().to(p.device)
        self.streams.states[k] = state["stream"].clone()


class _Feed:
    """What :meth:`TrainingRun.batches` reads of a collector, for one seed of a stack: its
    share of the frames, and the batch the stack's collector gave (set before each step)."""

    def __init__(self, collector: CollectorBase, n_seeds: int):
        self._collector, self._n = collector, n_seeds
        self.batch: TensorDictBase | None = None
        self.num_batches = getattr(collector, "num_batches", None)
        self.frames_per_batch = collector.frames_per_batch // n_seeds
        total = collector.total_frames
        self.total_frames = total // n_seeds if total > 0 else total

    @property
    def frames(self) -> int:
        return self._collector.frames // self._n

    def __iter__(self) -> Iterator[TensorDictBase]:
        while self.batch is not None:
            yield self.batch


class SeedRuns:
    """The ``K`` seeds' :class:`~marlkit.train.TrainingRun` objects, fed by the stack's
    collector: each seed's run sees its slice of every batch (``batch[k]``) and logs,
    evaluates, checkpoints and summarises as its own run would, in its own folder.

    Each run's ``collection_time``/``training_time`` are the stack's (the seeds are collected
    and trained together), so its ``frames_per_s`` is its own frames per second of the stack's
    wall time.

    Args:
        runs: seed ``k``'s run at index ``k``, each made with its seed's config.
        collector: the stack's collector (batches ``[K, *env_batch, T]``).
        states: each seed's checkpoint part (:class:`SeedState`).
        policies: each seed's plain policy (evaluated, and saved as its checkpoint's
            ``"policy"``); :meth:`end_iteration` copies the stack's weights into them first.
        stacked_policy: the stack's policy (:func:`~marlkit.modules.seeds.stack_seeds` of
            ``policies``), whose slices the plain policies get.
        split: the collector's batches are ``[K * n, T]`` (one env for every seed:
            :func:`one_env_for_seeds`): :meth:`batches` yields them as ``[K, n, T]``.
        parts: per seed, more checkpoint parts of its run (``{name: part}``, as
            :meth:`~marlkit.train.TrainingRun.track`'s: the exploration's schedule, say).
        buffers: per seed, its replay buffers saved with its checkpoints (``{name: buffer}``).
    """

    def __init__(
        self,
        runs: Sequence[TrainingRun],
        collector: CollectorBase,
        states: Sequence[SeedState],
        policies: Sequence[nn.Module],
        stacked_policy: nn.Module,
        split: bool = False,
        parts: Sequence[Mapping[str, Any]] | None = None,
        buffers: Sequence[Mapping[str, Any]] | None = None,
    ):
        self.runs, self.collector, self.split = list(runs), collector, split
        self.policies, self.stacked_policy = list(policies), stacked_policy
        self.n_seeds = len(self.runs)
        more = list(parts) if parts is not None else [{} for _ in self.runs]
        saved = list(buffers) if buffers is not None else [None for _ in self.runs]
        for run, state, policy, own, replay in zip(
            self.runs, states, self.policies, more, saved, strict=True
        ):
            run.track({"seed": state, "collector": collector, **own}, buffers=replay, policy=policy)

    def restore(self) -> None:
        """Restore every seed's run (its share of the stack) from its latest checkpoint.

        Raises:
            RuntimeError: the seeds' latest checkpoints are of different iterations (a process
                killed between two seeds' checkpoints): the message names them.
        """
        for run in self.runs:
            run.restore()
        iterations = {run.run_dir.name: run.iteration for run in self.runs}
        if len(set(iterations.values())) > 1:
            raise RuntimeError(
                f"the seeds' checkpoints are of different iterations ({iterations}): the stack "
                "resumes only from one iteration of every seed; delete the later checkpoints "
                "(checkpoints/step-<n>) so that each seed's latest is the same"
            )

    def batches(self) -> Iterator[TensorDictBase]:
        """The collector's batches ``[K, ...]``, each seed's slice shown to its run first."""
        feeds = [_Feed(self.collector, self.n_seeds) for _ in self.runs]
        iterators = [
            cast(Generator[TensorDictBase, None, None], run.batches(feed))
            for run, feed in zip(self.runs, feeds, strict=True)
        ]
        try:
            started = time.perf_counter()
            for batch in self.collector:
                came = time.perf_counter()
                if self.split:  # [K * n, T] -> [K, n, T]
                    batch = batch.reshape(self.n_seeds, -1, *batch.batch_size[1:])
                for k, (run, feed, it) in enumerate(zip(self.runs, feeds, iterators)):
                    feed.batch = batch[k]
                    next(it)
                    # the stack's times (the runs' own clocks see only their turn)
                    run._collection_time, run._batch_came = came - started, came
                yield batch
                started = time.perf_counter()
        finally:
            for feed, it in zip(feeds, iterators):
                feed.batch = None
                it.close()

    def end_iteration(
        self, batch: TensorDictBase, metrics: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Each seed's :meth:`~marlkit.train.TrainingRun.end_iteration` with its slice of
        ``batch``, its ``metrics`` and its plain policy (given the stack's weights first)."""
        outs = []
        for k, run in enumerate(self.runs):
            self._sync(k)
            outs.append(
                run.end_iteration(
                    batch[k], metrics[k], policy=self.policies[k], frames=self._frames()
                )
            )
        return outs

    def _frames(self) -> int:
        return self.collector.frames // self.n_seeds

    def _sync(self, k: int) -> None:
        """Seed ``k``'s plain policy given its slice of the stacked policy's weights."""
        copy_seed_(self.stacked_policy, self.policies[k], k)

    def progress(self, outs: Sequence[Mapping[str, Any]]) -> str:
        """A console line: the iteration, the frames and each seed's episode rewards."""
        rewards = {
            run.run_dir.name: {
                key: round(value, 3)
                for key, value in out.items()
                if key.endswith("episode_reward") or key.split("/")[-1] == "won"
            }
            for run, out in zip(self.runs, outs)
        }
        return f"iteration {self.runs[0].iteration}: frames {self._frames()} per seed {rewards}"

    def finish(self, info: Mapping[str, Any]) -> list[str]:
        """End every seed's run (its summary with ``info``, its frames and seed), shut the
        collector and the evaluation envs down; returns the lines to print."""
        lines = []
        try:
            for k, run in enumerate(self.runs):
                self._sync(k)
                summary = run.finish(self.policies[k], info={**info, "frames": self._frames()})
                lines.append(f"{run.run_dir.name}: {json.dumps(summary['trained'])}")
        finally:
            self.collector.shutdown()
            for run in self.runs:
                run.eval_env.close()
                run.close()
        parent = self.runs[0].run_dir.parent
        lines.append(f"outputs in {parent}/seed_<s>/ for seeds {self.seed_names()}")
        return lines

    def seed_names(self) -> list[str]:
        return [run.run_dir.name for run in self.runs]
