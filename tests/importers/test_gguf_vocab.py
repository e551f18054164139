"""GGUF vocabularies become tokenizers as llama.cpp tokenizes them.

SentencePiece-style (``tokenizer.ggml.model = llama``): encodings equal a reference written
here from llama.cpp's algorithm (llm_tokenizer_spm: merge the adjacent pair whose
concatenation is the token of highest score, leftmost first; leftover characters as
``<0xXX>`` byte tokens; a ``▁`` before the text and after each special token). transformers'
slow LlamaTokenizer would need sentencepiece and a .model file, neither of which a hermetic
test has. Byte-level BPE: each ``tokenizer.ggml.pre`` family splits a fixed text into the
pieces its llama.cpp regexes give (worked out by hand below)."""

from __future__ import annotations

import json
import random

import pytest
from gguf_models import CONFIG, random_weights, write_gguf

import speculant
from speculant_tools.importers import ImporterError, import_model
from speculant_tools.importers.gguf_vocab import PRE_TOKENIZERS, build_tokenizer

S = "\u2581"
SPECIALS = ["<unk>", "<s>", "</s>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
PIECES = [S, "a", "b", "c", "e", "h", "l", "o", "t", "n", "d", S + "t", "he", S + "the",
          "ll", "hell", "hello", S + "hello", "ab", "abc", S + "a", S + "an", S + "and", "lo"]
SPM_TOKENS = SPECIALS + BYTES + PIECES
SPM_TYPES = [2, 3, 3] + [6] * 256 + [1] * len(PIECES)
SPM_SCORES = [0.0] * (3 + 256) + [-float(i) for i in range(len(PIECES))]


def llama_cpp_spm(text: str, add_bos: bool = True) -> list[int]:
    """llama.cpp's SentencePiece tokenization of ``text`` (special tokens <s>, </s>)."""
    ids = {token: i for i, token in enumerate(SPM_TOKENS)}
    out = [1] if add_bos else []
    fragments = [f for f in _split_specials(text) if f]
    is_prev_special = True
    for fragment in fragments:
        if fragment in ("<s>", "</s>"):
            out.append(ids[fragment])
            is_prev_special = True
            continue
        symbols = list((" " if is_prev_special else "") + fragment)
        symbols = [S if c == " " else c for c in symbols]
        while True:
            best = None
            for i in range(len(symbols) - 1):
                merged = symbols[i] + symbols[i + 1]
                if merged in ids and SPM_TYPES[ids[merged]] == 1 and (
                        best is None or SPM_SCORES[ids[merged]] > best[0]):
                    best = (SPM_SCORES[ids[merged]], i)
            if best is None:
                break
            i = best[1]
            symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
        for symbol in symbols:
            if symbol in ids:
                out.append(ids[symbol])
            else:
                out += [ids[f"<0x{b:02X}>"] for b in symbol.encode("utf-8")]
        is_prev_special = False
    return out


def _split_specials(text: str) -> list[str]:
    parts = [text]
    for special in ("</s>", "<s>"):
        parts = [piece for part in parts for piece in _isolate(part, special)]
    return parts


def _isolate(text: str, special: str) -> list[str]:
    if text in ("<s>", "</s>"):
        return [text]
    pieces = text.split(special)
    out = [pieces[0]]
    for piece in pieces[1:]:
        out += [special, piece]
    return out


@pytest.fixture(scope="module")
def spm():
    return build_tokenizer(SPM_TOKENS, [], SPM_TYPES, model="llama", scores=SPM_SCORES,
                           bos_id=1, eos_id=2, unk_id=0, add_bos=True)


@pytest.mark.parametrize("text", ["hello the abc", "hello and the", " and", "hello\nthé €",
                                  "<s>hello</s>the", "ab  abc", "", "lo lo hell"])
def test_sentencepiece_encodes_as_llama_cpp(spm, text):
    assert spm.encode(text).ids == llama_cpp_spm(text)
    if "<" not in text:
        assert spm.decode(spm.encode(text).ids) == text


def test_sentencepiece_matches_llama_cpp_on_random_text(spm):
    rng = random.Random(3)
    alphabet = "abcdehlotn é\n"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14)))
        assert spm.encode(text).ids == llama_cpp_spm(text), text
        assert spm.decode(spm.encode(text).ids) == text


def test_sentencepiece_known_tokens(spm):
    assert spm.encode("hello the abc").tokens == ["<s>", S + "hello", S + "the", S, "abc"]
    assert spm.encode("é").tokens == ["<s>", S, "<0xC3>", "<0xA9>"]  # byte fallback


def test_without_space_prefix_no_marker_is_added():
    """Gemma's vocabularies: tokenizer.ggml.add_space_prefix = false."""
    tokenizer = build_tokenizer(SPM_TOKENS, [], SPM_TYPES, model="llama", scores=SPM_SCORES,
                                add_space_prefix=False)
    assert tokenizer.encode("hello the").tokens == ["hello", S + "the"]
    assert tokenizer.decode(tokenizer.encode("hello the").ids) == "hello the"


