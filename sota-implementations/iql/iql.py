"""IQL (independent Q-learning) on any registered marlkit env with discrete actions, one
Q-network, loss and replay buffer per agent group.

    python sota-implementations/iql/iql.py                                    # native navigation
    python sota-implementations/iql/iql.py env=vmas/navigation
    python sota-implementations/iql/iql.py env=pettingzoo/mpe2.simple_spread_v3
    python sota-implementations/iql/iql.py env=predator_prey                  # a loss per group
    python sota-implementations/iql/iql.py loss.double_dqn=true
    python sota-implementations/iql/iql.py collector=multisync
    python sota-implementations/iql/iql.py resume=runs/iql/<stamp>

The recipe (``configs/iql.yaml``) is that of ``qmix_vdn.py`` without a mixer (TorchRL's
``multiagent/iql.py`` at a CPU budget): per batch of 60 envs x 100 steps, a replay buffer
holding that one batch, ``epochs`` passes of ``frames_per_batch // minibatch_size`` minibatches
drawn without replacement, a soft target update after each optimiser step, and epsilon-greedy
exploration annealed over half the frames. Each agent learns its own TD target from its own
reward (``DQNLoss``) with a Q-network shared by the agents of its group. Everything here is a
marlkit part; the run's folder, checkpoints, evaluations and summary are :mod:`marlkit.train`'s.
"""

from __future__ import annotations

import hydra
import torch
from omegaconf import DictConfig
from tensordict.nn import TensorDictSequential

from marlkit.envs import EnvBase
from marlkit.modules import EGreedy, annealing_steps
from marlkit.objectives import DQNLoss, SoftUpdate
from marlkit.replay import SamplerWithoutReplacement
from marlkit.train import gradient_steps
from marlkit.train.builders import q_actor
from marlkit.train.config import COMMON_RULES, flag, integer, register_resolvers
from marlkit.train.scripts import (
    finish,
    group_buffers,
    load_policy,
    loss_keys,
    make_config_collector,
    open_run,
    start,
)

register_resolvers()  # run_folder, if_none: the configs' resolvers

# every value the script reads, checked before anything runs (the key named when one is wrong)
RULES = {
    **COMMON_RULES,
    "train.epochs": integer(1),
    "loss.double_dqn": flag(),
    "buffer.capacity": integer(1),
}


def make_policy(env: EnvBase, cfg: DictConfig) -> TensorDictSequential:
    """Every group's Q-network with its epsilon-greedy exploration, in one call; eps falls from
    ``eps_init`` to ``eps_end`` over ``annealing_fraction`` of the frames."""
    annealing = annealing_steps(cfg.collector.total_frames, cfg.exploration.annealing_fraction)
    return TensorDictSequential(
        *(
            EGreedy(
                q_actor(env, g, cfg.policy, "IQL"),
                cfg.exploration.eps_init,
                cfg.exploration.eps_end,
                annealing,
            )
            for g in env.groups
        )
    )


def trained_policy(env: EnvBase, run_dir: str, exploration: str = "deterministic") -> object:
    """The run's policy (its latest checkpoint) for ``env``: greedy, or epsilon-greedy with
    ``exploration="random"``."""
    return load_policy(run_dir, env, make_policy, exploration)  # type: ignore[arg-type]


@hydra.main(config_path="../configs", config_name="iql", version_base="1.3")
def main(cfg: DictConfig) -> None:
    minibatch = ("train.minibatch_size", "buffer.capacity", "a minibatch is drawn from the buffer")
    env_fn = start(cfg, RULES, [minibatch])
    env = env_fn()  # for the specs; the single collector steps this one
    groups = env.groups

    # --- the algorithm, per group: Q-actor with exploration, loss, optimiser, buffer
    policy = make_policy(env, cfg)  # every group's actions in one call
    explorers = torch.nn.ModuleDict(zip(groups, policy.module))
    losses = torch.nn.ModuleDict(
        {
            g: DQNLoss(
                explorers[g].module,
                group=g,
                gamma=cfg.loss.gamma,
                loss_function=cfg.loss.loss_function,
                double_dqn=cfg.loss.double_dqn,
            )
            for g in groups
        }
    )
    updaters = {g: SoftUpdate(losses[g], tau=cfg.loss.tau) for g in groups}
    optims = {
        g: torch.optim.Adam(losses[g].online_parameters(), lr=cfg.train.lr, fused=True)
        for g in groups
    }
    frames = cfg.collector.frames_per_batch
    buffers = group_buffers(
        groups,
        cfg.buffer.capacity,
        lambda: SamplerWithoutReplacement(seed=cfg.seed),
        cfg.train.minibatch_size,
    )
    collector = make_config_collector(cfg, env, env_fn, policy)

    # --- the run folder: logs, evaluations, checkpoints; resume from its latest checkpoint
    run = open_run(cfg)
    run.track(
        # losses: online and target nets; exploration: each group's eps and its step count
        {"losses": losses, "exploration": explorers, "optims": optims, "collector": collector},
        buffers={"replay": buffers},
        policy=policy,
    )
    run.restore()

    # --- the loop: collect, store, epochs of minibatches per group, anneal, the run's chores
    steps = cfg.train.epochs * max(1, frames // cfg.train.minibatch_size)
    keys = loss_keys(losses.values())
    for batch in run.batches(collector):
        buffers.extend(batch.select(*keys, strict=False).reshape(-1))
        metrics = {"eps": float(explorers[groups[0]].eps)}  # this batch's
        for g in groups:
            metrics[f"replay/{g}/size"] = len(buffers[g])
            terms = gradient_steps(
                losses[g],
                optims[g],
                buffers[g].sample,
                steps,
                max_grad_norm=cfg.train.max_grad_norm,
                after_step=updaters[g].step,
            )
            metrics.update({f"train/{g}/{k}": v for k, v in terms.items()})
            explorers[g].step(batch.numel())
        collector.update_policy_weights_()  # the new Q-networks and eps
        # evaluated with exploration off: EGreedy keeps the greedy actions
        out = run.end_iteration(batch, metrics, policy=policy, frames=collector.frames)
        print(run.progress(out), flush=True)

    # --- the end: the trained (greedy) policy next to a random one, the curve, summary.json
    info = {"algorithm": cfg.algorithm, "variant": "IQL", "env": cfg.env.name}
    print("\n".join(finish(run, policy, collector, info)))


if __name__ == "__main__":
    main()
