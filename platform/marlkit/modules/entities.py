"""Encoders of a *set* of entities per agent (SMAX-style unit lists, MAgent2's nearby units):
:class:`DeepSets` and :class:`EntityAttention`.

Input ``[*B, n_agents, k, features]`` (``k`` entities per agent) with an optional entity mask
``[*B, n_agents, k]`` (bool, True = the entity is there); output ``[*B, n_agents, out]``. Both
are permutation-invariant in the entities, and a masked entity changes nothing, whatever its
features hold (NaN included: masked features are zeroed before any arithmetic). Every agent runs
in one batched call per layer (independent agents' weights are stacked as in
:class:`~marlkit.modules.MultiAgentMLP`); an agent with no entity at all gets the encoding of an
empty set (the pooled vector is zero).
"""

from __future__ import annotations

from typing import Literal, cast

import torch
from torch import nn
from torch.nn import functional as F

from marlkit._checks import check_int, check_one_of
from marlkit.modules.mlp import MultiAgentMLP, StackedLinear

__all__ = ["DeepSets", "EntityAttention", "check_entities"]

Pooling = Literal["sum", "mean", "max"]


def check_entities(
    x: torch.Tensor,
    mask: torch.Tensor | None,
    n_agents: int,
    features: int,
    owner: str,
    dtype: torch.dtype,
) -> tuple[tuple[int, ...], int]:
    """Check entities ``[*B, n_agents, k, features]`` and their mask ``[*B, n_agents, k]``;
    return ``(B, k)``.

    Raises:
        ValueError: another shape of either (the message names the expected and the received
            shape).
        TypeError: entities of another dtype than ``dtype``, or a mask that is not bool.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{owner}: expected an entity tensor, got {type(x).__name__}")
    if x.dim() < 3 or x.shape[-3] != n_agents or x.shape[-1] != features:
        raise ValueError(
            f"{owner}: expected entities [*B, n_agents={n_agents}, k, features={features}], "
            f"got {list(x.shape)}"
        )
    if x.dtype != dtype:
        raise TypeError(
            f"{owner}: expected {dtype} entities (the parameters' dtype), got {x.dtype}"
        )
    batch, k = tuple(x.shape[:-3]), x.shape[-2]
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise TypeError(
                f"{owner}: the entity mask must be a bool tensor [*B, n_agents, k], got {got}"
            )
        if tuple(mask.shape) != (*batch, n_agents, k):
            raise ValueError(
                f"{owner}: the entity mask must have shape [*B, n_agents, k] "
                f"{[*batch, n_agents, k]}, got {list(mask.shape)}"
            )
    return batch, k


class DeepSets(nn.Module):
    """DeepSets per agent: ``rho(pool_{e in set} phi(x_e))``, ``phi`` and ``rho`` MLPs.

    Args:
        n_entity_features: features of each entity.
        n_agent_outputs: output features per agent.
        n_agents: number of agents.
        share_params: one ``phi`` and ``rho`` for every agent (else one each, stacked).
        embed_dim: width of ``phi``'s output (the pooled vector).
        num_cells: hidden width of ``phi`` and ``rho``.
        phi_depth, rho_depth: hidden layers of ``phi`` and of ``rho``.
        pooling: ``"sum"``, ``"mean"`` (over the present entities) or ``"max"``.
        activation: the hidden activation class.
        device: where the parameters live.

    Shapes:
        entities ``[*B, n_agents, k, n_entity_features]``, mask ``[*B, n_agents, k]`` (bool,
        optional) -> ``[*B, n_agents, n_agent_outputs]``.

    Examples:
        >>> import torch
        >>> from marlkit.modules import DeepSets
        >>> enc = DeepSets(5, 8, n_agents=3, num_cells=16)
        >>> x, mask = torch.randn(4, 3, 10, 5), torch.rand(4, 3, 10) > 0.3
        >>> enc(x, mask).shape
        torch.Size([4, 3, 8])
    """

    def __init__(
        self,
        n_entity_features: int,
        n_agent_outputs: int,
        n_agents: int,
        *,
        share_params: bool = False,
        embed_dim: int = 64,
        num_cells: int = 64,
        phi_depth: int = 1,
        rho_depth: int = 1,
        pooling: Pooling = "sum",
        activation: type[nn.Module] = nn.ReLU,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        owner = type(self).__name__
        self.n_entity_features = check_int(
            "n_entity_features", n_entity_features, low=1, owner=owner
        )
        self.n_agent_outputs = check_int("n_agent_outputs", n_agent_outputs, low=1, owner=owner)
        self.n_agents = check_int("n_agents", n_agents, low=1, owner=owner)
        self.pooling = check_one_of("pooling", pooling, ("sum", "mean", "max"), owner=owner)
        self.share_params = bool(share_params)
        self.phi = MultiAgentMLP(
            n_entity_features,
            embed_dim,
            n_agents,
            share_params=share_params,
            depth=phi_depth,
            num_cells=num_cells,
            activation=activation,
            device=device,
        )
        self.rho = MultiAgentMLP(
            embed_dim,
            n_agent_outputs,
            n_agents,
            share_params=share_params,
            depth=rho_depth,
            num_cells=num_cells,
            activation=activation,
            device=device,
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``[*B, n_agents, k, features]``, ``mask`` ``[*B, n_agents, k]`` ->
        ``[*B, n_agents, n_agent_outputs]``."""
        dtype = cast(StackedLinear, self.phi.layers[0]).weight.dtype
        check_entities(x, mask, self.n_agents, self.n_entity_features, "DeepSets", dtype)
        if mask is not None:
            x = x.masked_fill(~mask.unsqueeze(-1), 0.0)
        # [*B, k, n, f]: the entities are batch rows of the per-agent MLP
        h = self.phi(x.transpose(-3, -2)).transpose(-3, -2)  # [*B, n, k, E]
        pooled = _pool(h, mask, self.pooling)
        return self.rho(pooled)


