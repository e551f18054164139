"""The exported graphs against the numpy reference of the architecture (export_reference):
prefill, cached one-token steps, a multi-token block after a past, the attention mask, and
the drafter on the target's borrowed last-layer KV. float32 tight, float16 loose."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from export_models import CONFIG, TARGET_WEIGHTS
from export_reference import drafter_forward, target_forward

from speculant_tools.export import read_weights, rope_tables

PROMPT = [7, 3, 41, 12, 25]
CONTINUATION = [9, 33, 48, 2, 17, 30, 5]  # stepped one by one, then as one block
# (rtol, atol) per dtype against the reference on the weights the package holds; float16
# is loose: activations, IO and caches are rounded to float16 between the float32 parts.
TOLERANCE = {"float32": (1e-5, 2e-5), "float16": (2e-2, 6e-2)}
NP = {"float32": np.float32, "float16": np.float16}
C = CONFIG


def session(root, component: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(root / component / "model.onnx"),
                                providers=["CPUExecutionProvider"])


def empty_past(dtype: str) -> list[np.ndarray]:
    shape = (1, C.num_key_value_heads, 0, C.head_dim)
    return [np.zeros(shape, NP[dtype]) for _ in range(2 * C.num_hidden_layers)]


def run_target(sess, ids, past, dtype, mask=None) -> dict[str, np.ndarray]:
    """One pass over ``ids`` after ``past`` (per layer key, value), positions from the past's
    extent, mask all ones unless given."""
    start = past[0].shape[2]
    total = start + len(ids)
    feeds = {"input_ids": np.array([ids], np.int64),
             "position_ids": np.arange(start, total, dtype=np.int64)[None],
             "attention_mask": (np.ones((1, total), np.int64) if mask is None
                                else np.asarray(mask, np.int64)[None])}
    for i in range(C.num_hidden_layers):
        feeds[f"past_key_values.{i}.key"] = past[2 * i]
        feeds[f"past_key_values.{i}.value"] = past[2 * i + 1]
    names = [o.name for o in sess.get_outputs()]
    out = dict(zip(names, sess.run(None, feeds), strict=True))
    assert all(out[n].dtype == NP[dtype] for n in names)
    return out


def presents(out) -> list[np.ndarray]:
    return [out[f"present.{i}.{p}"] for i in range(C.num_hidden_layers)
            for p in ("key", "value")]


def check(actual, expected, dtype, what: str) -> None:
    rtol, atol = TOLERANCE[dtype]
    assert actual.shape == expected.shape, what
    np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=rtol, atol=atol,
                               err_msg=what)


def check_pass(out, reference, rows: slice, dtype: str, what: str) -> None:
    logits, hidden, keys, values = reference
    check(out["logits"][0], logits[rows], dtype, f"{what}: logits")
    check(out["hidden_states"][0], hidden[rows], dtype, f"{what}: hidden_states")
    for i in range(C.num_hidden_layers):
        total = out[f"present.{i}.key"].shape[2]
        check(out[f"present.{i}.key"][0], keys[i][:, :total], dtype, f"{what}: key {i}")
        check(out[f"present.{i}.value"][0], values[i][:, :total], dtype, f"{what}: value {i}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_target_prefill_steps_and_block_match_the_reference(pair_roots, dtype):
    sess = session(pair_roots[dtype], "target")
    stream = PROMPT + CONTINUATION
    _, weights, _ = read_weights(pair_roots[dtype])  # as the package holds them
    reference = target_forward(C, weights, stream)
    n = len(PROMPT)

    out = run_target(sess, PROMPT, empty_past(dtype), dtype)
    check_pass(out, reference, slice(0, n), dtype, "prefill")
    prefill_past = presents(out)
    past = prefill_past
    for step, token in enumerate(CONTINUATION):
        out = run_target(sess, [token], past, dtype)
        check_pass(out, reference, slice(n + step, n + step + 1), dtype, f"step {step}")
        past = presents(out)

    out = run_target(sess, CONTINUATION[:4], prefill_past, dtype)
    check_pass(out, reference, slice(n, n + 4), dtype, "block of 4 after the prompt")
    out = run_target(sess, CONTINUATION[4:], presents(out), dtype)
    check_pass(out, reference, slice(n + 4, len(stream)), dtype, "block of 3 after 9")


def test_target_honours_the_attention_mask(pair_root):
    """A zero in the mask hides that key from every query (the input is real)."""
    sess = session(pair_root, "target")
    mask = [1, 0, 1, 1, 0]
    out = run_target(sess, PROMPT, empty_past("float32"), "float32", mask=mask)
    reference = target_forward(C, TARGET_WEIGHTS, PROMPT, mask=mask)
    check(out["logits"][0], reference[0], "float32", "masked logits")
    unmasked = target_forward(C, TARGET_WEIGHTS, PROMPT)[0]
    assert not np.allclose(reference[0][2:], unmasked[2:], atol=1e-3)


def test_target_hidden_states_come_after_the_final_norm(pair_root):
    """Each row's RMS over hidden equals the RMS of model.norm.weight times a unit vector:
    logits are exactly hidden @ table.T."""
    out = run_target(session(pair_root, "target"), PROMPT, empty_past("float32"), "float32")
    table = TARGET_WEIGHTS["model.embed_tokens.weight"]
    np.testing.assert_allclose(out["logits"][0], out["hidden_states"][0] @ table.T,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_drafter_on_borrowed_kv_matches_the_reference(pair_roots, dtype):
    """The chain's bindings (runtime.md §9.2): position C' - 1, mask ones [1, C'], the
    target's last-layer present as borrowed KV; also a multi-row query and a masked key."""
    target, drafter = session(pair_roots[dtype], "target"), session(pair_roots[dtype],
                                                                     "assistant")
    out = run_target(target, PROMPT + CONTINUATION[:3], empty_past(dtype), dtype)
    last = C.num_hidden_layers - 1
    key, value = out[f"present.{last}.key"], out[f"present.{last}.value"]  # [1, KV, C', d]
    extent = key.shape[2]
    rng = np.random.default_rng(5)
    _, weights, drafter_weights = read_weights(pair_roots[dtype])
    table = weights["model.embed_tokens.weight"]
    for rows, mask in ((1, np.ones(extent, np.int64)),
                       (3, np.array([1, 1, 0] + [1] * (extent - 3), np.int64))):
        fused = np.concatenate([
            np.sqrt(C.hidden_size) * table[rng.integers(0, C.vocab_size, rows)],
            out["hidden_states"][0, -rows:]], axis=-1).astype(NP[dtype])  # [rows, 2H]
        positions = np.full(rows, extent - 1, np.int64)
        logits, state = drafter.run(["logits", "projected_state"], {
            "inputs_embeds": fused[None], "position_ids": positions[None],
            "attention_mask": mask[None], "shared_kv.key": key, "shared_kv.value": value})
        assert logits.dtype == state.dtype == NP[dtype]
        ref_logits, ref_state = drafter_forward(C, drafter_weights, table, fused, positions,
                                                key[0], value[0], mask)
        check(logits[0], ref_logits, dtype, f"drafter logits ({rows} rows)")
        check(state[0], ref_state, dtype, f"drafter projected_state ({rows} rows)")


def test_rope_tables_match_the_reference_rotation():
    cos, sin = rope_tables(C)
    assert cos.shape == sin.shape == (C.max_position_embeddings, C.head_dim)
    assert cos.dtype == np.float32
    inv_freq = 1.0 / C.rope_theta ** (np.arange(0, C.head_dim, 2) / C.head_dim)
    angles = np.outer(np.arange(C.max_position_embeddings), inv_freq)
    np.testing.assert_allclose(cos, np.cos(np.concatenate([angles, angles], -1)), atol=1e-5)
    np.testing.assert_allclose(sin, np.sin(np.concatenate([angles, angles], -1)), atol=1e-5)
