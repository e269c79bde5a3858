"""``MultiAgentMLP``: one MLP per agent (or one shared), all agents in one batched call."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from marlkit._checks import check_int, check_ints
from marlkit.modules.activations import Tanh

__all__ = ["MultiAgentMLP", "StackedLinear", "check_agent_input", "from_stacks", "to_stacks"]


def to_stacks(rows: torch.Tensor, n_stacks: int) -> torch.Tensor:
    """``[R, n_agents, F]`` -> the layout of :class:`StackedLinear`: ``[n_agents, R, F]`` with
    one stack per agent, ``[1, R * n_agents, F]`` with one shared stack."""
    if n_stacks == 1:
        return rows.reshape(1, -1, rows.shape[-1])
    return rows.transpose(0, 1)


def from_stacks(h: torch.Tensor, n_agents: int) -> torch.Tensor:
    """The inverse of :func:`to_stacks`: ``[S, *, F]`` -> ``[R, n_agents, F]``."""
    if h.shape[0] == 1:
        return h.reshape(-1, n_agents, h.shape[-1])
    return h.transpose(0, 1)


def check_agent_input(
    x: torch.Tensor, n_agents: int, features: int, what: str = "input"
) -> tuple[int, ...]:
    """Check that ``x`` is ``[*B, n_agents, features]`` and return ``B``.

    Raises:
        ValueError: another shape (the message names the expected and the received shape, and,
            for an input with more dims after the agents' dim, an image or a grid, the
            transform that flattens it or the convolutional model).
    """
    if x.dim() < 2 or x.shape[-2] != n_agents or x.shape[-1] != features:
        raise ValueError(
            f"{what}: expected a tensor of shape [*B, n_agents={n_agents}, {features}], "
            f"got {list(x.shape)}{_more_dims_hint(x, n_agents)}"
        )
    return tuple(x.shape[:-2])


def _more_dims_hint(x: torch.Tensor, n_agents: int) -> str:
    """For ``x`` ``[*B, n_agents, d1, d2, ...]`` (an image or grid per agent): what fixes it."""
    agent_dims = [i for i in range(x.dim() - 2) if x.shape[i] == n_agents]
    if not agent_dims:
        return ""
    trailing = list(x.shape[agent_dims[-1] + 1 :])
    return (
        f": more dims than [*B, n_agents, features] after the agents' dim (an image or grid "
        f"observation?); flatten them with env.transforms: [flatten_observation] "
        f"(FlattenObservation), or use the convolutional model (model=cnn); flattened, "
        f"{trailing} is {math.prod(trailing)} features per agent"
    )


class StackedLinear(nn.Module):
    """``n_stacks`` independent linear layers applied in one batched matmul.

    Weights are ``[n_stacks, in_features, out_features]``, initialised as ``nn.Linear`` does
    (uniform in ``±1/sqrt(in_features)``).

    Memory layout: a layer with fewer than :attr:`NARROW` outputs (an output layer: actions,
    logits, a value) keeps its weight in ``nn.Linear``'s order in memory, ``out_features`` before
    ``in_features``: the parameter is the transposed view of a contiguous
    ``[n_stacks, out, in]`` tensor, so its shape (and the ``state_dict``) are the same either
    way. With that order the matmuls of the forward and of the weight gradient produce their
    narrow results on the fast side of the BLAS: on the development machines (MKL, 1 thread) a
    ``[1200, 256] -> 4`` or ``-> 9`` layer's forward and backward take about a third of the time
    they take in-major (``benchmarks/modules.py --only layout``). Wider layers keep the in-major
    order, which is as fast there (and faster for the first layers, with few inputs).

    Args:
        n_stacks: number of independent layers (1: one layer shared by every stack of input).
        in_features, out_features: layer sizes.
        device: where the parameters live.
    """

    #: layers with fewer outputs than this keep an out-major weight in memory
    NARROW = 16

    def __init__(
        self,
        n_stacks: int,
        in_features: int,
        out_features: int,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        self.n_stacks, self.in_features, self.out_features = n_stacks, in_features, out_features
        weight = torch.empty(n_stacks, in_features, out_features, device=device)
        if out_features < self.NARROW:  # out-major in memory (see the class notes)
            weight = weight.transpose(1, 2).contiguous().transpose(1, 2)
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.empty(n_stacks, 1, out_features, device=device))
        self.reset_parameters()

    def reset_parameters(self, bound: float | None = None) -> None:
        """Draw new weights and biases, uniform in ``±bound`` (default ``1/sqrt(in_features)``,
        as ``nn.Linear``), in place: the memory layout stays."""
        if bound is None:
            bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():  # drawn in-major, whatever the layout: the same values either way
            weight = torch.empty(
                self.weight.shape, dtype=self.weight.dtype, device=self.weight.device
            )
            self.weight.copy_(weight.uniform_(-bound, bound))
            self.bias.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[n_stacks, N, in]`` (or ``[N, in]``/``[1, N, in]`` with one stack) ->
        ``[n_stacks, N, out]``."""
        if self.n_stacks == 1:
            # squeeze, not [0]: its backward is a view of the gradient, where select's
            # allocates a zeroed parameter-sized tensor and copies into it, per parameter
            w, b = self.weight.squeeze(0), self.bias.squeeze(0)
            return torch.addmm(b, x.reshape(-1, self.in_features), w).view(
                *x.shape[:-1], self.out_features
            )
        return self.stacked(x, self.weight, self.bias)

    @staticmethod
    def stacked(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``x`` ``[S, N, in]`` through ``S`` stacks of ``weight`` ``[S, in, out]`` and
        ``bias`` ``[S, 1, out]`` (a layer's parameters, or a slice of them)."""
        return torch.baddbmm(bias, x, weight)

    def extra_repr(self) -> str:
        return f"n_stacks={self.n_stacks}, in={self.in_features}, out={self.out_features}"


class MultiAgentMLP(nn.Module):
    """An MLP per agent, every agent computed in one batched matmul per layer (no Python loop
    over agents).

    Args:
        n_agent_inputs: input features per agent.
        n_agent_outputs: output features per agent.
        n_agents: number of agents.
        centralised: every agent reads the concatenation of all agents' inputs
            (``[*B, n_agents * n_agent_inputs]``), as a centralised critic does.
        share_params: one set of parameters for all agents (else one per agent).
        depth: number of hidden layers.
        num_cells: hidden width, an int for every layer or one per layer.
        activation: the activation class, instantiated after every hidden layer (default
            :class:`~marlkit.modules.Tanh`, ``nn.Tanh`` computed faster on CPU).
        device: where the parameters live.

    Shapes:
        input ``[*B, n_agents, n_agent_inputs]`` -> output ``[*B, n_agents, n_agent_outputs]``.

    On CPU, independent agents run in groups of agents (one batched call per layer and group)
    sized so that a group's widest activation fits in :attr:`cpu_group_bytes`: one layer's
    output is then still in cache when the next layer and the activation read it, and no
    activation is so large that the C allocator hands it back to the kernel when freed (glibc
    does that above 32 MiB, and every forward would pay the page faults again). At a rollout's
    batch all agents run in one call (groups apply only when the rows outnumber the widest
    layer's width, since splitting costs one copy of the weight gradients); at a training batch
    of 1024 rows and width 256 a group holds two agents (``benchmarks/modules.py``). The groups
    compute the same values.

    Raises:
        ValueError: a bad size; at call time, an input of another shape.

    Examples:
        >>> import torch
        >>> from marlkit.modules import MultiAgentMLP
        >>> mlp = MultiAgentMLP(4, 2, n_agents=3, num_cells=16)
        >>> mlp(torch.zeros(5, 7, 3, 4)).shape
        torch.Size([5, 7, 3, 2])
    """

    #: on CPU, the most bytes a group of independent agents' widest activation may take
    #: (``0``: every agent in one call, as on other devices); a class attribute, set it on an
    #: instance to tune one network
    cpu_group_bytes: int = 2 << 20

    def __init__(
        self,
        n_agent_inputs: int,
        n_agent_outputs: int,
        n_agents: int,
        *,
        centralised: bool = False,
        share_params: bool = False,
        depth: int = 2,
        num_cells: int | Sequence[int] = 256,
        activation: type[nn.Module] = Tanh,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        owner = type(self).__name__
        for name, value in (
            ("n_agent_inputs", n_agent_inputs),
            ("n_agent_outputs", n_agent_outputs),
            ("n_agents", n_agents),
        ):
            check_int(name, value, low=1, owner=owner)
        depth = check_int("depth", depth, low=0, owner=owner)
        cells = check_ints("num_cells", num_cells, low=1, length=depth, owner=owner)
        self.n_agent_inputs, self.n_agent_outputs = n_agent_inputs, n_agent_outputs
        self.n_agents, self.centralised, self.share_params = n_agents, centralised, share_params
        self.n_stacks = 1 if share_params else n_agents
        width_in = n_agent_inputs * n_agents if centralised else n_agent_inputs
        sizes = [width_in, *cells, n_agent_outputs]
        self.layers = nn.ModuleList(
            StackedLinear(self.n_stacks, a, b, device=device) for a, b in itertools.pairwise(sizes)
        )
        self.activations = nn.ModuleList(activation() for _ in cells)
        self._widest = max(sizes)

    def agents_per_group(self, rows: int, device: torch.device | str = "cpu") -> int:
        """How many agents' stacks one batched call computes for an input of ``rows`` rows
        (the product of the batch dims) on ``device``: all of them, except for independent
        agents on CPU whose widest activation would take more than :attr:`cpu_group_bytes`.

        Raises:
            TypeError, ValueError: :attr:`cpu_group_bytes` is not an int >= 0.
        """
        limit = self.cpu_group_bytes
        limit = check_int("cpu_group_bytes", limit, low=0, owner=type(self).__name__)
        if self.n_stacks == 1 or not limit or torch.device(device).type != "cpu":
            return self.n_stacks
        if rows < self._widest:  # an agent's activations smaller than its weights: the groups'
            return self.n_stacks  # one copy of the weight gradients would cost more than they save
        per_stack = rows * self._widest * cast(StackedLinear, self.layers[0]).weight.element_size()
        return min(self.n_stacks, max(1, limit // max(per_stack, 1)))

    def _layers(
        self, h: torch.Tensor, params: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None
    ) -> torch.Tensor:
        """The layers and activations over ``h``; with ``params``, each layer's ``(weight,
        bias)`` for the stacks ``h`` holds (a group's slices) instead of the layer's own."""
        activations = list(self.activations)  # indexing a ModuleList costs more than this
        for i, layer in enumerate(self.layers):
            h = layer(h) if params is None else StackedLinear.stacked(h, *params[i])
            if i < len(activations):
                h = activations[i](h)
        return h

    def _grouped_layers(self, h: torch.Tensor, group: int) -> torch.Tensor:
        """:meth:`_layers` over groups of ``group`` stacks; the parameters are split (not
        indexed) so that autograd gathers each parameter's gradient in one piece."""
        layers = [cast(StackedLinear, layer) for layer in self.layers]
        per_layer = [zip(layer.weight.split(group), layer.bias.split(group)) for layer in layers]
        groups = zip(h.split(group), zip(*per_layer))  # each: stacks, ((w, b) per layer)
        return torch.cat([self._layers(part, params) for part, params in groups])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[*B, n_agents, n_agent_inputs]`` -> ``[*B, n_agents, n_agent_outputs]``."""
        batch = check_agent_input(x, self.n_agents, self.n_agent_inputs, "MultiAgentMLP input")
        dtype = next(iter(self.layers)).weight.dtype
        if x.dtype != dtype:
            raise TypeError(
                f"MultiAgentMLP input: expected {dtype} (the parameters' dtype), got {x.dtype}; "
                f"convert the input (x.to({dtype})) or the module (.to({dtype}))"
            )
        n = self.n_agents
        flat = x.reshape(-1, n, self.n_agent_inputs)
        rows = flat.shape[0]
        if self.centralised:
            h = flat.reshape(1, rows, n * self.n_agent_inputs)
            if self.n_stacks > 1:
                h = h.expand(n, rows, h.shape[-1])
        else:
            h = to_stacks(flat, self.n_stacks)
        group = self.agents_per_group(rows, h.device)
        h = self._layers(h) if group >= self.n_stacks else self._grouped_layers(h, group)
        if self.centralised and self.n_stacks == 1:  # one output, the same for every agent
            out = h.reshape(rows, 1, self.n_agent_outputs).expand(rows, n, self.n_agent_outputs)
        else:
            out = from_stacks(h, n)
        return out.reshape(*batch, n, self.n_agent_outputs)

    def agent_network(self, agent: int) -> nn.Sequential:
        """A plain ``nn.Sequential`` holding copies of ``agent``'s parameters (for inspection
        and reference tests): it maps ``[*, width_in]`` to ``[*, n_agent_outputs]``.

        Raises:
            IndexError: ``agent`` out of range.
        """
        if not 0 <= agent < self.n_agents:
            raise IndexError(f"agent must be in [0, {self.n_agents}), got {agent}")
        stack = 0 if self.share_params else agent
        mods: list[nn.Module] = []
        for i, module in enumerate(self.layers):
            layer = cast(StackedLinear, module)
            lin = nn.Linear(layer.in_features, layer.out_features, device=layer.weight.device)
            with torch.no_grad():
                lin.weight.copy_(layer.weight[stack].T)
                lin.bias.copy_(layer.bias[stack, 0])
            mods.append(lin)
            if i < len(self.activations):
                mods.append(type(self.activations[i])())
        return nn.Sequential(*mods)

    def extra_repr(self) -> str:
        return (
            f"n_agents={self.n_agents}, centralised={self.centralised}, "
            f"share_params={self.share_params}"
        )
