"""The training procedure IQL, VDN and QMIX share around their losses (TorchRL's
``multiagent/iql.py`` and ``multiagent/qmix_vdn.py`` recipe): epsilon-greedy Q-actors, a replay
buffer per group holding one batch, epochs of minibatches drawn without replacement, a soft
target update after each optimiser step.

``sota-implementations/iql/iql.py`` and ``qmix_vdn/qmix_vdn.py`` build their policy with
:func:`egreedy_q_policy` and their losses per group, and hand both to :func:`train_q_learning`.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from tensordict.nn import TensorDictSequential

from marlkit.envs import EnvBase
from marlkit.modules import EGreedy, annealing_steps
from marlkit.replay import SamplerWithoutReplacement
from marlkit.train.builders import q_actor
from marlkit.train.scripts import finish, group_buffers, loss_keys, make_config_collector, open_run
from marlkit.train.updates import adam_per_group, soft_updates, update_groups

__all__ = ["egreedy_q_policy", "train_q_learning"]


def egreedy_q_policy(env: EnvBase, cfg: Any, algorithm: str) -> TensorDictSequential:
    """Every group's Q-network (:func:`~marlkit.train.builders.q_actor` of ``cfg.policy``) with
    its epsilon-greedy exploration, in one module: eps falls from ``exploration.eps_init`` to
    ``exploration.eps_end`` over ``exploration.annealing_fraction`` of
    ``collector.total_frames``. ``algorithm`` names the script in errors."""
    annealing = annealing_steps(cfg.collector.total_frames, cfg.exploration.annealing_fraction)
    return TensorDictSequential(
        *(
            EGreedy(
                q_actor(env, group, cfg.policy, algorithm),
                cfg.exploration.eps_init,
                cfg.exploration.eps_end,
                annealing,
            )
            for group in env.groups
        )
    )


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
    (``loss.tau``); eps anneals by the batch's frames; the run logs, evaluates (greedy) and
    checkpoints (networks, optimisers, eps, buffers, collector). ``variant`` goes to
    ``summary.json``.
    """
    groups = env.groups
    explorers = {g: cast(EGreedy, explorer) for g, explorer in zip(groups, policy.module)}
    updaters = soft_updates(losses, cfg.loss.tau)
    optims = adam_per_group(losses, cfg.train.lr)
    frames = cfg.collector.frames_per_batch
    buffers = group_buffers(
        groups,
        cfg.buffer.capacity,
        lambda: SamplerWithoutReplacement(seed=cfg.seed),
        cfg.train.minibatch_size,
    )
    collector = make_config_collector(cfg, env, env_fn, policy)

    run = open_run(cfg)
    run.track(
        # losses: online and target nets; exploration: each group's eps and its step count
        {
            "losses": losses,
            "exploration": torch.nn.ModuleDict(explorers),
            "optims": optims,
            "collector": collector,
        },
        buffers={"replay": buffers},
        policy=policy,
    )
    run.restore()

    steps = cfg.train.epochs * max(1, frames // cfg.train.minibatch_size)
    keys = loss_keys(losses.values())
    for batch in run.batches(collector):
        buffers.extend(batch.select(*keys, strict=False).reshape(-1))
        metrics = {"eps": float(explorers[groups[0]].eps)}  # this batch's
        metrics.update({f"replay/{g}/size": len(buffers[g]) for g in groups})
        clip = cfg.train.max_grad_norm
        metrics |= update_groups(
            losses, optims, buffers, steps, max_grad_norm=clip, updaters=updaters
        )
        for explorer in explorers.values():
            explorer.step(batch.numel())
        collector.update_policy_weights_()  # the new Q-networks and eps
        # evaluated with exploration off: EGreedy keeps the greedy actions
        out = run.end_iteration(batch, metrics, policy=policy, frames=collector.frames)
        print(run.progress(out), flush=True)

    info = {"algorithm": cfg.algorithm, "variant": variant, "env": cfg.env.name}
    return finish(run, policy, collector, info)
