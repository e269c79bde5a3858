"""QMIX and VDN on any registered marlkit env with discrete actions, one Q-network, mixer, loss
and replay buffer per agent group.

    python sota-implementations/qmix_vdn/qmix_vdn.py                          # native navigation
    python sota-implementations/qmix_vdn/qmix_vdn.py env=vmas/navigation
    python sota-implementations/qmix_vdn/qmix_vdn.py env=pettingzoo/mpe2.simple_spread_v3
    python sota-implementations/qmix_vdn/qmix_vdn.py env=predator_prey        # a mixer per group
    python sota-implementations/qmix_vdn/qmix_vdn.py loss.mixer=vdn
    python sota-implementations/qmix_vdn/qmix_vdn.py loss.mixer_state=state   # the env's "state"
    python sota-implementations/qmix_vdn/qmix_vdn.py collector=multisync
    python sota-implementations/qmix_vdn/qmix_vdn.py resume=runs/qmix_vdn/<stamp>

The recipe (``configs/qmix_vdn.yaml``) is TorchRL's ``multiagent/qmix_vdn.py`` at a CPU budget:
per batch of 60 envs x 100 steps, a replay buffer holding that one batch, ``epochs`` passes of
``frames_per_batch // minibatch_size`` minibatches drawn without replacement, a soft target
update after each optimiser step, and epsilon-greedy exploration annealed over half the frames.
The agents' Q-network is shared (``MultiAgentMLP(share_params=True)``); QMIX's hypernetworks
read the agents' observations concatenated (``loss.mixer_state=observation``) or the env's
global ``"state"`` (``loss.mixer_state=state``); VDN sums. Everything here is a marlkit part:
the env from the registry, the collector, the per-group buffers, actors, exploration, mixers,
losses and target updaters, the loggers, checkpoints and evaluation of :mod:`marlkit.record`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tensordict.nn import TensorDictSequential

from marlkit.collectors import make_collector
from marlkit.data.specs import Categorical, OneHot
from marlkit.envs import EnvBase, make_episodic
from marlkit.modules import (
    EGreedy,
    Mixer,
    MultiAgentMLP,
    QMixer,
    QValueActor,
    VDNMixer,
    annealing_steps,
)
from marlkit.native import set_threads
from marlkit.objectives import QMixerLoss, SoftUpdate
from marlkit.record import TrainingRun, rng_state, set_rng_state
from marlkit.record.config import (
    COMMON_RULES,
    check_config,
    check_not_above,
    flag,
    integer,
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
    "train.epochs": integer(1),
    "loss.double_dqn": flag(),
    "loss.mixing_embed_dim": integer(1),
    "buffer.capacity": integer(1),
}

MIXERS = ("qmix", "vdn")
MIXER_STATES = ("observation", "state")


def check_mixer(cfg: DictConfig) -> None:
    """Refuse an unknown mixer or mixer state before anything is built."""
    if not isinstance(cfg.loss, DictConfig):  # `loss=vdn` replaces the whole group
        raise ValueError(
            f"loss is a group of settings (loss.mixer, loss.mixer_state, ...), got "
            f"loss={cfg.loss!r}; VDN is loss.mixer=vdn"
        )
    if cfg.loss.mixer not in MIXERS:
        raise ValueError(f"loss.mixer must be one of {list(MIXERS)}, got {cfg.loss.mixer!r}")
    if cfg.loss.mixer_state not in MIXER_STATES:
        raise ValueError(
            f"loss.mixer_state must be one of {list(MIXER_STATES)}, got {cfg.loss.mixer_state!r}"
        )


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


def make_actor(env: EnvBase, group: str, cfg: DictConfig) -> QValueActor:
    """The group's Q-network (one MLP over the agents) and its greedy action.

    Raises:
        ValueError: the group's actions are not discrete.
    """
    spec = env.action_spec[group, "action"]
    if not isinstance(spec, (Categorical, OneHot)):
        raise ValueError(
            f"QMIX/VDN need discrete actions, but group {group!r} has a {type(spec).__name__} "
            "action spec; envs with a continuous_actions option (native scenarios, VMAS, MPE) take "
            "++env.kwargs.continuous_actions=false, others need an algorithm for continuous "
            "actions (mappo_ippo, maddpg_iddpg, masac_isac)"
        )
    mlp = MultiAgentMLP(
        env.observation_spec[group, "observation"].shape[-1],
        spec.n,
        len(env.group_map[group]),
        share_params=cfg.share_params,
        depth=cfg.depth,
        num_cells=cfg.num_cells,
    )
    return QValueActor(mlp, group=group, spec=spec)


def make_mixer(env: EnvBase, group: str, cfg: DictConfig) -> Mixer:
    """VDN's sum, or QMIX's hypernetwork of the agents' observations or of the env's state.

    Raises:
        ValueError: ``mixer_state=state`` on an env without a global ``"state"``.
    """
    n_agents = len(env.group_map[group])
    if cfg.mixer == "vdn":
        return VDNMixer(n_agents, group=group)
    if cfg.mixer_state == "observation":
        obs = env.observation_spec[group, "observation"].shape[-1]
        return QMixer(
            (n_agents, obs),
            cfg.mixing_embed_dim,
            n_agents,
            group=group,
            state_key=(group, "observation"),
        )
    if "state" not in env.state_spec:
        raise ValueError(
            "loss.mixer_state=state needs an env with a global 'state'; this one has none: "
            "use loss.mixer_state=observation"
        )
    shape = env.state_spec["state"].shape[len(env.batch_size) :]
    return QMixer(shape, cfg.mixing_embed_dim, n_agents, group=group)


def train_group(
    loss: QMixerLoss,
    optim: torch.optim.Optimizer,
    updater: SoftUpdate,
    buffer: ReplayBuffer,
    steps: int,
    max_grad_norm: float,
) -> dict[str, float]:
    """``steps`` optimiser steps on minibatches of ``buffer``, the targets moved after each;
    returns the last step's loss terms and gradient norm."""
    params = [p for group in optim.param_groups for p in group["params"]]
    for _ in range(steps):
        out = loss(buffer.sample())
        optim.zero_grad()
        out["loss"].backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optim.step()
        updater.step()
    terms = {k: out[k].item() for k in ("loss", "q_value", "target_value")}
    return {**terms, "grad_norm": grad_norm.item()}


