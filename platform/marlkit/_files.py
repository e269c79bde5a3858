"""Files that must survive a killed process, a full disk or another writer: folder locks, space
reserved before a write, and per-file checksums verified on load. Standard library and xxhash.

* :func:`lock_folder` / :func:`flock`: ``flock`` locks (dropped by the kernel when the process
  ends, killed or not); :class:`FolderInUse` names the process holding one.
* :func:`reserve`: ``posix_fallocate`` before a write, so a full disk is an ``OSError`` naming the
  file and the bytes needed, not a ``SIGBUS`` in a memory-mapped write or a half-written file.
* :func:`write_bytes` / :func:`write_manifest` / :func:`verify_manifest`: files written whole
  (space reserved first), their sizes and XXH3-128 digests in ``manifest.json``, and a load that
  refuses a folder holding a file the manifest does not list, a link, or a file of another size
  or digest, naming the folder and the file.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import json
import os
import pathlib
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

import xxhash

__all__ = [
    "MANIFEST",
    "DiskFull",
    "FolderInUse",
    "digest_file",
    "flock",
    "lock_folder",
    "no_space",
    "reserve",
    "verify_manifest",
    "write_bytes",
    "write_manifest",
]

#: The file listing each file of a folder with its size and digest.
MANIFEST = "manifest.json"
_FORMAT = "marlkit-manifest/1"
_HASH = "xxh3_128"
_CHUNK = 1 << 23  # 8 MiB: large enough for the hash's full speed, small enough for the cache
#: Files from this size on are hashed on a second thread while they are written.
_PIPELINE = 4 * _CHUNK


class DiskFull(OSError):
    """ENOSPC (or EDQUOT) for a write, naming the file, the bytes needed and the bytes free."""


class FolderInUse(RuntimeError):
    """Another process holds the folder's lock (its pid is in the message)."""


def lock_folder(folder: pathlib.Path, name: str, *, what: str, advice: str) -> IO[str] | None:
    """An exclusive lock on ``folder`` (the open file ``folder/name`` holding an ``flock``, with
    this process's pid in it; the kernel drops the lock when the process ends, killed or not),
    or ``None`` where ``flock`` does not exist (Windows). Close the returned file to release it.

    Raises:
        FolderInUse: another process (or another open of the same file) holds it; the message
            says ``what`` the folder is, the holder's pid and ``advice``.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return None
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / name, "a+")  # noqa: SIM115 - held until the caller closes it
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        pid = handle.read().strip() or "?"
        handle.close()
        raise FolderInUse(
            f"{str(folder)!r} is in use by another {what} (pid {pid}); {advice}"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


@contextlib.contextmanager
def flock(path: pathlib.Path, *, shared: bool) -> Iterator[None]:
    """Hold a blocking ``flock`` on the file ``path`` (created when missing) for the ``with``
    block: shared (readers) or exclusive (a writer removing what readers read)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield  # closing the file drops the lock


def no_space(path: str | os.PathLike[str], needed: int, err: OSError | None = None) -> OSError:
    """The :class:`DiskFull` (an ``OSError``, ENOSPC) for a write of ``needed`` bytes to
    ``path`` that does not fit, with the space the file system has left (``err``, a
    :class:`DiskFull` already, is returned as it is)."""
    free = "?"
    with contextlib.suppress(OSError):
        stat = os.statvfs(os.path.dirname(os.path.abspath(path)))
        free = f"{stat.f_bavail * stat.f_frsize:,}"
    if isinstance(err, DiskFull):
        return err
    why = f" ({err.strerror})" if err is not None and err.strerror else ""
    return DiskFull(
        errno.ENOSPC,
        f"no space left on the device for {str(path)!r}: {needed:,} bytes needed, {free} bytes "
        f"free{why}",
    )


def reserve(fd: int, path: str | os.PathLike[str], offset: int, length: int) -> None:
    """Allocate the bytes ``[offset, offset + length)`` of the open file ``fd`` (``path``) on the
    disk, so that writing them (through a memory map too) cannot fail for want of space.

    Raises:
        OSError: ENOSPC naming ``path`` and the bytes needed (the file keeps its content).
    """
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise no_space(path, length, err) from None
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # A file system without fallocate: glibc would have written zeros; best effort.


def write_bytes(path: pathlib.Path, chunks: Iterable[memoryview], size: int) -> str:
    """Write ``chunks`` (``size`` bytes in all) into the new file ``path``, the space reserved
    first; returns their digest. A write that fails leaves no file.

    Raises:
        OSError: ENOSPC naming ``path`` and ``size`` (nothing is left at ``path``).
    """
    digest = xxhash.xxh3_128()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        reserve(fd, path, 0, size)
        with os.fdopen(fd, "wb", closefd=False) as handle:
            if size < _PIPELINE:
                for chunk in chunks:
                    digest.update(chunk)
                    handle.write(chunk)
            else:
                _hash_while_writing(chunks, digest, handle)
    except OSError as err:
        os.close(fd)
        path.unlink(missing_ok=True)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise no_space(path, size, err) from None
        raise
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return digest.hexdigest()


