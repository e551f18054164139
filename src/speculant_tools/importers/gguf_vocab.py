"""A ``tokenizer.json`` for a GGUF's vocabulary, built with ``tokenizers``.

Two vocabulary kinds (``tokenizer.ggml.model``), as llama.cpp's ``llama-vocab.cpp`` reads them:

* ``gpt2``: byte-level BPE. The GGUF holds the vocabulary (already in the byte-to-unicode
  alphabet), the merges (``"a b"`` strings) and the name of the pre-tokenizer
  (``tokenizer.ggml.pre``). llama.cpp applies, for each name, a list of regular expressions
  one after another, each isolating its matches (:data:`PRE_TOKENIZERS`); here each becomes a
  ``Split(..., "isolated")`` before the byte-level mapping. The Llama 3 and Tekken families
  also look a whole word up before merging (``ignore_merges``).
* ``llama``: SentencePiece-style (Llama 2, Mistral, Gemma, Phi-3). No merges: llama.cpp merges
  the adjacent pair whose concatenation is the vocabulary token of highest score (the scores
  are ``tokenizer.ggml.scores``), which is BPE with the merges ranked by the merged token's
  score (:func:`score_merges`). Spaces become ``▁``; with ``tokenizer.ggml.add_space_prefix``
  (default true) each run of text after the start or a special token gets a leading ``▁``
  (a ``Prepend`` normalizer, applied per run between added tokens); characters outside the
  vocabulary fall back to the ``<0xXX>`` byte tokens.

Token types (``tokenizer.ggml.token_type``): CONTROL tokens become special added tokens,
USER_DEFINED ones plain added tokens, both matched before the model; the rest are the model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from speculant_tools.importers.checkpoint import ImporterError

UNKNOWN, CONTROL, USER_DEFINED, BYTE = 2, 3, 4, 6  # gguf.TokenType
MODELS = ("gpt2", "llama")
SPACE = "\u2581"  # SentencePiece's visible space
# the regular expressions of llama-vocab.cpp (the original forms its comments keep, which
# tokenizers' regex engine reads: (?i:...) included)
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
          r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
          r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
          r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}]*"
         rf"[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}]+{CONTRACTION}|[^\r\n\p{{L}}\p{{N}}]?"
         rf"[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}]+[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}]*"
         rf"{CONTRACTION}|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    """llama.cpp's pre-tokenization for a ``tokenizer.ggml.pre`` name."""

    regexes: tuple[str, ...]  # applied in order, each isolating its matches
    ignore_merges: bool = False  # a word that is a token is taken whole
    add_bos: bool = False  # llama.cpp's default where the file has no add_bos_token


