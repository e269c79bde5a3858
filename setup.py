"""Build the pybind11 extension ``marlkit._C`` from ``csrc/``; everything else is in pyproject.toml.

The extension links no libtorch: arrays cross as NumPy buffers (zero-copy from contiguous CPU
tensors). A hash of the C++ sources is compiled in, so that the Python side can tell a stale
build from a fresh one and say how to rebuild.

``MARLKIT_NO_EXTENSION=1`` skips the extension: ``make lint`` uses it for the strict editable
install its static tools read, which needs the package layout, not the compiled kernels.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

ROOT = pathlib.Path(__file__).resolve().parent


def _source_hash() -> str:
    # Load the hashing helper by path: the package itself is not importable before the build.
    path = ROOT / "platform" / "marlkit" / "native" / "_source_hash.py"
    spec = importlib.util.spec_from_file_location("_marlkit_source_hash", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None  # build script, not user input
    spec.loader.exec_module(module)
    return module.source_hash(ROOT / "csrc")


_compile_args = ["-O3", "-ffp-contract=off", "-pthread", "-fvisibility=hidden"]
_link_args = ["-pthread"]
if sys.platform == "darwin":
    _compile_args.remove("-pthread")
    _link_args = []

ext_modules = [
    Pybind11Extension(
        "marlkit._C",
        sources=["csrc/bindings.cpp"],
        include_dirs=["csrc/include"],
        # Headers too: without them build_ext skips a rebuild after a header-only edit.
        depends=sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.h")),
        cxx_std=17,
        extra_compile_args=_compile_args,
        extra_link_args=_link_args,
        define_macros=[("MARLKIT_SOURCE_HASH", f'"{_source_hash()}"')],
    )
]

if os.environ.get("MARLKIT_NO_EXTENSION") == "1":
    ext_modules = []

setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext})
