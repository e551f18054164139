"""The chained drafter at ``B`` rows (issue 40 item 3, docs/design/batching.md): its static
graph ``assistant/model.onnx``, bound to the batched target's last-layer buffers
``[B, KV, capacity, d]`` with per-row ``cache_lengths`` [B], steps every row in one run, and
each row's step equals its batch-1 step on the same cache contents (row ``b`` of the buffers
copied to ``[1, KV, capacity, d]``), for the three drafter forms a static pair can have. The
borrowed buffers are read only. Planted: one length for every row is caught."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from static_driver import FORMS, BatchedTarget, StaticDrafter
from test_batched_pass import CAPACITY, KEEP, PREFILL, VERIFY, random_fill

from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS
from speculant_tools.export import write_pair_package

ROWS = len(PREFILL) + 1  # the last row does not speculate: its length is 0, its block empty


@pytest.fixture(scope="module", params=list(FORMS))
def pair(request, tmp_path_factory, tokenizer_file):
    dtype, graph = FORMS[request.param]
    root = write_pair_package(tmp_path_factory.mktemp("batched-drafter") / request.param,
                              TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS, tokenizer_file,
                              dtype=dtype, graph=graph, cache="static", batch=ROWS)
    return root


def filled_batch(root) -> BatchedTarget:
    """The batched target after a ragged prefill, a ragged verify and two rollbacks: rows at
    lengths 6, 4, 10, 3 and 0, rejected drafts left past the lengths of rows 0 and 1."""
    batch = BatchedTarget(root / "target" / "batched.onnx", ROWS, CAPACITY, random_fill(ROWS))
    batch.run([*PREFILL, []])
    batch.run([*VERIFY, []])
    for b, kept in KEEP.items():
        batch.lengths[b] = len(PREFILL[b]) + kept
    assert batch.lengths.tolist() == [6, 4, 10, 3, 0]
    return batch


def row_of(batch: BatchedTarget, b: int) -> SimpleNamespace:
    """Row ``b`` of the batch's buffers copied to batch-1 buffers [1, KV, capacity, d]."""
    return SimpleNamespace(config=batch.config, buffers={
        key: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(buffer.numpy()[b:b + 1]))
        for key, buffer in batch.buffers.items()})


def test_each_row_steps_as_it_does_alone_on_the_same_caches(pair):
    batch = filled_batch(pair)
    lengths = batch.lengths.tolist()  # C'_b: each row's chain reads its committed slots
    positions = [max(length - 1, 0) for length in lengths]
    fused = np.random.default_rng(9).standard_normal(
        (ROWS, 1, 2 * CONFIG.hidden_size)).astype(batch.dtype)
    drafter = StaticDrafter(pair)
    before = batch.snapshot()
    rows = drafter.step_rows(batch, fused, positions, lengths)  # [B, vocab]
    states = drafter.state  # [B, 1, H]
    assert (batch.snapshot() == before).all()  # the borrowed buffers are read only
    for b in range(ROWS - 1):  # the last row does not speculate: its logits are ignored
        alone = drafter.step(row_of(batch, b), fused[b:b + 1], positions[b], lengths[b])
        np.testing.assert_allclose(rows[b], alone, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(states[b].astype(np.float32),
                                   drafter.state[0].astype(np.float32), rtol=1e-5, atol=1e-5)


def test_one_length_for_every_row_is_caught(pair):
    """Planted: the driver binds the longest row's length to every row, so the shorter rows
    read their rejected drafts and padding slots."""
    batch = filled_batch(pair)
    lengths = batch.lengths.tolist()
    fused = np.random.default_rng(9).standard_normal(
        (ROWS, 1, 2 * CONFIG.hidden_size)).astype(batch.dtype)
    drafter = StaticDrafter(pair)
    rows = drafter.step_rows(batch, fused, [length - 1 for length in lengths[:-1]] + [0],
                             [max(lengths)] * ROWS)
    alone = drafter.step(row_of(batch, 0), fused[:1], lengths[0] - 1, lengths[0])
    assert not np.allclose(rows[0], alone, rtol=1e-3, atol=1e-3)
