"""``check_time_order``: refuse a batch whose rows along time are not trajectories in order.

Estimators and recurrent modules run a recursion along a batch's time dim. Run on a batch that
was flattened or shuffled first (a replay sample of random transitions, ``batch.reshape(-1)``),
the recursion would carry values and hidden states across unrelated steps and return numbers
without any error. Where the collectors' trajectory ids are in the batch, that is detectable:
along time, the id may change only where a trajectory may end.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from marlkit.data.keys import COLLECTOR_MASK, TRAJ_IDS

__all__ = ["check_time_order"]


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
    crossed = (ids[..., 1:] != ids[..., :-1]) & ~boundary.movedim(time_dim, -1)[..., :-1]
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
