"""A ``tokenizer.json`` for a GGUF's gpt2-style byte-level BPE, built with ``tokenizers``.

The GGUF holds the vocabulary (``tokenizer.ggml.tokens``, already in the byte-to-unicode
alphabet), the merges (``"a b"`` strings), each token's type (CONTROL tokens become special
added tokens, USER_DEFINED ones plain added tokens) and the name of the pre-tokenizer
(``tokenizer.ggml.pre``), which picks the split rules llama.cpp applies for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from speculant_tools.importers.checkpoint import ImporterError

CONTROL, USER_DEFINED = 3, 4  # gguf.TokenType
# llama.cpp's llama-3 split (LLAMA_VOCAB_PRE_TYPE_LLAMA3), as in Llama 3's tokenizer.json
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(use_regex: bool = True) -> pre_tokenizers.ByteLevel:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                    use_regex=use_regex)


def _pre_tokenizer(pre: str):
    """llama.cpp's split rules for ``tokenizer.ggml.pre`` (llama-vocab.cpp)."""
    if pre in ("default", "gpt-2", "gpt2", "olmo", "jais"):
        return _byte_level()  # the GPT-2 regex
    if pre in ("smollm", "starcoder", "refact", "codeshell", "exaone", "minerva"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        _byte_level()])
    if pre in ("llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            _byte_level(use_regex=False)])
    raise ImporterError("this pre-tokenizer is not supported", path="tokenizer.ggml.pre",
                        value=pre, expected="default, gpt2, smollm, starcoder, llama-bpe")


def build_tokenizer(tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int],
                    *, pre: str = "default", bos_id: int | None = None,
                    add_bos: bool = False) -> Tokenizer:
    """The byte-level BPE tokenizer of a GGUF (``tokenizer.ggml.model == "gpt2"``). The
    vocabulary is checked before ``tokenizers`` sees it (a merge whose pieces or result are
    not tokens makes its BPE builder panic); anything ``tokenizers`` still refuses is an
    ImporterError too."""
    pre_tokenizer = _pre_tokenizer(pre)
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ImporterError("the vocabulary repeats a token", path="tokenizer.ggml.tokens",
                            value=len(tokens) - len(vocab), expected="distinct tokens")
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
    if len(token_types) != len(tokens):
        raise ImporterError("one token type per token", path="tokenizer.ggml.token_type",
                            value=len(token_types), expected=str(len(tokens)))
    try:
        return _tokenizer(vocab, pairs, pre_tokenizer, tokens, token_types,
                          bos_id if add_bos else None)
    except Exception as error:  # tokenizers raises its own errors as plain Exception
        raise ImporterError(f"tokenizers cannot build the vocabulary: {error}",
                            path="tokenizer.ggml") from None


def _tokenizer(vocab: dict[str, int], pairs: list[tuple[str, str]], pre_tokenizer,
               tokens: Sequence[str], token_types: Sequence[int],
               bos_id: int | None) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False,
                                     byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    for kind, add in ((CONTROL, tokenizer.add_special_tokens), (USER_DEFINED,
                                                                tokenizer.add_tokens)):
        add([AddedToken(tokens[i], special=kind == CONTROL, normalized=False)
             for i, each in enumerate(token_types) if each == kind])
    if bos_id is not None:  # the BOS token before every sequence
        bos = tokens[bos_id]
        tokenizer.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, bos_id)])])
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer
