"""Ctrl-C at any moment: the ``speculant`` command exits 130 with one line, never a traceback.

The interrupt is sent to the installed console script (and ``python -m speculant``) at three
moments found from the process itself, not from a clock: while numpy is being imported (its
library just mapped; the heavy imports run on for a second or more), once ONNX Runtime is
mapped, and in the command after it began writing its text. Each is asserted on the real
stderr, which ``CliRunner`` cannot see."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "speculant"
DEADLINE_S = 120  # generous: the machine may be loaded


def mapped(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def interrupt_when(command: list[str], is_ready) -> subprocess.CompletedProcess:
    """Start ``command``, send SIGINT as soon as ``is_ready(process)``, and collect it."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    started = time.monotonic()
    while process.poll() is None and not is_ready(process):
        assert time.monotonic() - started < DEADLINE_S, "never reached the moment"
        time.sleep(0.002)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=DEADLINE_S)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def assert_one_line(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 130, (result.returncode, result.stderr)
    assert result.stderr.split() == ["interrupted"], result.stderr  # (and rich's blank line)


GENERATE = ["generate", "demo", "--prompt", "def f(x):", "--max-new-tokens", "400"]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
@pytest.mark.parametrize(("launcher", "library"), [("script", "_multiarray_umath"),
                                                   ("script", "onnxruntime_pybind11_state"),
                                                   ("module", "_multiarray_umath")])
def test_an_interrupt_during_the_start_up_imports(launcher: str, library: str) -> None:
    command = [str(SCRIPT)] if launcher == "script" else [sys.executable, "-m", "speculant"]
    result = interrupt_when(command + GENERATE, lambda p: mapped(p.pid, library))
    assert result.stdout == ""  # it was interrupted before writing anything
    assert_one_line(result)


def test_an_interrupt_during_a_command_keeps_its_text() -> None:
    def has_written(process: subprocess.Popen) -> bool:
        return process.stdout.read(1) != ""  # blocks until the first character

    result = interrupt_when([str(SCRIPT), *GENERATE], has_written)
    assert_one_line(result)