# -- byte-level BPE ------------------------------------------------------------------------
BPE_TOKENS = (["<|endoftext|>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
              + [chr(c) for c in range(ord("A"), ord("Z") + 1)] + list("0123456789',!")
              + ["Ġ", "Ċ", "Ġa", "12", "123", "xyz"])  # xyz: a token no merge makes
BPE_MERGES = ["Ġ a", "1 2", "12 3"]
TEXT = "Hello 12345 world's,  ok!!\n\n x"
# the pieces llama.cpp's regexes give for TEXT, in the byte-level alphabet
SPLITS = {
    "gpt-2": ["Hello", "Ġ12345", "Ġworld", "'s", ",", "Ġ", "Ġok", "!!", "ĊĊ", "Ġx"],
    "default": ["Hello", "Ġ", "123", "45", "Ġworld", "'", "s", ",", "Ġ", "Ġok", "!!", "ĊĊ",
                "Ġx"],  # punctuation isolated first, then GPT-2, digit runs, triples
    "smollm": ["Hello", "Ġ", "1", "2", "3", "4", "5", "Ġworld", "'s", ",", "Ġ", "Ġok", "!!",
               "ĊĊ", "Ġx"],  # digits isolated first, then GPT-2
    "llama-bpe": ["Hello", "Ġ", "123", "45", "Ġworld", "'s", ",", "Ġ", "Ġok", "!!ĊĊ", "Ġx"],
    "qwen2": ["Hello", "Ġ", "1", "2", "3", "4", "5", "Ġworld", "'s", ",", "Ġ", "Ġok", "!!ĊĊ",
              "Ġx"],
    "tekken": ["Hello", "Ġ", "1", "2", "3", "4", "5", "Ġworld", "'s", ",", "Ġ", "Ġok",
               "!!ĊĊ", "Ġx"],
    "gpt-4o": ["Hello", "Ġ", "123", "45", "Ġworld's", ",", "Ġ", "Ġok", "!!ĊĊ", "Ġx"],
}


def _bpe(pre: str, **options):
    return build_tokenizer(BPE_TOKENS, BPE_MERGES, [3] + [1] * (len(BPE_TOKENS) - 1),
                           model="gpt2", pre=pre, **options)


@pytest.mark.parametrize("pre", sorted(SPLITS))
def test_each_pre_tokenizer_splits_as_llama_cpp(pre):
    tokenizer = _bpe(pre)
    assert [piece for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str(TEXT)] == \
        SPLITS[pre]
    assert tokenizer.decode(tokenizer.encode(TEXT).ids) == TEXT


def test_llama3_takes_a_whole_word_that_is_a_token():
    """ignore_merges (llama.cpp's Llama 3 and Tekken families): a word that is a token is
    taken whole even where no merge makes it; the other families merge."""
    assert _bpe("llama-bpe").encode("xyz").tokens == ["xyz"]
    assert _bpe("tekken").encode("xyz").tokens == ["xyz"]
    assert _bpe("qwen2").encode("xyz").tokens == ["x", "y", "z"]
    assert _bpe("qwen2").encode("123").tokens == ["1", "2", "3"]  # digits one by one
    assert _bpe("llama-bpe").encode("12345").tokens == ["123", "4", "5"]  # digits in threes


def test_aliases_share_their_family():
    assert PRE_TOKENIZERS["llama3"] == PRE_TOKENIZERS["llama-bpe"]
    assert PRE_TOKENIZERS["deepseek-r1-qwen"] == PRE_TOKENIZERS["qwen2"]
    assert PRE_TOKENIZERS["llama-bpe"].add_bos and not PRE_TOKENIZERS["qwen2"].add_bos


# -- refused, by key -----------------------------------------------------------------------
@pytest.mark.parametrize("model, pre, path, value", [
    ("gpt2", "deepseek-coder", "tokenizer.ggml.pre", "deepseek-coder"),
    ("bert", "default", "tokenizer.ggml.model", "bert"),
    ("t5", "default", "tokenizer.ggml.model", "t5"),
])
def test_a_vocabulary_speculant_cannot_build_names_the_key_value_and_remedy(model, pre, path,
                                                                            value):
    with pytest.raises(ImporterError) as caught:
        build_tokenizer(BPE_TOKENS, BPE_MERGES, [1] * len(BPE_TOKENS), model=model, pre=pre)
    problem = caught.value.problems[0]
    assert (problem.path, problem.value) == (path, value)
    assert "tokenizer.json" in problem.remedy


def test_a_sentencepiece_vocabulary_without_scores_is_refused():
    with pytest.raises(ImporterError) as caught:
        build_tokenizer(SPM_TOKENS, [], SPM_TYPES, model="llama", scores=None)
    assert caught.value.paths == ["tokenizer.ggml.scores"]


# -- through a GGUF file -------------------------------------------------------------------
def test_a_sentencepiece_gguf_imports_with_its_tokenizer(tmp_path):
    """The tiny model with 300 rows and the SentencePiece vocabulary above: add_bos_token
    absent, so llama.cpp's default for SPM (true); the package tokenizes as llama.cpp."""
    from dataclasses import replace

    config = replace(CONFIG, vocab_size=len(SPM_TOKENS))

    def vocabulary(writer) -> None:
        writer.add_tokenizer_model("llama")
        writer.add_token_list(SPM_TOKENS)
        writer.add_token_scores(SPM_SCORES)
        writer.add_token_types(SPM_TYPES)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)

    path = write_gguf(tmp_path / "spm.gguf", random_weights(config=config), config=config,
                      vocabulary=vocabulary)
    package = import_model(path, tmp_path / "package")
    tokenizer = speculant.load(package).tokenizer
    for text in ("hello the abc", "hello\nthé"):
        assert tokenizer.encode(text) == llama_cpp_spm(text)
    settings = json.loads((package / "tokenizer_config.json").read_text())
    assert (settings["add_bos_token"], settings["bos_token"], settings["eos_token"]) == \
        (True, "<s>", "</s>")
