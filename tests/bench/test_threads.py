"""`speculant.load(..., threads=N)`: every session gets ONNX Runtime's intra-op thread count."""

from __future__ import annotations

import speculant
from builders.writers import write_chained_package


def test_threads_reach_every_session(tmp_path):
    root = write_chained_package(tmp_path / "pair", fmt="onnx")
    engine = speculant.load(root, threads=1)
    assert set(engine.sessions) == {"target", "assistant"}
    for session in engine.sessions.values():
        assert session.session.get_session_options().intra_op_num_threads == 1


def test_threads_default_is_ort_default(tmp_path):
    root = write_chained_package(tmp_path / "pair", fmt="onnx")
    engine = speculant.load(root)
    for session in engine.sessions.values():
        assert session.session.get_session_options().intra_op_num_threads == 0
