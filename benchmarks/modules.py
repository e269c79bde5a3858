"""``MultiAgentMLP`` against a Python loop over per-agent MLPs; prints one JSON object.

Workload: one forward + backward (sum of the outputs) of independent per-agent MLPs, input 16
features per agent, 2 hidden layers of 256 Tanh, 4 outputs, a batch of 1024, for n_agents in
{4, 32, 256}.

* ``batched``: :class:`marlkit.modules.MultiAgentMLP` (``share_params=False``): one batched
  matmul per layer for each group of agents (``agents_per_group`` in the JSON: all of them
  unless a group's widest activation would pass ``MultiAgentMLP.cpu_group_bytes``).
* ``batched_one_call``: the same module with ``cpu_group_bytes = 0``, every agent in one
  batched matmul per layer (``ratio_batched_one_call_over_batched``: what the groups save).
* ``loop``: ``n_agents`` ``nn.Sequential`` MLPs of the same sizes, called one after the other on
  each agent's slice, outputs stacked: the plain-PyTorch way.

Target: ``loop / batched >= 3`` at 32 agents.

``--only activation`` times the hidden activation alone: torch's ``tanh`` (``torch.nn.Tanh``)
against the ``2 * sigmoid(2 x) - 1`` route of :class:`marlkit.modules.Tanh` on the recipes'
hidden activations (``[1200, 256]``: minibatch 400 x 3 agents, width 256), forward alone and
forward + backward, the same input and output gradient on both sides, and says whether this
machine's ``"auto"`` tanh method (:func:`marlkit.modules.get_tanh_method`) is the faster one.

``--only layout`` times one :class:`marlkit.modules.StackedLinear` layer with few outputs
(``256 -> 1, 4, 9``: a value, the MAPPO actor's ``loc``/``scale``, VMAS navigation's 9 Q-values)
on the recipes' rows (1,200 shared: ``[1200, 256]``; 3 stacks of 400), forward + backward
(input and weight gradients), with its weight stored in-major (``[n, in, out]`` contiguous, the
layout before) against out-major (``nn.Linear``'s order, the layer's default below 16
outputs): the same values, shapes and arithmetic, only the order of the weight in memory.

``--cells`` changes the hidden width (the loop's per-agent overhead only dominates for narrow
networks; at width 256 and batch 1024 both sides are bound by the same matmul FLOPs). Sides
alternate round by round; times are medians, the ratio the median of the per-round ratios.

    python benchmarks/modules.py                  # every section: mlp, activation, layout
    python benchmarks/modules.py --only mlp --agents 32 --rounds 7 --threads 1
    python benchmarks/modules.py --retain-freed-memory   # glibc keeps large freed blocks
    python benchmarks/modules.py --only activation
    python benchmarks/modules.py --only layout

``--retain-freed-memory`` raises glibc's mmap and trim thresholds (``mallopt``) before anything
is allocated, for both sides alike. By default glibc serves every block above 32 MB (the batched
activations at 32 agents x 1024 x 256 floats) with a fresh ``mmap`` and unmaps it when freed,
so each such tensor pays its page faults again; the loop's per-agent activations (1 MB) are
reused from the heap.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import sys
from collections.abc import Callable

import torch

from marlkit.bench import alternate_calls, make_parser, run_sections, summary
from marlkit.modules import MultiAgentMLP, StackedLinear, Tanh, get_tanh_method, set_tanh_method

BATCH, IN, OUT, CELLS = 1024, 16, 4, 256


def bench(n_agents: int, cells: int, batch: int, rounds: int, seconds: float) -> dict[str, object]:
    torch.manual_seed(0)
    mlp = MultiAgentMLP(IN, OUT, n_agents, num_cells=cells)
    nets = [mlp.agent_network(i) for i in range(n_agents)]  # the same weights
    x = torch.randn(batch, n_agents, IN)

    one_call = copy.deepcopy(mlp)
    one_call.cpu_group_bytes = 0  # every agent in one batched call, as before the groups

    def batched() -> None:
        mlp.zero_grad(set_to_none=True)
        mlp(x).sum().backward()

    def batched_one_call() -> None:
        one_call.zero_grad(set_to_none=True)
        one_call(x).sum().backward()

    def loop() -> None:
        for net in nets:
            net.zero_grad(set_to_none=True)
        torch.stack([net(x[:, i]) for i, net in enumerate(nets)], 1).sum().backward()

    torch.testing.assert_close(
        mlp(x), torch.stack([n(x[:, i]) for i, n in enumerate(nets)], 1), rtol=1e-4, atol=1e-5
    )
    sides = {"loop": loop, "batched": batched, "batched_one_call": batched_one_call}
    times = alternate_calls(sides, rounds, seconds, warmup=2)
    one_call_ratio = summary(times, "batched_one_call", "batched")
    return {
        "n_agents": n_agents,
        "num_cells": cells,
        "batch": batch,
        "agents_per_group": mlp.agents_per_group(batch),
        **summary(times, "loop", "batched"),
        "ratio_batched_one_call_over_batched": one_call_ratio[
            "ratio_batched_one_call_over_batched"
        ],
    }


def bench_activation(rows: int, cells: int, rounds: int, seconds: float) -> dict[str, object]:
    """torch's ``tanh`` against the ``2 sigmoid(2x) - 1`` route of :class:`Tanh`, and whether
    this machine's ``"auto"`` method is the faster of the two here."""
    torch.manual_seed(0)
    x = torch.randn(rows, cells, requires_grad=True)
    grad = torch.randn(rows, cells)
    auto = get_tanh_method()
    route, plain = Tanh(), torch.nn.Tanh()

    def forward(module: torch.nn.Module) -> Callable[[], object]:
        def run() -> None:
            with torch.no_grad():
                module(x)

        return run

    def forward_backward(module: torch.nn.Module) -> Callable[[], object]:
        def run() -> None:
            torch.autograd.grad(module(x), x, grad)

        return run

    # The method only steers marlkit's Tanh: torch.nn.Tanh is torch.tanh whatever it is.
    set_tanh_method("sigmoid")
    err = (route(x) - torch.tanh(x.double())).abs().max().item()
    times = alternate_calls(
        {
            "torch_forward": forward(plain),
            "sigmoid_forward": forward(route),
            "torch_forward_backward": forward_backward(plain),
            "sigmoid_forward_backward": forward_backward(route),
        },
        rounds,
        seconds,
        warmup=2,
    )
    set_tanh_method(auto)
    both = summary(
        {k: times[k] for k in ("torch_forward_backward", "sigmoid_forward_backward")},
        "torch_forward_backward",
        "sigmoid_forward_backward",
    )
    faster = (
        "sigmoid"
        if both["ratio_torch_forward_backward_over_sigmoid_forward_backward"] > 1
        else "torch"
    )
    return {
        "shape": [rows, cells],
        "sigmoid_max_abs_error_vs_float64": err,
        "auto_method": auto,
        "faster_here_forward_backward": faster,
        "auto_is_the_faster": auto == faster,
        "forward": summary(
            {k: times[k] for k in ("torch_forward", "sigmoid_forward")},
            "torch_forward",
            "sigmoid_forward",
        ),
        "forward_backward": both,
    }


