"""A group's network from a config: an encoder chosen by the observation kind, optional memory,
then an MLP head (:class:`ModelConfig`, :func:`build_model`).

The encoder reads the group's observation (``(group, "observation")``: one tensor, or a nested
``Composite`` of entries) and writes per-agent features ``[*B, n, features]``:

========== =========================================================================
``kind``   encoder
========== =========================================================================
mlp        none: the vector entries concatenated (the head is the whole network)
cnn        :class:`MultiAgentCNN` on each image entry ``[*B, n, C, H, W]``, flattened
deepsets   :class:`DeepSets` on each entity-set entry ``[*B, n, k, f]``
attention  :class:`EntityAttention` on each entity-set entry ``[*B, n, k, f]``
gnn        :class:`MultiAgentGNN` over the vector entries (positions, radius from the config)
========== =========================================================================

Entries are told apart by their trailing dims after the agents': one (``[F]``) a vector, two
(``[k, f]``) an entity set, three (``[C, H, W]``) an image. A bool entry ``<name>_mask``
``[*B, n, k]`` is the mask of the set ``<name>``. The vector entries are concatenated after the
encoder's output (a CNN's or a set encoder's), as BenchMARL's models do. Then, with
``memory="gru"`` or ``"lstm"``, a :class:`MultiAgentGRU` / :class:`MultiAgentLSTM` of
``hidden_size`` units; then a :class:`MultiAgentMLP` head, centralised (reading every agent's
features) when ``centralised`` is set: the encoders are per agent, the head mixes the agents.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn

from marlkit._checks import check_flag, check_int, check_one_of, check_real, did_you_mean
from marlkit.data.composite import Composite
from marlkit.data.keys import MASK, OBSERVATION, RNN_STATE, NestedKey, join_key
from marlkit.data.specs import TensorSpec
from marlkit.modules.activations import ACTIVATIONS, activation_class
from marlkit.modules.cnn import MultiAgentCNN
from marlkit.modules.entities import DeepSets, EntityAttention
from marlkit.modules.graph import MultiAgentGNN
from marlkit.modules.mlp import MultiAgentMLP
from marlkit.modules.rnn import MultiAgentGRU, MultiAgentLSTM

__all__ = ["MEMORY_KINDS", "MODEL_KINDS", "ModelConfig", "build_model"]

ModelKind = Literal["mlp", "cnn", "deepsets", "attention", "gnn"]
MemoryKind = Literal["none", "gru", "lstm"]
MODEL_KINDS: tuple[str, ...] = ("mlp", "cnn", "deepsets", "attention", "gnn")
MEMORY_KINDS: tuple[str, ...] = ("none", "gru", "lstm")

#: what each kind reads, as the error messages print it
_EXPECTS = {
    "mlp": "vector observations [*B, n, F]",
    "cnn": "observations [*B, n, C, H, W]",
    "deepsets": "entity observations [*B, n, k, f]",
    "attention": "entity observations [*B, n, k, f]",
    "gnn": "vector observations [*B, n, F]",
}


@dataclass
class ModelConfig:
    """``model``: a group's network (for the actor and, separately, the critic).

    Every field has a default, so ``ModelConfig()`` is the MLP of the training scripts.
    """

    kind: str = "mlp"
    """The encoder: ``mlp``, ``cnn`` (images), ``deepsets`` or ``attention`` (entity sets),
    ``gnn`` (message passing between agents)."""
    memory: str = "none"
    """``none``, ``gru`` or ``lstm``: a recurrent layer between the encoder and the head, its
    state carried in the TensorDict (``(group, "rnn_state")``)."""
    share_params: bool = True
    """One network for every agent of the group (true) or one each (stacked, no loop)."""
    centralised: bool = False
    """The head reads every agent's encoded features (a centralised critic)."""
    depth: int = 2
    """Hidden layers of the MLP head."""
    num_cells: int = 256
    """Units of each hidden layer of the head."""
    activation: str = "tanh"
    """The head's activation: ``tanh`` (:class:`~marlkit.modules.Tanh`), ``relu``, ``elu`` or
    ``leaky_relu`` (:func:`~marlkit.modules.activation_class`); the encoders keep their own."""
    hidden_size: int = 128
    """Units of the recurrent layer (``memory`` gru or lstm)."""
    cnn_cells: list[int] = field(default_factory=lambda: [32, 32, 32])
    """``cnn``: output channels of each conv layer (TorchRL's default)."""
    kernel_size: int = 5
    """``cnn``: kernel size of every conv layer."""
    stride: int = 2
    """``cnn``: stride of every conv layer."""
    padding: int = 0
    """``cnn``: padding of every conv layer."""
    embed_dim: int = 64
    """``deepsets``/``attention``/``gnn``: width of the encoder's output per agent."""
    num_heads: int = 4
    """``attention``: heads (``embed_dim`` must be a multiple)."""
    attention_depth: int = 1
    """``attention``: self-attention blocks before the pooling (0: pooling only, linear in the
    entities)."""
    pooling: str = "sum"
    """``deepsets``: ``sum``, ``mean`` or ``max`` over the present entities."""
    gnn_depth: int = 2
    """``gnn``: message-passing layers."""
    position_key: str | None = None
    """``gnn``: the entry (of the observation Composite, else of the group) holding positions
    ``[*B, n, d]``; their relative positions are message features."""
    edge_radius: float | None = None
    """``gnn``: connect agents within this distance (needs ``position_key``); ``None``: all
    pairs."""
    inputs: list[str] | None = None
    """The group's entries the encoder reads, in place of its observation: e.g. SMAX's
    ``[entities, own]`` (an entity set and the own features). ``None``: the observation."""
    entity_mask: str | None = None
    """The group's bool entry ``[*B, n, k]`` that masks the entity sets (e.g. SMAX's
    ``entity_mask``). ``None``: a set ``x``'s mask is its sibling ``x_mask``, where there is
    one."""

    def __post_init__(self) -> None:
        check_one_of("model", self.kind, MODEL_KINDS)
        check_one_of("model.memory", self.memory, MEMORY_KINDS)
        check_one_of("model.activation", self.activation, ACTIVATIONS)
        check_flag("model.share_params", self.share_params)
        check_flag("model.centralised", self.centralised)
        for name in ("depth", "padding", "attention_depth"):
            check_int(f"model.{name}", getattr(self, name), low=0)
        for name in ("num_cells", "hidden_size", "kernel_size", "stride", "embed_dim"):
            check_int(f"model.{name}", getattr(self, name), low=1)
        check_int("model.num_heads", self.num_heads, low=1)
        check_int("model.gnn_depth", self.gnn_depth, low=1)
        if not list(self.cnn_cells):
            raise ValueError("model.cnn_cells must name at least one conv layer, got []")
        for c in self.cnn_cells:
            check_int("model.cnn_cells", c, low=1)
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"model.embed_dim must be a multiple of model.num_heads={self.num_heads}, got "
                f"{self.embed_dim}"
            )
        check_one_of("model.pooling", self.pooling, ("sum", "mean", "max"))
        if self.inputs is not None:
            if isinstance(self.inputs, str) or not all(isinstance(k, str) for k in self.inputs):
                raise TypeError(
                    f"model.inputs must be a list of the group's entry names, got {self.inputs!r}"
                )
            if not self.inputs or len(set(self.inputs)) != len(self.inputs):
                raise ValueError(
                    f"model.inputs must name each entry once, at least one, got {self.inputs!r}"
                )
            self.inputs = list(self.inputs)
        if self.entity_mask is not None and not isinstance(self.entity_mask, str):
            raise TypeError(
                f"model.entity_mask must be an entry name, got {type(self.entity_mask).__name__}"
            )
        if self.edge_radius is not None:
            check_real("model.edge_radius", self.edge_radius, low=0.0)
            if self.position_key is None:
                raise ValueError("model.edge_radius needs model.position_key (the positions)")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ModelConfig:
        """A config from a plain mapping (a Hydra/OmegaConf section); unknown keys are refused.

        Raises:
            ValueError: an unknown key (named) or a bad value.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"model: unknown keys {unknown}; known: {sorted(names)}")
        return cls(**dict(values))


def _shown(trailing: Sequence[int], n: int) -> str:
    return "[" + ", ".join(["*B", str(n), *(str(d) for d in trailing)]) + "]"


@dataclass
class _Entry:
    key: NestedKey
    name: str
    trailing: tuple[int, ...]
    dtype: torch.dtype


def _entries(
    observation_spec: Composite, group: str, obs_key: str, cfg: ModelConfig | None = None
) -> tuple[int, int, list[_Entry], dict[str, _Entry]]:
    """``(n_agents, batch dims, entries, masks by set name)`` of the group's observation (or of
    ``cfg.inputs``; with ``cfg.entity_mask``, that entry masks every set, under the key
    ``""``)."""
    try:
        group_spec = observation_spec[group]
    except KeyError:
        raise KeyError(f"build_model: the observation spec has no group {group!r}") from None
    if not isinstance(group_spec, Composite):
        raise TypeError(f"build_model: observation_spec[{group!r}] must be a Composite")
    lead = len(group_spec.shape)
    if lead < 1:
        raise ValueError(f"build_model: group {group!r} has no agent dim (shape [])")
    n = int(group_spec.shape[-1])
    if cfg is not None and (cfg.inputs is not None or cfg.entity_mask is not None):
        return n, lead, *_named_entries(group_spec, group, obs_key, cfg)
    try:
        obs = group_spec[obs_key]
    except KeyError:
        raise KeyError(
            f"build_model: group {group!r} has no {obs_key!r} in the observation spec"
        ) from None
    items: list[tuple[NestedKey, str, TensorSpec]]
    if isinstance(obs, Composite):
        names = [str(name) for name in list(obs.keys())]
        items = [
            ((group, obs_key, name), name, cast(TensorSpec, obs[name]))
            for name in names
            if not isinstance(obs[name], Composite)
        ]
    else:
        items = [((group, obs_key), obs_key, obs)]
    entries, masks = [], {}
    for key, name, spec in items:
        entry = _Entry(key, name, tuple(int(d) for d in spec.shape[lead:]), spec.dtype)
        if spec.dtype == torch.bool and name.endswith("_mask"):
            masks[name[: -len("_mask")]] = entry
        else:
            entries.append(entry)
    return n, lead, entries, masks


def _named_entries(
    group_spec: Composite, group: str, obs_key: str, cfg: ModelConfig
) -> tuple[list[_Entry], dict[str, _Entry]]:
    """The entries of ``cfg.inputs`` (else the observation) and the mask ``cfg.entity_mask``,
    read from the group."""
    lead = len(group_spec.shape)
    present = [str(k) for k in list(group_spec.keys())]

    def entry(field: str, name: str) -> _Entry:
        if name not in present:
            hint = did_you_mean(name, present)
            raise KeyError(
                f"build_model: model.{field} names {name!r}, which group {group!r} does not "
                f"have.{hint} Its entries: {present}"
            )
        spec = group_spec[name]
        if isinstance(spec, Composite):
            raise ValueError(
                f"build_model: model.{field} entry {name!r} is a Composite; name its entries"
            )
        return _Entry((group, name), name, tuple(int(d) for d in spec.shape[lead:]), spec.dtype)

    entries = [entry("inputs", name) for name in (cfg.inputs or [obs_key])]
    masks: dict[str, _Entry] = {}
    if cfg.entity_mask is not None:
        mask = entry("entity_mask", cfg.entity_mask)
        if mask.dtype != torch.bool:
            raise TypeError(
                f"build_model: model.entity_mask {cfg.entity_mask!r} must be a bool entry, got "
                f"{mask.dtype}"
            )
        masks[""] = mask
    return entries, masks


class _Encoder(nn.Module):
    """The encoders of the image or set entries, then the vector entries concatenated; reads
    its inputs in ``in_keys`` order: encoded entries (with their masks), vectors, extras."""

    def __init__(
        self,
        encoders: Sequence[nn.Module],
        masked: Sequence[bool],
        n_vectors: int,
        vector_dims: Sequence[int],
        gnn: MultiAgentGNN | None,
        gnn_extras: Sequence[str],
    ) -> None:
        super().__init__()
        self.encoders = nn.ModuleList(encoders)
        self.masked, self.n_vectors = list(masked), n_vectors
        self.vector_dims = list(vector_dims)
        self.gnn, self.gnn_extras = gnn, list(gnn_extras)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        args, parts = list(inputs), []
        for encoder, masked in zip(self.encoders, self.masked):
            x = args.pop(0)
            parts.append(encoder(x, args.pop(0)) if masked else encoder(x))
        vectors = [args.pop(0) for _ in range(self.n_vectors)]
        if self.gnn is not None:
            extras = dict(zip(self.gnn_extras, args))
            h = torch.cat(vectors, -1) if len(vectors) > 1 else vectors[0]
            return self.gnn(h, **extras)
        parts += vectors
        return torch.cat(parts, -1) if len(parts) > 1 else parts[0]


def _cnn(cfg: ModelConfig, entry: _Entry, n: int) -> tuple[MultiAgentCNN, int]:
    c, h, w = entry.trailing
    cnn = MultiAgentCNN(
        c,
        n,
        share_params=cfg.share_params,
        num_cells=list(cfg.cnn_cells),
        kernel_sizes=cfg.kernel_size,
        strides=cfg.stride,
        paddings=cfg.padding,
    )
    try:
        return cnn, cnn.out_features(h, w)
    except ValueError as err:
        raise ValueError(
            f"model=cnn: the images {entry.name!r} {_shown(entry.trailing, n)} are too small "
            f"for model.cnn_cells={list(cfg.cnn_cells)}, model.kernel_size={cfg.kernel_size}, "
            f"model.stride={cfg.stride}, model.padding={cfg.padding} ({err})"
        ) from None


def _set_encoder(cfg: ModelConfig, entry: _Entry, n: int) -> nn.Module:
    f = entry.trailing[-1]
    if cfg.kind == "deepsets":
        return DeepSets(
            f,
            cfg.embed_dim,
            n,
            share_params=cfg.share_params,
            embed_dim=cfg.embed_dim,
            num_cells=cfg.embed_dim,
            pooling=cast(Any, cfg.pooling),
        )
    return EntityAttention(
        f,
        cfg.embed_dim,
        n,
        share_params=cfg.share_params,
        embed_dim=cfg.embed_dim,
        num_heads=cfg.num_heads,
        depth=cfg.attention_depth,
    )


def _encoder(
    cfg: ModelConfig,
    observation_spec: Composite,
    group: str,
    obs_key: str,
) -> tuple[_Encoder, list[NestedKey], int, int]:
    """The encoder module, its in_keys, its output width and the number of agents."""
    n, lead, entries, masks = _entries(observation_spec, group, obs_key, cfg)
    kind = cfg.kind
    for entry in entries:
        if entry.dtype.is_floating_point or entry.dtype == torch.bool:
            continue
        raise TypeError(
            f"model={kind}: observation entry {entry.name!r} is {entry.dtype}; the networks "
            "read floating-point observations (convert it in the env, e.g. a DTypeCast "
            "transform, and scale pixels to [0, 1])"
        )
    got = ", ".join(f"{e.name} {_shown(e.trailing, n)}" for e in entries) or "no entries"
    by_rank: dict[int, list[_Entry]] = {1: [], 2: [], 3: []}
    for entry in entries:
        rank = len(entry.trailing)
        if rank not in by_rank:
            raise ValueError(
                f"model={kind} expects {_EXPECTS[kind]}; entry {entry.name!r} is "
                f"{_shown(entry.trailing, n)} (one to three dims after the agents' are read)"
            )
        by_rank[rank].append(entry)
    vectors = [e for e in by_rank[1] if e.name != cfg.position_key or kind != "gnn"]
    wanted = {"cnn": 3, "deepsets": 2, "attention": 2}.get(kind, 1)
    others = [e for r, es in by_rank.items() if r not in (1, wanted) for e in es]
    if others or (wanted != 1 and not by_rank[wanted]) or (wanted == 1 and not vectors):
        hint = {3: " (images: model=cnn)", 2: " (entity sets: model=deepsets or attention)"}
        extra = hint.get(len(others[0].trailing), "") if others else ""
        raise ValueError(f"model={kind} expects {_EXPECTS[kind]}; got {got}{extra}")
    if "" in masks and wanted != 2:
        raise ValueError(
            f"model.entity_mask masks entity sets, which model={kind} does not read "
            "(model=deepsets or attention)"
        )
    in_keys: list[NestedKey] = []
    encoders: list[nn.Module] = []
    masked: list[bool] = []
    width = 0
    if wanted != 1:
        for entry in by_rank[wanted]:
            module: nn.Module
            if wanted == 3:
                module, out = _cnn(cfg, entry, n)
            else:
                module, out = _set_encoder(cfg, entry, n), cfg.embed_dim
            encoders.append(module)
            width += out
            in_keys.append(entry.key)
            mask = masks.get(entry.name, masks.get(""))
            masked.append(mask is not None)
            if mask is not None:
                if mask.trailing != entry.trailing[:1]:
                    raise ValueError(
                        f"model={kind}: the mask {mask.name!r} must be [*B, n, k] "
                        f"{_shown(entry.trailing[:1], n)}, got {_shown(mask.trailing, n)}"
                    )
                in_keys.append(mask.key)
    in_keys += [e.key for e in vectors]
    vector_dims = [e.trailing[0] for e in vectors]
    gnn: MultiAgentGNN | None = None
    extras: list[str] = []
    if kind == "gnn":
        gnn, gnn_keys, extras = _gnn(cfg, observation_spec, group, n, lead, by_rank[1], vector_dims)
        in_keys += gnn_keys
        width = cfg.embed_dim
    else:
        width += sum(vector_dims)
    encoder = _Encoder(encoders, masked, len(vectors), vector_dims, gnn, extras)
    return encoder, in_keys, width, n


def _gnn(
    cfg: ModelConfig,
    observation_spec: Composite,
    group: str,
    n: int,
    lead: int,
    vectors: list[_Entry],
    vector_dims: list[int],
) -> tuple[MultiAgentGNN, list[NestedKey], list[str]]:
    """``model=gnn``: the GNN, the keys it reads after the vectors, and their arguments."""
    in_keys: list[NestedKey] = []
    extras: list[str] = []
    position_dim = 0
    if cfg.position_key is not None:
        pos = [e for e in vectors if e.name == cfg.position_key]
        key: NestedKey
        if pos:
            key, position_dim = pos[0].key, pos[0].trailing[0]
        else:
            try:
                spec = observation_spec[group, cfg.position_key]
            except KeyError:
                raise KeyError(
                    f"model.position_key={cfg.position_key!r}: no such entry in group "
                    f"{group!r}'s observation nor in the group (expected positions "
                    f"[*B, {n}, d])"
                ) from None
            if len(spec.shape) != lead + 1:
                raise ValueError(
                    f"model.position_key={cfg.position_key!r} must be positions "
                    f"[*B, {n}, d], got {_shown(spec.shape[lead:], n)}"
                )
            key, position_dim = (group, cfg.position_key), int(spec.shape[-1])
        in_keys.append(key)
        extras.append("positions")
    if MASK in list(cast(Composite, observation_spec[group]).keys()):
        in_keys.append((group, MASK))
        extras.append("agent_mask")
    gnn = MultiAgentGNN(
        sum(vector_dims),
        cfg.embed_dim,
        n,
        share_params=cfg.share_params,
        depth=cfg.gnn_depth,
        num_cells=cfg.embed_dim,
        position_dim=position_dim,
        edge_radius=cfg.edge_radius,
    )
    return gnn, in_keys, extras


def build_model(
    config: ModelConfig,
    observation_spec: Composite,
    *,
    group: str,
    n_outputs: int,
    out_keys: Sequence[NestedKey],
    postprocess: nn.Module | None = None,
    obs_key: str = OBSERVATION,
    name: str = "",
) -> TensorDictModuleBase:
    """The network of ``group`` per ``config``: encoder, optional memory, MLP head.

    Args:
        config: the model's settings.
        observation_spec: the env's observation spec (``env.observation_spec``), whose
            ``group`` entry has shape ``[*B, n_agents]``.
        group: the agent group read and written.
        n_outputs: outputs per agent of the head (``2 * act_dim`` for a ``Normal``'s
            parameters, ``n_actions`` for logits or Q-values, 1 for a value).
        out_keys: where the outputs go (one key, or one per output of ``postprocess``).
        postprocess: a module after the head (e.g. :class:`NormalParamExtractor`).
        obs_key: the observation's name under the group.
        name: a prefix of the keys the model writes between its parts and of its recurrent
            state (``""``: ``(group, "rnn_state")``; ``"critic"``:
            ``(group, "critic_rnn_state")``), so that an actor and a critic with memory keep
            separate states.

    Returns:
        A ``TensorDictModule`` (no memory) or a ``TensorDictSequential`` (encoder, recurrent
        layer, head) reading the group's keys and writing ``out_keys`` ``[*B, n, ...]``.

    Raises:
        ValueError: observations that do not fit ``config.kind``; the message names the key
            and the shape expected, e.g. ``model=cnn expects observations [*B, n, C, H, W];
            got observation [*B, 3, 24]``.
        KeyError: no such group or observation in the spec.

    Examples:
        >>> import torch
        >>> from marlkit.data import Composite, Unbounded
        >>> from marlkit.modules import ModelConfig, build_model
        >>> spec = Composite(agents=Composite(observation=Unbounded(shape=(3, 8)), shape=(3,)))
        >>> net = build_model(ModelConfig(num_cells=16), spec, group="agents", n_outputs=5,
        ...                   out_keys=[("agents", "logits")])
        >>> net(spec.zero())["agents", "logits"].shape
        torch.Size([3, 5])
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"build_model: config must be a ModelConfig, got {type(config).__name__}")
    n_outputs = check_int("n_outputs", n_outputs, low=1, owner="build_model")
    if not out_keys:
        raise ValueError("build_model: out_keys must name at least one key")
    encoder, in_keys, width, n = _encoder(config, observation_spec, group, obs_key)
    prefix = f"{name}_" if name else ""
    head = MultiAgentMLP(
        config.hidden_size if config.memory != "none" else width,
        n_outputs,
        n,
        centralised=config.centralised,
        share_params=config.share_params,
        depth=config.depth,
        num_cells=config.num_cells,
        activation=activation_class(config.activation, key="model.activation"),
    )
    tail: nn.Module = head if postprocess is None else nn.Sequential(head, postprocess)
    if config.memory == "none":
        return TensorDictModule(
            _Chain(encoder, tail),
            in_keys=list(in_keys),
            out_keys=list(out_keys),
        )
    embedding = (group, f"{prefix}embedding")
    rnn_out = (group, f"{prefix}rnn_output")
    cls = MultiAgentGRU if config.memory == "gru" else MultiAgentLSTM
    rnn = cls(
        width,
        config.hidden_size,
        n,
        group=group,
        share_params=config.share_params,
        in_key=embedding,
        out_key=rnn_out,
        state_key=join_key(group, f"{prefix}{RNN_STATE}"),  # and its f"{prefix}rnn_state_in"
    )
    return TensorDictSequential(
        TensorDictModule(encoder, in_keys=list(in_keys), out_keys=[embedding]),
        rnn,
        TensorDictModule(tail, in_keys=[rnn_out], out_keys=list(out_keys)),
    )


class _Chain(nn.Module):
    """The encoder (several inputs) then the head (and its postprocess)."""

    def __init__(self, encoder: _Encoder, tail: nn.Module) -> None:
        super().__init__()
        self.encoder, self.tail = encoder, tail

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.tail(self.encoder(*inputs))
