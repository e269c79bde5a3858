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
evaluates with its squashed mean. Everything else is a marlkit part: the env from the registry,
the collector, the per-group buffers, modules and loss, the loggers, checkpoints and evaluation
of :mod:`marlkit.record`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tensordict.nn import TensorDictSequential
from torch import nn

from marlkit.collectors import make_collector
from marlkit.data.specs import Bounded
from marlkit.envs import EnvBase, make_episodic
from marlkit.modules import (
    MultiAgentMLP,
    NormalParamExtractor,
    ProbabilisticActor,
    StateActionValueCritic,
    TanhNormal,
)
from marlkit.native import set_threads
from marlkit.objectives import SACLoss, SoftUpdate
from marlkit.record import TrainingRun, rng_state, set_rng_state
from marlkit.record.config import (
    COMMON_RULES,
    CRITIC_RULES,
    OFF_POLICY_RULES,
    check_config,
    check_not_above,
    flag,
    register_resolvers,
)
from marlkit.replay import GroupReplayBuffers, RandomSampler, ReplayBuffer, TensorStorage

register_resolvers()  # run_folder, if_none: the configs' resolvers

# every value the script reads, checked before anything runs (the key named when one is wrong)
RULES = {**COMMON_RULES, **CRITIC_RULES, **OFF_POLICY_RULES, "loss.fixed_alpha": flag()}


def env_factory(cfg: DictConfig, num_envs: int, seed: int, evaluation: bool = False) -> Any:
    """A picklable factory of the configured env (``make_episodic``: episodes cut at
    ``env.max_steps``, rewards summed, the actions of ``env.actions`` asked for and checked); the
    evaluation env adds ``env.eval_kwargs``."""
    kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True)
    if evaluation:
        kwargs.update(OmegaConf.to_container(cfg.env.eval_kwargs, resolve=True))
    return functools.partial(
        make_episodic,
        cfg.env.name,
        num_envs=num_envs,
        max_steps=cfg.env.max_steps,
        seed=seed,
        imports=list(cfg.env.imports),
        actions=cfg.env.actions,
        **kwargs,
    )


