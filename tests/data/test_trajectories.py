"""``marlkit.data.trajectories``: the one place that reads trajectory ids (collectors split
batches with it, ``SliceSampler`` finds its slices with it, estimators check time order)."""

from __future__ import annotations

import doctest

import pytest
import torch
from tensordict import TensorDict

import marlkit.data.trajectories
from marlkit.collectors import split_trajectories as exported
from marlkit.data.keys import COLLECTOR_MASK, TRAJ_IDS
from marlkit.data.trajectories import (
    check_time_order,
    id_changes,
    split_trajectories,
    trajectory_runs,
    trajectory_starts,
)


def test_the_examples_in_the_docstrings_hold() -> None:
    failed, tried = doctest.testmod(marlkit.data.trajectories)
    assert tried >= 4 and failed == 0


def test_collectors_export_the_same_function() -> None:
    assert exported is split_trajectories


def test_id_changes_along_the_last_dim() -> None:
    ids = torch.tensor([[1, 1, 2], [3, 4, 4]])
    assert id_changes(ids).tolist() == [[False, True], [True, False]]
    assert id_changes(torch.tensor([7])).shape == (0,)


def test_trajectory_starts_and_runs() -> None:
    ids = torch.tensor([0, 0, 1, 1, 1, 1, 2, 2])
    assert trajectory_starts(ids).tolist() == [1, 0, 1, 0, 0, 0, 1, 0]
    # rows of 4 steps (two envs): the second row starts a trajectory although its id goes on
    starts = trajectory_starts(ids, row_length=4)
    assert starts.tolist() == [1, 0, 1, 0, 1, 0, 1, 0]
    first, length = trajectory_runs(starts)
    assert first.tolist() == [0, 2, 4, 6] and length.tolist() == [2, 2, 2, 2]
    assert first.dtype == length.dtype == torch.int64
    first, length = trajectory_runs(torch.tensor([True]))
    assert first.tolist() == [0] and length.tolist() == [1]


def test_split_trajectories_pads_each_trajectory() -> None:
    ids = torch.tensor([[0, 0, 1], [2, 2, 2]])
    batch = TensorDict({TRAJ_IDS: ids, "x": torch.arange(6.0).reshape(2, 3)}, [2, 3])
    out = split_trajectories(batch)
    assert out.batch_size == (3, 3)
    assert out["x"].tolist() == [[0, 1, 0], [2, 0, 0], [3, 4, 5]]
    assert out[COLLECTOR_MASK].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    with pytest.raises(KeyError, match="the batch has no"):
        split_trajectories(batch.exclude(TRAJ_IDS))


def test_check_time_order_refuses_a_shuffled_batch() -> None:
    ids = torch.tensor([[0, 0, 1, 1]])
    td = TensorDict({TRAJ_IDS: ids}, [1, 4])
    at_done = torch.tensor([[False, True, False, False]])
    check_time_order(td, at_done, 1, "GAE", "a done", "Keep time order.")  # an id change at a done
    with pytest.raises(ValueError, match=r"GAE: along the time dim \(1\).*at index \[0, 1\]"):
        check_time_order(td, torch.zeros(1, 4, dtype=torch.bool), 1, "GAE", "a done", "Fix it.")
