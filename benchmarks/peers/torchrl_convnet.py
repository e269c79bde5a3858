"""The peer side of ``benchmarks/modules.py --only cnn --torchrl-python PY``: TorchRL's
``MultiAgentConvNet`` forward + backward.

Runs under a Python that has TorchRL (0.14) installed, not marlkit's venv:

    /path/to/torchrl-venv/bin/python benchmarks/peers/torchrl_convnet.py --batch 256 --agents 8

The same work as the ``grouped`` side of ``benchmarks/modules.py``'s ``cnn`` section:
``MultiAgentConvNet(n_agents, centralized=False, share_params=False, in_features=3)`` with its
defaults (3 conv layers of 32 channels, kernel 5, stride 2, no padding, ``nn.ELU``, the output
flattened per agent), on ``[batch, n_agents, 3, size, size]`` float32 inputs; one call is the
forward, the sum of the outputs, the backward and ``zero_grad(set_to_none=True)``. Prints one
JSON line: the seconds per call of each round (each round at least ``--calls`` calls and
``--round-seconds`` seconds, after ``--warmup`` calls).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torchrl.modules import MultiAgentConvNet


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--round-seconds", type=float, default=0.0)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net = MultiAgentConvNet(args.agents, centralized=False, share_params=False, in_features=3)
    x = torch.randn(args.batch, args.agents, 3, args.size, args.size)
    out_shape = list(net(x).shape)

    def call() -> None:
        net(x).sum().backward()
        net.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        call()
    rounds = []
    for _ in range(args.rounds):
        count, start = 0, time.perf_counter()
        while True:
            call()
            count += 1
            elapsed = time.perf_counter() - start
            if count >= args.calls and elapsed >= args.round_seconds:
                break
        rounds.append(elapsed / count)
    import torchrl

    print(
        json.dumps(
            {
                "seconds_per_call": rounds,
                "output_shape": out_shape,
                "torchrl": torchrl.__version__,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
