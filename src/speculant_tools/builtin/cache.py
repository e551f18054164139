"""A cache of built packages: one folder per name and key, complete or absent.

    folder = cached(root, "smollm2", key, build)   # build(folder) writes the package

``build`` writes into a staging folder beside the final one (``.building-<name>-<key>``);
the manifest (every file's size and sha256) is written last, and the folder is renamed into
place while a file lock (``<name>-<key>.lock``) keeps other builders out. A folder without a
manifest, or whose files disagree with it, is rebuilt.

The staging folder and the one an old package is moved aside into (``.stale-<name>-<key>``)
are named by the key alone, so whoever holds the key's lock owns them: a builder that was
killed (SIGKILL, power loss) leaves them behind, and the next builder of that key removes
them under the lock before it starts. Builders of other keys never touch them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from speculant.errors import SpeculantError

FORMAT = 5  # bump when the importer writes different packages for the same sources
MANIFEST = "manifest.json"
REMEDY = "remove it (the cache rebuilds what it needs), or set SPECULANT_CACHE to another folder"


class BuiltinError(SpeculantError):
    """A built-in package cannot be found or built."""


def cached(root: Path, name: str, key: str, build: Callable[[Path], None], *,
           kind: str = "packages") -> Path:
    """``<kind>/<name>-<key>`` in the cache (``packages``, or ``downloads`` for fetched
    sources), built by ``build(folder)`` where it is missing or fails its manifest. Safe
    against concurrent builders and interrupted builds; a lock path that is not a regular
    file, or a cache that cannot be written, is a BuiltinError naming the path."""
    packages = root / kind
    final = packages / f"{name}-{key}"
    if is_complete(final):
        return final
    try:
        packages.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BuiltinError(f"cannot create the cache folder: {error.strerror}",
                           file=str(packages), remedy=REMEDY) from None
    with _locked(packages / f"{name}-{key}.lock"):
        if is_complete(final):  # another process built it while this one waited
            return final
        building, stale = packages / f".building-{name}-{key}", packages / f".stale-{name}-{key}"
        for leftover in (building, stale):  # a killed builder's: the lock is held, so stale
            _remove(leftover)
        building.mkdir()
        try:
            build(building / "package")
            write_manifest(building / "package")
            if final.exists() or final.is_symlink():  # incomplete or corrupted: aside, drop
                stale.mkdir()
                final.rename(stale / "package")
            (building / "package").rename(final)
        finally:  # what stays (a busy file, say) the next builder of this key removes
            shutil.rmtree(building, ignore_errors=True)
            shutil.rmtree(stale, ignore_errors=True)
    return final


@contextmanager
def _locked(lock: Path) -> Iterator[None]:
    """Hold the file lock at ``lock``, refusing a path that is there but not a regular file
    (a directory, a FIFO, a symbolic link) or that cannot be opened."""
    from filelock import FileLock

    try:
        mode = os.lstat(lock).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:
        raise BuiltinError(f"cannot read the cache's lock: {error.strerror}", file=str(lock),
                           remedy=REMEDY) from None
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else \
            "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
        raise BuiltinError("the cache's lock file is not a regular file", file=str(lock),
                           value=kind, expected="a regular file (or nothing there)",
                           remedy=REMEDY)
    try:
        lock_file = FileLock(str(lock))
        lock_file.acquire()
    except OSError as error:
        raise BuiltinError(f"cannot take the cache's lock: {error.strerror}", file=str(lock),
                           remedy=REMEDY) from None
    try:
        yield
    finally:
        lock_file.release()


def _remove(folder: Path) -> None:
    """Remove ``folder`` (or a file or link there) and all it holds, if present."""
    if not (folder.exists() or folder.is_symlink()):
        return
    try:
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
        else:
            folder.unlink()
    except OSError as error:
        raise BuiltinError(f"cannot remove a leftover of an interrupted build: "
                           f"{error.strerror}", file=str(folder), remedy=REMEDY) from None


def write_manifest(folder: Path) -> None:
    files = {str(path.relative_to(folder)): {"size": path.stat().st_size,
                                             "sha256": sha256(path)}
             for path in sorted(folder.rglob("*")) if path.is_file()}
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "files": files}, indent=1))


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds exactly the files its manifest lists, with their hashes."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        present = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
        if present != set(files) | {MANIFEST}:
            return False
        return all((folder / rel).stat().st_size == entry["size"]
                   and sha256(folder / rel) == entry["sha256"] for rel, entry in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def cache_key(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
