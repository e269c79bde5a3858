"""The training procedure IQL, VDN and QMIX share around their losses (TorchRL's
``multiagent/iql.py`` and ``multiagent/qmix_vdn.py`` recipe): epsilon-greedy Q-actors, a replay
buffer per group holding one batch, epochs of minibatches drawn without replacement, a soft
target update after each optimiser step.

``sota-implementations/iql/iql.py`` and ``qmix_vdn/qmix_vdn.py`` build their policy with
:func:`egreedy_q_policy` and their losses per group, and hand both to :func:`train_q_learning`.

With ``model.memory`` (``gru`` or ``lstm``, a :class:`~marlkit.train.sequences.MemoryConfig`)
the agents are recurrent as PyMARL's: the Q-network is :func:`~marlkit.modules.rnn.
recurrent_network`, the buffers hold windows of ``model.seq_len`` steps (``buffer.capacity``
and ``train.minibatch_size`` still count steps), and the losses run in recurrent mode: the
online and the target network unrolled over each window, the targets one step on from the
target network's states.

With ``loss.standardise_rewards`` (EPyMARL's ``standardise_rewards``, on in its QMIX, VDN and
IQL configs) each group's loss reads its minibatch's rewards standardised by a
:class:`~marlkit.objectives.standardise.RewardStandardiser`, whose running mean and variance
every minibatch updates first and the checkpoints save.

With ``seeds_in_process=K`` the scripts call :func:`train_q_learning_seeds`: ``K`` seeds' runs
trained together in one process, each as it would train alone (:mod:`marlkit.train.seeds`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from tensordict.nn import TensorDictSequential

from marlkit.data.keys import NEXT, REWARD
from marlkit.envs import EnvBase
from marlkit.modules import EGreedy, QValueActor, annealing_steps
from marlkit.modules.models import MODEL_KINDS
from marlkit.modules.rnn import recurrent_network, set_recurrent_mode
from marlkit.modules.seeds import seedwise_sampling, stack_seeds
from marlkit.objectives.standardise import RewardStandardiser, SeedRewardStandardiser
from marlkit.replay import SamplerWithoutReplacement
from marlkit.train.builders import encoder_network, memory_head, net_activation, q_actor
from marlkit.train.config import check_choice
from marlkit.train.precision import set_precision
from marlkit.train.scripts import (
    env_factory,
    finish,
    group_buffers,
    loss_keys,
    make_config_collector,
    open_run,
)
from marlkit.train.seeds import (
    SeedBuffers,
    SeedRewardStatistics,
    SeedRuns,
    SeedState,
    check_seeds_config,
    collector_streams,
    run_seeds,
    seed_config,
    seed_standardisers,
    seed_width,
    stack_collector,
    update_seed_groups,
)
from marlkit.train.sequences import MemoryConfig, split_sequences
from marlkit.train.updates import (
    adam_per_group,
    resume_target_updates,
    target_updates,
    update_groups,
)

__all__ = [
    "QModelConfig",
    "egreedy_q_policy",
    "reward_standardisers",
    "train_q_learning",
    "train_q_learning_seeds",
]


@dataclass
class QModelConfig(MemoryConfig):
    """``model`` of the Q-learning scripts: memory in the agents' Q-network (see
    :class:`~marlkit.train.sequences.MemoryConfig`) and its encoder."""

    kind: str = "mlp"
    """The Q-network's encoder: ``mlp`` (the ``policy`` MLP), ``cnn``, ``deepsets``,
    ``attention`` or ``gnn`` (:class:`marlkit.modules.ModelConfig`'s kinds, with its defaults
    for the encoder's own sizes), then ``policy.depth`` layers of ``policy.num_cells`` (or,
    with ``memory``, the cell and a linear head) to one value per action."""
    inputs: list[str] | None = None
    """The group's entries the encoder reads in place of its observation (e.g. SMAX's
    ``[entities, own]`` with ``kind=deepsets``); see :class:`marlkit.modules.ModelConfig`."""
    entity_mask: str | None = None
    """The group's bool entry masking the entity sets (e.g. SMAX's ``entity_mask``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("kind", self.kind, MODEL_KINDS)


def egreedy_q_policy(env: EnvBase, cfg: Any, algorithm: str) -> TensorDictSequential:
    """Every group's Q-network (:func:`~marlkit.train.builders.q_actor` of ``cfg.policy``) with
    its epsilon-greedy exploration, in one module: eps falls from ``exploration.eps_init`` to
    ``exploration.eps_end`` over ``exploration.annealing_fraction`` of
    ``collector.total_frames``. ``algorithm`` names the script in errors."""
    annealing = annealing_steps(cfg.collector.total_frames, cfg.exploration.annealing_fraction)
    return TensorDictSequential(
        *(
            EGreedy(
                _q_network(env, group, cfg, algorithm),
                cfg.exploration.eps_init,
                cfg.exploration.eps_end,
                annealing,
            )
            for group in env.groups
        )
    )


