"""MAPPO and IPPO on any registered marlkit env, one policy, critic and loss per agent group.

    python sota-implementations/mappo_ippo/mappo_ippo.py                      # native navigation
    python sota-implementations/mappo_ippo/mappo_ippo.py env=vmas/navigation
    python sota-implementations/mappo_ippo/mappo_ippo.py critic.centralised=false   # IPPO
    python sota-implementations/mappo_ippo/mappo_ippo.py critic.input=state   # the env's state
    python sota-implementations/mappo_ippo/mappo_ippo.py collector=multisync
    python sota-implementations/mappo_ippo/mappo_ippo.py resume=runs/mappo_ippo/<stamp>
    python sota-implementations/mappo_ippo/mappo_ippo.py model.memory=gru     # recurrent
    python sota-implementations/mappo_ippo/mappo_ippo.py model.kind=gnn       # another encoder

The recipe (``configs/mappo_ippo.yaml``) is TorchRL's multi-agent PPO tutorial: per batch, GAE
over the whole batch, then ``epochs`` passes over it in shuffled minibatches (each group's
replay buffer, sampled without replacement). MAPPO's critic reads every agent's observation
(``critic.centralised=true``), or with ``critic.input=state`` the env's global ``"state"`` and
the agent's one-hot index (JaxMARL's and EPyMARL's MAPPO critic); IPPO's reads the agent's
own. Everything here is a marlkit part: the env from the registry, the collector, the
per-group buffers, modules, estimator and loss; the run's folder, checkpoints, evaluations
and summary are :mod:`marlkit.train`'s.
With ``model.memory=gru|lstm`` the actor (and the critic) carry a recurrent state
(``(group, "rnn_state")``, collected with the rollout) and learn on windows of ``model.seq_len``
steps (:func:`marlkit.train.sequences.split_sequences`), replayed in recurrent mode;
``model.head_depth`` puts hidden layers between the cell and the output layer (JaxMARL's SMAX
actor and critic have one).
With ``model.kind=cnn|deepsets|attention|gnn`` the actor and the critic read the observation
through that encoder (:func:`marlkit.train.builders.encoder_network`, docs/models.md).
With ``seeds_in_process=K`` it trains ``K`` seeds' runs in this one process, each as it would
train alone, in ``<run_dir>/seed_<s>/`` (:mod:`marlkit.train.seeds`, docs/training.md).
"""

# No `from __future__ import annotations`: the config dataclasses below need real annotations
# to load with importlib's spec_from_file_location, which leaves a file out of sys.modules.
import copy
import functools
from dataclasses import dataclass, field
from typing import Any

import hydra
import torch
from omegaconf import MISSING, DictConfig
from tensordict.nn import TensorDictSequential

from marlkit.data.keys import STATE
from marlkit.data.specs import Categorical
from marlkit.envs import EnvBase
from marlkit.modules import Categorical as CategoricalDist
from marlkit.modules import (
    MaskedCategorical,
    MultiAgentMLP,
    NormalParamExtractor,
    ProbabilisticActor,
    StateValueCritic,
    StateWithAgentId,
    TanhNormal,
    orthogonal_init_,
)
from marlkit.modules.actors import distribution_keys
from marlkit.modules.models import MODEL_KINDS, ModelConfig
from marlkit.modules.rnn import recurrent_modules, recurrent_network, set_recurrent_mode
from marlkit.modules.seeds import seedwise_sampling, stack_seeds
from marlkit.objectives import GAE, ClipPPOLoss, NStepTD, SoftUpdate
from marlkit.objectives.standardise import RewardStandardiser
from marlkit.replay import SamplerWithoutReplacement
from marlkit.train import adam_per_group, update_groups
from marlkit.train.builders import encoder_network, memory_head, net_activation
from marlkit.train.config import (
    ActorCriticRunConfig,
    ConfigError,
    CriticConfig,
    EpochsTrainConfig,
    check_choice,
    check_fraction,
    check_int,
    check_not_above,
    check_real,
    register_schema,
)
from marlkit.train.precision import set_precision
from marlkit.train.scripts import (
    env_factory,
    finish,
    group_buffers,
    load_policy,
    loss_keys,
    make_config_collector,
    open_run,
    start,
    to_training_device,
)
from marlkit.train.seeds import (
    SeedBuffers,
    SeedRewardStatistics,
    SeedRuns,
    SeedState,
    check_seeds_config,
    collector_streams,
    run_seeds,
    seed_config,
    seed_standardisers,
    seed_width,
    stack_collector,
    update_seed_groups,
)
from marlkit.train.sequences import MemoryConfig, split_sequences

#: ``loss.estimator``'s choices
ESTIMATORS = ("gae", "nstep")


