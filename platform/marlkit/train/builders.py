"""What several training scripts build the same way: the configured env (with the observation
transforms of ``env.transforms``), the activation a ``policy`` or ``critic`` section names
(:func:`net_activation`), and from an env's specs a group's Q-network over discrete actions, the
bounds of its continuous actions, and a network with an encoder chosen by ``model.kind``
(:func:`encoder_network`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import torch

from marlkit.data.specs import Bounded, Categorical, OneHot
from marlkit.envs import EnvBase, TransformedEnv, make_episodic
from marlkit.envs.transforms import make_transforms
from marlkit.modules import MultiAgentMLP, QValueActor, StateActionValueCritic, activation_class
from marlkit.modules.models import ModelConfig, build_model

__all__ = [
    "MemoryHead",
    "action_bounds",
    "encoder_network",
    "make_env",
    "memory_head",
    "net_activation",
    "q_actor",
    "q_critic",
]


def make_env(
    name: str,
    *,
    transforms: Sequence[str | Mapping[str, Any]] = (),
    **kwargs: Any,
) -> TransformedEnv:
    """The env of a training config: :func:`~marlkit.envs.make_episodic` (``kwargs``: its
    ``num_envs``, ``max_steps``, ``seed``, ``imports``, ``actions`` and the env's own keyword
    arguments) followed by the transforms ``transforms`` names (a reward transform, one with
    ``before_episode_sums``, goes before the episode sums instead)
    (:func:`~marlkit.envs.transforms.make_transforms`: ``["flatten_observation"]``,
    ``[{"name": "pixels", "layout": "CHW"}]``), new ones each call. A ``functools.partial`` of
    it pickles by reference: the factory multiprocess collectors take.

    Raises:
        ValueError, TypeError: an unknown transform or argument (naming the entry), or a
            transform that does not fit the env (naming the key); and what ``make_episodic``
            raises.

    Examples:
        >>> from marlkit.train.builders import make_env
        >>> env = make_env("navigation", num_envs=2, max_steps=10, transforms=["double_to_float"])
        >>> type(env.transform[-1]).__name__
        'DoubleToFloat'
    """
    built = make_transforms(transforms)  # a bad entry fails before the env is made
    first = [t for t in built if t.before_episode_sums]  # CommonReward: summed as trained on
    env = make_episodic(name, transforms=first, **kwargs)
    for transform in built:
        if not transform.before_episode_sums:
            env.append_transform(transform)
    return env


def _activation_name(net: Any) -> str:
    """``activation`` of a ``policy`` or ``critic`` section (a config or the schema's
    dataclass): ``"tanh"`` for a checkpoint's config written before the key existed."""
    return str(getattr(net, "activation", "tanh"))


def net_activation(net: Any, key: str = "activation") -> type[torch.nn.Module]:
    """The activation class ``activation`` of a ``policy`` or ``critic`` section names
    (:func:`~marlkit.modules.activation_class`: ``tanh``, marlkit's ``Tanh``, for a config
    without the key), for its networks' hidden layers.

    Raises:
        ValueError: a name that is not one of the choices; the message names ``key``.
    """
    return activation_class(_activation_name(net), key=key)


class MemoryHead(TypedDict):
    """:func:`memory_head`'s keyword arguments of :func:`~marlkit.modules.rnn.recurrent_network`."""

    head_depth: int
    head_cells: int


def memory_head(model: Any) -> MemoryHead:
    """The hidden layers between a network's cell and its output layer, as the keyword
    arguments of :func:`~marlkit.modules.rnn.recurrent_network`: ``head_depth`` layers of
    ``head_cells`` units (``model.memory_hidden`` where ``head_cells`` is ``None``). ``model``
    is a script's ``model`` section (a config or the schema's dataclass); one written before
    the keys existed gives ``head_depth=0``, the linear head it was trained with.

    Examples:
        >>> from types import SimpleNamespace
        >>> memory_head(SimpleNamespace(memory="gru", memory_hidden=128))
        {'head_depth': 0, 'head_cells': 128}
        >>> memory_head(SimpleNamespace(memory_hidden=128, head_depth=1, head_cells=64))
        {'head_depth': 1, 'head_cells': 64}
    """
    cells = getattr(model, "head_cells", None)
    return MemoryHead(
        head_depth=int(getattr(model, "head_depth", 0)),
        head_cells=int(model.memory_hidden if cells is None else cells),
    )


