"""MAPPO and IPPO on any registered marlkit env, one policy, critic and loss per agent group.

    python sota-implementations/mappo_ippo/mappo_ippo.py                      # native navigation
    python sota-implementations/mappo_ippo/mappo_ippo.py env=vmas/navigation
    python sota-implementations/mappo_ippo/mappo_ippo.py critic.centralised=false   # IPPO
    python sota-implementations/mappo_ippo/mappo_ippo.py collector=multisync
    python sota-implementations/mappo_ippo/mappo_ippo.py resume=runs/mappo_ippo/<stamp>

The recipe (``configs/mappo_ippo.yaml``) is TorchRL's multi-agent PPO tutorial: per batch, GAE
over the whole batch, then ``epochs`` passes over it in shuffled minibatches (each group's
replay buffer, sampled without replacement). MAPPO's critic reads every agent's observation
(``critic.centralised=true``); IPPO's reads the agent's own. Everything here is a marlkit part:
the env from the registry, the collector, the per-group buffers, modules, estimator and loss,
the loggers, checkpoints and evaluation of :mod:`marlkit.record`.
"""

from __future__ import annotations

import functools
import json
import pathlib
import time
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tensordict.nn import TensorDictSequential

from marlkit.collectors import make_collector
from marlkit.data.specs import Categorical
from marlkit.envs import EnvBase, make_episodic
from marlkit.modules import Categorical as CategoricalDist
from marlkit.modules import (
    MaskedCategorical,
    MultiAgentMLP,
    NormalParamExtractor,
    ProbabilisticActor,
    StateValueCritic,
    TanhNormal,
)
from marlkit.objectives import GAE, ClipPPOLoss
from marlkit.record import (
    Checkpointer,
    episode_metrics,
    evaluate,
    make_logger,
    rng_state,
    set_rng_state,
    summarise_run,
)
from marlkit.replay import (
    GroupReplayBuffers,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorStorage,
)

OmegaConf.register_new_resolver("or", lambda a, b: a or b, replace=True)


def env_factory(cfg: DictConfig, num_envs: int, seed: int, evaluation: bool = False) -> Any:
    """A picklable factory of the configured env (``make_episodic``: episodes cut at
    ``env.max_steps``, rewards summed); the evaluation env adds ``env.eval_kwargs``."""
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
        **kwargs,
    )


def make_actor(env: EnvBase, group: str, cfg: DictConfig) -> ProbabilisticActor:
    """A TanhNormal policy for a continuous action spec, a categorical one for a discrete."""
    n_agents = len(env.group_map[group])
    n_obs = env.observation_spec[group, "observation"].shape[-1]
    spec = env.action_spec[group, "action"]
    mlp = functools.partial(
        MultiAgentMLP,
        n_obs,
        n_agents=n_agents,
        share_params=cfg.share_params,
        depth=cfg.depth,
        num_cells=cfg.num_cells,
    )
    if isinstance(spec, Categorical):
        masked = (group, "action_mask") in env.observation_spec.keys(True, True)
        return ProbabilisticActor(
            mlp(spec.n),
            group=group,
            distribution_class=MaskedCategorical if masked else CategoricalDist,
        )
    batch = (0,) * len(env.batch_size)  # the bounds of one env: [n_agents, act_dim]
    return ProbabilisticActor(
        torch.nn.Sequential(mlp(2 * spec.shape[-1]), NormalParamExtractor()),
        group=group,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": spec.low[batch], "high": spec.high[batch]},
    )


def make_critic(env: EnvBase, group: str, cfg: DictConfig) -> StateValueCritic:
    return StateValueCritic(
        len(env.group_map[group]),
        env.observation_spec[group, "observation"].shape[-1],
        group=group,
        centralised=cfg.centralised,
        share_params=cfg.share_params,
        depth=cfg.depth,
        num_cells=cfg.num_cells,
    )


