"""MASAC and ISAC on any registered marlkit env with continuous actions, one actor, twin critics,
loss, optimiser and replay buffer per agent group.

    python sota-implementations/masac_isac/masac_isac.py                      # native navigation
    python sota-implementations/masac_isac/masac_isac.py env=vmas/balance     # the measured task
    python sota-implementations/masac_isac/masac_isac.py critic.centralised=false   # ISAC
    python sota-implementations/masac_isac/masac_isac.py env=predator_prey    # two groups
    python sota-implementations/masac_isac/masac_isac.py env=mujoco/ant_2x4
    python sota-implementations/masac_isac/masac_isac.py collector=multisync
    python sota-implementations/masac_isac/masac_isac.py resume=runs/masac_isac/<stamp>

The recipe (``configs/masac_isac.yaml``) is TorchRL's multi-agent SAC at a CPU budget: per batch
of 60 envs x 100 steps, the transitions go into each group's replay buffer and
``train.num_updates`` minibatches sampled uniformly from it train the actor, the two Q-networks
(clipped double Q) and the temperature ``alpha`` (learned towards minus the action dimension)
of :class:`~marlkit.objectives.SACLoss`, each update followed by a soft update of the target
Q-networks. MASAC's critics read every agent's observation and action
(``critic.centralised=true``); ISAC's read the agent's own. The actor is a TanhNormal policy: it
explores by sampling (after ``collector.init_random_frames`` of uniformly random actions) and
evaluates with its squashed mean. Everything else is a marlkit part; the run's folder,
checkpoints, evaluations and summary are :mod:`marlkit.train`'s.
"""

# No `from __future__ import annotations`: the config dataclasses below need real annotations
# to load with importlib's spec_from_file_location, which leaves a file out of sys.modules.
import functools
import math
from dataclasses import dataclass
from typing import Any

import hydra
from omegaconf import MISSING, DictConfig
from tensordict.nn import TensorDictSequential
from torch import nn

from marlkit.envs import EnvBase
from marlkit.modules import MultiAgentMLP, NormalParamExtractor, ProbabilisticActor, TanhNormal
from marlkit.objectives import SACLoss
from marlkit.replay import RandomSampler
from marlkit.train import adam_per_group, soft_updates, update_groups
from marlkit.train.builders import action_bounds, net_activation, q_critic
from marlkit.train.config import (
    OffPolicyRunConfig,
    TargetLossConfig,
    check_int,
    check_real,
    register_schema,
)
from marlkit.train.precision import set_precision
from marlkit.train.scripts import (
    finish,
    group_buffers,
    load_policy,
    loss_keys,
    make_config_collector,
    open_run,
    start,
    to_training_device,
)


@dataclass
class SACLossConfig(TargetLossConfig):
    """``loss``: SAC's losses and its entropy coefficient."""

    num_qvalue_nets: int = MISSING
    """Q-networks whose minimum is the target (clipped double Q: 2)."""
    alpha_init: float = MISSING
    """The entropy coefficient at the start."""
    fixed_alpha: bool = MISSING
    """Keep alpha at ``alpha_init``; false: learn it towards ``target_entropy``."""
    target_entropy: Any = MISSING
    """``auto`` (minus the action dimension) or a number."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_qvalue_nets", self.num_qvalue_nets, low=1)
        check_real("alpha_init", self.alpha_init)
        if self.target_entropy != "auto":
            check_real("target_entropy", self.target_entropy, low=-math.inf)


@dataclass
class MasacIsacConfig(OffPolicyRunConfig):
    """The keys of ``configs/masac_isac.yaml`` (its types and ranges, checked before anything
    runs)."""

    loss: SACLossConfig = MISSING
    """SAC's loss."""


register_schema("masac_isac_schema", MasacIsacConfig)  # configs/masac_isac.yaml's defaults


def make_actor(env: EnvBase, group: str, cfg: DictConfig) -> ProbabilisticActor:
    """A TanhNormal policy into the action bounds, writing its sample's log-prob."""
    low, high = action_bounds(env, group, "MASAC" if cfg.critic.centralised else "ISAC")
    mlp = MultiAgentMLP(
        env.observation_spec[group, "observation"].shape[-1],
        2 * low.shape[-1],
        n_agents=len(env.group_map[group]),
        share_params=cfg.policy.share_params,
        depth=cfg.policy.depth,
        num_cells=cfg.policy.num_cells,
        activation=net_activation(cfg.policy, "policy.activation"),
    )
    return ProbabilisticActor(
        nn.Sequential(mlp, NormalParamExtractor()),
        group=group,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": low, "high": high},
        return_log_prob=True,
    )


