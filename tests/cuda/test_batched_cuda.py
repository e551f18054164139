"""The batched pass on CUDA in float16 beside the package's own batch-1 graph and with the
chained drafter (docs/design/batching.md; issue 40 items 1 and 3). The CPU's equality is
tests/cuda/test_batched_pass_cuda.py's; here, on device buffers bound in place: each ragged
pass's rows (a rollback by length between them) equal each row's batch-1 pass on CUDA with
the package's GroupQueryAttention graph within float16 steps, every byte outside the rows'
valid slots unchanged; then the drafter steps every row on those buffers as each alone.

Run on the GPU machine: ``pytest -m cuda tests/cuda/test_batched_cuda.py``.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from gpu_probe import cuda_marks

from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS, write_tokenizer
from speculant_tools.export import write_pair_package
from static_cache.static_driver import BatchedTarget, StaticDrafter, StaticTarget

pytestmark = cuda_marks()
CAPACITY = 24
# the passes of tests/static_cache/test_batched_pass.py, a fifth row idle throughout
PASSES = [[[7, 3, 41, 12, 25], [9, 2], [33, 48, 2, 17, 5, 6, 30, 11, 40], [14, 8, 21], []],
          [[19, 4, 27], [36, 10, 3, 44], [22], [], []]]
KEEP = {0: 1, 1: 2}  # row -> drafts kept of the verify block, then rolled back by length
AFTER = [[29, 13], [1, 45, 7], [16, 38, 20], [6], []]
ROWS = len(AFTER)
FLOAT16_LOGITS = 0.1875  # 12 float16 steps at the logits' magnitude (test_batched_pass.py)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("batched-cuda")
    return write_pair_package(base / "pair", TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS,
                              write_tokenizer(base / "tokenizer.json"), dtype="float16",
                              graph="fused", cache="static", batch=ROWS)


def fill() -> np.ndarray:
    c = CONFIG
    return np.random.default_rng(5).standard_normal(
        (c.num_hidden_layers, 2, ROWS, c.num_key_value_heads, CAPACITY, c.head_dim))


def test_the_batched_pass_on_cuda_equals_each_row_alone_after_a_rollback(pair):
    device = BatchedTarget(pair / "target" / "batched.onnx", ROWS, CAPACITY, fill(),
                           device="cuda")
    singles = [StaticTarget(pair, CAPACITY, device="cuda") for _ in range(ROWS)]
    for number, blocks in enumerate([*PASSES, AFTER]):
        if number == 2:  # rollback: a length change per row
            for b, kept in KEEP.items():
                device.lengths[b] = len(PASSES[0][b]) + kept
                singles[b].rollback(len(PASSES[0][b]) + kept)
        before, lengths = device.snapshot(), device.lengths.copy()
        rows = device.run(blocks)
        changed = (before != device.snapshot()).any(axis=(0, 1, 3, 5))  # [rows, capacity]
        for b, block in enumerate(blocks):
            allowed = np.zeros(CAPACITY, bool)
            allowed[lengths[b]:lengths[b] + len(block)] = True
            assert not (changed[b] & ~allowed).any(), f"pass {number}: row {b} written " \
                f"at slots {np.flatnonzero(changed[b] & ~allowed).tolist()}"
            if block:
                np.testing.assert_allclose(rows[b], singles[b].run(block),
                                           atol=FLOAT16_LOGITS, err_msg=f"pass {number}")
        for key, buffer in device.buffers.items():  # in place: the present is the buffer
            assert device.presents[key].data_ptr() == buffer.data_ptr()


def test_the_drafter_steps_every_row_on_the_device_buffers_as_each_alone(pair):
    batch = BatchedTarget(pair / "target" / "batched.onnx", ROWS, CAPACITY, fill(),
                          device="cuda")
    for blocks in PASSES:
        batch.run(blocks)
    lengths = batch.lengths.tolist()
    positions = [max(length - 1, 0) for length in lengths]
    fused = np.random.default_rng(9).standard_normal(
        (ROWS, 1, 2 * CONFIG.hidden_size)).astype(np.float16)
    drafter = StaticDrafter(pair, device="cuda")
    before = batch.snapshot()
    rows = drafter.step_rows(batch, fused, positions, lengths)
    assert (batch.snapshot() == before).all()
    for b in range(ROWS - 1):  # the idle row's outputs are ignored
        row = type("Row", (), {"config": batch.config, "buffers": {
            key: ort.OrtValue.ortvalue_from_numpy(
                np.ascontiguousarray(buffer.numpy()[b:b + 1]), "cuda", 0)
            for key, buffer in batch.buffers.items()}})
        alone = drafter.step(row, fused[b:b + 1], positions[b], lengths[b])
        np.testing.assert_allclose(rows[b], alone, atol=FLOAT16_LOGITS)
