"""A replay buffer stores plain data: what it is given may carry an autograd graph (log-probs
computed outside ``no_grad``), but its storage, samples and priorities never do."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from marlkit.native._loader import extension_available
from marlkit.native.gather import gather_rows
from marlkit.replay import MemmapStorage, PrioritizedSampler, ReplayBuffer, TensorStorage


@pytest.mark.parametrize("kind", ["tensor", "memmap"])
def test_data_that_requires_grad_is_stored_without_its_graph(kind: str, tmp_path: Path) -> None:
    weight = torch.ones(3, requires_grad=True)  # a policy parameter
    storage = TensorStorage(16) if kind == "tensor" else MemmapStorage(16, tmp_path / "mm")
    rb = ReplayBuffer(storage)
    logp = torch.randn(4, 3) * weight
    rb.extend(TensorDict({"logp": logp, "agents": {"a": logp[:, :, None] * 2}}, [4]))
    rb.add(TensorDict({"logp": torch.randn(3) * weight, "agents": {"a": torch.ones(3, 1)}}, []))
    storage.set(  # a scatter write too
        torch.tensor([7]),
        TensorDict({"logp": torch.ones(1, 3) * weight, "agents": {"a": torch.ones(1, 3, 1)}}, [1]),
        length=8,
    )
    data = storage.data
    assert data is not None
    for key, value in data.items(True, True):
        assert not value.requires_grad and value.grad_fn is None, key
    assert torch.equal(data["logp"][:4], logp.detach())
    sample = rb.sample(8)
    assert not any(v.requires_grad for v in sample.values(True, True))
    if extension_available():  # the native gather refuses tensors that require grad
        gather_rows([data["logp"]], torch.tensor([0, 1]), backend="native")
    assert weight.grad is None


def test_a_priority_that_requires_grad_is_detached_quietly() -> None:
    rb = ReplayBuffer(TensorStorage(8), PrioritizedSampler(8, alpha=1.0, eps=1e-8, seed=0))
    rb.extend(TensorDict({"x": torch.zeros(4, 1)}, [4]))
    scale = torch.tensor(2.0, requires_grad=True)
    td_error = torch.tensor([1.0, 2.0, 3.0, 4.0]) * scale  # from a loss, not detached
    rb.update_priority(torch.arange(4), td_error)  # warnings are errors in the tests
    assert rb.sampler.priorities(torch.arange(4)).tolist() == pytest.approx([2.0, 4.0, 6.0, 8.0])
    assert scale.grad is None