@dataclass
class PPOLossConfig:
    """``loss``: PPO's clipped objective, GAE."""

    gamma: float = MISSING
    """The discount."""
    lmbda: float = MISSING
    """GAE's lambda (``estimator=gae``)."""
    clip_epsilon: float = MISSING
    """The probability ratio is clipped to ``[1 - clip_epsilon, 1 + clip_epsilon]``."""
    entropy_coef: float = MISSING
    """Weight of the entropy bonus."""
    critic_coef: float = MISSING
    """Weight of the critic's loss."""
    loss_critic_type: str = MISSING
    """The critic's loss: ``l2``, ``smooth_l1`` or ``l1``."""
    normalize_advantage: bool = MISSING
    """Normalise the advantages of each minibatch."""
    team_episodes: bool = False
    """Advantages over the team's episode, as JaxMARL's MAPPO on SMAX (its GAE reads the
    episode's done for every agent): GAE reads the root ``done``/``terminated`` for each agent,
    so an agent's steps before its death earn the team's later rewards (a win's bonus included),
    and no agent's steps are masked out of GAE or the loss (a dead SMAX unit may only stop: its
    policy term has no gradient; its value learns the team's return). false: an agent's episode
    ends at its own ``terminated`` (a unit's death) and absent agents (``(group, "mask")``
    false) add nothing."""
    clip_value: float | None = None
    """PPO's value clipping: the critic's loss is the larger of the new value's and of the new
    value clipped to ``old +- clip_value`` (``old``: the value at collection), as JaxMARL's
    MAPPO and IPPO (their ``CLIP_EPS``) and MAPPO (Yu et al.); ``null``: none (TorchRL's
    tutorial recipe)."""
    standardise_rewards: bool = False
    """Each batch's rewards standardised by the running mean and variance of every reward
    collected so far, before GAE reads them (EPyMARL's ``standardise_rewards``, on in its
    MAPPO and IPPO configs; its statistics are updated once per batch, as here). The logged
    returns stay the env's."""
    estimator: str = "gae"
    """The advantages and value targets: ``gae`` (GAE with ``lmbda``, Yu et al.'s MAPPO,
    TorchRL's and JaxMARL's) or ``nstep``: ``nstep``-step TD returns
    (:class:`~marlkit.objectives.NStepTD`), EPyMARL's MAPPO and IPPO (``q_nstep``)."""
    nstep: int = 5
    """``estimator=nstep``: the rewards summed before the return bootstraps (EPyMARL: 5)."""
    target_critic_tau: float | None = None
    """The estimator reads a target copy of the critic, moved ``tau`` of the way to the critic
    after each batch's epochs (Polyak averaging; EPyMARL's ``target_update_interval_or_tau:
    0.01``); ``null``: the critic itself. Needs a feed-forward critic."""
    refresh_advantage: bool = False
    """Each epoch's advantage is the value target minus the critic's value at that epoch
    (:class:`~marlkit.objectives.ClipPPOLoss`'s ``refresh_advantage``), as EPyMARL's
    ``ppo_learner`` recomputes its TD error each epoch; false: the advantages computed once per
    batch."""

    def __post_init__(self) -> None:
        check_fraction("gamma", self.gamma)
        check_fraction("lmbda", self.lmbda)
        check_choice("estimator", self.estimator, ESTIMATORS)
        check_int("nstep", self.nstep, low=1)
        if self.target_critic_tau is not None:
            check_fraction("target_critic_tau", self.target_critic_tau, strict=True)
            if self.clip_value is not None:
                raise ConfigError(
                    "loss.clip_value clips the critic around the values of the batch, which "
                    "loss.target_critic_tau makes the target critic's: use one or the other"
                )
        check_real("clip_epsilon", self.clip_epsilon)
        check_real("entropy_coef", self.entropy_coef, low=0.0, strict=False)
        check_real("critic_coef", self.critic_coef, low=0.0, strict=False)
        check_choice("loss_critic_type", self.loss_critic_type, ("l2", "smooth_l1", "l1"))
        if self.clip_value is not None:
            check_real("clip_value", self.clip_value, low=0.0)


@dataclass
class PPOTrainConfig(EpochsTrainConfig):
    """``train``: epochs of minibatches over each batch."""

    compile: bool = MISSING
    """``torch.compile`` the loss (forward and backward); see docs/training.md."""
    anneal_lr: bool = False
    """The learning rate falls linearly over the run's batches, ``lr * (1 - i / n)`` for the
    i-th of n batches (0-based: the first at ``lr``, the last at ``lr / n``), as JaxMARL's,
    EPyMARL's and CleanRL's PPO do (``ANNEAL_LR``); logged as ``lr``."""
    clip_per_network: bool = False
    """The actor's and the critic's gradients each clipped to ``max_grad_norm`` on its own (one
    Adam, a parameter group each), as JaxMARL's and EPyMARL's separate actor and critic
    optimisers clip them; false: their norm together (TorchRL's). Together, a critic's large
    gradient shrinks the actor's step too."""


#: ``model.init``'s choices
INITS = ("default", "orthogonal")