def _pool(h: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """``h`` ``[..., k, E]`` pooled over ``k`` where ``mask`` ``[..., k]`` holds; an empty set
    pools to zeros."""
    if mask is None:
        if pooling == "sum":
            return h.sum(-2)
        if pooling == "mean":
            return h.mean(-2)
        return h.amax(-2) if h.shape[-2] else h.sum(-2)
    present = mask.unsqueeze(-1)
    if pooling == "max":
        out = h.masked_fill(~present, float("-inf")).amax(-2) if h.shape[-2] else h.sum(-2)
        return out.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    total = h.masked_fill(~present, 0.0).sum(-2)
    if pooling == "sum":
        return total
    return total / mask.sum(-1, keepdim=True).clamp(min=1).to(h.dtype)


class _StackedAttention(nn.Module):
    """Multi-head attention with stacked (per-agent) projections: queries ``[S, G, q, E]``,
    keys/values ``[S, G, k, E]``, key mask ``[S, G, k]`` (True = attend)."""

    def __init__(self, stacks: int, embed_dim: int, num_heads: int, device: object) -> None:
        super().__init__()
        self.heads, self.embed_dim = num_heads, embed_dim
        self.q = StackedLinear(stacks, embed_dim, embed_dim, device=device)  # type: ignore[arg-type]
        self.kv = StackedLinear(stacks, embed_dim, 2 * embed_dim, device=device)  # type: ignore[arg-type]
        self.out = StackedLinear(stacks, embed_dim, embed_dim, device=device)  # type: ignore[arg-type]

    def forward(self, query: torch.Tensor, items: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        s, g, nq, e = query.shape
        nk, heads, d = items.shape[2], self.heads, self.embed_dim // self.heads
        q = self.q(query.reshape(s, g * nq, e)).view(s * g, nq, heads, d).transpose(1, 2)
        kv = self.kv(items.reshape(s, g * nk, e)).view(s * g, nk, 2, heads, d)
        k, v = kv.unbind(2)
        attn = mask.reshape(s * g, 1, 1, nk)
        out = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn)
        out = out.transpose(1, 2).reshape(s, g * nq, e)
        return self.out(out).view(s, g, nq, e)


class EntityAttention(nn.Module):
    """Multi-head attention over each agent's entities: an embedding, ``depth`` self-attention
    blocks (entities attend to each other, then a feed-forward layer, each residual and
    layer-normalised), then pooling by attention (a learned query per agent attends to the
    entities, as the Set Transformer's PMA) and an output layer.

    Memory: a self-attention block holds a ``k x k`` score matrix per head and set (quadratic in
    the entities, unless ``torch``'s fused attention kernel avoids it); the pooling holds ``k``
    scores, so ``depth=0`` is linear in the entities. ``benchmarks/modules.py --only attention``
    measures both.

    Args:
        n_entity_features: features of each entity.
        n_agent_outputs: output features per agent.
        n_agents: number of agents.
        share_params: one network for every agent (else one each, stacked).
        embed_dim: width of the embedding (a multiple of ``num_heads``).
        num_heads: attention heads.
        depth: self-attention blocks before the pooling (0: pooling only).
        device: where the parameters live.

    Shapes:
        entities ``[*B, n_agents, k, n_entity_features]``, mask ``[*B, n_agents, k]`` (bool,
        optional) -> ``[*B, n_agents, n_agent_outputs]``.

    Examples:
        >>> import torch
        >>> from marlkit.modules import EntityAttention
        >>> enc = EntityAttention(5, 8, n_agents=3, embed_dim=16, num_heads=2)
        >>> enc(torch.randn(4, 3, 10, 5), torch.rand(4, 3, 10) > 0.3).shape
        torch.Size([4, 3, 8])
    """

    def __init__(
        self,
        n_entity_features: int,
        n_agent_outputs: int,
        n_agents: int,
        *,
        share_params: bool = False,
        embed_dim: int = 64,
        num_heads: int = 4,
        depth: int = 1,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        owner = type(self).__name__
        self.n_entity_features = check_int(
            "n_entity_features", n_entity_features, low=1, owner=owner
        )
        self.n_agent_outputs = check_int("n_agent_outputs", n_agent_outputs, low=1, owner=owner)
        self.n_agents = check_int("n_agents", n_agents, low=1, owner=owner)
        self.embed_dim = check_int("embed_dim", embed_dim, low=1, owner=owner)
        self.num_heads = check_int("num_heads", num_heads, low=1, owner=owner)
        self.depth = check_int("depth", depth, low=0, owner=owner)
        if embed_dim % num_heads:
            raise ValueError(
                f"{owner}: embed_dim must be a multiple of num_heads={num_heads}, got {embed_dim}"
            )
        self.share_params = bool(share_params)
        s = self.n_stacks = 1 if share_params else n_agents
        self.embed = StackedLinear(s, n_entity_features, embed_dim, device=device)
        self.blocks = nn.ModuleList(
            _StackedAttention(s, embed_dim, num_heads, device) for _ in range(depth)
        )
        self.feed_forward = nn.ModuleList(
            StackedLinear(s, embed_dim, embed_dim, device=device) for _ in range(2 * depth)
        )
        self.pool = _StackedAttention(s, embed_dim, num_heads, device)
        self.seed = nn.Parameter(torch.randn(s, 1, 1, embed_dim, device=device) * embed_dim**-0.5)
        self.head = StackedLinear(s, embed_dim, n_agent_outputs, device=device)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``[*B, n_agents, k, features]``, ``mask`` ``[*B, n_agents, k]`` ->
        ``[*B, n_agents, n_agent_outputs]``."""
        owner = type(self).__name__
        batch, k = check_entities(
            x, mask, self.n_agents, self.n_entity_features, owner, self.embed.weight.dtype
        )
        n, f, s, e = self.n_agents, self.n_entity_features, self.n_stacks, self.embed_dim
        flat = x.reshape(-1, n, k, f)
        rows = flat.shape[0]
        keep = (
            mask.reshape(rows, n, k)
            if mask is not None
            else torch.ones(rows, n, k, dtype=torch.bool, device=x.device)
        )
        flat = flat.masked_fill(~keep.unsqueeze(-1), 0.0)
        if s == 1:  # [1, rows * n, k, f]: every agent's set is a group of one stack
            h, keys = flat.reshape(1, rows * n, k, f), keep.reshape(1, rows * n, k)
        else:  # [n, rows, k, f]: agent i's sets in stack i
            h, keys = flat.transpose(0, 1), keep.transpose(0, 1)
        groups = h.shape[1]
        empty = ~keys.any(-1, keepdim=True)  # [S, G, 1]: no entity at all
        # an empty set attends to its (zeroed) entities, and its pooled vector is zeroed below:
        # softmax over no key at all would be NaN
        attend = keys | empty
        h = self.embed(h.reshape(s, groups * k, f)).view(s, groups, k, e)
        ffs = [cast(StackedLinear, ff) for ff in self.feed_forward]
        for block, ff1, ff2 in zip(self.blocks, ffs[0::2], ffs[1::2]):
            h = F.layer_norm(h + block(h, h, attend), (e,))
            ff = ff2(F.relu(ff1(h.reshape(s, groups * k, e)))).view(s, groups, k, e)
            h = F.layer_norm(h + ff, (e,))
        query = self.seed.expand(s, groups, 1, e)
        pooled = self.pool(query, h, attend).view(s, groups, e).masked_fill(empty, 0.0)
        out = self.head(pooled)  # [S, G, out]
        if s == 1:
            return out.reshape(*batch, n, self.n_agent_outputs)
        return out.transpose(0, 1).reshape(*batch, n, self.n_agent_outputs)

    def extra_repr(self) -> str:
        return (
            f"n_agents={self.n_agents}, share_params={self.share_params}, "
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, depth={self.depth}"
        )
