"""Python faces of the ``marlkit._C`` kernels, each with a torch or NumPy twin.

The twins are the fallback on devices the kernels do not serve and the oracle of agreement
tests. Anything that needs the compiled kernels calls :func:`load_extension`, which raises
:class:`ExtensionError` (an ``ImportError``) saying how to rebuild when the extension is missing
or stale, never a bare ``ImportError`` from deep inside.
"""

from __future__ import annotations

from marlkit.native._loader import (
    ABI_VERSION,
    ExtensionError,
    extension_available,
    get_min_work_per_thread,
    get_num_threads,
    load_extension,
    native_or_fallback,
    set_min_work_per_thread,
    set_num_threads,
)
from marlkit.native._threads import set_threads

__all__ = [
    "ABI_VERSION",
    "ExtensionError",
    "extension_available",
    "get_min_work_per_thread",
    "get_num_threads",
    "load_extension",
    "native_or_fallback",
    "set_min_work_per_thread",
    "set_num_threads",
    "set_threads",
]
