"""Where a benchmark ran: versions, threads and machine, recorded next to the figures."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
from typing import Any

import torch

import marlkit
from marlkit.native import extension_available, get_num_threads, load_extension

__all__ = ["describe_environment", "load_average"]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_average() -> float | None:
    """The 1-minute load average of the machine (``None`` where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def describe_environment() -> dict[str, Any]:
    """Date, versions, thread counts and machine of this process, JSON-ready."""
    native = extension_available()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "marlkit": marlkit.__version__,
        "torch": torch.__version__,
        "vmas": _version("vmas"),
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "native_threads": get_num_threads() if native else None,
        "native_extension": native,
        # Which C++ sources the kernels were built from: ties a figure to a kernel version.
        "native_source_hash": getattr(load_extension(), "SOURCE_HASH", None) if native else None,
        "cpus": os.cpu_count(),
        "load_average": load_average(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "system": f"{platform.system()} {platform.release()}",
    }