def _family(names: str, *regexes: str, **options: bool) -> dict[str, PreTokenizer]:
    return {name: PreTokenizer(regexes, **options) for name in names.split()}


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **_family("default", r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    **_family("gpt2 gpt-2 phi-2 mpt olmo jais trillion exaone4 gigachat mellum", GPT2),
    **_family("starcoder refact command-r smollm codeshell exaone minerva-7b mellum2",
              r"\p{N}", GPT2),
    **_family("falcon", r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"),
    **_family("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2", LLAMA3,
              ignore_merges=True, add_bos=True),
    **_family("dbrx smaug-bpe", LLAMA3),
    **_family("qwen2 deepseek-r1-qwen megrez stablelm2 hunyuan solar-open kormo grok-2",
              QWEN2),
    **_family("tekken", TEKKEN, ignore_merges=True, add_bos=True),
    **_family("gpt-4o llama4", GPT4O),
}


def _refuse(message: str, path: str, value=None, expected: str = "") -> ImporterError:
    return ImporterError(message, path=path, value=value, expected=expected,
                         remedy="import the model's Hugging Face folder (its tokenizer.json "
                                "is used as it is)")


def pre_tokenizer_of(pre: str) -> PreTokenizer:
    if pre not in PRE_TOKENIZERS:
        raise _refuse("speculant does not know this pre-tokenizer", "tokenizer.ggml.pre", pre,
                      "one of " + ", ".join(sorted(PRE_TOKENIZERS)))
    return PRE_TOKENIZERS[pre]


def default_add_bos(model: str, pre: str) -> bool:
    """llama.cpp's ``add_bos`` where the file has no ``tokenizer.ggml.add_bos_token``."""
    return model == "llama" or (pre in PRE_TOKENIZERS and PRE_TOKENIZERS[pre].add_bos)


def score_merges(tokens: Sequence[str], scores: Sequence[float],
                 types: Sequence[int]) -> list[tuple[str, str]]:
    """The BPE merges that reproduce llama.cpp's SentencePiece merging: every split of a
    vocabulary token into two vocabulary tokens, ranked by the whole token's score (highest
    first; ties by the whole token's id, then the left piece's length). Added tokens
    (CONTROL, USER_DEFINED) and byte tokens are never merge results."""
    ids = {token: i for i, token in enumerate(tokens)}
    merges = []
    for i, token in enumerate(tokens):
        if types[i] in (CONTROL, USER_DEFINED, BYTE, UNKNOWN):
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                merges.append((-scores[i], i, cut, left, right))
    merges.sort()
    return [(left, right) for *_, left, right in merges]


def build_tokenizer(tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int],
                    *, model: str = "gpt2", pre: str = "default",
                    scores: Sequence[float] | None = None, bos_id: int | None = None,
                    eos_id: int | None = None, unk_id: int | None = None,
                    add_bos: bool = False, add_eos: bool = False,
                    add_space_prefix: bool = True) -> Tokenizer:
    """The tokenizer of a GGUF vocabulary (``model`` ``gpt2`` or ``llama``). The vocabulary
    is checked before ``tokenizers`` sees it (a merge whose pieces or result are not tokens
    makes its BPE builder panic); anything ``tokenizers`` still refuses, and a vocabulary
    kind or pre-tokenizer speculant does not build, is an ImporterError naming the key."""
    if model not in MODELS:
        raise _refuse("speculant does not build this kind of vocabulary",
                      "tokenizer.ggml.model", model, " or ".join(MODELS))
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ImporterError("the vocabulary repeats a token", path="tokenizer.ggml.tokens",
                            value=len(tokens) - len(vocab), expected="distinct tokens")
    if len(token_types) != len(tokens):
        raise ImporterError("one token type per token", path="tokenizer.ggml.token_type",
                            value=len(token_types), expected=str(len(tokens)))
    if model == "gpt2":
        pre_tokenizer = pre_tokenizer_of(pre)
        bpe = models.BPE(vocab=vocab, merges=_merge_pairs(merges, vocab), fuse_unk=False,
                         byte_fallback=False, ignore_merges=pre_tokenizer.ignore_merges)
    else:
        if scores is None or len(scores) != len(tokens):
            raise ImporterError("a SentencePiece vocabulary needs one score per token",
                                path="tokenizer.ggml.scores",
                                value=None if scores is None else len(scores),
                                expected=str(len(tokens)))
        unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
        bpe = models.BPE(vocab=vocab, merges=score_merges(tokens, scores, token_types),
                         unk_token=unk, fuse_unk=True, byte_fallback=True)
    try:
        tokenizer = Tokenizer(bpe)
        if model == "gpt2":
            _byte_level(tokenizer, pre_tokenizer)
        else:
            _sentencepiece(tokenizer, add_space_prefix)
        _add_tokens(tokenizer, tokens, token_types)
        tokenizer.post_processor = _post_processor(
            tokens, bos_id if add_bos else None, eos_id if add_eos else None, model)
        return tokenizer
    except Exception as error:  # tokenizers raises its own errors as plain Exception
        raise ImporterError(f"tokenizers cannot build the vocabulary: {error}",
                            path="tokenizer.ggml") from None


def _merge_pairs(merges: Sequence[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    pairs = []
    for index, merge in enumerate(merges):
        left, space, right = merge.partition(" ")
        if not space or not left or not right:
            raise ImporterError("a merge must be two tokens separated by one space",
                                path=f"tokenizer.ggml.merges[{index}]", value=merge)
        if not (left in vocab and right in vocab and left + right in vocab):
            raise ImporterError("a merge of tokens outside the vocabulary",
                                path=f"tokenizer.ggml.merges[{index}]", value=merge,
                                expected="both pieces and their concatenation in "
                                         "tokenizer.ggml.tokens")
        pairs.append((left, right))
    return pairs


def _byte_level(tokenizer: Tokenizer, pre: PreTokenizer) -> None:
    splits = [pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
              for regex in pre.regexes]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        *splits, pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                          use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()


def _sentencepiece(tokenizer: Tokenizer, add_space_prefix: bool) -> None:
    escape = normalizers.Replace(" ", SPACE)
    tokenizer.normalizer = (normalizers.Sequence([normalizers.Prepend(SPACE), escape])
                            if add_space_prefix else escape)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:  # the prefix the normalizer added is not part of the text
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)


def _add_tokens(tokenizer: Tokenizer, tokens: Sequence[str], types: Sequence[int]) -> None:
    """CONTROL and UNKNOWN tokens as special added tokens, USER_DEFINED ones as plain added
    tokens: llama.cpp matches all three in the text before the model runs."""
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i, kind in enumerate(types) if kind in (CONTROL, UNKNOWN)])
    tokenizer.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                          for i, kind in enumerate(types) if kind == USER_DEFINED])


def _post_processor(tokens: Sequence[str], bos_id: int | None, eos_id: int | None,
                    model: str):
    """The BOS before and the EOS after every sequence, as the file asks."""
    steps = [processors.ByteLevel(trim_offsets=False)] if model == "gpt2" else []
    if bos_id is not None or eos_id is not None:
        before = [tokens[bos_id]] if bos_id is not None else []
        after = [tokens[eos_id]] if eos_id is not None else []
        single = [*before, "$A", *after]
        steps.append(processors.TemplateProcessing(
            single=" ".join(single),
            pair=" ".join(single + [*before, "$B:1", *after]),
            special_tokens=sorted({(tokens[i], i) for i in (bos_id, eos_id)
                                   if i is not None})))
    return processors.Sequence(steps)
