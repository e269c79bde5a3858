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
from collections.abc import Callable
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tensordict.nn import TensorDictSequential

from marlkit.collectors import make_collector
from marlkit.data.exploration import set_exploration
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
from marlkit.native import set_threads
from marlkit.objectives import GAE, ClipPPOLoss
from marlkit.record import Checkpointer, TrainingRun, rng_state, set_rng_state
from marlkit.record.config import (
    COMMON_RULES,
    CRITIC_RULES,
    check_config,
    check_not_above,
    flag,
    integer,
    number,
    register_resolvers,
)
from marlkit.replay import (
    GroupReplayBuffers,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorStorage,
)

register_resolvers()  # run_folder, if_none: the configs' resolvers

# every value the script reads, checked before anything runs (the key named when one is wrong)
RULES = {
    **COMMON_RULES,
    **CRITIC_RULES,
    "train.epochs": integer(1),
    "train.compile": flag(),
    "loss.normalize_advantage": flag(),
    "loss.entropy_coef": number(strict=False),
    "loss.critic_coef": number(strict=False),
}


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
    low, high = spec.low[batch], spec.high[batch]
    bounds: dict[str, Any] = {"low": low, "high": high}
    if bool((low == low.flatten()[0]).all() & (high == high.flatten()[0]).all()):
        # one bound for every agent and dim (VMAS: [-1, 1]) as numbers: TanhNormal then checks
        # them once in Python and, for [-1, 1], leaves out the affine map that is the identity
        # (the same values, fewer ops at every update)
        bounds = {"low": float(low.flatten()[0]), "high": float(high.flatten()[0])}
    return ProbabilisticActor(
        torch.nn.Sequential(mlp(2 * spec.shape[-1]), NormalParamExtractor()),
        group=group,
        distribution_class=TanhNormal,
        distribution_kwargs=bounds,
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


def trained_policy(env: EnvBase, run_dir: str | pathlib.Path) -> Callable[..., Any]:
    """The policy of the run in ``run_dir`` (its latest checkpoint), greedy: every group's
    actions in one call, for ``env``, an env of the run's kind (its batch size may differ).
    To film it, ``marlkit record ENV --policy film.py:build`` with ``build(env)`` returning
    ``trained_policy(env, RUN)`` (docs/training.md); to use it elsewhere, call it on the env's
    TensorDicts.

    Raises:
        FileNotFoundError: no checkpoint in ``run_dir``.
        ValueError: ``env`` is not of the run's kind; the message names the run's env and its
            keyword arguments.
    """
    state = Checkpointer(pathlib.Path(run_dir) / "checkpoints").load()
    cfg = OmegaConf.create(state["config"])
    weights = state["losses"]
    actors = []
    for g in env.groups:
        prefix = f"{g}.actor_network."
        mine = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
        actor = make_actor(env, g, cfg.policy)
        try:
            actor.load_state_dict(mine)
        except RuntimeError as err:  # no such group, or other sizes: another env
            kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True)
            raise ValueError(
                f"the run in {str(run_dir)!r} trained on {cfg.env.name} with {kwargs} (env.kwargs "
                f"of its config): make the env with those; group {g!r} of this one does not "
                f"fit its policy ({str(err).splitlines()[-1].strip()})"
            ) from None
        actors.append(actor)
    return set_exploration("deterministic")(TensorDictSequential(*actors))


def train_group(
    loss: torch.nn.Module,
    optim: torch.optim.Optimizer,
    buffer: ReplayBuffer,
    epochs: int,
    minibatches: int,
    max_grad_norm: float,
) -> dict[str, float]:
    """``epochs`` passes of ``minibatches`` PPO steps over ``buffer`` (one batch, sampled
    without replacement); returns the last step's loss terms and gradient norm. ``loss``: a
    ``ClipPPOLoss``, or ``torch.compile`` of one (the same parameters)."""
    params = list(loss.parameters())  # once: walking the modules each step costs ~0.1 ms
    for _ in range(epochs):
        for _ in range(minibatches):
            terms = loss(buffer.sample())
            total = terms["loss_objective"] + terms["loss_critic"] + terms["loss_entropy"]
            optim.zero_grad()
            total.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optim.step()
    return {**{k: v.item() for k, v in terms.items()}, "grad_norm": grad_norm.item()}


@hydra.main(config_path="../configs", config_name="mappo_ippo", version_base="1.3")
def main(cfg: DictConfig) -> None:
    check_config(cfg, RULES)
    check_not_above(  # an epoch would be one minibatch of the whole batch
        cfg,
        "train.minibatch_size",
        "collector.frames_per_batch",
        "each epoch passes over the batch in minibatches of at most that many frames",
    )
    set_threads(cfg.threads)  # torch's and the native kernels' threads (None: the defaults)
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
    optims = {
        g: torch.optim.Adam(losses[g].parameters(), lr=cfg.train.lr, fused=True) for g in groups
    }
    # train.compile: the loss's forward and backward through torch.compile (inductor), the
    # same parameters; compiled on the first minibatch
    loss_fns = {g: torch.compile(losses[g]) if cfg.train.compile else losses[g] for g in groups}
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
    state = run.restore()
    if state is not None:
        losses.load_state_dict(state["losses"])
        for g in groups:
            optims[g].load_state_dict(state["optims"][g])
        collector.load_state_dict(state["collector"])
        collector.update_policy_weights_()
        set_rng_state(state["rng"])

    def checkpoint() -> dict[str, Any]:
        return {
            "losses": losses.state_dict(),
            "optims": {g: o.state_dict() for g, o in optims.items()},
            "collector": collector.state_dict(),
            "rng": rng_state(),
        }

    # --- the loop: collect, GAE, epochs of minibatches per group, then the run's chores
    minibatches = max(1, frames // cfg.train.minibatch_size)
    keys = list(dict.fromkeys(k for loss in losses.values() for k in loss.in_keys))
    for batch in run.batches(collector):
        with torch.no_grad():
            for g in groups:
                gaes[g](batch)
        buffers.empty()
        # only what the losses read (masks where the env has them)
        buffers.extend(batch.select(*keys, strict=False).reshape(-1))
        metrics = {}
        for g in groups:
            terms = train_group(
                loss_fns[g],
                optims[g],
                buffers[g],
                cfg.train.epochs,
                minibatches,
                cfg.train.max_grad_norm,
            )
            metrics.update({f"train/{g}/{k}": v for k, v in terms.items()})
        collector.update_policy_weights_()
        out = run.end_iteration(
            batch, metrics, policy=policy, state=checkpoint, frames=collector.frames
        )
        rewards = {k: round(v, 3) for k, v in out.items() if k.endswith("episode_reward")}
        print(f"iteration {run.iteration}: frames {collector.frames} {rewards}", flush=True)

    # --- the end: the trained policy next to a random one, the curve, summary.json
    variant = "MAPPO" if cfg.critic.centralised else "IPPO"
    info = {"algorithm": cfg.algorithm, "variant": variant, "env": cfg.env.name}
    summary = run.finish(policy, info={**info, "frames": collector.frames})
    collector.shutdown()
    run.eval_env.close()
    print(json.dumps(summary["trained"]), "random:", json.dumps(summary["random"]))
    print(f"outputs in {cfg.run_dir}/ ({', '.join(summary['files'])})")


if __name__ == "__main__":
    main()
