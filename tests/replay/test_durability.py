"""Checkpoints that survive SIGKILL, tested by killing real processes: a buffer killed in the
middle of training restores every item of its last completed ``dumps``, and a ``dumps`` killed
halfway leaves the previous checkpoint readable."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from marlkit.replay import MemmapStorage, PrioritizedSampler, ReplayBuffer, TensorStorage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# Items are numbered: item n holds x = n and a row of 256 copies of n. A run prints, after each
# dumps() returns, how many items it had written then; it stops writing one chunk short of the
# capacity (and waits for its kill), so the live storage's length is what it wrote.
TRAIN = """
import json, sys, time
import torch
from tensordict import TensorDict
from marlkit.replay import {storage}, PrioritizedSampler, ReplayBuffer

live, ckpt, capacity, chunk, every = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
storage = {make_storage}
rb = ReplayBuffer(storage, PrioritizedSampler(capacity, seed=0))
n = 0
while True:
    x = torch.arange(n, n + chunk, dtype=torch.float32)
    row = x[:, None].expand(chunk, 256).clone()
    rb.extend(TensorDict({{"x": x[:, None], "row": row}}, [chunk]))
    n += chunk
    sample = rb.sample(32)
    rb.update_priority(sample["index"], sample["x"][:, 0] % 7 + 1)
    if (n // chunk) % every == 0:
        rb.dumps(ckpt)
        print(json.dumps({{"dumped": n}}), flush=True)
    if n + chunk >= capacity:  # never wrap around: a fast machine must not outrun the kill
        time.sleep(3600)
"""


def run_and_kill(tmp_path: Path, storage: str, args: list[int], dumps: int) -> int:
    """Start a training script, SIGKILL it at a random moment within the three iterations after
    ``dumps`` completed dumps (an iteration: the time between the last two reports, so the kill
    lands in the work on a fast machine too, not in the final sleep); returns the item count of
    the last dumps it reported."""
    make = {
        "MemmapStorage": "MemmapStorage(capacity, live)",
        "TensorStorage": "TensorStorage(capacity)",
    }[storage]
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN.format(storage=storage, make_storage=make)))
    cmd = [sys.executable, str(script), str(tmp_path / "live"), str(tmp_path / "ckpt")]
    with subprocess.Popen(
        [*cmd, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        last, seen = 0, []
        try:
            for _ in range(dumps):
                line = proc.stdout.readline()
                assert line, proc.stderr.read() if proc.stderr else "no output"
                last = json.loads(line)["dumped"]
                seen.append(time.monotonic())
            iteration = seen[-1] - seen[-2] if len(seen) > 1 else 0.1
            time.sleep(random.uniform(0.0, 3 * iteration))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            # A dumps that completed between our last read and the kill counts too.
            for line in proc.stdout.read().splitlines():
                last = json.loads(line)["dumped"]
        finally:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    return last


def check_items(rb: ReplayBuffer, written: int, capacity: int) -> None:
    """``rb`` holds exactly the newest items of a run that had written ``written``."""
    x = rb[:]["x"].reshape(-1)
    assert len(rb) == min(written, capacity)
    assert sorted(x.int().tolist()) == list(range(max(0, written - capacity), written))
    assert (rb[:]["row"] == x[:, None]).all()  # no item torn


def test_a_buffer_killed_while_training_restores_its_last_checkpoint(tmp_path: Path) -> None:
    capacity = 4096
    reported = run_and_kill(tmp_path, "MemmapStorage", [capacity, 64, 4], dumps=5)
    restored = ReplayBuffer(MemmapStorage(capacity, tmp_path / "new"), PrioritizedSampler(capacity))
    restored.loads(tmp_path / "ckpt")
    written = int(restored[:]["x"].max()) + 1
    assert written >= reported  # the last completed dumps, or a later one that completed
    check_items(restored, written, capacity)
    assert restored.sampler.priorities(torch.arange(len(restored))).min() > 0
    # The live memory maps reopen too, with every item whose extend returned before the kill
    # (the run never filled its capacity: a write cut short lies past the recorded length).
    live = ReplayBuffer(MemmapStorage.open(tmp_path / "live"))
    assert written <= len(live) < capacity
    check_items(live, len(live), capacity)


def test_a_dumps_killed_halfway_leaves_the_previous_checkpoint_readable(tmp_path: Path) -> None:
    capacity = 16384  # 16 MiB of items: most of the run's time is spent in dumps
    for _attempt in range(8):
        for old in tmp_path.iterdir():
            subprocess.run(["rm", "-rf", str(old)], check=True)
        reported = run_and_kill(tmp_path, "TensorStorage", [capacity, 2048, 1], dumps=2)
        interrupted = list((tmp_path / "ckpt").glob(".tmp-*"))
        restored = ReplayBuffer(TensorStorage(capacity), PrioritizedSampler(capacity))
        restored.loads(tmp_path / "ckpt")
        written = int(restored[:]["x"].max()) + 1
        assert written >= reported
        check_items(restored, written, capacity)
        if interrupted:  # the kill landed inside a dumps: the checkpoint before it was read
            return
    pytest.fail("in eight runs the kill never landed inside a dumps")