@hydra.main(config_path="../configs", config_name="mappo_ippo", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_dir = pathlib.Path(cfg.run_dir)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    env_fn = env_factory(cfg, cfg.env.num_envs, cfg.seed)
    env = env_fn()  # for the specs; the single collector steps this one
    groups = env.groups

    # --- the algorithm, per group: actor, critic, GAE, PPO loss, optimiser, buffer
    actors = {g: make_actor(env, g, cfg.policy) for g in groups}
    critics = {g: make_critic(env, g, cfg.critic) for g in groups}
    gaes = {
        g: GAE(cfg.loss.gamma, cfg.loss.lmbda, value_network=critics[g], group=g) for g in groups
    }
    losses = torch.nn.ModuleDict(
        {
            g: ClipPPOLoss(
                actors[g],
                critics[g],
                group=g,
                clip_epsilon=cfg.loss.clip_epsilon,
                entropy_coef=cfg.loss.entropy_coef,
                critic_coef=cfg.loss.critic_coef,
                loss_critic_type=cfg.loss.loss_critic_type,
                normalize_advantage=cfg.loss.normalize_advantage,
            )
            for g in groups
        }
    )
    optims = {g: torch.optim.Adam(losses[g].parameters(), lr=cfg.train.lr) for g in groups}
    frames = cfg.collector.frames_per_batch
    buffers = GroupReplayBuffers(
        groups,
        lambda g: ReplayBuffer(
            TensorStorage(frames),
            SamplerWithoutReplacement(seed=cfg.seed),
            batch_size=cfg.train.minibatch_size,
        ),
    )
    policy = TensorDictSequential(*actors.values())  # every group's actions in one call

    collector = make_collector(
        cfg.collector.kind,
        env if cfg.collector.kind == "single" else env_fn,
        policy,
        frames,
        cfg.collector.total_frames,
        num_workers=cfg.collector.num_workers,
        seed=cfg.seed,
    )
    eval_env = env_factory(cfg, cfg.eval.num_envs, cfg.seed + 10_000, evaluation=True)()

    # --- resume: modules, optimisers, collector counters, RNG states, the metrics file
    checkpointer = Checkpointer(run_dir / "checkpoints", keep=cfg.checkpoint.keep)
    iteration = 0
    if cfg.resume is not None and checkpointer.latest() is not None:
        state = checkpointer.load()
        losses.load_state_dict(state["losses"])
        for g in groups:
            optims[g].load_state_dict(state["optims"][g])
        collector.load_state_dict(state["collector"])
        collector.update_policy_weights_()
        set_rng_state(state["rng"])
        iteration = state["iteration"]
    logger = make_logger(
        run_dir,
        backends=cfg.logger.backends
        if cfg.logger.backends == "auto"
        else list(cfg.logger.backends),
        resume=cfg.resume is not None,
        project=cfg.logger.project,
        name=run_dir.name,
        config=OmegaConf.to_container(cfg, resolve=True),
    )
    logger.csv.truncate(iteration)  # rows logged after that checkpoint are done again

    def run_eval(tag: str, video: bool) -> dict[str, float]:
        out = evaluate(
            eval_env,
            policy,
            steps=cfg.env.max_steps,
            video=run_dir / "videos" / f"{tag}.mp4" if video else None,
            env_indices="all",
            tile=True,
            fps=cfg.eval.fps,
        )
        return {f"eval/{k}": v for k, v in out.metrics.items()}

    def save() -> None:
        state = {
            "iteration": iteration,
            "losses": losses.state_dict(),
            "optims": {g: o.state_dict() for g, o in optims.items()},
            "collector": collector.state_dict(),
            "rng": rng_state(),
        }
        checkpointer.save(iteration, state)

    # --- the loop: collect, GAE, epochs of minibatches per group, log, evaluate, checkpoint
    n_minibatches = max(1, frames // cfg.train.minibatch_size)
    keys = list(dict.fromkeys(k for loss in losses.values() for k in loss.in_keys))
    start = time.perf_counter()
    collect_start = start
    for batch in collector:
        collect_time = time.perf_counter() - collect_start
        iteration += 1
        train_start = time.perf_counter()
        metrics: dict[str, Any] = {}
        with torch.no_grad():
            for g in groups:
                gaes[g](batch)
        buffers.empty()
        buffers.extend(batch.select(*keys).reshape(-1))  # only what the losses read
        for g in groups:
            for _ in range(cfg.train.epochs):
                for _ in range(n_minibatches):
                    terms = losses[g](buffers.sample(g))
                    total = terms["loss_objective"] + terms["loss_critic"] + terms["loss_entropy"]
                    optims[g].zero_grad()
                    total.backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(
                        losses[g].parameters(), cfg.train.max_grad_norm
                    )
                    optims[g].step()
            for name, value in terms.items():
                metrics[f"train/{g}/{name}"] = value.item()
            metrics[f"train/{g}/grad_norm"] = grad_norm.item()
        collector.update_policy_weights_()
        train_time = time.perf_counter() - train_start

        metrics.update(
            frames=collector.frames,
            frames_per_s=batch.numel() / (collect_time + train_time),
            collection_time=collect_time,
            training_time=train_time,
            time=time.perf_counter() - start,
            **episode_metrics(batch),
        )
        last = iteration == collector.num_batches
        if last or (cfg.eval.every and iteration % cfg.eval.every == 0):
            metrics.update(run_eval(f"eval-{iteration:04d}", video=cfg.eval.video))
        logger.log(metrics, step=iteration)
        if last or iteration % cfg.checkpoint.every == 0:
            save()
        rewards = {k: round(v, 3) for k, v in metrics.items() if k.endswith("episode_reward")}
        print(f"iteration {iteration}: frames {collector.frames} {rewards}", flush=True)
        collect_start = time.perf_counter()

    # --- the end: the trained policy next to a random one, the curve, summary.json
    summary = summarise_run(
        run_dir,
        eval_env,
        policy,
        steps=cfg.env.max_steps,
        rows=logger.csv.rows(),
        video=cfg.eval.video,
        fps=cfg.eval.fps,
        info={"algorithm": cfg.algorithm, "env": cfg.env.name, "frames": collector.frames},
    )
    logger.close()
    collector.shutdown()
    eval_env.close()
    print(json.dumps(summary["trained"]), "random:", json.dumps(summary["random"]))
    print(f"outputs in {run_dir}/ (metrics.csv, reward.png, rollout.mp4, summary.json)")


if __name__ == "__main__":
    main()
