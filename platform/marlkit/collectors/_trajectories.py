"""``split_trajectories``: a batch ``[*B, T]`` regrouped by trajectory, padded."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from marlkit.data.keys import COLLECTOR_MASK, TRAJ_IDS, NestedKey

__all__ = ["split_trajectories"]


def split_trajectories(
    batch: TensorDictBase, *, traj_key: NestedKey = TRAJ_IDS, mask_key: NestedKey = COLLECTOR_MASK
) -> TensorDictBase:
    """Regroup a collector batch ``[*B, T]`` by trajectory: ``[n_trajectories, T_max]``.

    Trajectory ``k`` of the result holds the steps with the ``k``-th trajectory id met (envs in
    order, then time), in time order, followed by zero padding; ``mask_key`` ``[n, T_max]``
    bool marks its real steps. A trajectory cut by the batch's end (or start) is a trajectory of
    the batch: its id says that it continues in the next batch.

    Args:
        batch: what a collector yields, with ``traj_key`` ``[*B, T]``.
        traj_key: the trajectory ids.
        mask_key: where the mask is written.

    Raises:
        KeyError: ``batch`` has no ``traj_key``.
        ValueError: a batch with no time dimension.
    """
    if batch.batch_dims < 1:
        raise ValueError("split_trajectories needs a batch [*B, T] with a time dimension")
    ids = batch.get(traj_key, None)
    if ids is None:
        raise KeyError(
            f"split_trajectories: the batch has no {traj_key!r} (the trajectory ids collectors "
            "write)"
        )
    steps = batch.batch_size[-1]
    flat = batch.reshape(-1)  # env after env, each env's steps in time order
    ids = ids.reshape(-1)
    first = torch.ones_like(ids, dtype=torch.bool)
    first[1:] = ids[1:] != ids[:-1]
    first[::steps] = True  # a new env row starts a new trajectory
    segment = first.cumsum(0) - 1
    starts = first.nonzero().reshape(-1)
    lengths = torch.bincount(segment, minlength=starts.numel())
    longest = int(lengths.max())
    offsets = torch.arange(longest, device=ids.device)
    valid = offsets[None, :] < lengths[:, None]  # [n, T_max]
    index = torch.where(valid, starts[:, None] + offsets[None, :], starts[:, None])
    out = flat[index.reshape(-1)].reshape(starts.numel(), longest)
    keep = valid

    def pad(value: torch.Tensor) -> torch.Tensor:
        mask = keep.reshape(*keep.shape, *([1] * (value.ndim - 2)))
        return torch.where(mask, value, torch.zeros((), dtype=value.dtype, device=value.device))

    padded = out.apply(pad)
    if padded is None:  # unreachable: apply returns a new TensorDict unless told otherwise
        raise RuntimeError("TensorDict.apply returned nothing")
    padded.set(mask_key, valid)
    return padded
