"""``MultiAgentGNN``: message passing between the agents of a group over a graph the env gives
(all pairs, positions within a radius, or an adjacency it computes), as BenchMARL's GNN model.

Why plain torch and not ``torch_geometric`` (what BenchMARL uses): the graphs here are small and
dense. A group holds a few to a few dozen agents, and a whole env batch steps at once, so the
graph is a dense adjacency ``[*B, n, n]`` and one layer's aggregation is one batched matmul
``A @ h`` over every env of the batch: no ``edge_index`` lists rebuilt and re-batched at every
step, no ``torch_cluster`` for radius graphs, no scatter kernels, and no dependency (with its
compiled extensions, matched to each torch build) for what is 40 lines of torch. The cost is
``O(n^2)`` memory per env in the adjacency alone (features are aggregated by the matmul, never
materialised per edge): 64 agents are 4,096 booleans per env. For sparse graphs of thousands of
nodes ``torch_geometric`` would be the right tool; that is not a multi-agent group.

The layer is PyG's ``GraphConv`` (``h_i' = W_1 h_i + W_2 agg_{j in N(i)} h_j``), with, when
positions are given, the neighbours' relative positions aggregated alongside
(``agg_j (p_j - p_i)``, BenchMARL's ``position_key`` edge features). Independent agents own
their receiving weights (``W_1``, ``W_2`` of agent ``i`` act on what agent ``i`` receives): with
one layer an agent's output depends on its neighbours' inputs and never on their parameters;
with more, a neighbour's hidden state (computed with its own weights) is the next layer's
message.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from marlkit._checks import check_int, check_one_of, check_real
from marlkit.modules.activations import Tanh
from marlkit.modules.cnn import check_agent_mask
from marlkit.modules.mlp import StackedLinear, check_agent_input, from_stacks, to_stacks

__all__ = ["MultiAgentGNN", "full_graph", "radius_graph"]

Aggregation = Literal["mean", "sum"]


def full_graph(
    batch: tuple[int, ...], n_agents: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Every pair of distinct agents connected: ``[*batch, n, n]`` bool, False on the
    diagonal."""
    eye = torch.eye(n_agents, dtype=torch.bool, device=device)
    return (~eye).expand(*batch, n_agents, n_agents)


def radius_graph(positions: torch.Tensor, radius: float) -> torch.Tensor:
    """Agents within ``radius`` of each other connected: ``positions`` ``[*B, n, d]`` ->
    adjacency ``[*B, n, n]`` bool (no self-loops).

    Raises:
        ValueError: ``radius`` not a finite number > 0, or positions that are not ``[*B, n, d]``.
    """
    radius = check_real("radius", radius, low=0.0, strict=True)
    if positions.dim() < 2:
        raise ValueError(f"radius_graph: positions must be [*B, n, d], got {list(positions.shape)}")
    dist = torch.cdist(positions, positions)
    n = positions.shape[-2]
    eye = torch.eye(n, dtype=torch.bool, device=positions.device)
    return (dist <= radius) & ~eye


