"""Hash of the C++ sources, shared by ``setup.py`` (compiled into ``marlkit._C``) and the loader.

Standard library only: ``setup.py`` loads this file by path before the package can be imported.
"""

from __future__ import annotations

import hashlib
import pathlib

__all__ = ["SOURCE_SUFFIXES", "source_hash"]

SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc")


def source_hash(csrc: pathlib.Path) -> str:
    """Return a short hex digest of every C++ source under ``csrc`` (paths and contents)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in csrc.rglob("*") if p.suffix in SOURCE_SUFFIXES):
        digest.update(path.relative_to(csrc).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes().replace(b"\r\n", b"\n"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]
