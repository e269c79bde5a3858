"""Build the pybind11 extension ``marlkit._C`` from ``csrc/``; everything else is in pyproject.toml.

The extension links no libtorch: arrays cross as NumPy buffers (zero-copy from contiguous CPU
tensors). A hash of the C++ sources is compiled in, so that the Python side can tell a stale
build from a fresh one and say how to rebuild.

``MARLKIT_NO_EXTENSION=1`` skips the extension: ``make lint`` uses it for the strict editable
install its static tools read, which needs the package layout, not the compiled kernels.

One packaging fix lives here too, because pyproject.toml cannot express it: the default
(lenient) editable install also puts ``platform/`` on ``sys.path`` (see :class:`_EditableWheel`).
"""

from __future__ import annotations

import importlib.util
import locale
import os
import pathlib
import sys
from typing import Any

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup
from setuptools.command.editable_wheel import editable_wheel

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


class _WithPlatformOnPath:
    """setuptools' lenient editable strategy, plus a ``.pth`` line that puts ``platform/`` on
    ``sys.path``.

    The lenient strategy maps ``marlkit``, ``marlkit.adapters`` and ``marlkit.scenarios`` to
    their folders with an import hook that it appends to ``sys.meta_path``, after the
    ``PathFinder``. Python run from a folder that holds a clone named ``marlkit`` then finds
    that clone (no ``__init__.py`` at its top) through ``sys.path[0]`` as a namespace package
    first, and the hook is never asked: ``marlkit.make`` is missing (pypa/setuptools#3557).
    A ``sys.path`` entry holding the real package wins over a namespace package wherever it
    stands in ``sys.path``, as a regular install in site-packages does; ``marlkit.adapters``
    and ``marlkit.scenarios``, which are not under ``platform/marlkit/``, still come from
    the hook. ``platform/`` holds nothing but ``marlkit`` (tests/test_packaging.py checks it),
    so the entry makes nothing else importable: the reason the lenient mode prefers a hook.
    """

    def __init__(self, strategy: Any, name: str, entry: pathlib.Path):
        self._strategy, self._name, self._entry = strategy, name, entry

    def __enter__(self) -> _WithPlatformOnPath:
        self._strategy.__enter__()
        return self

    def __exit__(self, *exc: object) -> Any:
        return self._strategy.__exit__(*exc)

    def __call__(self, wheel: Any, files: list[str], mapping: dict[str, str]) -> None:
        self._strategy(wheel, files, mapping)
        # site reads .pth files in the locale's encoding before Python 3.13, UTF-8 from then on.
        encoding = "utf-8" if sys.version_info >= (3, 13) else locale.getpreferredencoding(False)
        line = f"{self._entry}\n".encode(encoding)
        wheel.writestr(f"__editable__.{self._name}.platform.pth", line)


class _EditableWheel(editable_wheel):
    """``pip install -e .``: setuptools' own editable wheel, with ``platform/`` on ``sys.path``
    in the default (lenient) mode. ``--config-settings editable_mode=strict`` (``make lint``)
    and ``compat`` are left as setuptools builds them.

    ``_select_strategy`` is setuptools' own (private) hook (checked with setuptools 84): were it
    renamed, this override would go unused and the install would be setuptools' plain one, and
    ``tests/test_packaging.py`` would fail, naming the trap.
    """

    def _select_strategy(self, name: str, tag: str, build_lib: Any) -> Any:
        strategy = super()._select_strategy(name, tag, build_lib)
        if str(self.mode or "lenient").lower() != "lenient":
            return strategy
        entry = pathlib.Path(self.project_dir, "platform").resolve()
        return _WithPlatformOnPath(strategy, name, entry)


setup(
    ext_modules=ext_modules,
    cmdclass={"build_ext": build_ext, "editable_wheel": _EditableWheel},
)