class MultiAgentGNN(nn.Module):
    """Graph message passing between agents, every agent and env of the batch in one batched
    matmul per layer (see the module notes for the choice of plain torch).

    Args:
        n_agent_inputs: input features per agent.
        n_agent_outputs: output features per agent.
        n_agents: number of agents.
        share_params: one set of weights for every agent (else one each, stacked).
        depth: message-passing layers (each followed by ``activation``), then a linear output
            layer.
        num_cells: hidden width of the message-passing layers.
        position_dim: the width ``d`` of positions passed to :meth:`forward` (their relative
            positions are aggregated with the features); 0 for none.
        edge_radius: connect agents within this distance of each other (needs positions);
            ``None``: the adjacency passed to :meth:`forward`, else all pairs.
        aggregation: ``"mean"`` (over the neighbours) or ``"sum"``.
        activation: the activation class.
        device: where the parameters live.

    Shapes:
        ``x`` ``[*B, n_agents, n_agent_inputs]``, ``adjacency`` ``[*B, n, n]`` bool (``A[i, j]``:
        ``j`` sends to ``i``), ``positions`` ``[*B, n, position_dim]``, ``agent_mask``
        ``[*B, n]`` bool -> ``[*B, n_agents, n_agent_outputs]``.

    Raises:
        ValueError: bad sizes; at call time inputs of other shapes, or positions missing where
            the model needs them.
        TypeError: at call time a mask or adjacency that is not bool.

    Examples:
        >>> import torch
        >>> from marlkit.modules import MultiAgentGNN
        >>> gnn = MultiAgentGNN(6, 4, n_agents=5, position_dim=2, edge_radius=0.5, num_cells=16)
        >>> x, pos = torch.randn(8, 5, 6), torch.rand(8, 5, 2)
        >>> gnn(x, positions=pos).shape
        torch.Size([8, 5, 4])
    """

    def __init__(
        self,
        n_agent_inputs: int,
        n_agent_outputs: int,
        n_agents: int,
        *,
        share_params: bool = False,
        depth: int = 2,
        num_cells: int = 64,
        position_dim: int = 0,
        edge_radius: float | None = None,
        aggregation: Aggregation = "mean",
        activation: type[nn.Module] = Tanh,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        owner = type(self).__name__
        self.n_agent_inputs = check_int("n_agent_inputs", n_agent_inputs, low=1, owner=owner)
        self.n_agent_outputs = check_int("n_agent_outputs", n_agent_outputs, low=1, owner=owner)
        self.n_agents = check_int("n_agents", n_agents, low=1, owner=owner)
        self.depth = check_int("depth", depth, low=1, owner=owner)
        self.num_cells = check_int("num_cells", num_cells, low=1, owner=owner)
        self.position_dim = check_int("position_dim", position_dim, low=0, owner=owner)
        self.aggregation = check_one_of("aggregation", aggregation, ("mean", "sum"), owner=owner)
        if edge_radius is not None:
            edge_radius = check_real("edge_radius", edge_radius, low=0.0, strict=True, owner=owner)
            if not self.position_dim:
                raise ValueError(f"{owner}: edge_radius needs positions: pass position_dim >= 1")
        self.edge_radius = edge_radius
        self.share_params = bool(share_params)
        s = self.n_stacks = 1 if share_params else n_agents
        widths = [n_agent_inputs] + [num_cells] * depth
        # each layer reads [h_i, agg_j h_j, agg_j (p_j - p_i)]
        self.layers = nn.ModuleList(
            StackedLinear(s, 2 * widths[i] + self.position_dim, widths[i + 1], device=device)
            for i in range(depth)
        )
        self.activations = nn.ModuleList(activation() for _ in range(depth))
        self.head = StackedLinear(s, num_cells, n_agent_outputs, device=device)

    def _adjacency(
        self,
        batch: tuple[int, ...],
        adjacency: torch.Tensor | None,
        positions: torch.Tensor | None,
        device: torch.device,
    ) -> torch.Tensor:
        owner, n = type(self).__name__, self.n_agents
        if self.edge_radius is not None:
            if positions is None:
                raise ValueError(
                    f"{owner}: edge_radius={self.edge_radius} builds the graph from positions "
                    f"[*B, n_agents={n}, {self.position_dim}]; none were passed"
                )
            if adjacency is not None:
                raise ValueError(f"{owner}: pass an adjacency or set edge_radius, not both")
            return radius_graph(positions, self.edge_radius)
        if adjacency is None:
            return full_graph(batch, n, device)
        if adjacency.dtype != torch.bool:
            raise TypeError(
                f"{owner}: the adjacency must be a bool tensor [*B, n, n], got {adjacency.dtype}"
            )
        if tuple(adjacency.shape) != (*batch, n, n):
            raise ValueError(
                f"{owner}: the adjacency must have shape [*B, n_agents, n_agents] "
                f"{[*batch, n, n]}, got {list(adjacency.shape)}"
            )
        return adjacency

    def forward(
        self,
        x: torch.Tensor,
        adjacency: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        agent_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``[*B, n_agents, n_agent_inputs]`` -> ``[*B, n_agents, n_agent_outputs]``.

        An absent agent (``agent_mask`` False) neither sends nor receives messages, and its
        input is read as zeros.
        """
        owner, n = type(self).__name__, self.n_agents
        batch = check_agent_input(x, n, self.n_agent_inputs, f"{owner} input")
        dtype = self.head.weight.dtype
        if x.dtype != dtype:
            raise TypeError(
                f"{owner} input: expected {dtype} (the parameters' dtype), got {x.dtype}"
            )
        if self.position_dim:
            if positions is None:
                raise ValueError(
                    f"{owner}: position_dim={self.position_dim} needs positions "
                    f"[*B, n_agents={n}, {self.position_dim}]"
                )
            check_agent_input(positions, n, self.position_dim, f"{owner} positions")
            if tuple(positions.shape[:-2]) != batch:
                raise ValueError(
                    f"{owner} positions: expected batch dims {list(batch)} (the input's), got "
                    f"{list(positions.shape)}"
                )
        elif positions is not None:
            raise ValueError(f"{owner}: positions passed, but position_dim=0 (set position_dim)")
        adj = self._adjacency(batch, adjacency, positions, x.device)
        if agent_mask is not None:
            mask = check_agent_mask(agent_mask, batch, n, owner)
            x = x.masked_fill(~mask.unsqueeze(-1), 0.0)
            adj = adj & mask.unsqueeze(-1) & mask.unsqueeze(-2)
        rows = x.reshape(-1, n, self.n_agent_inputs)
        a = adj.reshape(-1, n, n).to(dtype)  # [N, n, n]
        if self.aggregation == "mean":
            a = a / a.sum(-1, keepdim=True).clamp(min=1.0)
        rel = None
        if positions is not None:
            p = positions.reshape(-1, n, self.position_dim).to(dtype)
            rel = a @ p - a.sum(-1, keepdim=True) * p  # agg_j (p_j - p_i)
        h = rows
        for layer, act in zip(self.layers, self.activations):
            parts = [h, a @ h] if rel is None else [h, a @ h, rel]
            h = from_stacks(act(layer(to_stacks(torch.cat(parts, -1), self.n_stacks))), n)
        out = from_stacks(self.head(to_stacks(h, self.n_stacks)), n)
        return out.reshape(*batch, n, self.n_agent_outputs)

    def extra_repr(self) -> str:
        return (
            f"n_agents={self.n_agents}, share_params={self.share_params}, depth={self.depth}, "
            f"position_dim={self.position_dim}, edge_radius={self.edge_radius}, "
            f"aggregation={self.aggregation!r}"
        )
