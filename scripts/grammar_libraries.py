"""Measure the grammar libraries that constrained decoding could use, on this CPU.

For each installed library (llguidance, outlines-core, xgrammar) and each vocabulary given
(a ``tokenizer.json``): the time to compile a JSON schema into a matcher and compute its
first mask, the mean and the worst time of each later token mask (computed into a packed
bitmask, the form the runtime applies) along a valid instance of the schema, and whether the
matcher rolls back. The figures and
the choice they led to: docs/design/structured.md.

    python scripts/grammar_libraries.py TOKENIZER_JSON [TOKENIZER_JSON ...]

A library that is not installed is reported as such. xgrammar imports torch and
transformers; outlines-core needs the vocabulary as byte strings (built here from the
byte-level BPE table).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "is_active": {"type": "boolean"},
    },
    "required": ["name", "age", "kind", "tags", "is_active"],
    "additionalProperties": False,
}
INSTANCE = '{"name": "Ana Lopez", "age": 31, "kind": "dog", "tags": ["hiking", "tea"], ' \
           '"is_active": true}'


def byte_level_vocabulary(tokenizer_json: Path) -> dict[int, bytes]:
    """Each id's bytes under GPT-2's byte-level mapping (added tokens as their UTF-8)."""
    table = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
             *range(ord("®"), ord("ÿ") + 1)]
    chars, n = list(table), 0
    for b in range(256):
        if b not in table:
            table.append(b)
            chars.append(256 + n)
            n += 1
    decoder = {chr(c): b for b, c in zip(table, chars, strict=True)}
    document = json.loads(tokenizer_json.read_text())
    vocab = {i: bytes(decoder[c] for c in token) for token, i in
             document["model"]["vocab"].items() if all(c in decoder for c in token)}
    for added in document.get("added_tokens", []):
        vocab[added["id"]] = added["content"].encode()
    return vocab


def tokens_of(tokenizer_json: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json)).encode(text, add_special_tokens=False).ids


def timed_masks(compute, consume, tokens: list[int]) -> list[float]:
    """Each token's mask time along ``tokens`` (the first includes what a library leaves
    to its first mask)."""
    times = []
    for token in tokens:
        started = time.perf_counter()
        compute()
        times.append(time.perf_counter() - started)
        consume(token)
    return times


def llguidance_run(tokenizer_json: Path, tokens: list[int]) -> dict:
    import llguidance
    import llguidance.numpy as lln

    tokenizer = llguidance.LLTokenizer(str(tokenizer_json))
    started = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    compiled = time.perf_counter() - started
    assert not matcher.is_error(), matcher.get_error()
    bitmask = lln.allocate_token_bitmask(1, tokenizer.vocab_size)
    masks = timed_masks(lambda: lln.fill_next_token_bitmask(matcher, bitmask),
                        lambda t: matcher.consume_token(t), tokens)
    return {"compile_s": compiled, "masks": masks, "rollback": matcher.rollback(3)}


def outlines_core_run(tokenizer_json: Path, tokens: list[int]) -> dict:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    vocab = byte_level_vocabulary(tokenizer_json)
    eos = 0
    by_bytes: dict[bytes, list[int]] = {}
    for i, piece in vocab.items():
        if i != eos:
            by_bytes.setdefault(piece, []).append(i)
    vocabulary = Vocabulary(eos, by_bytes)
    started = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), vocabulary)
    guide = Guide(index)
    compiled = time.perf_counter() - started
    bitmask = np.zeros((len(vocab) + 31) // 32, dtype=np.int32)
    masks = timed_masks(lambda: guide.write_mask_into(bitmask.ctypes.data, bitmask.size, 4),
                        lambda t: guide.advance(t, return_tokens=False), tokens)
    guide.rollback_state(3)
    return {"compile_s": compiled, "masks": masks, "rollback": True}


def xgrammar_run(tokenizer_json: Path, tokens: list[int]) -> dict:
    import xgrammar
    from transformers import PreTrainedTokenizerFast

    info = xgrammar.TokenizerInfo.from_huggingface(
        PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json)))
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    started = time.perf_counter()
    matcher = xgrammar.GrammarMatcher(compiler.compile_json_schema(json.dumps(SCHEMA)))
    compiled = time.perf_counter() - started
    bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
    masks = timed_masks(lambda: matcher.fill_next_token_bitmask(bitmask),
                        lambda t: matcher.accept_token(t), tokens)
    matcher.rollback(3)
    return {"compile_s": compiled, "masks": masks, "rollback": True}


RUNS = {"llguidance": llguidance_run, "outlines-core": outlines_core_run,
        "xgrammar": xgrammar_run}


def main(paths: list[str]) -> None:
    print("| library | vocabulary | compile + first mask (ms) | mask mean (µs) | mask max (µs) | "
          "masks | rollback |")
    print("|---|---|---|---|---|---|---|")
    for path in map(Path, paths):
        tokens = tokens_of(path, INSTANCE)
        size = len(json.loads(path.read_text())["model"]["vocab"])
        for name, run in RUNS.items():
            try:
                found = run(path, tokens)
            except ImportError as error:
                print(f"| {name} | {size:,} | not installed ({error.name}) | | | | |")
                continue
            first, *masks = found["masks"]  # llguidance compiles lazily, at the first mask
            print(f"| {name} | {size:,} | {(found['compile_s'] + first) * 1e3:.1f} | "
                  f"{statistics.mean(masks) * 1e6:.0f} | {max(masks) * 1e6:.0f} | "
                  f"{len(masks)} | {'yes' if found['rollback'] else 'no'} |")


if __name__ == "__main__":
    main(sys.argv[1:])
