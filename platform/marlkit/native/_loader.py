"""Load ``marlkit._C`` once, and refuse a missing or stale build with a message that fixes it."""

from __future__ import annotations

import importlib
import pathlib
from types import ModuleType

from marlkit._checks import check_int
from marlkit._utils import get_logger
from marlkit.native._source_hash import source_hash

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
]

#: The binding signatures this Python code expects; csrc/bindings.cpp carries the same number.
ABI_VERSION = 4

_REBUILD = (
    "Rebuild it from the repository root with `pip install -e .` (or `make install`); "
    "C++ edits always need that step again."
)

_cache: dict[str, ModuleType] = {}
_warned: set[str] = set()  # components that said they fall back to their twin
_logger = get_logger("native")


class ExtensionError(ImportError):
    """The compiled extension ``marlkit._C`` is missing, broken or older than its sources."""


def _checkout_csrc() -> pathlib.Path | None:
    """The ``csrc/`` folder of a source checkout this package runs from, if any."""
    # platform/marlkit/native/_loader.py -> the repository root is three folders up.
    root = pathlib.Path(__file__).resolve().parents[3]
    csrc = root / "csrc"
    return csrc if (csrc / "bindings.cpp").is_file() else None


def _import_module() -> ModuleType:
    return importlib.import_module("marlkit._C")


def load_extension() -> ModuleType:
    """Return the ``marlkit._C`` module, checked against the Python side and the C++ sources.

    Raises:
        ExtensionError: the extension is not built, fails to load, or was built from other
            sources than the checkout it runs in.
    """
    module = _cache.get("_C")
    if module is not None:
        return module
    try:
        module = _import_module()
    except ImportError as err:
        raise ExtensionError(
            f"marlkit's C++ extension marlkit._C is not built or failed to load ({err}). {_REBUILD}"
        ) from err
    abi = getattr(module, "ABI_VERSION", None)
    if abi != ABI_VERSION:
        raise ExtensionError(
            f"marlkit._C is stale: its ABI version is {abi}, this code expects {ABI_VERSION}. "
            f"{_REBUILD}"
        )
    csrc = _checkout_csrc()
    if csrc is not None:
        expected = source_hash(csrc)
        built = getattr(module, "SOURCE_HASH", None)
        if built != expected:
            raise ExtensionError(
                f"marlkit._C is stale: it was built from C++ sources with hash {built}, "
                f"but {csrc} now hashes to {expected}. {_REBUILD}"
            )
    _cache["_C"] = module
    return module


def extension_available() -> bool:
    """Whether :func:`load_extension` succeeds (a missing or stale build gives ``False``)."""
    try:
        load_extension()
    except ExtensionError:
        return False
    return True


def native_or_fallback(component: str) -> bool:
    """For ``backend="auto"`` on CPU: whether ``component`` can use the C++ kernels.

    When the extension is missing or stale, ``component`` runs on its torch or NumPy twin (the
    same results, slower) and a warning, once per component and process, says why and how to
    rebuild: a stale build never slows a run down silently.
    """
    try:
        load_extension()
    except ExtensionError as err:
        if component not in _warned:
            _warned.add(component)
            _logger.warning("%s falls back to its slower torch/NumPy twin: %s", component, err)
        return False
    return True


def set_num_threads(n: int) -> None:
    """Set how many threads the native kernels use (``0`` means all hardware threads).

    Raises:
        TypeError: ``n`` is not an int.
        ValueError: ``n`` is negative or above 1,024 (a pool the OS cannot start).
    """
    load_extension().set_num_threads(check_int("num_threads", n))


def get_num_threads() -> int:
    """Number of threads the native kernels use now."""
    return int(load_extension().get_num_threads())


def set_min_work_per_thread(units: int) -> None:
    """Set the least work a particle-physics or LiDAR call gives each extra kernel thread.

    ``units`` are the kernels' own work estimate (about one pair test or agent update each,
    0.2-0.5 ns on a recent x86 core); a call with less work than ``units`` per thread runs on
    fewer threads, down to the calling thread alone. The default (262,144) keeps calls below
    roughly 50-150 us of work on one thread, because waking another thread and reading back
    what it wrote cost more than they save there on small VMs. Lower it on machines where
    threads wake quickly; results are bit for bit the same for every setting. ``units < 1``
    raises ``ValueError`` (from the kernels' own check).
    """
    load_extension().set_min_work_per_thread(check_int("min_work_per_thread", units))


def get_min_work_per_thread() -> int:
    """The least work (kernel work units) a particle or LiDAR call gives each kernel thread."""
    return int(load_extension().get_min_work_per_thread())