def _forward_backward(
    layer: StackedLinear, x: torch.Tensor, grad: torch.Tensor
) -> Callable[[], object]:
    def run() -> None:
        torch.autograd.grad(layer(x), [x, layer.weight, layer.bias], grad)

    return run


def bench_layout(rounds: int, seconds: float) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    for stacks, rows in ((1, 1200), (3, 400)):
        for out in (1, 4, 9):
            torch.manual_seed(0)
            layer = StackedLinear(stacks, CELLS, out)
            in_major = copy.deepcopy(layer)
            in_major.weight = torch.nn.Parameter(layer.weight.detach().contiguous())
            x = torch.randn(stacks, rows, CELLS, requires_grad=True)
            grad = torch.randn(stacks, rows, out)
            torch.testing.assert_close(in_major(x), layer(x))

            sides = {
                "in_major": _forward_backward(in_major, x, grad),
                "out_major": _forward_backward(layer, x, grad),
            }
            times = alternate_calls(sides, rounds, seconds, warmup=2)
            results.append(
                {
                    "stacks": stacks,
                    "rows": rows,
                    "in": CELLS,
                    "out": out,
                    **summary(times, "in_major", "out_major"),
                }
            )
    return results


def retain_freed_memory() -> dict[str, int]:
    """Make glibc keep freed blocks of up to 1 GiB in the heap (no ``mmap``/``munmap`` per large
    tensor); returns the settings. Raises OSError where the C library has no ``mallopt``."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "mallopt"):
        raise OSError("this C library has no mallopt (glibc only)")
    settings = {"M_MMAP_THRESHOLD": 1 << 30, "M_TRIM_THRESHOLD": 1 << 30}
    for option, value in zip((-3, -1), settings.values()):  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
        if libc.mallopt(option, value) != 1:
            raise OSError(f"mallopt({option}, {value}) failed")
    return settings


COMPUTES = {
    "batched": "MultiAgentMLP(16, 4, n_agents, num_cells=cells, depth=2, Tanh) forward "
    "+ backward on [batch, n_agents, 16], independent params; one batched matmul per "
    "layer for each group of agents_per_group agents (all of them unless a group's "
    "widest activation would pass MultiAgentMLP.cpu_group_bytes)",
    "batched_one_call": "the same MultiAgentMLP with cpu_group_bytes=0: every agent "
    "in one batched matmul per layer (what the groups save)",
    "loop": "the same maths as n_agents nn.Sequential MLPs called in a Python loop "
    "(the same marlkit Tanh, by this machine's tanh method: tanh_method)",
    "activation": "torch.nn.Tanh (torch.tanh: MKL's vsTanh on x86 builds) vs "
    "marlkit.modules.Tanh's sigmoid route (2 sigmoid(2x) - 1) on the same [rows, cells] "
    "float32 input: forward under no_grad, and forward + backward (autograd.grad of "
    "the output against a fixed gradient)",
    "layout": "one StackedLinear(stacks, 256, out) forward + backward (input, weight "
    "and bias gradients) with the same values, its weight in-major ([n, in, out] "
    "contiguous) vs out-major (nn.Linear's order in memory, the default below 16 "
    "outputs)",
}

SECTIONS = {
    "mlp": lambda args: [
        bench(n, cells, args.batch, args.rounds, args.round_seconds)
        for cells in args.cells or [CELLS]
        for n in args.agents or [4, 32, 256]
    ],
    "activation": lambda args: bench_activation(1200, CELLS, args.rounds, args.round_seconds),
    "layout": lambda args: bench_layout(args.rounds, args.round_seconds),
}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, sections=SECTIONS, rounds=5, round_seconds=1.0, threads=1)
    parser.add_argument("--agents", type=int, action="append", default=None)
    parser.add_argument(
        "--cells", type=int, action="append", default=None, help="hidden width (default 256)"
    )
    parser.add_argument("--batch", type=int, default=BATCH, help="rows per call (default 1024)")
    parser.add_argument(
        "--retain-freed-memory",
        action="store_true",
        help="raise glibc's mmap and trim thresholds first (both sides)",
    )
    args = parser.parse_args(argv)
    allocator = retain_freed_memory() if args.retain_freed_memory else "glibc defaults"
    extra = {
        "computes": COMPUTES,
        "target": "loop / batched >= 3 at 32 agents",
        "allocator": allocator,
        "tanh_method": get_tanh_method(),
    }
    return run_sections("modules", SECTIONS, args, extra=extra)


if __name__ == "__main__":
    sys.exit(main())
