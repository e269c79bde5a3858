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

``--only cnn`` times :class:`marlkit.modules.MultiAgentCNN` (independent agents, TorchRL's
``MultiAgentConvNet`` defaults: 3 conv layers of 32 channels, kernel 5, stride 2, ``nn.ELU``,
outputs flattened) forward + backward on ``[--cnn-batch, --cnn-agents, 3, 64, 64]``:

* ``grouped``: one grouped convolution per layer, channels-last (the module's default);
* ``grouped_nchw``: the same in the default NCHW layout (``channels_last=False``);
* ``vmap``: ``independent_method="vmap"``, ``torch.func.vmap`` over the stacked weights;
* ``loop``: ``n_agents`` plain ``nn.Sequential`` convnets (the same weights) called one after
  the other on each agent's slice, outputs stacked;
* ``torchrl`` (with ``--torchrl-python PY``, a Python with TorchRL 0.14.1): TorchRL's
  ``MultiAgentConvNet`` with the same sizes, a subprocess per round
  (``benchmarks/peers/torchrl_convnet.py``).

Target: ``torchrl / grouped >= 1.0`` at batch 256 x 8 agents of 3 x 64 x 64.

``--only attention`` times :class:`marlkit.modules.EntityAttention` (8 agents, independent,
embedding 64, 4 heads, 8 features per entity, a quarter of the entities masked) forward +
backward as the entities per agent grow (``--entities``, default 8 to 512), with one
self-attention block (``depth=1``) and pooling only (``depth=0``), each in a fresh process: the
time per call and the peak memory (growth of the process's peak RSS over its size before the
first call).

``--only gru`` times a :class:`marlkit.modules.MultiAgentGRU` shared by its agents (128 units)
in recurrent mode, forward + backward, on EPyMARL's MAPPO batch for LBF (10 whole 50-step
episodes, 2 agents) and on SMAX 3m rows (8 and 32 rows of 128 steps, 3 agents, whole envs
restarting in the middle): ``fused`` (``torch.gru`` and its backward on the module's weights,
the module's default on the CPU for few sequences), ``unrolled`` (the cell unrolled in Python,
autograd's backward) and ``torch_nn_gru`` (``torch.nn.GRU``, autograd's backward, one call per
stretch without a restart); ``default_path`` says which the module takes at that size.

``--cells`` changes the hidden width (the loop's per-agent overhead only dominates for narrow
networks; at width 256 and batch 1024 both sides are bound by the same matmul FLOPs). Sides
alternate round by round; times are medians, the ratio the median of the per-round ratios.

    python benchmarks/modules.py                  # mlp, activation, layout (not cnn, attention)
    python benchmarks/modules.py --only mlp --agents 32 --rounds 7 --threads 1
    python benchmarks/modules.py --retain-freed-memory   # glibc keeps large freed blocks
    python benchmarks/modules.py --only activation
    python benchmarks/modules.py --only layout
    python benchmarks/modules.py --only cnn --threads 2 --rounds 3 --torchrl-python trl/bin/python
    python benchmarks/modules.py --only attention --threads 2
    python benchmarks/modules.py --only gru --rounds 7

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
import itertools
import json
import multiprocessing
import pathlib
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch

from marlkit.bench import (
    alternate,
    alternate_calls,
    make_parser,
    run_sections,
    seconds_per_call,
    summary,
)
from marlkit.modules import (
    EntityAttention,
    MultiAgentCNN,
    MultiAgentMLP,
    StackedLinear,
    Tanh,
    get_tanh_method,
    set_tanh_method,
)

PEERS = pathlib.Path(__file__).resolve().parent / "peers"

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


def _torchrl_round(args: Any) -> Callable[[], float]:
    """One round of TorchRL's ``MultiAgentConvNet`` (``peers/torchrl_convnet.py``, a
    subprocess of ``--torchrl-python``): its seconds per call."""
    cmd = [
        args.torchrl_python,
        str(PEERS / "torchrl_convnet.py"),
        *("--batch", str(args.cnn_batch), "--agents", str(args.cnn_agents)),
        *("--size", str(args.cnn_size), "--threads", str(torch.get_num_threads())),
        *("--calls", str(args.cnn_calls), "--round-seconds", str(args.round_seconds)),
    ]

    def run() -> float:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            raise RuntimeError(
                f"the TorchRL peer failed ({' '.join(cmd)}; --torchrl-python must be a Python "
                f"with torchrl installed):\n{proc.stderr[-2000:]}"
            )
        return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds_per_call"][0])

    return run