def make_policy(env: EnvBase, cfg: DictConfig) -> TensorDictSequential:
    """Every group's actor, in one call: sampled while collecting, the squashed mean in
    evaluations."""
    return TensorDictSequential(*(make_actor(env, g, cfg) for g in env.groups))


def trained_policy(env: EnvBase, run_dir: str, exploration: str = "deterministic") -> Any:
    """The run's policy (its latest checkpoint) for ``env``: its squashed mean, or sampled with
    ``exploration="random"``."""
    return load_policy(run_dir, env, make_policy, exploration)  # type: ignore[arg-type]


@hydra.main(config_path="../configs", config_name="masac_isac", version_base="1.3")
def main(cfg: DictConfig) -> None:
    env_fn = start(cfg)  # the config's ranges checked, threads, seed
    env = env_fn()  # for the specs; the single collector steps this one
    groups = env.groups

    # --- the algorithm, per group: actor, critic (twinned by the loss), SAC loss, updater, buffer
    policy = make_policy(env, cfg)
    actors = dict(zip(groups, policy.module))
    losses = nn.ModuleDict(
        {
            g: SACLoss(
                actors[g],
                q_critic(env, g, cfg.critic),
                group=g,
                gamma=cfg.loss.gamma,
                num_qvalue_nets=cfg.loss.num_qvalue_nets,
                alpha_init=cfg.loss.alpha_init,
                fixed_alpha=cfg.loss.fixed_alpha,
                target_entropy=cfg.loss.target_entropy,
                loss_function=cfg.loss.loss_function,
            )
            for g in groups
        }
    )
    to_training_device(cfg, policy, losses)  # `device`, before the optimisers
    updaters = soft_updates(losses, cfg.loss.tau)
    optims = adam_per_group(losses, cfg.train.lr, cfg.train.adam_eps)
    precision = set_precision(losses, cfg.train.precision)  # bf16: autocast in the updates
    sampler = functools.partial(RandomSampler, seed=cfg.seed)
    buffers = group_buffers(groups, cfg.buffer.size, sampler, cfg.train.minibatch_size)
    random_frames = cfg.collector.init_random_frames  # collected with random actions first
    collector = make_config_collector(cfg, env, env_fn, policy, init_random_frames=random_frames)

    # --- the run folder: logs, evaluations, checkpoints; resume from its latest checkpoint
    run = open_run(cfg)
    # losses: the networks (online, target) and log alpha
    parts = {"losses": losses, "optims": optims, "collector": collector}
    run.track(parts, buffers={"replay": buffers}, policy=policy)
    run.restore()

    # --- the loop: collect, store, num_updates per group, then the run's chores
    # (the buffers store the losses' keys: no loc, scale or log-prob, which the loss recomputes)
    keys = loss_keys(losses.values())
    for batch in run.batches(collector):
        buffers.extend(batch.select(*keys, strict=False).reshape(-1))
        metrics = update_groups(
            losses,
            optims,
            buffers,
            cfg.train.num_updates,
            max_grad_norm=cfg.train.max_grad_norm,
            objective=lambda t: t["loss_actor"] + t["loss_value"] + t["loss_alpha"],
            updaters=updaters,
            report="mean",
        )
        metrics.update({f"replay/{g}/size": len(buffers[g]) for g in groups})
        collector.update_policy_weights_()
        # evaluated with exploration off: the squashed mean action
        out = run.end_iteration(batch, metrics, policy=policy, frames=collector.frames)
        print(run.progress(out), flush=True)

    # --- the end: the trained policy next to a random one, the curve, summary.json
    variant = "MASAC" if cfg.critic.centralised else "ISAC"
    info = {"algorithm": cfg.algorithm, "variant": variant, "env": cfg.env.name}
    info["precision"] = precision  # bf16, or fp32 where the hardware has no bf16
    print("\n".join(finish(run, policy, collector, info)))


if __name__ == "__main__":
    main()
