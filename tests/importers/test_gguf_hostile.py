"""Hostile GGUF files (issue 38): every crafted file of the 2026-12-07 probe, and a few hundred
fuzzed ones, end in an ImporterError naming the file and the field, or import; memory stays
bounded by the tensors present (context_length 2^25 or block_count 4*10^6 in a 33 KB file
allocate nothing in proportion)."""

from __future__ import annotations

import random
import tracemalloc
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_fuzz import header_end, header_slots, mutants, patched, run_input, seed_file
from gguf_models import write_gguf
from typer.testing import CliRunner

import speculant_tools.importers.gguf_header as gguf_header
from speculant.cli import full_app
from speculant_tools.importers import ImporterError, import_model, read_checkpoint
from speculant_tools.importers.checkpoint import MIN_POSITIONS

NUM_FUZZED = 300
FUZZ_SEED = 38
PEAK_BYTES = 32 << 20  # traced peak of refusing any crafted file (the seed's import: ~3 MB)


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    return seed_file(tmp_path_factory.mktemp("seed") / "seed.gguf")


def _edit(**values):
    """A GGUF whose keys are overridden (GGUFWriter keeps the last value of a key)."""
    def edit(writer: gguf.GGUFWriter) -> None:
        for key, (kind, value) in values.items():
            writer.add_key_value(key, value, kind)
    return lambda path, weights: write_gguf(path, weights, edit=edit).read_bytes()


def _patch(*changes):
    """The seed with header parts set: (slot label, value, item)."""
    def build(path, weights):
        data = seed_file(path).read_bytes()
        slots = header_slots(path)
        for label, value, item in changes:
            data = patched(data, slots[label], value, item)
        return data
    return build


def _cut(fraction: float | int):
    def build(path, weights):
        data = seed_file(path).read_bytes()
        return data[:fraction if isinstance(fraction, int) else int(len(data) * fraction)]
    return build


def _raw(data: bytes):
    return lambda path, weights: data