def bench_cnn(args: Any) -> dict[str, object]:
    """``MultiAgentCNN`` (grouped, channels-last) against its NCHW and vmap routes, a loop of
    per-agent convnets and, with ``--torchrl-python``, TorchRL's ``MultiAgentConvNet``."""
    torch.manual_seed(0)
    n, batch, size = args.cnn_agents, args.cnn_batch, args.cnn_size
    x = torch.randn(batch, n, 3, size, size)
    modules = {
        "grouped": MultiAgentCNN(3, n),
        "grouped_nchw": MultiAgentCNN(3, n, channels_last=False),
        "vmap": MultiAgentCNN(3, n, independent_method="vmap"),
    }
    for module in list(modules.values())[1:]:
        module.load_state_dict(modules["grouped"].state_dict())
    nets = [modules["grouped"].agent_network(i) for i in range(n)]  # the same weights
    check = slice(0, 2)  # the agreement check on two rows: the full batch is the timed work
    reference = torch.stack([net(x[check, i]).flatten(1) for i, net in enumerate(nets)], 1)
    for module in modules.values():
        torch.testing.assert_close(module(x[check]), reference, rtol=1e-4, atol=1e-4)

    def module_call(module: MultiAgentCNN) -> Callable[[], None]:
        def run() -> None:
            module(x).sum().backward()
            module.zero_grad(set_to_none=True)

        return run

    def loop() -> None:
        torch.stack([net(x[:, i]).flatten(1) for i, net in enumerate(nets)], 1).sum().backward()
        for net in nets:
            net.zero_grad(set_to_none=True)

    calls = {name: module_call(module) for name, module in modules.items()}
    calls["loop"] = loop
    sides: dict[str, Callable[[], float]] = {
        name: (
            lambda call=call: seconds_per_call(
                call, args.round_seconds, min_calls=args.cnn_calls, warmup=1
            )
        )
        for name, call in calls.items()
    }
    if args.torchrl_python:
        sides["torchrl"] = _torchrl_round(args)
    times = alternate(sides, args.rounds)
    out: dict[str, object] = {
        "batch": batch,
        "n_agents": n,
        "image": [3, size, size],
        "output_features": modules["grouped"].out_features(size, size),
        "threads": torch.get_num_threads(),
        **{f"{name}_ms": 1e3 * statistics.median(ts) for name, ts in times.items()},
        "rounds_s": {name: [round(t, 4) for t in ts] for name, ts in times.items()},
    }
    for other in ("grouped_nchw", "vmap", "loop", "torchrl"):
        if other in times:
            ratio = summary(times, other, "grouped")
            out[f"ratio_{other}_over_grouped"] = ratio[f"ratio_{other}_over_grouped"]
    return out


