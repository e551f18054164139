"""`speculant serve`: registered onto `speculant`; a missing extra is a typed error."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from speculant.cli import full_app
from speculant.serve import MissingExtraError, require


def test_serve_is_a_speculant_command():
    result = CliRunner().invoke(full_app(), ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--host", "--port", "--proposer", "--ray", "--replicas"):
        assert option in result.stdout


@pytest.mark.parametrize("module, extra", [("fastapi", "serve"), ("uvicorn", "serve"),
                                           ("ray.serve", "ray")])
def test_a_missing_extra_names_its_install(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import now raises ImportError
    with pytest.raises(MissingExtraError) as missing:
        require(extra)
    assert f"pip install 'speculant[{extra}]'" in str(missing.value)


def test_serve_without_fastapi_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)
    result = CliRunner().invoke(full_app(), ["serve", "--port", "1"])
    assert result.exit_code == 2
    assert "MissingExtraError" in result.stderr
    assert "pip install 'speculant[serve]'" in result.stderr


def test_an_unknown_default_proposer_is_refused():
    result = CliRunner().invoke(full_app(), ["serve", "--proposer", "eagle7"])
    assert result.exit_code == 2 and "eagle7" in result.stderr
