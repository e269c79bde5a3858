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
    python sota-implementations/qmix_vdn/qmix_vdn.py model.memory=gru model.memory_hidden=64
    python sota-implementations/qmix_vdn/qmix_vdn.py model.kind=gnn                # another encoder
    python sota-implementations/qmix_vdn/qmix_vdn.py --config-name qmix_lbf        # EPyMARL's QMIX
    python sota-implementations/qmix_vdn/qmix_vdn.py seeds_in_process=4       # 4 seeds, one process

The recipe (``configs/qmix_vdn.yaml``) is TorchRL's ``multiagent/qmix_vdn.py`` at a CPU budget:
per batch of 60 envs x 100 steps, a replay buffer holding that one batch, ``epochs`` passes of
``frames_per_batch // minibatch_size`` minibatches drawn without replacement, a soft target
update after each optimiser step, and epsilon-greedy exploration annealed over half the frames.
The agents' Q-network is shared (``MultiAgentMLP(share_params=True)``); QMIX's hypernetworks
read the agents' observations concatenated (``loss.mixer_state=observation``) or the env's
global ``"state"`` (``loss.mixer_state=state``); VDN sums. Everything here is a marlkit part;
the run's folder, checkpoints, evaluations and summary are :mod:`marlkit.train`'s.
With ``seeds_in_process=K`` it trains ``K`` seeds' runs in this one process, each as it would
train alone (Q-networks, mixers and their targets stacked), in ``<run_dir>/seed_<s>/``
(:func:`marlkit.train.q_learning.train_q_learning_seeds`, docs/training.md).
"""

# No `from __future__ import annotations`: the config dataclasses below need real annotations
# to load with importlib's spec_from_file_location, which leaves a file out of sys.modules.
import functools
from dataclasses import dataclass, field
from typing import Any, cast

import hydra
import torch
from omegaconf import MISSING, DictConfig
from tensordict.nn import TensorDictSequential

from marlkit.envs import EnvBase
from marlkit.modules import Mixer, QMixer, VDNMixer
from marlkit.objectives import QMixerLoss
from marlkit.train.config import (
    QLearningRunConfig,
    QLossConfig,
    check_choice,
    check_int,
    check_real,
    register_schema,
)
from marlkit.train.q_learning import (
    QModelConfig,
    egreedy_q_policy,
    train_q_learning,
    train_q_learning_seeds,
)
from marlkit.train.scripts import (
    load_policy,
    start,
    to_training_device,
)


@dataclass
class QmixVdnLossConfig(QLossConfig):
    """``loss``: QMIX's or VDN's mixer, and the Q-learning loss."""

    mixer: str = MISSING
    """``qmix`` or ``vdn``."""
    mixer_state: str = MISSING
    """What QMIX's hypernetworks read: ``observation`` (the agents', joined) or ``state`` (the
    env's global ``"state"``, where it has one)."""
    mixing_embed_dim: int = MISSING
    """QMIX's mixing embedding size."""
    hypernet_layers: int = 1
    """Layers of QMIX's weight hypernetworks: 1 (PyMARL's QMixer) or 2 (EPyMARL's default,
    ``Linear -> ReLU -> Linear``)."""
    hypernet_embed: int = 64
    """The hidden width of QMIX's 2-layer weight hypernetworks (EPyMARL: 64)."""
    mixer_state_scale: float = 1.0
    """QMIX's hypernetworks read the state divided by this (1: as it comes, as EPyMARL)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("mixer", self.mixer, ("qmix", "vdn"))
        check_choice("mixer_state", self.mixer_state, ("observation", "state"))
        check_int("mixing_embed_dim", self.mixing_embed_dim, low=1)
        check_int("hypernet_layers", self.hypernet_layers, low=1, high=2)
        check_int("hypernet_embed", self.hypernet_embed, low=1)
        check_real("mixer_state_scale", self.mixer_state_scale)


@dataclass
class QmixVdnConfig(QLearningRunConfig):
    """The keys of ``configs/qmix_vdn.yaml`` (its types and ranges, checked before anything
    runs)."""

    loss: QmixVdnLossConfig = MISSING
    """The mixer and the loss."""
    model: QModelConfig = field(default_factory=QModelConfig)
    """Memory in the agents' Q-network (``model.memory=gru``: PyMARL's recurrent agents) and
    its encoder (``model.kind=cnn|deepsets|attention|gnn``)."""


register_schema("qmix_vdn_schema", QmixVdnConfig)  # configs/qmix_vdn.yaml's defaults


def make_policy(env: EnvBase, cfg: DictConfig) -> TensorDictSequential:
    """Every group's Q-network with its epsilon-greedy exploration, in one call; eps falls from
    ``eps_init`` to ``eps_end`` over ``annealing_fraction`` of the frames."""
    return egreedy_q_policy(env, cfg, cfg.loss.mixer.upper())


def trained_policy(env: EnvBase, run_dir: str, exploration: str = "deterministic") -> object:
    """The run's policy (its latest checkpoint) for ``env``: greedy, or epsilon-greedy with
    ``exploration="random"``."""
    return load_policy(run_dir, env, make_policy, exploration)  # type: ignore[arg-type]


def make_mixer(env: EnvBase, group: str, cfg: DictConfig) -> Mixer:
    """VDN's sum, or QMIX's hypernetwork of the agents' observations or of the env's state.

    Raises:
        ValueError: ``mixer_state=state`` on an env without a global ``"state"``.
    """
    n_agents = len(env.group_map[group])
    if cfg.mixer == "vdn":
        return VDNMixer(n_agents, group=group)
    hypernets = {
        "hypernet_layers": cfg.get("hypernet_layers", 1),
        "hypernet_embed": cfg.get("hypernet_embed", 64),
        "state_scale": float(cfg.get("mixer_state_scale", 1.0)),
    }
    if cfg.mixer_state == "observation":
        # [n, *obs]: vectors, or images and grids (model.kind=cnn) flattened by the mixer
        obs = env.observation_spec[group, "observation"].shape[len(env.batch_size) :]
        return QMixer(
            tuple(obs),
            cfg.mixing_embed_dim,
            n_agents,
            group=group,
            state_key=(group, "observation"),
            **hypernets,
        )
    if "state" not in env.state_spec:
        raise ValueError(
            "loss.mixer_state=state needs an env with a global 'state'; this one has none: "
            "use loss.mixer_state=observation"
        )
    shape = env.state_spec["state"].shape[len(env.batch_size) :]
    return QMixer(shape, cfg.mixing_embed_dim, n_agents, group=group, **hypernets)


def make_losses(
    env: EnvBase, policy: TensorDictSequential, mixers: dict, cfg: DictConfig, **kwargs: Any
) -> torch.nn.ModuleDict:
    """Each group's QMIX/VDN loss over its Q-network (of ``policy``) and its mixer; ``kwargs``
    go to every loss (``separate_dims`` of a stack of seeds)."""
    q_nets = {g: cast(Any, explorer).module for g, explorer in zip(env.groups, policy.module)}
    return torch.nn.ModuleDict(
        {
            g: QMixerLoss(
                q_nets[g],
                mixers[g],
                group=g,
                gamma=cfg.loss.gamma,
                loss_function=cfg.loss.loss_function,
                double_dqn=cfg.loss.double_dqn,
                **kwargs,
            )
            for g in env.groups
        }
    )


def make_networks(env: EnvBase, cfg: DictConfig) -> tuple[TensorDictSequential, dict]:
    """The policy, then each group's mixer, in the order a run draws their weights."""
    policy = make_policy(env, cfg)  # every group's actions in one call
    return policy, {g: make_mixer(env, g, cfg.loss) for g in env.groups}


@hydra.main(config_path="../configs", config_name="qmix_vdn", version_base="1.3")
def main(cfg: DictConfig) -> None:
    env_fn = start(cfg)  # the config's ranges checked, threads, seed
    variant = cfg.loss.mixer.upper()
    if cfg.seeds_in_process > 1:  # K seeds' runs stacked in this process, in run_dir/seed_<s>/
        networks = functools.partial(make_networks, cfg=cfg)
        losses_of = functools.partial(make_losses, cfg=cfg)
        print("\n".join(train_q_learning_seeds(cfg, networks, losses_of, variant)))
        return
    env = env_fn()  # for the specs; the single collector steps this one

    # --- the algorithm, per group: Q-actor with exploration, mixer, loss, then the shared procedure
    policy, mixers = make_networks(env, cfg)
    losses = make_losses(env, policy, mixers, cfg)

    to_training_device(cfg, policy, losses)  # `device`, before the optimisers
    # --- the procedure IQL, VDN and QMIX share: replay, epochs of minibatches, soft target
    # updates, eps annealing, the run's logs, evaluations and checkpoints
    print("\n".join(train_q_learning(cfg, env, env_fn, policy, losses, variant)))


if __name__ == "__main__":
    main()
