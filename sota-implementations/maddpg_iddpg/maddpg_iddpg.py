"""MADDPG and IDDPG on any registered marlkit env with continuous actions, one actor, critic,
loss, optimiser and replay buffer per agent group.

    python sota-implementations/maddpg_iddpg/maddpg_iddpg.py                  # native navigation
    python sota-implementations/maddpg_iddpg/maddpg_iddpg.py env=vmas/balance  # the measured task
    python sota-implementations/maddpg_iddpg/maddpg_iddpg.py critic.centralised=false  # IDDPG
    python sota-implementations/maddpg_iddpg/maddpg_iddpg.py env=predator_prey  # two groups
    python sota-implementations/maddpg_iddpg/maddpg_iddpg.py env=mujoco/ant_2x4
    python sota-implementations/maddpg_iddpg/maddpg_iddpg.py collector=multisync
    python sota-implementations/maddpg_iddpg/maddpg_iddpg.py resume=runs/maddpg_iddpg/<stamp>

The recipe (``configs/maddpg_iddpg.yaml``) is TorchRL's multi-agent DDPG at a CPU budget: per
batch of 60 envs x 100 steps, the transitions go into each group's replay buffer and
``train.num_updates`` minibatches sampled uniformly from it train the actor and the critic
(:class:`~marlkit.objectives.DDPGLoss`), each update followed by a soft update of the target
networks. MADDPG's critic reads every agent's observation and action
(``critic.centralised=true``); IDDPG's reads the agent's own. The actor is deterministic; it
explores through Gaussian noise added to its action while collecting (annealed over the
fraction ``exploration.annealing_fraction`` of ``collector.total_frames``) and through the
first ``collector.init_random_frames`` of uniformly random actions. Everything else is a
marlkit part; the run's folder, checkpoints, evaluations and summary are
:mod:`marlkit.train`'s.
"""

# No `from __future__ import annotations`: the config dataclasses below need real annotations
# to load with importlib's spec_from_file_location, which leaves a file out of sys.modules.
import functools
from dataclasses import dataclass
from typing import Any

import hydra
from omegaconf import MISSING, DictConfig
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from marlkit.envs import EnvBase
from marlkit.modules import AdditiveGaussian, MultiAgentMLP, TanhBounds, annealing_steps
from marlkit.objectives import DDPGLoss
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
class GaussianNoiseConfig:
    """``exploration``: Gaussian noise on the actor's action while collecting (never in
    evaluation)."""

    sigma_init: float = MISSING
    """The noise's std at the start, as a fraction of half the action range."""
    sigma_end: float = MISSING
    """The std once annealed."""
    annealing_fraction: float = MISSING
    """sigma reaches ``sigma_end`` after this fraction of ``collector.total_frames``."""

    def __post_init__(self) -> None:
        check_real("sigma_init", self.sigma_init, low=0.0, strict=False)
        check_real("sigma_end", self.sigma_end, low=0.0, strict=False)
        check_real("annealing_fraction", self.annealing_fraction, low=0.0, strict=False)


@dataclass
class DDPGLossConfig(TargetLossConfig):
    """``loss``: DDPG's, with the options against a saturated tanh actor (0, 0.5, 0 and 1: off,
    TorchRL's DDPG)."""

    actor_preact_penalty: float = MISSING
    """``c``: ``loss_actor += c * mean(u^2)`` of the actor's pre-tanh output ``u`` (0: none)."""
    target_policy_noise: float = MISSING
    """TD3's target policy smoothing: the std of the noise on the target action, as a fraction
    of half the action range (0: none)."""
    target_noise_clip: float = MISSING
    """That noise clipped to +-this fraction of half the action range."""
    actor_delay: int = MISSING
    """TD3's delayed policy updates: the actor trained on every ``actor_delay``-th gradient
    step (1: every step)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_real("actor_preact_penalty", self.actor_preact_penalty, low=0.0, strict=False)
        check_real("target_policy_noise", self.target_policy_noise, low=0.0, strict=False)
        check_real("target_noise_clip", self.target_noise_clip, low=0.0, strict=False)
        check_int("actor_delay", self.actor_delay, low=1)


@dataclass
class MaddpgIddpgConfig(OffPolicyRunConfig):
    """The keys of ``configs/maddpg_iddpg.yaml`` (its types and ranges, checked before
    anything runs)."""

    exploration: GaussianNoiseConfig = MISSING
    """The exploration noise."""
    loss: DDPGLossConfig = MISSING
    """DDPG's loss."""


register_schema("maddpg_iddpg_schema", MaddpgIddpgConfig)  # configs/maddpg_iddpg.yaml's defaults