def q_actor(env: EnvBase, group: str, policy: Any, algorithm: str) -> QValueActor:
    """The Q-network of ``group`` (one :class:`MultiAgentMLP` over its agents, sized by
    ``policy.share_params``, ``policy.depth`` and ``policy.num_cells``, its hidden layers
    followed by ``policy.activation``) and its greedy action.

    Raises:
        ValueError: the group's actions are not discrete; the message names ``algorithm`` and
            what to do.
    """
    spec = env.action_spec[group, "action"]
    if not isinstance(spec, (Categorical, OneHot)):
        raise ValueError(
            f"{algorithm} needs discrete actions, but group {group!r} has a "
            f"{type(spec).__name__} action spec; envs with a continuous_actions option (native "
            "scenarios, VMAS, MPE) take ++env.kwargs.continuous_actions=false, others need an "
            "algorithm for continuous actions (mappo_ippo, maddpg_iddpg, masac_isac)"
        )
    mlp = MultiAgentMLP(
        env.observation_spec[group, "observation"].shape[-1],
        spec.n,
        len(env.group_map[group]),
        share_params=policy.share_params,
        depth=policy.depth,
        num_cells=policy.num_cells,
        activation=net_activation(policy, "policy.activation"),
    )
    return QValueActor(mlp, group=group, spec=spec)


def action_bounds(env: EnvBase, group: str, algorithm: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The bounds of one env's actions of ``group``, ``[n_agents, act_dim]`` each.

    Raises:
        ValueError: the group's actions are not continuous (a ``Bounded`` spec); the message
            names ``algorithm`` and what to do.
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


def q_critic(env: EnvBase, group: str, critic: Any) -> StateActionValueCritic:
    """Q(o, a) per agent of ``group``: centralised (every agent's observation and action) or
    not, per ``critic.centralised``, ``critic.share_params``, ``critic.depth``,
    ``critic.num_cells`` and ``critic.activation``."""
    return StateActionValueCritic(
        len(env.group_map[group]),
        env.observation_spec[group, "observation"].shape[-1],
        env.action_spec[group, "action"].shape[-1],
        group=group,
        centralised=critic.centralised,
        share_params=critic.share_params,
        depth=critic.depth,
        num_cells=critic.num_cells,
        activation=net_activation(critic, "critic.activation"),
    )


#: the ``model`` keys of the conv stack (``model.kind=cnn``) that a script's section may set
_CNN_KEYS = ("cnn_cells", "kernel_size", "stride", "padding")


def encoder_network(
    env: EnvBase,
    group: str,
    net: Any,
    model: Any,
    *,
    n_outputs: int,
    out_keys: Sequence[Any],
    postprocess: torch.nn.Module | None = None,
    centralised: bool = False,
    memory: bool = True,
    name: str = "",
) -> Any:
    """The network of ``group`` for a script's ``model.kind`` other than ``mlp``
    (:func:`~marlkit.modules.build_model`): the kind's encoder, then, with ``model.memory``
    (and ``memory``), a cell of ``model.memory_hidden`` features and a head of
    ``model.head_depth`` hidden layers of ``model.head_cells`` (:func:`memory_head`; 0: a linear
    head), each followed by ``net.activation``, as the ``mlp`` kind's recurrent network puts its
    cell after ``depth`` layers; without memory, a head of ``net.depth`` layers of
    ``net.num_cells``, each followed by ``net.activation`` (``net``: the ``policy`` or
    ``critic`` section, with ``share_params``; the encoders keep their own activations).
    ``model.cnn_cells``, ``kernel_size``, ``stride`` and ``padding``, where ``model`` has them,
    size the conv stack of ``kind=cnn``. ``name`` prefixes the keys the network writes and its
    state (``"critic"``: ``(group, "critic_rnn_state")``).

    Raises:
        ValueError: the group's observations do not fit ``model.kind`` (the message names the
            entry and the shape the kind reads); a bad ``model`` value (naming its key).
    """
    cell = str(model.memory) if memory else "none"
    inputs = getattr(model, "inputs", None)  # absent from configs written before it existed
    # the conv stack's sizes where the section has them (ModelConfig's defaults otherwise: a
    # section, or a checkpoint's config, without them)
    conv: dict[str, Any] = {
        name: getattr(model, name) for name in _CNN_KEYS if getattr(model, name, None) is not None
    }
    if "cnn_cells" in conv:
        conv["cnn_cells"] = [int(c) for c in conv["cnn_cells"]]
    if cell != "none":  # build_model's head (depth layers of num_cells) follows the cell
        head = memory_head(model)
        depth, cells = head["head_depth"], head["head_cells"]
    else:
        depth, cells = int(net.depth), int(net.num_cells)
    config = ModelConfig(
        kind=str(model.kind),
        memory=cell,
        hidden_size=int(model.memory_hidden),
        share_params=bool(net.share_params),
        centralised=centralised,
        depth=depth,
        num_cells=cells,
        activation=_activation_name(net),
        inputs=None if inputs is None else [str(k) for k in inputs],
        entity_mask=getattr(model, "entity_mask", None),
        **conv,
    )
    return build_model(
        config,
        env.observation_spec,
        group=group,
        n_outputs=n_outputs,
        out_keys=out_keys,
        postprocess=postprocess,
        name=name,
    )