@dataclass
class PPOMemoryConfig(MemoryConfig):
    """``model``: memory in the policy and the critic (see :class:`MemoryConfig`)."""

    critic_memory: bool = True
    """The critic has memory too (false: EPyMARL's feed-forward critic)."""
    kind: str = "mlp"
    """The encoder of the actor and the critic: ``mlp`` (the ``policy``/``critic`` MLPs),
    ``cnn``, ``deepsets``, ``attention`` or ``gnn`` (:class:`marlkit.modules.ModelConfig`'s
    kinds, with its defaults for the encoder's own sizes)."""
    inputs: list[str] | None = None
    """The group's entries the encoder reads in place of its observation (e.g. SMAX's
    ``[entities, own]`` with ``kind=deepsets``); see :class:`marlkit.modules.ModelConfig`."""
    entity_mask: str | None = None
    """The group's bool entry masking the entity sets (e.g. SMAX's ``entity_mask``)."""
    cnn_cells: list[int] = field(default_factory=lambda: list(ModelConfig().cnn_cells))
    """``kind=cnn``: output channels of each conv layer (TorchRL's default: three of 32)."""
    kernel_size: int = ModelConfig.kernel_size
    """``kind=cnn``: the kernel of every conv layer (5: MAgent2's 13 x 13 views need a
    smaller one, or fewer layers)."""
    stride: int = ModelConfig.stride
    """``kind=cnn``: the stride of every conv layer."""
    padding: int = ModelConfig.padding
    """``kind=cnn``: the padding of every conv layer."""
    init: str = "default"
    """How the actor's and the critic's linear and conv layers are drawn: ``default`` (torch's,
    uniform in ``+-1/sqrt(in)``) or ``orthogonal`` (CleanRL's, JaxMARL's and the MAPPO paper's
    PPO: orthogonal weights with gain sqrt(2), the actor's output layer 0.01, so that the first
    policy is near uniform, the critic's 1.0, zero biases;
    :func:`marlkit.modules.orthogonal_init_`). Recurrent cells keep torch's initialisation."""
    init_head_gain: float | None = None
    """With ``init=orthogonal``: the gain of the hidden layers after the recurrent cell
    (``head_depth``); null: sqrt(2) as the others. JaxMARL's recurrent MAPPO draws them with 2."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("kind", self.kind, MODEL_KINDS)
        check_choice("init", self.init, INITS)
        if self.init_head_gain is not None:
            check_real("init_head_gain", self.init_head_gain)
            if self.init != "orthogonal":
                raise ConfigError(
                    f"init_head_gain={self.init_head_gain} is the orthogonal initialisation's "
                    f"gain after the recurrent cell: it needs model.init=orthogonal, got "
                    f"{self.init!r}"
                )
        if not list(self.cnn_cells):
            raise ConfigError("cnn_cells must name at least one conv layer, got []")
        for channels in self.cnn_cells:
            check_int("cnn_cells", channels, low=1)
        check_int("kernel_size", self.kernel_size, low=1)
        check_int("stride", self.stride, low=1)
        check_int("padding", self.padding, low=0)


#: ``critic.input``'s choices
CRITIC_INPUTS = ("observations", "state")


@dataclass
class PPOCriticConfig(CriticConfig):
    """``critic``: the critic's network and what it reads."""

    input: str = "observations"
    """What the critic reads: ``observations`` (every agent's joined, MAPPO, or the agent's
    own, IPPO: ``centralised``) or ``state``: the env's global ``"state"`` ``[*B, s]`` joined
    with the agent's one-hot index in its group, ``[*B, n, s + n]``, as JaxMARL's MAPPO critic
    (its ``world_state`` wrapper) and EPyMARL's ``cv_critic`` read it; MAPPO only
    (``centralised=true``), with the ``mlp`` encoder (``model.kind``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("input", self.input, CRITIC_INPUTS)


@dataclass
class MappoIppoConfig(ActorCriticRunConfig):
    """The keys of ``configs/mappo_ippo.yaml`` (its types and ranges, checked before anything
    runs)."""

    critic: PPOCriticConfig = MISSING
    """The critic's network and what it reads."""
    loss: PPOLossConfig = MISSING
    """PPO's loss and GAE."""
    train: PPOTrainConfig = MISSING
    """The optimiser and the epochs per batch."""
    model: PPOMemoryConfig = field(default_factory=PPOMemoryConfig)
    """Memory in the networks."""
    seeds_in_process: int = 1
    """Train this many seeds' runs in this one process (``seed``, ``seed + w``, ...: see
    :func:`marlkit.train.seeds.run_seeds`), their networks stacked, each in
    ``<run_dir>/seed_<s>/`` as its own run would train; 1: one run, in ``run_dir``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("seeds_in_process", self.seeds_in_process, low=1)
        check_critic_input(self.critic, self.model)
        recurrent_critic = self.model.memory != "none" and self.model.critic_memory
        if self.loss.target_critic_tau is not None and recurrent_critic:
            raise ConfigError(
                "loss.target_critic_tau needs a feed-forward critic: the critic has memory "
                f"(model.memory={self.model.memory}, model.critic_memory=true); set "
                "model.critic_memory=false (EPyMARL's critics are feed-forward)"
            )
        if self.seeds_in_process > 1 and self.train.clip_per_network:
            raise ConfigError(
                f"seeds_in_process={self.seeds_in_process} does not support "
                "train.clip_per_network=True yet (the stack clips each seed's gradient as one): "
                "run the seeds as separate runs, or leave train.clip_per_network at False"
            )
        check_not_above(  # an epoch would be one minibatch of the whole batch
            "train.minibatch_size",
            self.train.minibatch_size,
            "collector.frames_per_batch",
            self.collector.frames_per_batch,
            "each epoch passes over the batch in minibatches of at most that many frames",
        )


register_schema("mappo_ippo_schema", MappoIppoConfig)  # configs/mappo_ippo.yaml's defaults


def memory(cfg: DictConfig) -> str:
    """``model.memory`` (``none`` for a checkpoint's config written before it existed)."""
    return str(cfg.get("model", {}).get("memory", "none"))


def kind(model: Any) -> str:
    """``model.kind`` (``mlp`` without a ``model`` or for a config written before it existed)."""
    return "mlp" if model is None else str(model.get("kind", "mlp"))


def make_actor(env: EnvBase, group: str, cfg: DictConfig, model: Any = None) -> ProbabilisticActor:
    """A TanhNormal policy for a continuous action spec, a categorical one for a discrete; an
    MLP, or with ``model.memory`` a recurrent network writing the distribution's keys, or with
    ``model.kind`` another encoder (:func:`~marlkit.train.builders.encoder_network`)."""
    n_agents = len(env.group_map[group])
    n_obs = env.observation_spec[group, "observation"].shape[-1]
    spec = env.action_spec[group, "action"]
    activation = net_activation(cfg, "policy.activation")

    def net(n_out: int, dist: type, head: Any = None) -> Any:
        keys = [k for name, k in distribution_keys(dist, group).items() if name != "mask"]
        if kind(model) != "mlp":
            return encoder_network(
                env, group, cfg, model, n_outputs=n_out, out_keys=keys, postprocess=head
            )
        if model is None or model.memory == "none":
            mlp = MultiAgentMLP(
                n_obs,
                n_out,
                n_agents,
                share_params=cfg.share_params,
                depth=cfg.depth,
                num_cells=cfg.num_cells,
                activation=activation,
            )
            return mlp if head is None else torch.nn.Sequential(mlp, head)
        return recurrent_network(
            n_obs,
            n_out,
            n_agents,
            memory=model.memory,
            hidden_size=model.memory_hidden,
            group=group,
            out_keys=keys,
            head=head,
            share_params=cfg.share_params,
            depth=cfg.depth,
            num_cells=cfg.num_cells,
            activation=activation,
            **memory_head(model),
        )

    if isinstance(spec, Categorical):
        masked = (group, "action_mask") in env.observation_spec.keys(True, True)
        dist = MaskedCategorical if masked else CategoricalDist
        return ProbabilisticActor(net(spec.n, dist), group=group, distribution_class=dist)
    batch = (0,) * len(env.batch_size)  # the bounds of one env: [n_agents, act_dim]
    low, high = spec.low[batch], spec.high[batch]
    bounds: dict[str, Any] = {"low": low, "high": high}
    if bool((low == low.flatten()[0]).all() & (high == high.flatten()[0]).all()):
        # one bound for every agent and dim (VMAS: [-1, 1]) as numbers: TanhNormal then checks
        # them once in Python and, for [-1, 1], leaves out the affine map that is the identity
        # (the same values, fewer ops at every update)
        bounds = {"low": float(low.flatten()[0]), "high": float(high.flatten()[0])}
    return ProbabilisticActor(
        net(2 * spec.shape[-1], TanhNormal, NormalParamExtractor()),
        group=group,
        distribution_class=TanhNormal,
        distribution_kwargs=bounds,
    )


def critic_input(critic: Any) -> str:
    """``critic.input`` of the section (a config or the schema's dataclass; ``observations``
    for a checkpoint's config written before it existed)."""
    return str(getattr(critic, "input", "observations"))


def check_critic_input(critic: Any, model: Any) -> None:
    """``critic.input=state`` with what it needs of the config: MAPPO's critic
    (``critic.centralised``), the ``mlp`` encoder (``model.kind``).

    Raises:
        ConfigError: ``critic.input=state`` with ``critic.centralised=false`` or another
            ``model.kind``; the message names both keys.
    """
    if critic_input(critic) != "state":
        return
    if not critic.centralised:
        raise ConfigError(
            "critic.input=state is MAPPO's critic (critic.centralised=true); IPPO's "
            "(critic.centralised=false) reads the agent's own observation: use "
            "critic.input=observations with it"
        )
    encoder = str(getattr(model, "kind", "mlp"))
    if encoder != "mlp":
        raise ConfigError(
            f"critic.input=state reads the env's state through the mlp encoder; "
            f"model.kind={encoder} reads the group's observations: use model.kind=mlp "
            "with critic.input=state, or critic.input=observations"
        )


def state_width(env: EnvBase) -> int:
    """The features ``s`` of the env's root ``"state"`` ``[*B, s]``, which ``critic.input=state``
    reads.

    Raises:
        ConfigError: the env has no root ``"state"`` (the message lists its keys and the envs
            that have one), or its state is not a vector.
    """
    if STATE not in env.state_spec:
        keys = [*env.observation_spec.keys(True, True), *env.state_spec.keys(True, True)]
        raise ConfigError(
            f"critic.input=state reads the env's global 'state' [*B, s]; this env "
            f"({type(env).__name__}) has none, its keys: {keys}. The native scenarios "
            "(navigation, swarm, predator_prey, smax/<map>) have one, and the adapters' envs "
            "whose simulator gives one (PettingZoo's with a state_space, MPE's say; jaxmarl/SMAX; "
            "mujoco/; magent2/ and meltingpot/, flattened); VMAS's, Gymnasium's and EPyMARL's "
            "(gymma/, lbforaging/, rware/) have none: use critic.input=observations"
        )
    shape = env.state_spec[STATE].shape[len(env.batch_size) :]
    if len(shape) != 1:
        raise ConfigError(
            f"critic.input=state reads a state vector [*B, s]; this env's 'state' is "
            f"[*B, {', '.join(map(str, shape))}]: flatten it (env.transforms=[flatten_observation])"
            " or use critic.input=observations"
        )
    return int(shape[0])


def make_critic(env: EnvBase, group: str, cfg: DictConfig, model: Any) -> Any:
    """The value of each agent, from every agent's observation (MAPPO) or its own (IPPO), or
    with ``critic.input=state`` from the env's ``"state"`` and the agent's one-hot index;
    recurrent with ``model.memory`` and ``model.critic_memory``; ``model.kind``'s encoder.

    Raises:
        ConfigError: ``critic.input=state`` on an env without a ``"state"`` vector, or with
            IPPO or an encoder other than ``mlp`` (:func:`check_critic_input`).
    """
    if critic_input(cfg) == "state":
        return make_state_critic(env, group, cfg, model)
    if kind(model) != "mlp":
        return encoder_network(
            env,
            group,
            cfg,
            model,
            n_outputs=1,
            out_keys=[(group, "state_value")],
            centralised=cfg.centralised,
            memory=bool(model.critic_memory),
            name="critic",  # (group, "critic_rnn_state"): the actor has "rnn_state"
        )
    if model.memory != "none" and model.critic_memory:
        return recurrent_network(
            env.observation_spec[group, "observation"].shape[-1],
            1,
            len(env.group_map[group]),
            memory=model.memory,
            hidden_size=model.memory_hidden,
            group=group,
            name="critic_rnn",  # (group, "critic_rnn_state"): the actor has "rnn_state"
            out_keys=[(group, "state_value")],
            centralised=cfg.centralised,
            share_params=cfg.share_params,
            depth=cfg.depth,
            num_cells=cfg.num_cells,
            activation=net_activation(cfg, "critic.activation"),
            **memory_head(model),
        )
    return StateValueCritic(
        len(env.group_map[group]),
        env.observation_spec[group, "observation"].shape[-1],
        group=group,
        centralised=cfg.centralised,
        share_params=cfg.share_params,
        depth=cfg.depth,
        num_cells=cfg.num_cells,
        activation=net_activation(cfg, "critic.activation"),
    )


def make_state_critic(env: EnvBase, group: str, cfg: DictConfig, model: Any) -> Any:
    """``critic.input=state``: each of the group's ``n`` agents reads the root ``"state"``
    ``[*B, s]`` joined with its one-hot index, ``[*B, n, s + n]``
    (:class:`~marlkit.modules.StateWithAgentId`), through the critic's MLP (shared with
    ``critic.share_params``: one network, each agent its own value), and with
    ``model.critic_memory`` a cell (its state ``(group, "critic_rnn_state")``)."""
    check_critic_input(cfg, model)
    n, width = len(env.group_map[group]), state_width(env)
    if model.memory != "none" and model.critic_memory:
        return recurrent_network(
            width + n,
            1,
            n,
            memory=model.memory,
            hidden_size=model.memory_hidden,
            group=group,
            in_key=STATE,
            preprocess=StateWithAgentId(n),
            name="critic_rnn",
            out_keys=[(group, "state_value")],
            share_params=cfg.share_params,
            depth=cfg.depth,
            num_cells=cfg.num_cells,
            activation=net_activation(cfg, "critic.activation"),
            **memory_head(model),
        )
    return StateValueCritic(
        n,
        group=group,
        state_dim=width,
        agent_id=True,
        share_params=cfg.share_params,
        depth=cfg.depth,
        num_cells=cfg.num_cells,
        activation=net_activation(cfg, "critic.activation"),
    )


def init_networks(cfg: DictConfig, policy: TensorDictSequential, critics: dict[str, Any]) -> None:
    """``model.init=orthogonal``: every group's actor and critic drawn again, orthogonal
    (:func:`~marlkit.modules.orthogonal_init_`: output gain 0.01 for an actor, 1.0 for a critic,
    ``model.init_head_gain`` after a recurrent cell); ``default`` leaves them (and torch's
    generator) as built."""
    model = cfg.get("model")
    if model is None or model.get("init", "default") == "default":
        return
    head_gain = model.get("init_head_gain")
    for actor in policy.module:
        orthogonal_init_(actor, output_gain=0.01, head_gain=head_gain)
    for critic in critics.values():
        orthogonal_init_(critic, output_gain=1.0, head_gain=head_gain)


def make_policy(env: EnvBase, cfg: DictConfig) -> TensorDictSequential:
    """Every group's actor, in one call."""
    model = cfg.get("model") if memory(cfg) != "none" or kind(cfg.get("model")) != "mlp" else None
    return TensorDictSequential(*(make_actor(env, g, cfg.policy, model) for g in env.groups))


def trained_policy(env: EnvBase, run_dir: str, exploration: str = "deterministic") -> Any:
    """The policy of the run in ``run_dir`` (its latest checkpoint), for ``env``, an env of the
    run's kind (its batch size may differ): its mode (greedy, or the squashed mean), or sampled
    with ``exploration="random"``. To film it, ``marlkit record ENV --policy film.py:build``
    with ``build(env)`` returning ``trained_policy(env, RUN)`` (docs/training.md).

    Raises:
        FileNotFoundError: no checkpoint in ``run_dir``.
        ValueError: ``env`` is not of the run's kind; the message names the run's env and its
            keyword arguments.
    """
    return load_policy(run_dir, env, make_policy, exploration)  # type: ignore[arg-type]


def make_loss(actor: Any, critic: Any, group: str, cfg: DictConfig, **kwargs: Any) -> ClipPPOLoss:
    """The group's PPO loss of ``loss``'s settings."""
    return ClipPPOLoss(
        actor,
        critic,
        group=group,
        clip_epsilon=cfg.loss.clip_epsilon,
        entropy_coef=cfg.loss.entropy_coef,
        critic_coef=cfg.loss.critic_coef,
        loss_critic_type=cfg.loss.loss_critic_type,
        normalize_advantage=cfg.loss.normalize_advantage,
        clip_value=cfg.loss.get("clip_value"),  # None for a config written before it existed
        refresh_advantage=bool(cfg.loss.get("refresh_advantage", False)),
        **kwargs,
    )


#: loss.team_episodes: the entries of the root flags per agent, and the mask entry GAE and the
#: loss read instead of ``(group, "mask")`` (never written, so nothing is masked).
TEAM_FLAGS = {"done": "team_done", "terminated": "team_terminated"}
NO_MASK = "team_episodes_no_mask"


def estimators(cfg: DictConfig, critics: dict[str, Any]) -> dict[str, Any]:
    """Per group, ``loss.estimator``'s estimator over the values of ``critics`` (each group's
    critic, or its target copy)."""
    loss = cfg.loss
    if loss.get("estimator", "gae") == "nstep":
        return {
            g: NStepTD(loss.gamma, loss.nstep, value_network=c, group=g) for g, c in critics.items()
        }
    return {g: GAE(loss.gamma, loss.lmbda, value_network=c, group=g) for g, c in critics.items()}


def target_critics(cfg: DictConfig, critics: dict[str, Any]) -> tuple[Any, Any]:
    """With ``loss.target_critic_tau``, per group a frozen copy of its critic and the
    :class:`~marlkit.objectives.SoftUpdate` that moves the copies after each batch; ``(None,
    None)`` without."""
    tau = cfg.loss.get("target_critic_tau")
    if tau is None:
        return None, None
    targets = torch.nn.ModuleDict(
        {g: copy.deepcopy(c).requires_grad_(False) for g, c in critics.items()}
    )
    return targets, SoftUpdate([(critics[g], targets[g]) for g in critics], tau=tau)


def use_team_episodes(gaes: dict[str, Any], losses: Any) -> None:
    """``loss.team_episodes``: each group's GAE reads the team's flags (:func:`team_flags`)
    and neither GAE nor the loss reads the group's mask."""
    for g, gae in gaes.items():
        done, terminated = ((g, TEAM_FLAGS[f]) for f in ("done", "terminated"))
        gae.set_keys(done=done, terminated=terminated, mask=(g, NO_MASK))
        losses[g].set_keys(mask=(g, NO_MASK))


def team_flags(batch: Any, agents: dict[str, int]) -> None:
    """Write ``("next", group, "team_done"|"team_terminated")`` ``[*B, T, n, 1]``: the root
    ``("next", "done"|"terminated")`` ``[*B, T, 1]`` given to each of the group's ``n`` agents
    (``agents``: each group's ``n``)."""
    for g, n in agents.items():
        for flag, entry in TEAM_FLAGS.items():
            root = batch.get(("next", flag))
            batch.set(("next", g, entry), root.unsqueeze(-2).expand(*root.shape[:-1], n, 1).clone())


def anneal_lr(cfg: DictConfig, optims: dict[str, torch.optim.Optimizer], collector: Any) -> Any:
    """With ``train.anneal_lr``, the learning rate of the batch ``collector`` just yielded
    (:class:`PPOTrainConfig`'s schedule, set on every optimiser; a resumed run goes on from its
    collector's count); ``None`` without."""
    if not cfg.train.anneal_lr:
        return None
    lr = cfg.train.lr * (1.0 - (collector.batches - 1) / collector.num_batches)
    for optim in optims.values():
        for group in optim.param_groups:
            group["lr"] = lr
    return lr


def reward_standardisers(groups: Any, cfg: DictConfig) -> Any:
    """With ``loss.standardise_rewards``, per group a
    :class:`~marlkit.objectives.standardise.RewardStandardiser` of the rewards its GAE reads;
    ``None`` without."""
    if not cfg.loss.standardise_rewards:
        return None
    return torch.nn.ModuleDict({g: RewardStandardiser([("next", g, "reward")]) for g in groups})


def advantages(batch: Any, gaes: dict[str, Any], standardisers: Any) -> Any:
    """``batch`` with each group's advantages and value targets (GAE), over its rewards
    standardised first where ``standardisers`` are given (then a shallow copy of ``batch``,
    whose own rewards stay the env's)."""
    with torch.no_grad():
        for standardise in (standardisers or {}).values():
            batch = standardise(batch)
        for gae in gaes.values():
            gae(batch)
    return batch


def adam_per_network(losses: Any, lr: float, eps: float = 1e-8) -> dict[str, torch.optim.Adam]:
    """``train.clip_per_network``: per group, one (fused) Adam with a parameter group for the
    actor and one for the critic (the same steps as one group: Adam is elementwise), so that
    each is clipped on its own."""
    optims = {}
    for group, loss in losses.items():
        actor = list(loss.actor_network.parameters())
        mine = {id(p) for p in actor}
        rest = [p for p in loss.parameters() if id(p) not in mine]
        optims[group] = torch.optim.Adam(
            [{"params": actor}, {"params": rest}], lr=lr, eps=eps, fused=True
        )
    return optims


def objective(terms: Any) -> Any:
    """What PPO minimises: the objective, critic and entropy losses summed."""
    return terms["loss_objective"] + terms["loss_critic"] + terms["loss_entropy"]


def train_seeds(cfg: DictConfig) -> None:
    """``seeds_in_process=K``: K seeds' runs in this process (:mod:`marlkit.train.seeds`).
    Each seed's env, policy and critics are made under its seed as its own run makes them, then
    stacked; each seed's run lives in ``<run_dir>/seed_<s>/``."""
    n_seeds = check_seeds_config(cfg)

    def build(seed: int) -> tuple[EnvBase, TensorDictSequential, dict[str, Any]]:
        torch.manual_seed(seed)  # as start() seeds a run of its own
        env = env_factory(cfg, cfg.env.num_envs, seed)()
        policy = make_policy(env, cfg)
        critics = {g: make_critic(env, g, cfg.critic, cfg.model) for g in env.groups}
        init_networks(cfg, policy, critics)  # model.init, under the seed's own generator
        return env, policy, critics

    first = build(cfg.seed)
    seeds = run_seeds(cfg.seed, n_seeds, seed_width(first[0]))
    built = [first, *(build(s) for s in seeds[1:])]
    groups = first[0].groups
    streams = collector_streams(seeds)  # each seed's draws where its own collector starts them
    policy = seedwise_sampling(stack_seeds([b[1] for b in built]), streams)
    actors = dict(zip(groups, policy.module))
    critics = {g: stack_seeds([b[2][g] for b in built]) for g in groups}
    # loss.target_critic_tau: stacked target copies (each seed's slices its own target)
    targets, move_targets = target_critics(cfg, critics)
    gaes = estimators(cfg, dict(targets) if targets is not None else critics)
    losses = torch.nn.ModuleDict(
        {g: make_loss(actors[g], critics[g], g, cfg, separate_dims=1) for g in groups}
    )
    if cfg.loss.team_episodes:
        use_team_episodes(gaes, losses)
    # elementwise: each seed's state in its slices
    optims = adam_per_group(losses, cfg.train.lr, cfg.train.adam_eps)
    frames = cfg.collector.frames_per_batch
    buffers = SeedBuffers(groups, seeds, frames, cfg.train.minibatch_size)
    # the seeds' envs stepped together (Python adapters: one env of K x num_envs instances)
    collector, split = stack_collector(cfg, [b[0] for b in built], seeds, policy)
    # loss.standardise_rewards: each seed's statistics of its own rewards, saved with its run
    standardisers = None
    parts: list[dict[str, Any]] = [{} for _ in seeds]
    if cfg.loss.standardise_rewards:
        standardisers = seed_standardisers({g: [("next", g, "reward")] for g in groups}, n_seeds)
        for k, part in enumerate(parts):
            part["reward_standardisers"] = SeedRewardStatistics(standardisers, k)
    saved = dict(losses)  # each seed's slices of these go to its run's checkpoints
    if targets is not None:
        saved.update({f"target_critic.{g}": targets[g] for g in groups})
    runs = SeedRuns(
        [open_run(seed_config(cfg, s)) for s in seeds],
        collector,
        [SeedState(k, saved, optims, streams) for k in range(n_seeds)],
        [b[1] for b in built],
        policy,
        split=split,
        parts=parts,
    )
    runs.restore()

    steps = cfg.train.epochs * max(1, frames // cfg.train.minibatch_size)
    keys = loss_keys(losses.values())
    for batch in runs.batches():  # [K, num_envs, T]
        if cfg.loss.team_episodes:
            team_flags(batch, {g: len(first[0].group_map[g]) for g in groups})
        data = advantages(batch, gaes, standardisers)  # the batch logged keeps its rewards
        buffers.empty()
        buffers.extend(data.select(*keys, strict=False))
        lr = anneal_lr(cfg, optims, collector)  # the seeds' batches are the collector's
        metrics = update_seed_groups(
            losses,
            optims,
            buffers,
            steps,
            max_grad_norm=cfg.train.max_grad_norm,
            objective=objective,
        )
        if move_targets is not None:
            move_targets.step()
        if lr is not None:
            metrics = [{**m, "lr": lr} for m in metrics]
        print(runs.progress(runs.end_iteration(batch, metrics)), flush=True)

    variant = "MAPPO" if cfg.critic.centralised else "IPPO"
    info = {"algorithm": cfg.algorithm, "variant": variant, "env": cfg.env.name}
    info.update(precision="fp32", seeds_in_process=n_seeds)
    print("\n".join(runs.finish(info)))


@hydra.main(config_path="../configs", config_name="mappo_ippo", version_base="1.3")
def main(cfg: DictConfig) -> None:
    env_fn = start(cfg)  # the config's ranges checked, threads, seed
    if cfg.seeds_in_process > 1:
        return train_seeds(cfg)
    env = env_fn()  # for the specs; the single collector steps this one
    groups = env.groups

    # --- the algorithm, per group: actor, critic, GAE, PPO loss, optimiser, buffer
    policy = make_policy(env, cfg)  # every group's actions in one call
    actors = dict(zip(groups, policy.module))
    critics = {g: make_critic(env, g, cfg.critic, cfg.model) for g in groups}
    init_networks(cfg, policy, critics)  # model.init
    # loss.target_critic_tau: the estimator reads target copies of the critics (EPyMARL's)
    targets, move_targets = target_critics(cfg, critics)
    gaes = estimators(cfg, dict(targets) if targets is not None else critics)
    losses = torch.nn.ModuleDict({g: make_loss(actors[g], critics[g], g, cfg) for g in groups})
    if cfg.loss.team_episodes:
        use_team_episodes(gaes, losses)
    standardisers = reward_standardisers(groups, cfg)  # loss.standardise_rewards
    to_training_device(cfg, policy, losses, *gaes.values())  # `device`, before the optimisers
    clip_apart = bool(cfg.train.get("clip_per_network", False))  # absent: configs before it
    optims = (adam_per_network if clip_apart else adam_per_group)(
        losses, cfg.train.lr, cfg.train.adam_eps
    )
    precision = set_precision(losses, cfg.train.precision)  # bf16: autocast in the updates
    # train.compile: the loss's forward and backward through torch.compile (inductor), the
    # same parameters; compiled on the first minibatch
    loss_fns = {g: torch.compile(losses[g]) if cfg.train.compile else losses[g] for g in groups}
    # model.memory: the buffers hold windows of seq_len steps, the losses replay them in
    # recurrent mode, and critics with memory step with the rollout (their state is collected)
    recurrent, seq_len = cfg.model.memory != "none", cfg.model.seq_len
    if recurrent:
        loss_fns = {g: set_recurrent_mode(True)(fn) for g, fn in loss_fns.items()}
    frames = cfg.collector.frames_per_batch
    sampler = functools.partial(SamplerWithoutReplacement, seed=cfg.seed)
    per_item = seq_len if recurrent else 1  # minibatch_size counts steps
    minibatch = max(1, cfg.train.minibatch_size // per_item)
    # Each buffer holds one batch's items (steps, or windows of seq_len steps with memory): made
    # at the first batch to its size. (Sized in frames, windows of 128 steps took 128x the
    # batch's memory: 15.5 GB for configs/mappo_smax.yaml.)
    buffers: Any = None
    capacity = 0
    stepping = [c for c in critics.values() if recurrent_modules(c)]  # critics with memory
    acting = TensorDictSequential(policy, *stepping) if stepping else policy
    collector = make_config_collector(cfg, env, env_fn, acting)

    # --- the run folder: logs, evaluations, checkpoints; resume from its latest checkpoint
    run = open_run(cfg)
    state = {"losses": losses, "optims": optims, "collector": collector}
    if standardisers is not None:  # a resumed run goes on with the same statistics
        state["reward_standardisers"] = standardisers
    if targets is not None:
        state["target_critics"] = targets
    run.track(state, policy=policy)
    run.restore()

    # --- the loop: collect, GAE, epochs of minibatches per group, then the run's chores
    steps = cfg.train.epochs * max(1, frames // cfg.train.minibatch_size)
    keys = loss_keys(losses.values())
    for batch in run.batches(collector):
        if cfg.loss.team_episodes:
            team_flags(batch, {g: len(env.group_map[g]) for g in groups})
        data = advantages(batch, gaes, standardisers).select(*keys, strict=False)
        if recurrent:  # [*B, T] -> windows [N, burn_in + seq_len], counted steps masked
            items = split_sequences(data, seq_len, cfg.model.burn_in)
        else:
            items = data.reshape(-1)
        if len(items) > capacity:
            capacity = len(items)
            buffers = group_buffers(groups, capacity, sampler, minibatch)
        buffers.empty()
        buffers.extend(items)
        lr = anneal_lr(cfg, optims, collector)
        metrics = update_groups(
            loss_fns,
            optims,
            buffers,
            steps,
            max_grad_norm=cfg.train.max_grad_norm,
            objective=objective,
            clip_per_param_group=clip_apart,
        )
        if move_targets is not None:
            move_targets.step()
        if lr is not None:
            metrics["lr"] = lr
        collector.update_policy_weights_()
        out = run.end_iteration(batch, metrics, policy=policy, frames=collector.frames)
        print(run.progress(out), flush=True)

    # --- the end: the trained policy next to a random one, the curve, summary.json
    variant = "MAPPO" if cfg.critic.centralised else "IPPO"
    info = {"algorithm": cfg.algorithm, "variant": variant, "env": cfg.env.name}
    info["precision"] = precision  # bf16, or fp32 where the hardware has no bf16
    print("\n".join(finish(run, policy, collector, info)))


if __name__ == "__main__":
    main()