def _hash_while_writing(chunks: Iterable[memoryview], digest: Any, handle: IO[bytes]) -> None:
    """Hash each chunk on a second thread while this one writes it (both release the GIL), in
    order: the hash of a large file then costs little more than its write. The thread lives
    for this call only (a pool kept across calls would not survive a fork)."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="marlkit-hash") as pool:
        pending: concurrent.futures.Future[None] | None = None
        try:
            for chunk in chunks:
                if pending is not None:
                    pending.result()
                pending = pool.submit(digest.update, chunk)
                handle.write(chunk)
        finally:
            if pending is not None:
                pending.result()


def digest_file(path: pathlib.Path) -> str:
    """The XXH3-128 digest of the file ``path``."""
    digest = xxhash.xxh3_128()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def _files_of(mapping: Mapping[str, Any]) -> str:
    return json.dumps(mapping, sort_keys=True, separators=(",", ":"))


def write_manifest(folder: pathlib.Path, files: Mapping[str, tuple[int, str]]) -> None:
    """Write ``folder/manifest.json``: ``files`` (relative path -> (size, digest)) and a digest
    of that list itself."""
    entries = {name: {"size": size, _HASH: digest} for name, (size, digest) in files.items()}
    manifest = {
        "format": _FORMAT,
        "files": entries,
        "digest": xxhash.xxh3_128(_files_of(entries).encode()).hexdigest(),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def _walk(folder: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """Every entry under ``folder`` (relative path, path), links and special files included."""
    for root, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            path = pathlib.Path(root) / name
            yield path.relative_to(folder).as_posix(), path


def _read_manifest(path: pathlib.Path) -> dict[str, tuple[int, str]]:
    """The files ``manifest.json`` lists, after checking its own digest.

    Raises:
        FileNotFoundError: no manifest.
        ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError: a damaged one.
    """
    manifest = json.loads(path.read_text())
    if manifest.get("format") != _FORMAT:
        raise ValueError(f"format {manifest.get('format')!r}, not {_FORMAT!r}")
    entries = manifest["files"]
    if xxhash.xxh3_128(_files_of(entries).encode()).hexdigest() != manifest["digest"]:
        raise ValueError("its list of files does not match its digest")
    return {name: (int(entry["size"]), str(entry[_HASH])) for name, entry in entries.items()}


def _unexpected(
    folder: pathlib.Path, files: Mapping[str, Any], folders: Iterable[str], skip: tuple[str, ...]
) -> str | None:
    """Why an entry under ``folder`` is not one the manifest allows (the first), or None."""
    allowed = {str(pathlib.PurePosixPath(d)) for d in (*folders, *skip)}
    for name in files:
        allowed.update(str(p) for p in pathlib.PurePosixPath(name).parents if str(p) != ".")
    for name, entry in _walk(folder):
        if entry.is_symlink():
            return f"{name} is a link; a checkpoint holds plain files only"
        if any(name == s or name.startswith(f"{s}/") for s in skip):
            continue
        if entry.is_dir():
            if name not in allowed:
                return f"{name}/ is not part of the format (a folder no manifest lists)"
        elif name != MANIFEST and name not in files:
            return f"{name} is not part of the format (a file the manifest does not list)"
        elif not entry.is_file():
            return f"{name} is not a regular file"
    return None


def verify_manifest(
    folder: pathlib.Path,
    what: str,
    *,
    folders: Iterable[str] = (),
    skip: Iterable[str] = (),
) -> dict[str, tuple[int, str]]:
    """Check ``folder`` against its ``manifest.json``: it holds exactly the files listed (and
    the sub-folders that lead to them, ``folders``, and what is under ``skip``: folders checked
    on their own), each a regular file of its size and digest, and no link. Returns the
    manifest's files.

    Raises:
        ValueError: naming ``what`` (the checkpoint), ``folder`` and the first file that is
            missing, unexpected (not part of the format), a link, or of another size or digest;
            or a manifest that does not parse.
    """

    def damaged(why: str) -> ValueError:
        return ValueError(f"{what} {folder}: {why}; nothing was loaded")

    try:
        files = _read_manifest(folder / MANIFEST)
    except FileNotFoundError:
        raise damaged(f"{MANIFEST} is missing") from None
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as err:
        raise damaged(f"{MANIFEST} is damaged ({type(err).__name__}: {err})") from None
    why = _unexpected(folder, files, folders, tuple(skip))
    if why is not None:
        raise damaged(why)
    for name, (size, digest) in sorted(files.items()):
        entry = folder / name
        if not entry.is_file():
            raise damaged(f"{name} is missing")
        found = entry.stat().st_size
        if found != size:
            raise damaged(f"{name} holds {found:,} bytes, the manifest says {size:,}")
        if digest_file(entry) != digest:
            raise damaged(f"{name} does not match its checksum (its content changed)")
    return files