def action_bounds(env: EnvBase, group: str, algorithm: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The bounds of one env's actions of ``group``, ``[n_agents, act_dim]`` each.

    Raises:
        ValueError: the group's actions are not continuous (a ``Bounded`` spec).
    """
    spec = env.action_spec[group, "action"]
    if not isinstance(spec, Bounded):
        raise ValueError(
            f"{algorithm} needs continuous actions (a Bounded action spec), but group "
            f"{group!r} of this env has {type(spec).__name__} actions; pick an env with "
            "continuous actions (navigation, vmas/balance, mujoco/ant_2x4, predator_prey; MPE "
            "with ++env.kwargs.continuous_actions=true) or, for discrete actions, an algorithm "
            "for them (mappo_ippo)"
        )
    batch = (0,) * len(env.batch_size)
    return spec.low[batch], spec.high[batch]


def make_actor(env: EnvBase, group: str, cfg: DictConfig, algorithm: str) -> ProbabilisticActor:
    """A TanhNormal policy into the action bounds, writing its sample's log-prob."""
    low, high = action_bounds(env, group, algorithm)
    mlp = MultiAgentMLP(
        env.observation_spec[group, "observation"].shape[-1],
        2 * low.shape[-1],
        n_agents=len(env.group_map[group]),
        share_params=cfg.share_params,
        depth=cfg.depth,
        num_cells=cfg.num_cells,
    )
    return ProbabilisticActor(
        nn.Sequential(mlp, NormalParamExtractor()),
        group=group,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": low, "high": high},
        return_log_prob=True,
    )


def make_critic(env: EnvBase, group: str, cfg: DictConfig) -> StateActionValueCritic:
    """Q(o, a) per agent of ``group``, centralised (MASAC) or not (ISAC)."""
    return StateActionValueCritic(
        len(env.group_map[group]),
        env.observation_spec[group, "observation"].shape[-1],
        env.action_spec[group, "action"].shape[-1],
        group=group,
        centralised=cfg.centralised,
        share_params=cfg.share_params,
        depth=cfg.depth,
        num_cells=cfg.num_cells,
    )


def train_group(
    loss: SACLoss,
    optim: torch.optim.Optimizer,
    updater: SoftUpdate,
    buffer: ReplayBuffer,
    cfg: DictConfig,
) -> dict[str, float]:
    """``train.num_updates`` gradient steps on uniform samples of ``buffer``, each followed by
    a soft update of the target Q-networks; returns the loss terms averaged over the steps."""
    params = list(loss.online_parameters())
    sums: dict[str, float] = {}
    for _ in range(cfg.num_updates):
        terms = loss(buffer.sample())
        optim.zero_grad()
        (terms["loss_actor"] + terms["loss_value"] + terms["loss_alpha"]).backward()
        grad_norm = nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optim.step()
        updater.step()
        for name, value in terms.exclude("td_error").items():
            sums[name] = sums.get(name, 0.0) + value.item()
        sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm.item()
    return {name: total / cfg.num_updates for name, total in sums.items()}


@hydra.main(config_path="../configs", config_name="masac_isac", version_base="1.3")
def main(cfg: DictConfig) -> None:
    check_config(cfg, RULES)
    check_not_above(
        cfg, "train.minibatch_size", "buffer.size", "a minibatch is drawn from the buffer"
    )
    set_threads(cfg.threads)  # torch's and the native kernels' threads (None: the defaults)
    torch.manual_seed(cfg.seed)
    env_fn = env_factory(cfg, cfg.env.num_envs, cfg.seed)
    env = env_fn()  # for the specs; the single collector steps this one
    groups = env.groups
    name = "MASAC" if cfg.critic.centralised else "ISAC"

    # --- the algorithm, per group: actor, critic (twinned by the loss), SAC loss, updater, buffer
    actors = {g: make_actor(env, g, cfg.policy, name) for g in groups}
    losses = nn.ModuleDict(
        {
            g: SACLoss(
                actors[g],
                make_critic(env, g, cfg.critic),
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
    updaters = {g: SoftUpdate(losses[g], tau=cfg.loss.tau) for g in groups}
    optims = {
        g: torch.optim.Adam(losses[g].online_parameters(), lr=cfg.train.lr, fused=True)
        for g in groups
    }
    buffers = GroupReplayBuffers(
        groups,
        lambda g: ReplayBuffer(
            TensorStorage(cfg.buffer.size),
            RandomSampler(seed=cfg.seed),
            batch_size=cfg.train.minibatch_size,
        ),
    )
    policy = TensorDictSequential(*actors.values())  # every group's actions in one call

    collector = make_collector(
        cfg.collector.kind,
        env if cfg.collector.kind == "single" else env_fn,
        policy,
        cfg.collector.frames_per_batch,
        cfg.collector.total_frames,
        num_workers=cfg.collector.num_workers,
        seed=cfg.seed,
        init_random_frames=cfg.collector.init_random_frames,
    )

    # --- the run folder: logs, evaluations, checkpoints; resume from its latest checkpoint
    eval_seed = cfg.seed + 10_000  # apart from the training envs' seeds (cfg.seed, +1, ...)
    run = TrainingRun(
        cfg.run_dir,
        resume=cfg.resume,  # a run folder, checked: it must hold a run, and be run_dir
        eval_env=env_factory(cfg, cfg.eval.num_envs, eval_seed, evaluation=True)(),
        eval_seed=eval_seed,  # every evaluation plays the same episodes
        eval_steps=cfg.env.max_steps,
        eval_every=cfg.eval.every,
        video=cfg.eval.video,
        video_envs=cfg.eval.video_envs,
        fps=cfg.eval.fps,
        checkpoint_every=cfg.checkpoint.every,
        keep=cfg.checkpoint.keep,
        backends=OmegaConf.to_container(cfg.logger, resolve=True)["backends"],
        project=cfg.logger.project,
        config=OmegaConf.to_container(cfg, resolve=True),
    )
    state = run.restore()  # networks (online, target, log alpha), optimisers, collector, RNG
    if state is not None:
        losses.load_state_dict(state["losses"])
        for g in groups:
            optims[g].load_state_dict(state["optims"][g])
        collector.load_state_dict(state["collector"])
        collector.update_policy_weights_()
        set_rng_state(state["rng"])
        run.restore_buffers({"replay": buffers})

    def checkpoint() -> dict[str, Any]:
        return {
            "losses": losses.state_dict(),
            "optims": {g: o.state_dict() for g, o in optims.items()},
            "collector": collector.state_dict(),
            "rng": rng_state(),
        }

    # --- the loop: collect, store, num_updates per group, then the run's chores
    # Only what the losses read is stored (each loss's in_keys, optional ones kept where the env
    # has them): the same keys from the batches of init_random_frames (the env's keys only) as
    # from the policy's (no loc, scale, log-prob: the loss recomputes them), and none of the
    # simulator's info or episode statistics.
    keys = list(dict.fromkeys(k for loss in losses.values() for k in loss.in_keys))
    for batch in run.batches(collector):
        buffers.extend(batch.select(*keys, strict=False).reshape(-1))
        metrics: dict[str, Any] = {}
        for g in groups:
            terms = train_group(losses[g], optims[g], updaters[g], buffers[g], cfg.train)
            metrics.update({f"train/{g}/{k}": v for k, v in terms.items()})
            metrics[f"replay/{g}/size"] = len(buffers[g])
        collector.update_policy_weights_()
        out = run.end_iteration(
            batch,
            metrics,
            policy=policy,  # evaluated with exploration off: the squashed mean action
            state=checkpoint,
            frames=collector.frames,
            buffers={"replay": buffers},
        )
        rewards = {k: round(v, 3) for k, v in out.items() if k.endswith("episode_reward")}
        print(f"iteration {run.iteration}: frames {collector.frames} {rewards}", flush=True)

    # --- the end: the trained policy next to a random one, the curve, summary.json
    info = {"algorithm": cfg.algorithm, "variant": name, "env": cfg.env.name}
    summary = run.finish(policy, info={**info, "frames": collector.frames})
    collector.shutdown()
    run.eval_env.close()
    print(json.dumps(summary["trained"]), "random:", json.dumps(summary["random"]))
    print(f"outputs in {cfg.run_dir}/ ({', '.join(summary['files'])})")


if __name__ == "__main__":
    main()