V = gguf.GGUFValueType
EMBD = "tensors.token_embd.weight"
# the probe's 33 files (less its three chat templates, which issue 38's template work covers),
# its two scale variants, a float64 beyond float32 and a merge the tokenizers library
# panicked on
CRAFTED = {
    "architecture as an int": (_edit(**{"general.architecture": (V.UINT32, 7)}),
                               "general.architecture"),
    "block_count 10^6": (_edit(**{"llama.block_count": (V.UINT32, 10**6)}),
                         "llama.block_count"),
    "block_count 4*10^6": (_edit(**{"llama.block_count": (V.UINT32, 4 * 10**6)}),
                           "llama.block_count"),
    "tensor dims [2^20, 2^20]": (_patch((f"{EMBD}#3", 1 << 20, 0), (f"{EMBD}#3", 1 << 20, 1)),
                                 EMBD),
    "tensor dims [2^40, 2^40]": (_patch((f"{EMBD}#3", 1 << 40, 0), (f"{EMBD}#3", 1 << 40, 1)),
                                 EMBD),
    "embedding_length 2^31": (_edit(**{"llama.embedding_length": (V.UINT32, 1 << 31)}),
                              "llama.rope.dimension_count"),
    "vocab_size 2^40": (_edit(**{"llama.vocab_size": (V.UINT64, 1 << 40)}), f"{EMBD}.dims"),
    "n_dims 2^31": (_patch((f"{EMBD}#2", 1 << 31, 0)), f"{EMBD}.n_dims"),
    "tensor offset 2^60": (_patch((f"{EMBD}#5", 1 << 60, 0)), EMBD),
    "tensor type 9999": (_patch((f"{EMBD}#4", 9999, 0)), f"{EMBD}.type"),
    "rms_eps NaN": (_edit(**{"llama.attention.layer_norm_rms_epsilon": (V.FLOAT32, np.nan)}),
                    "llama.attention.layer_norm_rms_epsilon"),
    "rope freq_base 1e300 (f64)": (_edit(**{"llama.rope.freq_base": (V.FLOAT64, 1e300)}),
                                   "llama.rope.freq_base"),
    "feed_forward_length 0": (_edit(**{"llama.feed_forward_length": (V.UINT32, 0)}),
                              "llama.feed_forward_length"),
    "head_count_kv 0": (_edit(**{"llama.attention.head_count_kv": (V.UINT32, 0)}),
                        "llama.attention.head_count_kv"),
    "version 99": (_patch(("GGUF.version#0", 99, 0)), "GGUF.version"),
    "empty file": (_raw(b""), "GGUF.magic"),
    "random bytes": (_raw(random.Random(1).randbytes(4096)), "GGUF.magic"),
    "GGUF + random bytes": (_raw(b"GGUF" + random.Random(2).randbytes(4096)), "GGUF.version"),
    "truncated at 5 %": (_cut(0.05), "tokenizer.chat_template"),
    "truncated at 10 %": (_cut(0.1), EMBD),
    "truncated at 50 %": (_cut(0.5), "tensors.blk.0.ffn_down.weight"),
    "truncated at 90 %": (_cut(0.9), "tensors.blk.1.ffn_down.weight"),
    "truncated at 99 %": (_cut(0.99), "tensors.blk.1.ffn_down.weight"),
    "n_tensors 2^62": (_patch(("GGUF.tensor_count#0", 1 << 62, 0)), "GGUF.tensor_count"),
    "n_tensors 10^6": (_patch(("GGUF.tensor_count#0", 10**6, 0)), "GGUF.tensor_count"),
    "n_kv 2^62": (_patch(("GGUF.kv_count#0", 1 << 62, 0)), "GGUF.kv_count"),
    "tokens array count 2^40": (_patch(("tokenizer.ggml.tokens#4", 1 << 40, 0)),
                                "tokenizer.ggml.tokens"),
    "the file cut after the header (24 B)": (_cut(24), "GGUF.kv_count"),
    "the 4-byte file GGUF": (_raw(b"GGUF"), "GGUF.version"),
    "head_count 0": (_edit(**{"llama.attention.head_count": (V.UINT32, 0)}),
                     "llama.attention.head_count"),
    "eos_token_id as a string": (_edit(**{"tokenizer.ggml.eos_token_id": (V.STRING, "2")}),
                                 "tokenizer.ggml.eos_token_id"),
    "context_length 2^25": (_edit(**{"llama.context_length": (V.UINT32, 1 << 25)}),
                            "llama.context_length"),
    "context_length 2^31": (_edit(**{"llama.context_length": (V.UINT32, 1 << 31)}),
                            "llama.context_length"),
    "context_length 2^40 (u64)": (_edit(**{"llama.context_length": (V.UINT64, 1 << 40)}),
                                  "llama.context_length"),
    "a merge whose result is no token": (_edit(**{"tokenizer.ggml.merges": (
        V.ARRAY, ["a b", "a c"])}), "tokenizer.ggml.merges[1]"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_each_crafted_file_is_an_importer_error_naming_the_field(case, tmp_path, weights):
    build, field = CRAFTED[case]
    path = tmp_path / "crafted.gguf"
    path.write_bytes(build(tmp_path / "source.gguf", weights))
    tracemalloc.start()
    try:
        with pytest.raises(ImporterError) as caught:
            import_model(path, tmp_path / "out")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.paths == [field], str(caught.value)
    assert caught.value.problems[0].file == str(path)
    assert peak < PEAK_BYTES, f"{peak / 2**20:.0f} MiB traced"
    assert not (tmp_path / "out").exists()


def test_the_4_byte_file_is_exit_2_on_the_command_line(tmp_path):
    (tmp_path / "t.gguf").write_bytes(b"GGUF")
    result = CliRunner().invoke(full_app(), ["import", str(tmp_path / "t.gguf"),
                                             str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "ImporterError" in result.stderr and "GGUF.version" in result.stderr
    assert "internal error" not in result.output + result.stderr


def test_fuzzed_headers_are_importer_errors_or_imports(seed, tmp_path):
    """A fixed set of mutants of the seed (gguf_fuzz.py); the long run is
    scripts/fuzz_gguf.py (docs/evidence/hostile-2026-12/gguf.md)."""
    slots, end, data = header_slots(seed), header_end(seed), seed.read_bytes()
    outcomes, wrong = Counter(), []
    for index, mutant in enumerate(mutants(data, slots, end, FUZZ_SEED, NUM_FUZZED)):
        path = tmp_path / "mutant.gguf"
        path.write_bytes(mutant)
        outcome = run_input(path, tmp_path / "out")
        outcomes[outcome.kind] += 1
        if outcome.kind not in ("typed", "accepted"):
            wrong.append(f"mutant {index}: {outcome.kind}: {outcome.detail}")
    assert not wrong, "\n".join(wrong[:5])
    assert outcomes["typed"] > NUM_FUZZED // 2 and outcomes["accepted"] > 0, outcomes


def test_context_length_is_bounded_by_the_weights(tmp_path, weights):
    """Up to MIN_POSITIONS positions always; beyond, no more than the weights' values per
    head dimension (the tiny model holds ~20 k values: 2.5 k positions)."""
    def with_context(n: int) -> Path:
        return write_gguf(tmp_path / f"c{n}.gguf", weights,
                          edit=lambda w: w.add_key_value("llama.context_length", n, V.UINT32))
    assert read_checkpoint(with_context(MIN_POSITIONS)).config.max_position_embeddings == \
        MIN_POSITIONS
    with pytest.raises(ImporterError, match="gguf-set-metadata") as caught:
        read_checkpoint(with_context(MIN_POSITIONS + 1))
    assert caught.value.paths == ["llama.context_length"]


def test_the_header_item_budget_names_the_array_over_it(seed, monkeypatch):
    """The seed holds ~150 key-values, array elements and tensors; under a budget of 100 the
    array that crosses it is named."""
    monkeypatch.setattr(gguf_header, "MAX_HEADER_ITEMS", 100)
    with pytest.raises(ImporterError, match="more key-values") as caught:
        read_checkpoint(seed)
    assert caught.value.paths == ["tokenizer.ggml.token_type"]


def test_a_big_endian_header_is_walked_in_its_byte_order(tmp_path):
    path = tmp_path / "be.gguf"
    writer = gguf.GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_block_count(1)
    writer.add_token_list(["a", "b"])
    writer.add_tensor("output_norm.weight", np.ones(32, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gguf_header.check_header(path)  # the reader reads it too
    assert gguf.GGUFReader(path).fields["llama.block_count"].contents() == 1
    with pytest.raises(ImporterError) as caught:  # read as little-endian, kv[0] would fail
        gguf_header.check_header(_truncated(path, 75))
    assert caught.value.paths == ["kv[1].key (its length)"]


def _truncated(path: Path, size: int) -> Path:
    cut = path.with_suffix(".cut.gguf")
    cut.write_bytes(path.read_bytes()[:size])
    return cut


def test_a_hostile_key_reaches_no_terminal_raw(tmp_path, weights):
    key = "\x1b[2J" + "k" * 200
    path = write_gguf(tmp_path / "k.gguf", weights,
                      edit=lambda w: w.add_key_value(key, "x" * 64, V.STRING))
    slots = header_slots(path)
    value = slots[f"{key}#4"]  # the string value's bytes
    with pytest.raises(ImporterError) as caught:
        gguf_header.check_header(_truncated(path, value.offset + 10))
    assert "\x1b" not in str(caught.value) and "\\x1b[2J" in str(caught.value)
    assert len(caught.value.paths[0]) <= 2 * gguf_header.MAX_NAME_CHARS