def _attention_worker(
    entities: int, depth: int, rows: int, seconds: float, threads: int, queue: Any
) -> None:
    """In a fresh process: ``EntityAttention`` forward + backward with ``entities`` per agent;
    puts ``{ms, peak_mib}`` on ``queue``."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    n, features = 8, 8
    enc = EntityAttention(features, 32, n, embed_dim=64, num_heads=4, depth=depth)
    x = torch.randn(rows, n, entities, features)
    mask = torch.rand(rows, n, entities) >= 0.25

    def call() -> None:
        enc(x, mask).sum().backward()
        enc.zero_grad(set_to_none=True)

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    call()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    ms = 1e3 * seconds_per_call(call, seconds, min_calls=3, warmup=1)
    queue.put({"ms": ms, "peak_mib": peak / 1024})  # ru_maxrss is in KiB on Linux


def _attention_cell(entities: int, depth: int, rows: int, seconds: float) -> dict[str, float]:
    # A fresh process for a peak RSS of its own; spawned, not forked: OpenMP's thread pool does
    # not survive a fork (a forked child computing on 2 threads ran 5-25x slower here).
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    threads = torch.get_num_threads()
    proc = ctx.Process(
        target=_attention_worker, args=(entities, depth, rows, seconds, threads, queue)
    )
    proc.start()
    result = queue.get(timeout=1800)
    proc.join()
    return dict(result)


def bench_attention(args: Any) -> list[dict[str, object]]:
    """``EntityAttention`` as the entities per agent grow: time per call and peak memory."""
    results: list[dict[str, object]] = []
    for entities in args.entities or [8, 32, 128, 512]:
        for depth in (1, 0):
            runs = [
                _attention_cell(entities, depth, args.attention_rows, args.round_seconds)
                for _ in range(args.rounds)
            ]
            results.append(
                {
                    "entities": entities,
                    "depth": depth,
                    "rows": args.attention_rows,
                    "n_agents": 8,
                    "ms": statistics.median(r["ms"] for r in runs),
                    "peak_mib": statistics.median(r["peak_mib"] for r in runs),
                    "rounds_ms": [round(r["ms"], 3) for r in runs],
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
    "cnn": "MultiAgentCNN(3, n_agents) (independent params, TorchRL's MultiAgentConvNet "
    "defaults: 3 x conv 32 channels, kernel 5, stride 2, ELU, flattened) forward, sum, backward "
    "and zero_grad on [batch, n_agents, 3, 64, 64]: grouped (channels-last, the default), "
    "grouped_nchw, vmap (torch.func.vmap over stacked weights), loop (n_agents nn.Sequential "
    "convnets with the same weights), torchrl (TorchRL 0.14.1 MultiAgentConvNet with the same "
    "sizes, centralized=False, share_params=False, in its own venv, a process per round)",
    "attention": "EntityAttention(8 features, 32 outputs, 8 agents, embed 64, 4 heads, "
    "independent) forward + backward on [rows, 8, entities, 8] with 75 % of the entities "
    "present; depth=1 (a self-attention block, then attention pooling) and depth=0 (pooling "
    "only); each cell in a spawned process: peak_mib is the growth of its peak RSS in the "
    "first call",
    "gru": "MultiAgentGRU(128, 128, n_agents, share_params=True) in recurrent mode over "
    "[rows, steps, n_agents, 128] with whole envs restarting (is_init) where the case says, "
    "forward and the gradients of the input and every weight against a fixed output gradient: "
    "fused (torch.gru and its backward through marlkit.modules.rnn._gru_sequence, the weights "
    "made contiguous in torch's layout; the module's default on the CPU up to "
    "fused_max_step_flops: default_path says which the module takes here), "
    "unrolled (the same module with its cell unrolled in Python, autograd's backward: the path "
    "before), torch_nn_gru (torch.nn.GRU with the same weights, one call per stretch without a "
    "restart as the module's forward makes them, the state zeroed between, autograd's "
    "backward); the outputs checked equal first",
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
    "cnn": bench_cnn,
    "attention": bench_attention,
    "gru": lambda args: bench_gru(args.rounds, args.round_seconds),
}


#: (label, steps T, rows, agents, restart probability per env step): EPyMARL's MAPPO batch on
#: LBF (10 whole 50-step episodes, 2 agents); SMAX 3m rows of 128 steps (3 agents, episodes of
#: about 30-60 steps ending anywhere in a row), 8 of them and JaxMARL's minibatch of 32
GRU_CASES = (
    ("lbf_mappo", 50, 10, 2, 0.0),
    ("smax_3m_8_rows", 128, 8, 3, 0.025),
    ("smax_3m_minibatch", 128, 32, 3, 0.025),
)


def bench_gru(rounds: int, seconds: float) -> list[dict[str, object]]:
    """A shared 128-unit GRU over whole rows, forward + backward, three ways on the same data
    (module docs: ``--only gru``)."""
    return [_gru_case(*case, rounds, seconds) for case in GRU_CASES]


def _gru_case(
    label: str, steps: int, rows: int, n: int, restart: float, rounds: int, seconds: float
) -> dict[str, object]:
    from tensordict import TensorDict

    from marlkit.modules import MultiAgentGRU, set_recurrent_mode

    torch.manual_seed(0)
    gru = MultiAgentGRU(128, 128, n, share_params=True)
    default_fused = gru._fusable(torch.empty(rows, steps, n, 128))
    gru.fused_max_step_flops = float("inf")  # fused at every size, to compare
    unrolled = copy.deepcopy(gru)
    unrolled._sequence_op = None  # this instance unrolls its cell in Python
    x = torch.randn(rows, steps, n, 128, requires_grad=True)
    starts = torch.rand(rows, steps, 1) < restart  # whole envs restart
    starts[:, 0] = True
    grad = torch.randn(rows, steps, n, 128)
    nn_gru = torch.nn.GRU(128, 128, batch_first=True)
    with torch.no_grad():  # the same weights in torch's layout
        nn_gru.weight_ih_l0.copy_(gru.input_gates.weight[0].t())
        nn_gru.weight_hh_l0.copy_(gru.hidden_gates.weight[0].t())
        nn_gru.bias_ih_l0.copy_(gru.input_gates.bias.reshape(-1))
        nn_gru.bias_hh_l0.copy_(gru.hidden_gates.bias.reshape(-1))
    flat_starts = starts.expand(rows, steps, n).transpose(1, 2).reshape(rows * n, steps)
    cuts = [0, *(flat_starts[:, 1:].any(0).nonzero().flatten() + 1).tolist(), steps]

    def module(net: MultiAgentGRU) -> Callable[[], object]:
        def run() -> None:
            td = TensorDict({"agents": {"observation": x}, "is_init": starts}, [rows, steps])
            with set_recurrent_mode(True):
                out = net(td)["agents", "rnn_output"]
            torch.autograd.grad(out, [x, *net.parameters()], grad)

        return run

    def torch_nn_gru() -> None:
        seq = x.transpose(1, 2).reshape(rows * n, steps, 128)
        state, outs = x.new_zeros(1, rows * n, 128), []
        for begin, end in itertools.pairwise(cuts):
            state = state.masked_fill(flat_starts[None, :, begin, None], 0.0)
            out, state = nn_gru(seq[:, begin:end], state)
            outs.append(out)
        out = torch.cat(outs, 1).reshape(rows, n, steps, 128).transpose(1, 2)
        torch.autograd.grad(out, [x, *nn_gru.parameters()], grad)

    td = TensorDict({"agents": {"observation": x}, "is_init": starts}, [rows, steps])
    with set_recurrent_mode(True), torch.no_grad():
        fused_out = gru(td.clone())["agents", "rnn_output"]
        torch.testing.assert_close(fused_out, unrolled(td.clone())["agents", "rnn_output"])
    sides = {
        "unrolled": module(unrolled),
        "fused": module(gru),
        "torch_nn_gru": torch_nn_gru,
    }
    times = alternate_calls(sides, rounds, seconds, warmup=2)
    return {
        "case": label,
        "steps": steps,
        "rows": rows,
        "n_agents": n,
        "hidden": 128,
        "restarts_in_rows": int(starts[:, 1:].sum()),
        "torch_gru_calls": len(cuts) - 1,
        "step_flops": 2 * rows * n * 3 * 128 * 128,
        "default_path": "fused" if default_fused else "unrolled",
        **summary(times, "unrolled", "fused"),
        "ratio_torch_nn_gru_over_fused": summary(times, "torch_nn_gru", "fused")[
            "ratio_torch_nn_gru_over_fused"
        ],
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
    parser.add_argument("--cnn-batch", type=int, default=256, help="cnn: rows (default 256)")
    parser.add_argument("--cnn-agents", type=int, default=8, help="cnn: agents (default 8)")
    parser.add_argument("--cnn-size", type=int, default=64, help="cnn: image side (default 64)")
    parser.add_argument(
        "--cnn-calls", type=int, default=1, help="cnn: least calls per side and round (1)"
    )
    parser.add_argument(
        "--torchrl-python", default=None, help="cnn: a Python with TorchRL 0.14.1 (the peer)"
    )
    parser.add_argument(
        "--entities", type=int, action="append", default=None, help="attention: entity counts"
    )
    parser.add_argument(
        "--attention-rows", type=int, default=64, help="attention: batch rows (default 64)"
    )
    args = parser.parse_args(argv)
    allocator = retain_freed_memory() if args.retain_freed_memory else "glibc defaults"
    extra = {
        "computes": COMPUTES,
        "target": "mlp: loop / batched >= 3 at 32 agents; cnn: torchrl / grouped >= 1.0 at "
        "batch 256 x 8 agents of 3 x 64 x 64",
        "allocator": allocator,
        "tanh_method": get_tanh_method(),
    }
    default = ["mlp", "activation", "layout"]  # cnn and attention take minutes: --only them
    return run_sections("modules", SECTIONS, args, default, extra=extra)


if __name__ == "__main__":
    sys.exit(main())