def make_actor(env: EnvBase, group: str, cfg: DictConfig) -> TensorDictSequential:
    """The deterministic actor of ``group`` (tanh into the bounds; with
    ``loss.actor_preact_penalty > 0`` it also writes its pre-tanh output under ``(group,
    "action_preact")``) and the exploration noise that follows it while collecting (sigma
    annealed over ``annealing_fraction`` of the frames)."""
    algorithm = "MADDPG" if cfg.critic.centralised else "IDDPG"
    low, high = action_bounds(env, group, algorithm)
    annealing = annealing_steps(cfg.collector.total_frames, cfg.exploration.annealing_fraction)
    mlp = MultiAgentMLP(
        env.observation_spec[group, "observation"].shape[-1],
        low.shape[-1],
        n_agents=len(env.group_map[group]),
        share_params=cfg.policy.share_params,
        depth=cfg.policy.depth,
        num_cells=cfg.policy.num_cells,
        activation=net_activation(cfg.policy, "policy.activation"),
    )
    preact = cfg.loss.get("actor_preact_penalty", 0.0) > 0  # runs before the option: none
    actor = TensorDictModule(
        nn.Sequential(mlp, TanhBounds(low, high, preact=preact)),
        in_keys=[(group, "observation")],
        out_keys=[(group, "action"), *([(group, "action_preact")] if preact else [])],
    )
    noise = AdditiveGaussian(
        low,
        high,
        action_key=(group, "action"),
        sigma_init=cfg.exploration.sigma_init,
        sigma_end=cfg.exploration.sigma_end,
        annealing_num_steps=annealing,
    )
    return TensorDictSequential(actor, noise)


def make_policy(env: EnvBase, cfg: DictConfig) -> TensorDictSequential:
    """Every group's actions in one call, with noise while collecting (evaluations turn it
    off)."""
    return TensorDictSequential(*(make_actor(env, g, cfg) for g in env.groups))


def trained_policy(env: EnvBase, run_dir: str, exploration: str = "deterministic") -> Any:
    """The run's policy (its latest checkpoint) for ``env``: deterministic, or with its
    exploration noise with ``exploration="random"``."""
    return load_policy(run_dir, env, make_policy, exploration)  # type: ignore[arg-type]


@hydra.main(config_path="../configs", config_name="maddpg_iddpg", version_base="1.3")
def main(cfg: DictConfig) -> None:
    env_fn = start(cfg)  # the config's ranges checked, threads, seed
    env = env_fn()  # for the specs; the single collector steps this one
    groups = env.groups

    # --- the algorithm, per group: actor + noise, critic, DDPG loss, target updater, buffer
    policy = make_policy(env, cfg)
    actors = {g: policy.module[i].module[0] for i, g in enumerate(groups)}
    noises = nn.ModuleDict({g: policy.module[i].module[1] for i, g in enumerate(groups)})
    losses = nn.ModuleDict(
        {
            g: DDPGLoss(
                actors[g],
                q_critic(env, g, cfg.critic),
                group=g,
                gamma=cfg.loss.gamma,
                loss_function=cfg.loss.loss_function,
                actor_preact_penalty=cfg.loss.actor_preact_penalty,
                target_policy_noise=cfg.loss.target_policy_noise,
                target_noise_clip=cfg.loss.target_noise_clip,
                actor_delay=cfg.loss.actor_delay,
                action_bounds=action_bounds(env, g, "MADDPG"),
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
    run.track(
        # losses: online and target networks; exploration: each group's sigma and step count
        {"losses": losses, "exploration": noises, "optims": optims, "collector": collector},
        buffers={"replay": buffers},
        policy=policy,
    )
    run.restore()

    # --- the loop: collect, store, num_updates per group, anneal the noise, the run's chores
    # (the batches of init_random_frames hold the env's keys only: the losses' keys are stored)
    keys = loss_keys(losses.values())
    for batch in run.batches(collector):
        buffers.extend(batch.select(*keys, strict=False).reshape(-1))
        metrics = update_groups(
            losses,
            optims,
            buffers,
            cfg.train.num_updates,
            max_grad_norm=cfg.train.max_grad_norm,
            objective=lambda t: t["loss_actor"] + t["loss_value"],
            updaters=updaters,
            report="mean",
        )
        for g in groups:
            metrics[f"train/{g}/sigma"] = float(noises[g].sigma)
            metrics[f"replay/{g}/size"] = len(buffers[g])
            noises[g].step(batch.numel())
        collector.update_policy_weights_()
        # evaluated with exploration off: no noise
        out = run.end_iteration(batch, metrics, policy=policy, frames=collector.frames)
        print(run.progress(out), flush=True)

    # --- the end: the trained policy next to a random one, the curve, summary.json
    variant = "MADDPG" if cfg.critic.centralised else "IDDPG"
    info = {"algorithm": cfg.algorithm, "variant": variant, "env": cfg.env.name}
    info["precision"] = precision  # bf16, or fp32 where the hardware has no bf16
    print("\n".join(finish(run, policy, collector, info)))


if __name__ == "__main__":
    main()