def _hard_interval(cfg: Any) -> int:
    """``loss.hard_update_interval`` (0, soft updates, for configs written before it)."""
    return int(cfg.loss.get("hard_update_interval", 0))


def _memory(cfg: Any) -> str:
    """``model.memory`` (``none`` for configs without a ``model`` section)."""
    return str(cfg.get("model", {}).get("memory", "none"))


def _kind(cfg: Any) -> str:
    """``model.kind`` (``mlp`` for configs without it)."""
    return str(cfg.get("model", {}).get("kind", "mlp"))


def _q_network(env: EnvBase, group: str, cfg: Any, algorithm: str) -> QValueActor:
    """:func:`~marlkit.train.builders.q_actor` (which refuses continuous actions, naming
    ``algorithm``), or with ``model.memory`` the recurrent Q-network of the same size, or with
    ``model.kind`` another encoder (:func:`~marlkit.train.builders.encoder_network`; a kind
    the observations do not fit is refused, naming the entry and the shape it reads)."""
    actor = q_actor(env, group, cfg.policy, algorithm)
    spec = env.action_spec[group, "action"]
    if _kind(cfg) != "mlp":
        network = encoder_network(
            env,
            group,
            cfg.policy,
            cfg.model,
            n_outputs=actor.n_actions or spec.n,
            out_keys=[actor.action_value_key],
        )
        return QValueActor(network, group=group, spec=spec)
    if _memory(cfg) == "none":
        return actor
    network = recurrent_network(
        env.observation_spec[group, "observation"].shape[-1],
        actor.n_actions or spec.n,
        len(env.group_map[group]),
        memory=cfg.model.memory,
        hidden_size=cfg.model.memory_hidden,
        group=group,
        out_keys=[actor.action_value_key],
        share_params=cfg.policy.share_params,
        depth=cfg.policy.depth,
        num_cells=cfg.policy.num_cells,
        activation=net_activation(cfg.policy, "policy.activation"),
        **memory_head(cfg.model),
    )
    return QValueActor(network, group=group, spec=spec)


def reward_standardisers(losses: torch.nn.ModuleDict) -> torch.nn.ModuleDict:
    """Per group, a :class:`~marlkit.objectives.standardise.RewardStandardiser` of the reward
    entries its loss reads (``("next", ..., "reward")`` among its ``in_keys``)."""
    return torch.nn.ModuleDict(
        {
            group: RewardStandardiser(
                [
                    key
                    for key in cast(list[Any], loss.in_keys)
                    if isinstance(key, tuple) and key[0] == NEXT and key[-1] == REWARD
                ]
            )
            for group, loss in losses.items()
        }
    )


def _standardised(loss: Any, standardise: Any) -> Any:
    """``loss`` reading its input's rewards standardised (the statistics updated first)."""
    return lambda td: loss(standardise(td))


