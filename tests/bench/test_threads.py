"""`speculant.load(..., threads=N)`: every session runs as its pool decision says
(`session/pools.py`; the decision in fresh processes: tests/session/test_pools.py)."""

from __future__ import annotations

import pytest

import speculant
from builders.writers import write_chained_package


@pytest.mark.parametrize("threads", [1, None])
def test_every_session_runs_as_its_pool_decision_says(tmp_path, threads):
    root = write_chained_package(tmp_path / "pair", fmt="onnx")
    engine = speculant.load(root, threads=threads)
    assert set(engine.sessions) == {"target", "assistant"}
    for session in engine.sessions.values():
        options = session.session.get_session_options()
        assert session.pool == engine.sessions["target"].pool
        assert options.use_per_session_threads == (not session.pool.is_shared)
        if not session.pool.is_shared:  # its own pool: the count asked (0: ORT's default)
            assert options.intra_op_num_threads == (threads or 0)
    assert engine.cpu_pool == session.pool.describe("the target and the assistant")
