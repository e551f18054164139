"""A cache of built packages: one folder per name and key, complete or absent.

    folder = cached(root, "smollm2", key, build)   # build(folder) writes the package

``build`` writes into a fresh folder beside the final one; the manifest (every file's size
and sha256) is written last, and the folder is renamed into place while a file lock keeps
other builders out. A folder without a manifest, or whose files disagree with it, is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

FORMAT = 4  # bump when the importer writes different packages for the same sources
MANIFEST = "manifest.json"


def cached(root: Path, name: str, key: str, build: Callable[[Path], None]) -> Path:
    """``packages/<name>-<key>`` in the cache, built by ``build(folder)`` where it is missing
    or fails its manifest. Safe against concurrent builders and interrupted builds."""
    from filelock import FileLock

    packages = root / "packages"
    final = packages / f"{name}-{key}"
    if is_complete(final):
        return final
    packages.mkdir(parents=True, exist_ok=True)
    with FileLock(str(packages / f"{name}-{key}.lock")):
        if is_complete(final):  # another process built it while this one waited
            return final
        building = Path(tempfile.mkdtemp(prefix=f".building-{name}-", dir=packages))
        try:
            build(building / "package")
            write_manifest(building / "package")
            if final.exists():  # incomplete or corrupted: move it aside, then drop it
                stale = Path(tempfile.mkdtemp(prefix=f".stale-{name}-", dir=packages))
                final.rename(stale / "package")
                shutil.rmtree(stale, ignore_errors=True)
            (building / "package").rename(final)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return final


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
