"""One call that sets the threads of torch and of the native kernels alike."""

from __future__ import annotations

import torch

from marlkit._checks import check_int
from marlkit.native._loader import extension_available, set_num_threads

__all__ = ["set_threads"]


def set_threads(threads: int | None) -> None:
    """Use ``threads`` torch threads and native-kernel threads (``None``: leave the defaults).

    What the training scripts' ``threads=`` and the benchmarks' ``--threads`` set. The kernels'
    threads are set only where the extension is built (their twins run on torch's).

    Raises:
        TypeError: ``threads`` is not an int (nor ``None``).
        ValueError: ``threads`` is below 1.
    """
    threads = check_int("threads", threads, low=1, allow_none=True)
    if threads is None:
        return
    torch.set_num_threads(threads)
    if extension_available():
        set_num_threads(threads)
