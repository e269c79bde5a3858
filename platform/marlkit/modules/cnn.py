"""``MultiAgentCNN``: a convolutional trunk per agent (or one shared) over pixel observations,
every agent in one convolution per layer (no Python loop over agents).

Independent agents run as one *grouped* convolution per layer (``groups=n_agents``): the
agents' channels sit side by side in ``[N, n_agents * C, H, W]`` (a free reshape of
``[N, n_agents, C, H, W]``), and agent ``i``'s filters see only its own channels. The other
route, ``torch.func.vmap`` over the stacked per-agent weights (TorchRL's), is kept as
``independent_method="vmap"`` for comparison: ``vmap``'s batching rule for a convolution with
batched weights is itself a grouped convolution, so both compute the same thing through the same
kernel, ``vmap`` with a transposition of its input and output around it
(``benchmarks/modules.py --only cnn`` times both).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal, cast

import torch
from torch import nn
from torch.nn import functional as F

from marlkit._checks import check_int, check_ints, check_one_of

__all__ = ["MultiAgentCNN", "check_agent_mask"]

IndependentMethod = Literal["grouped", "vmap"]


def check_agent_mask(
    mask: torch.Tensor, batch: tuple[int, ...], n_agents: int, owner: str
) -> torch.Tensor:
    """Check an agent mask ``[*B, n_agents]`` (bool, True = present) against the input's
    batch dims ``B``; return it.

    Raises:
        TypeError: not a bool tensor.
        ValueError: another shape (the message gives the expected and the received shape).
    """
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"{owner}: the agent mask must be a bool tensor [*B, n_agents], got {got}")
    if tuple(mask.shape) != (*batch, n_agents):
        raise ValueError(
            f"{owner}: the agent mask must have shape [*B, n_agents] {[*batch, n_agents]}, "
            f"got {list(mask.shape)}"
        )
    return mask


def _conv(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, *, stride: Any, padding: Any
) -> torch.Tensor:
    return F.conv2d(x, w, b, stride=stride, padding=padding)


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


class MultiAgentCNN(nn.Module):
    """A convolutional network per agent over images ``[*B, n_agents, C, H, W]``, its output
    flattened to ``[*B, n_agents, features]`` (``features = out_features(H, W)``), as TorchRL's
    ``MultiAgentConvNet``; put a :class:`~marlkit.modules.MultiAgentMLP` after it for a head
    (:func:`marlkit.modules.build_model` does).

    Args:
        in_channels: channels ``C`` of each agent's image.
        n_agents: number of agents.
        centralised: every agent's network reads all agents' images, stacked along the
            channels (``n_agents * C`` input channels).
        share_params: one network for every agent (else one per agent, stacked).
        num_cells: output channels of each conv layer (TorchRL's default ``[32, 32, 32]``).
        kernel_sizes, strides, paddings: one int for every layer or one per layer (TorchRL's
            defaults: 5, 2, 0).
        activation: the activation class after every layer (TorchRL's default ``nn.ELU``).
        independent_method: how independent agents' layers run: ``"grouped"`` (one grouped
            convolution) or ``"vmap"`` (``torch.func.vmap`` over the agents' weights); the
            same parameters and values either way.
        device: where the parameters live.

    Shapes:
        input ``[*B, n_agents, in_channels, H, W]`` (float, the parameters' dtype), optional
        ``agent_mask`` ``[*B, n_agents]`` bool -> ``[*B, n_agents, out_features(H, W)]``.

    Raises:
        ValueError: a bad size; at call time an input of another shape, an image too small for
            the kernels, or a mask of another shape.
        TypeError: at call time an input of another dtype, or a mask that is not bool.

    Examples:
        >>> import torch
        >>> from marlkit.modules import MultiAgentCNN
        >>> cnn = MultiAgentCNN(3, n_agents=4, num_cells=[8, 8], kernel_sizes=3, strides=1)
        >>> cnn(torch.zeros(5, 4, 3, 10, 10)).shape, cnn.out_features(10, 10)
        (torch.Size([5, 4, 288]), 288)
    """

    def __init__(
        self,
        in_channels: int,
        n_agents: int,
        *,
        centralised: bool = False,
        share_params: bool = False,
        num_cells: int | Sequence[int] = (32, 32, 32),
        kernel_sizes: int | Sequence[int] = 5,
        strides: int | Sequence[int] = 2,
        paddings: int | Sequence[int] = 0,
        activation: type[nn.Module] = nn.ELU,
        independent_method: IndependentMethod = "grouped",
        channels_last: bool = True,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        owner = type(self).__name__
        self.in_channels = check_int("in_channels", in_channels, low=1, owner=owner)
        self.n_agents = check_int("n_agents", n_agents, low=1, owner=owner)
        if isinstance(num_cells, int):
            num_cells = [num_cells]
        cells = check_ints("num_cells", num_cells, low=1, owner=owner)
        if not cells:
            raise ValueError(f"{owner}: num_cells must name at least one layer, got []")
        depth = len(cells)
        self.kernel_sizes = check_ints(
            "kernel_sizes", kernel_sizes, low=1, length=depth, owner=owner
        )
        self.strides = check_ints("strides", strides, low=1, length=depth, owner=owner)
        self.paddings = check_ints("paddings", paddings, low=0, length=depth, owner=owner)
        self.independent_method = check_one_of(
            "independent_method", independent_method, ("grouped", "vmap"), owner=owner
        )
        self.centralised, self.share_params = bool(centralised), bool(share_params)
        self.n_stacks = 1 if share_params else n_agents
        self.num_cells = list(cells)
        s = self.n_stacks
        width_in = in_channels * n_agents if centralised else in_channels
        convs = []
        for i, (c_out, k, st, p) in enumerate(
            zip(cells, self.kernel_sizes, self.strides, self.paddings)
        ):
            c_in = width_in if i == 0 else cells[i - 1]
            # Layer 0 of a centralised net reads every agent's channels: one dense convolution
            # with the stacks' filters side by side (n_stacks * c_out outputs), no input copy.
            groups = 1 if (i == 0 and centralised) else s
            conv = nn.Conv2d(
                c_in * (1 if groups == 1 else s),
                c_out * s,
                k,
                stride=st,
                padding=p,
                groups=groups,
                device=device,
            )
            convs.append(conv)
        self.convs = nn.ModuleList(convs)
        self.activations = nn.ModuleList(activation() for _ in cells)
        self.channels_last = bool(channels_last)
        if self.channels_last:
            for conv in self.conv_layers():
                conv.weight.data = conv.weight.data.contiguous(memory_format=torch.channels_last)
        self.reset_parameters()

    def conv_layers(self) -> list[nn.Conv2d]:
        """The conv layers (each holding every stack's filters)."""
        return [cast(nn.Conv2d, conv) for conv in self.convs]

    def reset_parameters(self) -> None:
        """Draw each agent's filters as ``nn.Conv2d`` draws one network's (fan-in of one
        agent's filter, not of the grouped layer)."""
        with torch.no_grad():
            for conv in self.conv_layers():
                fan_in = conv.weight[0].numel()  # [c_in per group, k, k]: one filter's fan-in
                bound = fan_in**-0.5
                # kaiming_uniform(a=sqrt(5)) as nn.Conv2d: bound = 1/sqrt(fan_in) for both
                conv.weight.uniform_(-bound, bound)
                if conv.bias is not None:
                    conv.bias.uniform_(-bound, bound)

    def out_features(self, height: int, width: int) -> int:
        """Features per agent of the output for images ``H x W``.

        Raises:
            ValueError: the image is too small for the layers' kernels.
        """
        h, w = height, width
        for k, st, p in zip(self.kernel_sizes, self.strides, self.paddings):
            h, w = _conv_out(h, k, st, p), _conv_out(w, k, st, p)
            if h < 1 or w < 1:
                raise ValueError(
                    f"{type(self).__name__}: images {height}x{width} are too small for the "
                    f"kernels {self.kernel_sizes}, strides {self.strides} and paddings "
                    f"{self.paddings}"
                )
        return self.num_cells[-1] * h * w

    def _check(self, x: torch.Tensor) -> tuple[int, ...]:
        owner = type(self).__name__
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{owner}: expected a tensor, got {type(x).__name__}")
        if x.dim() < 4 or x.shape[-4] != self.n_agents or x.shape[-3] != self.in_channels:
            shown = "[*B, " + ", ".join(str(d) for d in x.shape[-4:]) + "]"
            raise ValueError(
                f"{owner}: expected images [*B, n_agents={self.n_agents}, "
                f"C={self.in_channels}, H, W], got {shown} (shape {list(x.shape)})"
            )
        dtype = self.conv_layers()[0].weight.dtype
        if x.dtype != dtype:
            raise TypeError(
                f"{owner}: expected {dtype} images (the parameters' dtype), got {x.dtype}; "
                f"convert them (x.to({dtype}), and scale uint8 pixels to [0, 1])"
            )
        self.out_features(x.shape[-2], x.shape[-1])
        return tuple(x.shape[:-4])

    def _trunk(self, h: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            h = h.contiguous(memory_format=torch.channels_last)
        for conv, act in zip(self.conv_layers(), self.activations):
            h = act(conv(h))
        return h

    def _vmap_trunk(self, h: torch.Tensor) -> torch.Tensor:
        """The independent agents' layers through ``torch.func.vmap`` over their weights: ``h``
        ``[N, n_agents * C, H, W]`` (the grouped layout) in and out."""
        n, rows = self.n_agents, h.shape[0]
        per_agent = h.reshape(rows, n, -1, *h.shape[-2:]).transpose(0, 1)  # [n, N, C, H, W]
        for i, (conv, act) in enumerate(zip(self.conv_layers(), self.activations)):
            if i == 0 and self.centralised:  # the dense first layer reads every agent
                out = act(conv(h))
                per_agent = out.reshape(rows, n, -1, *out.shape[-2:]).transpose(0, 1)
                continue
            weight = conv.weight.reshape(n, -1, *conv.weight.shape[1:])
            bias = conv.bias.reshape(n, -1) if conv.bias is not None else None
            one = functools.partial(_conv, stride=conv.stride, padding=conv.padding)
            per_agent = act(torch.func.vmap(one)(per_agent, weight, bias))
        return per_agent.transpose(0, 1)

    def forward(self, x: torch.Tensor, agent_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``[*B, n_agents, C, H, W]`` -> ``[*B, n_agents, out_features(H, W)]``.

        ``agent_mask`` ``[*B, n_agents]`` (bool, True = present): a centralised network reads
        absent agents' images as zeros, so they do not change the present agents' outputs.
        Each agent's own output is computed either way (mask it where it is used).
        """
        batch = self._check(x)
        n, c = self.n_agents, self.in_channels
        flat = x.reshape(-1, n, c, *x.shape[-2:])
        rows = flat.shape[0]
        if agent_mask is not None:
            mask = check_agent_mask(agent_mask, batch, n, type(self).__name__)
            if self.centralised:
                flat = flat.masked_fill(~mask.reshape(rows, n, 1, 1, 1), 0.0)
        if self.n_stacks == 1 and not self.centralised:
            h = self._trunk(flat.reshape(rows * n, c, *x.shape[-2:]))
        elif self.n_stacks == 1:  # centralised, shared: one output for every agent
            h = self._trunk(flat.reshape(rows, n * c, *x.shape[-2:]))
            h = h.reshape(rows, 1, -1).expand(rows, n, h[0].numel())
        elif self.independent_method == "vmap":
            h = self._vmap_trunk(flat.reshape(rows, n * c, *x.shape[-2:]))
        else:
            h = self._trunk(flat.reshape(rows, n * c, *x.shape[-2:]))
        return h.reshape(*batch, n, -1)

    def agent_network(self, agent: int) -> nn.Sequential:
        """A plain ``nn.Sequential`` of ``nn.Conv2d`` layers holding copies of ``agent``'s
        parameters (for inspection and reference tests), mapping one agent's input
        ``[N, C, H, W]`` (``[N, n_agents * C, H, W]`` if centralised) to ``[N, c, h, w]``
        (flatten it for the module's output).

        Raises:
            IndexError: ``agent`` out of range.
        """
        if not 0 <= agent < self.n_agents:
            raise IndexError(f"agent must be in [0, {self.n_agents}), got {agent}")
        stack = 0 if self.share_params else agent
        mods: list[nn.Module] = []
        for i, (conv, act) in enumerate(zip(self.conv_layers(), self.activations)):
            out = conv.out_channels // self.n_stacks
            weight = conv.weight[stack * out : (stack + 1) * out]
            one = nn.Conv2d(
                weight.shape[1],
                out,
                self.kernel_sizes[i],
                stride=self.strides[i],
                padding=self.paddings[i],
                device=weight.device,
            )
            with torch.no_grad():
                one.weight.copy_(weight)
                if conv.bias is not None and one.bias is not None:
                    one.bias.copy_(conv.bias[stack * out : (stack + 1) * out])
            mods += [one, type(act)()]
        return nn.Sequential(*mods)

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, n_agents={self.n_agents}, "
            f"centralised={self.centralised}, share_params={self.share_params}, "
            f"independent_method={self.independent_method!r}"
        )
