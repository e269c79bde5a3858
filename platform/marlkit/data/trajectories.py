"""Trajectory ids: where trajectories start, how long they run, whether a batch is in order.

Collectors write ``("collector", "traj_ids")`` ``[*B, T]``: the trajectory each step belongs to,
unique across batches (and across workers). Everything that reads them lives here, so that the
collectors (:func:`split_trajectories`), the replay samplers (``SliceSampler``) and the
estimators and recurrent modules (:func:`check_time_order`) find trajectories the same way.

Estimators and recurrent modules run a recursion along a batch's time dim. Run on a batch that
was flattened or shuffled first (a replay sample of random transitions, ``batch.reshape(-1)``),
the recursion would carry values and hidden states across unrelated steps and return numbers
without any error. Where the collectors' trajectory ids are in the batch, that is detectable:
along time, the id may change only where a trajectory may end.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from marlkit.data.keys import COLLECTOR_MASK, TRAJ_IDS, NestedKey

__all__ = [
    "check_time_order",
    "id_changes",
    "split_trajectories",
    "trajectory_runs",
    "trajectory_starts",
]


def id_changes(ids: torch.Tensor) -> torch.Tensor:
    """``[..., T - 1]`` bool: True at ``k`` where the id of step ``k + 1`` differs from step
    ``k``'s, along the last dim of ``ids`` ``[..., T]`` (time, or the flat order of storage).

    Example:
        >>> id_changes(torch.tensor([4, 4, 5, 5, 9])).tolist()
        [False, True, False, True]
    """
    return ids[..., 1:] != ids[..., :-1]


def trajectory_starts(ids: torch.Tensor, *, row_length: int | None = None) -> torch.Tensor:
    """``[N]`` bool: True at each step of the flat ids ``[N]`` that begins a trajectory: the
    first step, a step whose id differs from the one before, and (given ``row_length``) the
    first step of every row of ``row_length`` steps (a batch ``[*B, T]`` flattened: another env).

    Example:
        >>> trajectory_starts(torch.tensor([4, 4, 5, 5, 5, 9]), row_length=3).tolist()
        [True, False, True, True, False, True]
    """
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[1:] = id_changes(ids)
    if row_length is not None:
        starts[::row_length] = True
    return starts


def trajectory_runs(starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, length)``, int64 ``[n]`` each: the first index and the number of steps of every
    trajectory that ``starts`` ``[N]`` bool marks (see :func:`trajectory_starts`; ``starts[0]``
    is True, each trajectory runs to the next start).

    Example:
        >>> first, length = trajectory_runs(torch.tensor([True, False, True, True, False]))
        >>> first.tolist(), length.tolist()
        ([0, 2, 3], [2, 1, 2])
    """
    first = starts.nonzero().reshape(-1)
    after = torch.cat([first[1:], first.new_tensor([starts.numel()])])
    return first, after - first


def check_time_order(
    td: TensorDictBase, boundary: torch.Tensor, time_dim: int, owner: str, what: str, fix: str
) -> None:
    """Raise unless ``td``'s trajectory ids change along ``time_dim`` only at ``boundary``.

    Args:
        td: the batch ``[*B]`` (nothing is checked when it has no ``("collector",
            "traj_ids")`` of its batch shape).
        boundary: ``[*B]`` bool; True at step ``k`` (along ``time_dim``): a new trajectory
            may follow step ``k`` (a done at ``k``, an episode start at ``k + 1``).
        time_dim: the time dim, ``0 <= time_dim < td.batch_dims``.
        owner, what, fix: for the message (who checks, what marks a boundary, what to do).

    Raises:
        ValueError: an id change at a step that is not a boundary (the padding of
            ``split_trajs`` batches, ``("collector", "mask")`` False, is left out).
    """
    ids = td.get(TRAJ_IDS, None)
    if ids is None or tuple(ids.shape) != tuple(td.batch_size) or ids.shape[time_dim] < 2:
        return
    ids = ids.movedim(time_dim, -1)
    crossed = id_changes(ids) & ~boundary.movedim(time_dim, -1)[..., :-1]
    valid = td.get(COLLECTOR_MASK, None)
    if valid is not None and tuple(valid.shape) == tuple(td.batch_size):
        valid = valid.movedim(time_dim, -1)
        crossed &= valid[..., 1:] & valid[..., :-1]
    if bool(crossed.any()):
        step = crossed.nonzero()[0].tolist()
        raise ValueError(
            f"{owner}: along the time dim ({time_dim}) of the batch {list(td.batch_size)}, "
            f"{TRAJ_IDS!r} changes without {what} (at index {step}, time moved last): the rows "
            f"are not trajectories in time order (a flattened or shuffled batch?). {fix}"
        )


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
    flat = batch.reshape(-1)  # env after env, each env's steps in time order
    ids = ids.reshape(-1)
    starts, lengths = trajectory_runs(trajectory_starts(ids, row_length=batch.batch_size[-1]))
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
