"""One call that sets the threads of torch and of the native kernels alike."""

from __future__ import annotations

import torch

from marlkit.native._loader import extension_available, set_num_threads

__all__ = ["set_threads"]


def set_threads(threads: int | None) -> None:
    """Use ``threads`` torch threads and native-kernel threads (``None``: leave the defaults).

    What the training scripts' ``threads=`` and the benchmarks' ``--threads`` set. The kernels'
    threads are set only where the extension is built (their twins run on torch's).

    Raises:
        ValueError: ``threads`` is not an int >= 1 (nor ``None``).
    """
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1 or None, got {threads!r}")
    torch.set_num_threads(threads)
    if extension_available():
        set_num_threads(threads)