@hydra.main(config_path="../configs", config_name="qmix_vdn", version_base="1.3")
def main(cfg: DictConfig) -> None:
    check_mixer(cfg)
    check_config(cfg, RULES)
    check_not_above(
        cfg, "train.minibatch_size", "buffer.capacity", "a minibatch is drawn from the buffer"
    )
    set_threads(cfg.threads)  # torch's and the native kernels' threads (None: the defaults)
    torch.manual_seed(cfg.seed)
    env_fn = env_factory(cfg, cfg.env.num_envs, cfg.seed)
    env = env_fn()  # for the specs; the single collector steps this one
    groups = env.groups

    # --- the algorithm, per group: Q-actor, exploration, mixer, loss, optimiser, buffer
    actors = {g: make_actor(env, g, cfg.policy) for g in groups}
    # eps falls to eps_end over this many frames (a fraction of 0: at once)
    annealing = annealing_steps(cfg.collector.total_frames, cfg.exploration.annealing_fraction)
    explorers = torch.nn.ModuleDict(
        {
            g: EGreedy(actors[g], cfg.exploration.eps_init, cfg.exploration.eps_end, annealing)
            for g in groups
        }
    )
    losses = torch.nn.ModuleDict(
        {
            g: QMixerLoss(
                actors[g],
                make_mixer(env, g, cfg.loss),
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
    buffers = GroupReplayBuffers(
        groups,
        lambda g: ReplayBuffer(
            TensorStorage(cfg.buffer.capacity),
            SamplerWithoutReplacement(seed=cfg.seed),
            batch_size=cfg.train.minibatch_size,
        ),
    )
    policy = TensorDictSequential(*explorers.values())  # every group's actions in one call

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
    state = run.restore()  # losses (online and target nets), optimisers, eps, collector, RNG
    if state is not None:
        losses.load_state_dict(state["losses"])
        explorers.load_state_dict(state["exploration"])
        for g in groups:
            optims[g].load_state_dict(state["optims"][g])
        collector.load_state_dict(state["collector"])
        collector.update_policy_weights_()
        set_rng_state(state["rng"])
        run.restore_buffers({"replay": buffers})

    def checkpoint() -> dict[str, Any]:
        return {
            "losses": losses.state_dict(),
            "exploration": explorers.state_dict(),  # each group's eps and its step count
            "optims": {g: o.state_dict() for g, o in optims.items()},
            "collector": collector.state_dict(),
            "rng": rng_state(),
        }

    # --- the loop: collect, store, epochs of minibatches per group, anneal, the run's chores
    steps = cfg.train.epochs * max(1, frames // cfg.train.minibatch_size)
    # Only what the losses read is stored (not the simulator's info, episode statistics or
    # the policy's outputs): each loss's in_keys, optional ones (masks, root or per-agent
    # rewards) kept where the env has them.
    keys = list(dict.fromkeys(k for loss in losses.values() for k in loss.in_keys))
    for batch in run.batches(collector):
        buffers.extend(batch.select(*keys, strict=False).reshape(-1))
        metrics: dict[str, Any] = {"eps": float(explorers[groups[0]].eps)}  # this batch's
        for g in groups:
            metrics[f"replay/{g}/size"] = len(buffers[g])
            terms = train_group(
                losses[g], optims[g], updaters[g], buffers[g], steps, cfg.train.max_grad_norm
            )
            metrics.update({f"train/{g}/{k}": v for k, v in terms.items()})
            explorers[g].step(batch.numel())
        collector.update_policy_weights_()  # the new Q-networks and eps
        out = run.end_iteration(
            batch,
            metrics,
            policy=policy,  # evaluated with exploration off: EGreedy keeps the greedy actions
            state=checkpoint,
            frames=collector.frames,
            buffers={"replay": buffers},
        )
        rewards = {k: round(v, 3) for k, v in out.items() if k.endswith("episode_reward")}
        print(f"iteration {run.iteration}: frames {collector.frames} {rewards}", flush=True)

    # --- the end: the trained (greedy) policy next to a random one, the curve, summary.json
    info = {"algorithm": cfg.algorithm, "variant": cfg.loss.mixer.upper(), "env": cfg.env.name}
    summary = run.finish(policy, info={**info, "frames": collector.frames})
    collector.shutdown()
    run.eval_env.close()
    print(json.dumps(summary["trained"]), "random:", json.dumps(summary["random"]))
    print(f"outputs in {cfg.run_dir}/ ({', '.join(summary['files'])})")


if __name__ == "__main__":
    main()
