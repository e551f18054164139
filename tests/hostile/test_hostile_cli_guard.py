"""The console script never prints a traceback (issue 15): an unexpected exception prints one
line with a hint to report it and exits 1; a SpeculantError that escapes a command exits 2;
text that cannot be encoded is printed escaped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import speculant.cli as cli_module
from speculant.errors import MetadataError

SCRIPT = Path(sys.executable).parent / "speculant"


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["speculant", *args])
    # main() would allow the process-wide CPU pool for the whole test process (the console
    # script owns its process; pytest's does not): test_pools runs main() in its own process
    monkeypatch.setattr("speculant.session.session.share_cpu_pool", lambda: None)
    with pytest.raises(SystemExit) as caught:
        cli_module.main()
    out, err = capsys.readouterr()
    return caught.value.code, out, err


def broken_load(error: BaseException):
    def load(*args, **kwargs):
        raise error
    return load


def test_an_unexpected_exception_is_one_line_and_exit_1(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("speculant.engine.load",
                        broken_load(RuntimeError("something\nunforeseen")))
    code, out, err = run_main(monkeypatch, capsys, "inspect", str(tmp_path))
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "internal error: RuntimeError: something unforeseen" in lines[0]
    assert cli_module.REPORT_HINT in lines[0]


def test_a_speculant_error_escaping_a_command_is_exit_2(monkeypatch, capsys):
    def register(app):
        @app.command("explode")
        def explode() -> None:
            raise MetadataError("a typed failure", file="f.yaml")
    monkeypatch.setattr(cli_module, "full_app", lambda: _app_with(register))
    code, _, err = run_main(monkeypatch, capsys, "explode")
    assert code == 2
    assert err.strip() == "MetadataError: f.yaml: a typed failure"


def _app_with(register):
    import typer
    app = typer.Typer(add_completion=False)
    register(app)

    @app.command("noop")
    def noop() -> None:
        pass
    return app


def test_a_path_that_is_not_valid_utf8_prints_escaped(tmp_path):
    """A file name of undecodable bytes reaches Python as lone surrogates; printing it must
    not raise UnicodeEncodeError (review D3, the printing half)."""
    name = tmp_path / "meta\udcff.json"
    name.write_text('{"schema_version": "v1"}')
    result = subprocess.run([str(SCRIPT), "inspect", "--metadata-only", str(name)],
                            capture_output=True, timeout=120, check=False)
    assert b"Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    assert b"meta\\udcff.json" in result.stdout


def test_an_undecodable_prompt_is_one_line_and_exit_2(tmp_path):
    from builders.writers import write_decoder_package
    root = write_decoder_package(tmp_path / "decoder")
    result = subprocess.run([str(SCRIPT), "generate", str(root), "--prompt", b"def \xff",
                             "--max-new-tokens", "2"], capture_output=True, timeout=120,
                            check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("RequestError:"), lines


def test_an_interrupt_while_commands_register_exits_130_quietly(monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(cli_module, "full_app", interrupted)
    code, out, err = run_main(monkeypatch, capsys)
    assert code == 130 and "Traceback" not in err
