"""Static-cache graphs (export ``cache="static"``) driven by raw ONNX Runtime: the same
function as the appended graphs, blocks written in place into fixed-capacity buffers, a
k-token pass equal to k one-token passes, rollback as a length change; and planted defects
(a stale length after rollback, a borrowed view of the wrong layer) that the checks catch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from static_driver import (
    FORMS,
    STALE,
    STORAGE,
    AppendedTarget,
    StaticDrafter,
    StaticTarget,
    appended_drafter_step,
    chained,
    greedy,
)

import speculant
from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS

CAPACITY = 32
PROMPT = [7, 3, 41, 12, 25, 9]
BLOCK = [33, 48, 2, 17]
# (rtol, atol) of static against appended logits: float32 to summation order, float16 to
# its rounding (the static graphs compute the same float32 attention over more, masked slots)
TOLERANCE = {"float32": (1e-5, 1e-4), "float16": (2e-2, 6e-2)}


def close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_the_graph_io_of_the_static_target_and_drafter(pairs):
    """Pasts and presents have the capacity axis; the valid length replaces the mask; each
    present is produced by the node that writes it (ScatterElements or GroupQueryAttention),
    so ONNX Runtime writes into the buffer bound to it."""
    for form in FORMS:
        target = onnx.load(str(pairs[form, "static"] / "target" / "model.onnx")).graph
        inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
                  for i in target.input}
        assert "attention_mask" not in inputs and inputs["cache_lengths"] == ["batch"]
        assert inputs["past_key_values.0.key"] == ["batch", 2, "capacity", 16]
        producers = {out: node.op_type for node in target.node for out in node.output}
        writer = "ScatterElements" if form.startswith("scatter") else "GroupQueryAttention"
        for i in range(CONFIG.num_hidden_layers):
            assert producers[f"present.{i}.key"] == producers[f"present.{i}.value"] == writer
        drafter = onnx.load(str(pairs[form, "static"] / "assistant" / "model.onnx")).graph
        names = [i.name for i in drafter.input]
        assert "cache_lengths" in names and "attention_mask" not in names


@pytest.mark.parametrize("form", list(FORMS))
def test_static_target_equals_the_appended_target(pairs, form):
    """Prefill, a 4-token block, one token: logits within the dtype's rounding, argmax equal,
    the buffers' valid slots equal the appended presents, and the slots past the length
    still hold what they held (nothing is written outside the block)."""
    dtype = FORMS[form][0]
    static = StaticTarget(pairs[form, "static"], CAPACITY)
    reference = AppendedTarget(pairs[form, "appended"])
    for ids in (PROMPT, BLOCK, [5]):
        got, want = static.run(ids), reference.run(ids)
        close(got, want, dtype)
        assert (got.argmax(-1) == want.argmax(-1)).all()
        for key, cell in static.cells().items():
            close(cell.astype(np.float32), reference.caches[key].astype(np.float32), dtype)
    untouched = static.buffers[0, "key"].numpy()[:, :, static.length:]
    assert (untouched == STALE).all()


@pytest.mark.parametrize("form", list(FORMS))
def test_the_block_is_written_in_place(pairs, form):
    """Past and present bound to one OrtValue: the present ONNX Runtime returns is that
    buffer (same address), for every layer, pass after pass."""
    static = StaticTarget(pairs[form, "static"], CAPACITY)
    addresses = {key: buffer.data_ptr() for key, buffer in static.buffers.items()}
    for ids in (PROMPT, [5]):
        static.run(ids)
        for (i, part), address in addresses.items():
            assert static.last_outputs[f"present.{i}.{part}"].data_ptr() == address
            assert static.buffers[i, part].data_ptr() == address


@pytest.mark.parametrize("form", list(FORMS))
def test_greedy_tokens_equal_the_appended_package(pairs, form):
    """Greedy through the raw static driver = speculant's greedy on the appended package."""
    engine = speculant.load(pairs[form, "appended"])
    for prompt in (PROMPT, [20, 21]):
        want = engine.generate(prompt, 16, stop_on_eos=False).token_ids
        assert greedy(StaticTarget(pairs[form, "static"], CAPACITY), prompt, 16) == want


@pytest.mark.parametrize("form", list(FORMS))
def test_a_k_token_pass_equals_k_one_token_passes(pairs, form):
    dtype = FORMS[form][0]
    wide, narrow = (StaticTarget(pairs[form, "static"], CAPACITY) for _ in range(2))
    wide.run(PROMPT)
    narrow.run(PROMPT)
    block = wide.run(BLOCK)
    rows = np.concatenate([narrow.run([token]) for token in BLOCK])
    close(block, rows, dtype)
    assert wide.length == narrow.length == len(PROMPT) + len(BLOCK)
    for key, cell in wide.cells().items():
        close(cell.astype(np.float32), narrow.cells()[key].astype(np.float32), dtype)


