"""IQL (independent Q-learning) on any registered marlkit env with discrete actions, one
Q-network, loss and replay buffer per agent group.

    python sota-implementations/iql/iql.py                                    # native navigation
    python sota-implementations/iql/iql.py env=vmas/navigation
    python sota-implementations/iql/iql.py env=pettingzoo/mpe2.simple_spread_v3
    python sota-implementations/iql/iql.py env=predator_prey                  # a loss per group
    python sota-implementations/iql/iql.py loss.double_dqn=true
    python sota-implementations/iql/iql.py collector=multisync
    python sota-implementations/iql/iql.py resume=runs/iql/<stamp>
    python sota-implementations/iql/iql.py model.kind=gnn                     # another encoder
    python sota-implementations/iql/iql.py seeds_in_process=4                 # 4 seeds, one process

The recipe (``configs/iql.yaml``) is that of ``qmix_vdn.py`` without a mixer (TorchRL's
``multiagent/iql.py`` at a CPU budget): per batch of 60 envs x 100 steps, a replay buffer
holding that one batch, ``epochs`` passes of ``frames_per_batch // minibatch_size`` minibatches
drawn without replacement, a soft target update after each optimiser step, and epsilon-greedy
exploration annealed over half the frames. Each agent learns its own TD target from its own
reward (``DQNLoss``) with a Q-network shared by the agents of its group. Everything here is a
marlkit part; the run's folder, checkpoints, evaluations and summary are :mod:`marlkit.train`'s.
With ``seeds_in_process=K`` it trains ``K`` seeds' runs in this one process, each as it would
train alone (Q-networks and their targets stacked), in ``<run_dir>/seed_<s>/``
(:func:`marlkit.train.q_learning.train_q_learning_seeds`, docs/training.md).
"""

# No `from __future__ import annotations`: the config dataclass below needs real annotations
# to load with importlib's spec_from_file_location, which leaves a file out of sys.modules.
import functools
from dataclasses import dataclass, field

import hydra
import torch
from omegaconf import DictConfig
from tensordict.nn import TensorDictSequential

from marlkit.envs import EnvBase
from marlkit.objectives import DQNLoss
from marlkit.train.config import QLearningRunConfig, register_schema
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
class IqlConfig(QLearningRunConfig):
    """The keys of ``configs/iql.yaml``, their types and ranges (checked before anything runs):
    the Q-learning procedure's, with no mixer, and memory."""

    model: QModelConfig = field(default_factory=QModelConfig)
    """Memory in the agents' Q-network (``model.memory=gru``: PyMARL's recurrent agents) and
    its encoder (``model.kind=cnn|deepsets|attention|gnn``)."""


register_schema("iql_schema", IqlConfig)


def make_policy(env: EnvBase, cfg: DictConfig) -> TensorDictSequential:
    """Every group's Q-network with its epsilon-greedy exploration, in one call; eps falls from
    ``eps_init`` to ``eps_end`` over ``annealing_fraction`` of the frames."""
    return egreedy_q_policy(env, cfg, "IQL")


def trained_policy(env: EnvBase, run_dir: str, exploration: str = "deterministic") -> object:
    """The run's policy (its latest checkpoint) for ``env``: greedy, or epsilon-greedy with
    ``exploration="random"``."""
    return load_policy(run_dir, env, make_policy, exploration)  # type: ignore[arg-type]


def make_losses(
    env: EnvBase, policy: TensorDictSequential, others: dict, cfg: DictConfig, **kwargs: object
) -> torch.nn.ModuleDict:
    """Each group's DQN loss over its Q-network (of ``policy``; IQL has no ``others``);
    ``kwargs`` go to every loss (``separate_dims`` of a stack of seeds)."""
    q_nets = {g: explorer.module for g, explorer in zip(env.groups, policy.module)}
    return torch.nn.ModuleDict(
        {
            g: DQNLoss(
                q_nets[g],
                group=g,
                gamma=cfg.loss.gamma,
                loss_function=cfg.loss.loss_function,
                double_dqn=cfg.loss.double_dqn,
                **kwargs,
            )
            for g in env.groups
        }
    )


@hydra.main(config_path="../configs", config_name="iql", version_base="1.3")
def main(cfg: DictConfig) -> None:
    env_fn = start(cfg)  # the config's ranges checked, threads, seed
    if cfg.seeds_in_process > 1:  # K seeds' runs stacked in this process, in run_dir/seed_<s>/

        def networks(env: EnvBase) -> tuple[TensorDictSequential, dict]:
            return make_policy(env, cfg), {}  # IQL: the Q-networks only

        losses_of = functools.partial(make_losses, cfg=cfg)
        print("\n".join(train_q_learning_seeds(cfg, networks, losses_of, "IQL")))
        return
    env = env_fn()  # for the specs; the single collector steps this one

    # --- the algorithm, per group: Q-actor with exploration, loss, then the shared procedure
    policy = make_policy(env, cfg)  # every group's actions in one call
    losses = make_losses(env, policy, {}, cfg)

    to_training_device(cfg, policy, losses)  # `device`, before the optimisers
    # --- the procedure IQL, VDN and QMIX share: replay, epochs of minibatches, soft target
    # updates, eps annealing, the run's logs, evaluations and checkpoints
    print("\n".join(train_q_learning(cfg, env, env_fn, policy, losses, "IQL")))


if __name__ == "__main__":
    main()