def train_q_learning(
    cfg: Any,
    env: EnvBase,
    env_fn: Any,
    policy: TensorDictSequential,
    losses: torch.nn.ModuleDict,
    variant: str,
) -> list[str]:
    """Train ``losses`` (one value loss per group of ``env``, over the Q-actors of ``policy``,
    an :func:`egreedy_q_policy`) for the run of ``cfg``; returns the lines to print at the end.

    Per batch of ``collector.frames_per_batch`` frames: the batch replaces the buffers'
    contents (``buffer.capacity`` items), then each group takes ``train.epochs`` passes of
    ``frames_per_batch // train.minibatch_size`` Adam steps (``train.lr``, gradient norm
    clipped to ``train.max_grad_norm``), each followed by a soft target update
    (``loss.tau``; or a copy every ``loss.hard_update_interval`` steps), its rewards
    standardised first with ``loss.standardise_rewards``; eps
    anneals by the batch's frames; the run logs, evaluates (greedy) and checkpoints (networks,
    optimisers, eps, buffers, collector). ``variant`` goes to ``summary.json``.
    """
    groups = env.groups
    explorers = {g: cast(EGreedy, explorer) for g, explorer in zip(groups, policy.module)}
    updaters = target_updates(losses, cfg.loss.tau, _hard_interval(cfg))
    optims = adam_per_group(losses, cfg.train.lr, cfg.train.adam_eps)
    precision = set_precision(losses, cfg.train.precision)  # bf16: autocast in the updates
    frames = cfg.collector.frames_per_batch
    recurrent = _memory(cfg) != "none"
    per_item = cfg.model.seq_len if recurrent else 1  # items: windows of seq_len steps
    buffers = group_buffers(
        groups,
        max(1, cfg.buffer.capacity // per_item),
        lambda: SamplerWithoutReplacement(seed=cfg.seed),
        max(1, cfg.train.minibatch_size // per_item),
    )
    # with memory, the losses unroll the networks over windows (recurrent mode)
    loss_fns = {g: set_recurrent_mode(recurrent)(loss) for g, loss in losses.items()}
    standardisers = reward_standardisers(losses)
    standardise = bool(cfg.loss.get("standardise_rewards", False))
    if standardise:  # EPyMARL's standardise_rewards: running statistics of the sampled rewards
        loss_fns = {
            g: _standardised(fn, cast(RewardStandardiser, standardisers[g]))
            for g, fn in loss_fns.items()
        }
    collector = make_config_collector(cfg, env, env_fn, policy)

    run = open_run(cfg)
    run.track(
        # losses: online and target nets; exploration: each group's eps and its step count
        {
            "losses": losses,
            "exploration": torch.nn.ModuleDict(explorers),
            "optims": optims,
            "collector": collector,
            **({"reward_standardisers": standardisers} if standardise else {}),
        },
        buffers={"replay": buffers},
        policy=policy,
    )
    run.restore()

    steps = cfg.train.epochs * max(1, frames // cfg.train.minibatch_size)
    resume_target_updates(updaters, run.iteration * steps)  # a hard copy's step count
    keys = loss_keys(losses.values())
    for batch in run.batches(collector):
        data = batch.select(*keys, strict=False)
        if recurrent:  # [*B, T] -> windows [N, burn_in + seq_len], counted steps masked
            buffers.extend(split_sequences(data, cfg.model.seq_len, cfg.model.burn_in))
        else:
            buffers.extend(data.reshape(-1))
        metrics = {"eps": float(explorers[groups[0]].eps)}  # this batch's
        metrics.update({f"replay/{g}/size": len(buffers[g]) for g in groups})
        if standardise:  # the scale the losses' rewards are divided by
            metrics.update(
                {
                    f"train/{g}/reward_std": float(cast(RewardStandardiser, s).stats.var.sqrt())
                    for g, s in standardisers.items()
                }
            )
        clip = cfg.train.max_grad_norm
        metrics |= update_groups(
            loss_fns,  # the losses, in their mode
            optims,
            buffers,
            steps,
            max_grad_norm=clip,
            updaters=updaters,
        )
        for explorer in explorers.values():
            explorer.step(batch.numel())
        collector.update_policy_weights_()  # the new Q-networks and eps
        # evaluated with exploration off: EGreedy keeps the greedy actions
        out = run.end_iteration(batch, metrics, policy=policy, frames=collector.frames)
        print(run.progress(out), flush=True)

    info = {"algorithm": cfg.algorithm, "variant": variant, "env": cfg.env.name}
    info["precision"] = precision  # bf16, or fp32 where the hardware has no bf16
    return finish(run, policy, collector, info)


class _Schedules:
    """A checkpoint part: the eps schedules (``eps``, ``steps_done``) of a stack's explorers
    and of one seed's plain policy's, which step together (every seed of a stack anneals by
    its own frames, the same count); saved from the first, loaded into both."""

    def __init__(self, *explorers: Mapping[str, EGreedy]):
        self.explorers = explorers

    def state_dict(self) -> dict[str, Any]:
        return {
            g: {"eps": e.eps.clone(), "steps_done": e.steps_done.clone()}
            for g, e in self.explorers[0].items()
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for explorers in self.explorers:
            for g, e in explorers.items():
                e.eps.copy_(state[g]["eps"])
                e.steps_done.copy_(state[g]["steps_done"])


#: What a Q-learning script builds of one seed's run, from its env: its policy (an
#: :func:`egreedy_q_policy`) and, per group, the other networks its losses take (QMIX's
#: mixers; none for IQL).
Networks = Callable[[EnvBase], tuple[TensorDictSequential, Mapping[str, torch.nn.Module]]]
#: The losses of a policy and those networks (``separate_dims`` passed on to each loss).
MakeLosses = Callable[..., torch.nn.ModuleDict]


def train_q_learning_seeds(
    cfg: Any, networks: Networks, make_losses: MakeLosses, variant: str
) -> list[str]:
    """``seeds_in_process=K`` of :func:`train_q_learning` (:mod:`marlkit.train.seeds`): ``K``
    seeds' runs in this process, each in ``<run_dir>/seed_<s>/`` as it would train alone.

    Each seed's env, Q-networks and other networks (``networks(env)``: QMIX's mixers) are made
    under its seed as its own run makes them, then stacked (:func:`~marlkit.modules.seeds.
    stack_seeds`: the Q-networks' layers and the mixers' hypernetworks, one batched matmul per
    layer for every seed); ``make_losses(env, policy, others, separate_dims=1)`` gives per-seed
    terms, so each seed gets its own gradient, clipped on its own; the target networks are
    stacked copies moved by elementwise soft updates; Adam is elementwise; each seed's
    epsilon-greedy draws come from its own random stream; each seed has its own replay buffer
    and sampler, saved with its checkpoints. Returns the lines to print at the end.
    """
    n_seeds = check_seeds_config(cfg)  # what the stack cannot do, refused by name

    def build(seed: int) -> tuple[EnvBase, TensorDictSequential, Mapping[str, torch.nn.Module]]:
        torch.manual_seed(seed)  # as start() seeds a run of its own
        env = env_factory(cfg, cfg.env.num_envs, seed)()
        return (env, *networks(env))

    first = build(cfg.seed)
    seeds = run_seeds(cfg.seed, n_seeds, seed_width(first[0]))
    built = [first, *(build(s) for s in seeds[1:])]
    env, groups = first[0], first[0].groups
    streams = collector_streams(seeds)  # each seed's draws where its own collector starts them
    policy = cast(
        TensorDictSequential, seedwise_sampling(stack_seeds([b[1] for b in built]), streams)
    )
    others = {g: stack_seeds([b[2][g] for b in built]) for g in first[2]}
    losses = make_losses(env, policy, others, separate_dims=1)
    # elementwise: each seed's own targets
    updaters = target_updates(losses, cfg.loss.tau, _hard_interval(cfg))
    # elementwise: each seed's state in its slices
    optims = adam_per_group(losses, cfg.train.lr, cfg.train.adam_eps)
    buffers = SeedBuffers(groups, seeds, cfg.buffer.capacity, cfg.train.minibatch_size)
    collector, split = stack_collector(cfg, [b[0] for b in built], seeds, policy)
    explorers = {g: cast(EGreedy, e) for g, e in zip(groups, policy.module)}
    plain = [{g: cast(EGreedy, e) for g, e in zip(groups, b[1].module)} for b in built]
    # loss.standardise_rewards: each seed's statistics of its own rewards
    standardisers: dict[str, SeedRewardStandardiser] = {}
    loss_fns: dict[str, Any] = dict(losses.items())
    if cfg.loss.get("standardise_rewards", False):
        rewards = {
            g: cast(RewardStandardiser, s).keys for g, s in reward_standardisers(losses).items()
        }
        standardisers = seed_standardisers(rewards, n_seeds)
        loss_fns = {g: _standardised(losses[g], standardisers[g]) for g in groups}
    parts: list[dict[str, Any]] = [{"exploration": _Schedules(explorers, own)} for own in plain]
    if standardisers:
        for k, part in enumerate(parts):
            part["reward_standardisers"] = SeedRewardStatistics(standardisers, k)
    runs = SeedRuns(
        [open_run(seed_config(cfg, s)) for s in seeds],
        collector,
        [SeedState(k, losses, optims, streams) for k in range(n_seeds)],
        [b[1] for b in built],
        policy,
        split=split,
        parts=parts,
        buffers=[{"replay": own} for own in buffers.buffers],
    )
    runs.restore()

    steps = cfg.train.epochs * max(1, cfg.collector.frames_per_batch // cfg.train.minibatch_size)
    resume_target_updates(updaters, runs.runs[0].iteration * steps)  # one count for every seed
    keys = loss_keys(losses.values())
    for batch in runs.batches():  # [K, num_envs, T]
        buffers.extend(batch.select(*keys, strict=False))
        metrics = [
            {
                "eps": float(explorers[groups[0]].eps),  # this batch's
                **{f"replay/{g}/size": len(own[g]) for g in groups},
                **{  # the scale each seed's rewards are divided by, as a lone run logs it
                    f"train/{g}/reward_std": float(s.var[k].sqrt())
                    for g, s in standardisers.items()
                },
            }
            for k, own in enumerate(buffers.buffers)
        ]
        trained = update_seed_groups(
            loss_fns,
            optims,
            buffers,
            steps,
            max_grad_norm=cfg.train.max_grad_norm,
            updaters=updaters,
        )
        frames = batch[0].numel()  # each seed's
        for schedule in (explorers, *plain):
            for explorer in schedule.values():
                explorer.step(frames)
        outs = runs.end_iteration(batch, [m | t for m, t in zip(metrics, trained)])
        print(runs.progress(outs), flush=True)

    info = {"algorithm": cfg.algorithm, "variant": variant, "env": cfg.env.name}
    info.update(precision="fp32", seeds_in_process=n_seeds)
    return runs.finish(info)
