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


def test_serve_ray_hands_its_limits_to_the_deployment(monkeypatch):
    """``--ray`` passes the limit and chat-template options to ray_app.run_blocking (a
    stand-in module here: no ray needed); test_ray_serve follows them into the replicas."""
    import types

    import speculant.serve.command as command
    from speculant.serve.limits import ServerLimits
    from speculant.text.chat import TemplateLimits

    received = {}
    stand_in = types.ModuleType("speculant.serve.ray_app")
    stand_in.run_blocking = lambda package, **kwargs: received.update(kwargs, package=package)
    monkeypatch.setitem(sys.modules, "speculant.serve.ray_app", stand_in)
    monkeypatch.setattr(command, "require", lambda extra: None)
    result = CliRunner().invoke(full_app(), [
        "serve", "pkg", "--ray", "--replicas", "2", "--max-waiting", "3",
        "--request-timeout", "7", "--max-tokens", "5", "--chat-template-deadline", "0.5",
        "--chat-template-max-chars", "999"])
    assert result.exit_code == 0, result.output
    assert received["package"] == "pkg" and received["num_replicas"] == 2
    assert received["limits"] == ServerLimits(request_timeout_s=7.0, max_waiting=3,
                                              max_tokens=5)
    assert received["template_limits"] == TemplateLimits(deadline_s=0.5, max_output_chars=999)