def rollback_matches(target: StaticTarget, fresh: StaticTarget, keep: int) -> bool:
    """Verify a block of which only ``keep`` tokens are accepted, roll back to
    ``len(PROMPT) + keep`` and continue: the logits equal (exactly) a run that only ever
    consumed the kept tokens."""
    target.run(PROMPT)
    target.run(BLOCK)  # 4 slots written; only `keep` of them stay
    target.rollback(len(PROMPT) + keep)
    fresh.run(PROMPT + BLOCK[:keep])
    follow = [11, 30, 4]
    logits_equal = all(np.array_equal(target.run([token]), fresh.run([token]))
                       for token in follow)
    # re-running from the kept length overwrote the rejected slots: the valid slots are equal
    cells_equal = all(np.array_equal(cell, fresh.cells()[key])
                      for key, cell in target.cells(fresh.length).items())
    return logits_equal and cells_equal


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("keep", [0, 1, 3])
def test_rollback_is_a_length_change(pairs, form, keep):
    """Rolling back moves no byte (the buffers keep their addresses and the rejected slots
    their contents until overwritten) and decodes exactly as never having gone forward."""
    root = pairs[form, "static"]
    target = StaticTarget(root, CAPACITY)
    addresses = {key: buffer.data_ptr() for key, buffer in target.buffers.items()}
    assert rollback_matches(target, StaticTarget(root, CAPACITY), keep)
    assert {key: b.data_ptr() for key, b in target.buffers.items()} == addresses


@pytest.mark.parametrize("form", list(FORMS))
def test_a_stale_length_after_rollback_is_caught(pairs, form):
    """Planted defect: rollback leaves the length where it was, so the rejected drafts stay
    visible. The rollback check above fails on it."""
    root = pairs[form, "static"]
    defective = StaticTarget(root, CAPACITY, defect="stale_length")
    assert not rollback_matches(defective, StaticTarget(root, CAPACITY), keep=1)


def drafter_matches(pairs, form: str, defect: str | None) -> bool:
    """A drafter step reading the target's buffers (borrowed, no copy) at length ``C'``
    equals the appended drafter reading the appended presents cut to ``C'``."""
    dtype = FORMS[form][0]
    static = StaticTarget(pairs[form, "static"], CAPACITY)
    reference = AppendedTarget(pairs[form, "appended"])
    for ids in (PROMPT, BLOCK):
        static.run(ids)
        reference.run(ids)
    static.rollback(len(PROMPT) + 2)  # a round that accepted one draft: C' = P + 2
    length = len(PROMPT) + 2
    rng = np.random.default_rng(0)
    fused = rng.standard_normal((1, 1, 2 * CONFIG.hidden_size)).astype(static.dtype)
    got = StaticDrafter(pairs[form, "static"], defect).step(static, fused, length - 1, length)
    want = appended_drafter_step(pairs[form, "appended"], reference, fused, length - 1, length)
    rtol, atol = TOLERANCE[dtype]
    return np.allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("form", list(FORMS))
def test_the_drafter_reads_the_target_buffers(pairs, form):
    assert drafter_matches(pairs, form, defect=None)


@pytest.mark.parametrize("form", list(FORMS))
def test_a_borrowed_view_of_the_wrong_layer_is_caught(pairs, form):
    """Planted defect: the drafter borrows layer 0's buffers instead of the last layer's."""
    assert not drafter_matches(pairs, form, defect="wrong_layer")


def test_the_scatter_form_runs_on_plain_numpy_buffers(pairs):
    """Without IO binding: numpy buffers in, the written buffers out (ONNX Runtime copies);
    the same logits as the bound run."""
    root = pairs["scatter-float32", "static"]
    bound = StaticTarget(root, CAPACITY)
    want = bound.run(PROMPT)
    c = CONFIG
    buffer = np.zeros((1, c.num_key_value_heads, CAPACITY, c.head_dim), np.float32)
    feeds = {"input_ids": np.array([PROMPT], np.int64),
             "position_ids": np.arange(len(PROMPT), dtype=np.int64)[None],
             "cache_lengths": np.array([0], np.int64)}
    feeds.update({f"past_key_values.{i}.{part}": buffer for i in range(c.num_hidden_layers)
                  for part in ("key", "value")})
    logits, *presents = bound.session.run(
        ["logits", *(f"present.{i}.{p}" for i in range(c.num_hidden_layers)
                     for p in ("key", "value"))], feeds)
    np.testing.assert_array_equal(logits[0], want)
    assert presents[0].shape == (1, c.num_key_value_heads, CAPACITY, c.head_dim)
    np.testing.assert_array_equal(presents[0][:, :, :len(PROMPT)],
                                  bound.cells()[0, "key"])


def test_the_draft_model_package_has_the_static_form(draft_packages):
    static = StaticTarget(draft_packages["static"], CAPACITY, component="decoder")
    reference = AppendedTarget(draft_packages["appended"], component="decoder")
    assert greedy(static, PROMPT, 12) == greedy(reference, PROMPT, 12)


def test_weights_are_the_same_in_both_forms(pairs):
    from speculant_tools.export import read_weights

    for form in FORMS:
        _, target, drafter = read_weights(pairs[form, "static"])
        storage = np.float16 if FORMS[form][0] == "float16" else np.float32
        for name, array in TARGET_WEIGHTS.items():
            np.testing.assert_array_equal(target[name], array.astype(storage))
        assert drafter.keys() == DRAFTER_WEIGHTS.keys()


@pytest.fixture(scope="module")
def demo_static(tmp_path_factory):
    """The bundled demo pair (trained weights) rebuilt with static caches in both graphs."""
    from speculant_tools.export import convert

    base = tmp_path_factory.mktemp("demo-static")
    return {"scatter-float32": convert(DEMO, base / "f32", "float32", graph="explicit",
                                       cache="static"),
            "gqa-float16": convert(DEMO, base / "f16", "float16", cache="static")}


DEMO = Path(speculant.__file__).parent / "demo"


def first_prompt() -> list[int]:
    data = json.loads((DEMO / "val_prompts.json").read_text())
    first = (data["prompts"] if isinstance(data, dict) else data)[0]
    return first["prompt"] if isinstance(first, dict) else first


def scaled_table(root, dtype: str) -> np.ndarray:
    """The chain's table: the target's embedding times the package's scale, once, rounded
    to the currency (runtime.md §9.3)."""
    from speculant_tools.export import read_weights
    from speculant_tools.export.package import read_settings

    _, weights, _ = read_weights(root)
    scale = np.float32(np.asarray(read_settings(root).scale, dtype=STORAGE[dtype]))
    table = weights["model.embed_tokens.weight"].astype(np.float32) * scale
    return table.astype(STORAGE[dtype])


@pytest.mark.parametrize("form", ["scatter-float32", "gqa-float16"])
def test_chained_speculation_on_static_caches_equals_greedy(demo_static, form, tmp_path):
    """The demo pair with static caches, driven by raw ONNX Runtime through whole chained
    rounds (the drafter borrowing the target's buffers, every rollback a length change):
    the tokens equal speculant's greedy on the appended pair, drafts are accepted and
    rejected."""
    from speculant_tools.export import convert

    root = demo_static[form]
    dtype = FORMS[form][0]
    appended = DEMO if dtype == "float32" else convert(DEMO, tmp_path / "f16", "float16")
    prompt = first_prompt()
    want = speculant.load(appended).generate(prompt, 40, stop_on_eos=False).token_ids
    table = scaled_table(root, dtype)
    target = StaticTarget(root, capacity=128)
    got, num_accepted = chained(target, StaticDrafter(root), table, prompt, 40, k=4)
    assert got == want
    assert 0 < num_accepted < 40 - 1  # drafts accepted, and some rejected (rolled back)


@pytest.mark.parametrize("defect", ["stale_length", "wrong_layer"])
def test_a_planted_defect_breaks_chained_speculation(demo_static, defect):
    """The same rounds with a stale length after rollback, or a drafter borrowing layer 0:
    the committed tokens leave greedy (stale length) or no draft survives verification as
    often (wrong layer): either way the run above would fail."""
    root = demo_static["scatter-float32"]
    prompt = first_prompt()
    want = speculant.load(DEMO).generate(prompt, 40, stop_on_eos=False).token_ids
    table = scaled_table(root, "float32")
    good = chained(StaticTarget(root, 128), StaticDrafter(root), table, prompt, 40, k=4)
    # a stale length grows by k + 1 a round whatever is accepted: room for every round
    target = StaticTarget(root, 256, defect=defect if defect == "stale_length" else None)
    drafter = StaticDrafter(root, defect=defect if defect == "wrong_layer" else None)
    got, num_accepted = chained(target, drafter, table, prompt, 40, k=4)
    if defect == "stale_length":
        assert got != want
    else:  # the tokens stay the target's; the drafts no longer read the right context
        assert got == want and num_accepted < good[1]
