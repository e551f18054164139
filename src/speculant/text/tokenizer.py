"""Text <-> token ids through a package's ``tokenizer.json`` (docs/design/spec/metadata.md §2.4).

:class:`Tokenizer` wraps the ``tokenizers`` library. A package without a tokenizer still
loads; it gets a :class:`NoTokenizer`, whose text methods raise :class:`RequestError` while
everything that works on token ids carries on. :func:`load_tokenizer` picks the right one, so
callers never branch on ``None``.

The EOS ids come from the metadata (``package.tokenizer.special_tokens.eos``), not from the
tokenizer file: the package states its stop token, speculant does not guess it.

Load-time checks (:func:`tokenizer_for`; each a ``MetadataError`` naming the file and field):

* V1. Every EOS id lies inside the target's logits width ``V`` (else no run could stop on it).
* V2. The tokenizer file holds at least the ids the package declares it holds
  (``package.tokenizer.vocab_size``; without that declaration, ``V``). The logits may be wider
  than the declared vocabulary: rows ``[vocab_size, V)`` are padding (a vocabulary rounded up
  to a multiple of 64 or 128), the target never emits them in practice, and they decode to
  nothing. What is refused is a tokenizer that cannot decode ids the package itself calls
  tokens (a 300-entry ``tokenizer.json`` for a declared vocabulary of 4,096).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import tokenizers

from speculant.errors import MetadataError, RequestError

if TYPE_CHECKING:
    from speculant.package.package import Package

EOS_FIELD = "package.tokenizer.special_tokens.eos.id"


class Tokenizer:
    """A loaded ``tokenizer.json``: ``encode`` text to ids, ``decode`` ids to text."""

    has_text = True

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        eos_token_ids: Sequence[int] = (),
        source: str = "",
    ) -> None:
        self.backend = backend
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)
        self.source = source  # the file it came from, for messages

    @classmethod
    def from_file(cls, path: Path | str, *, eos_token_ids: Sequence[int] = ()) -> Tokenizer:
        """Load ``path`` (a ``tokenizer.json``); a file the library cannot read is a
        :class:`MetadataError` naming it."""
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception
            raise MetadataError(
                f"cannot load the tokenizer: {exc}",
                file=str(path),
                expected="a tokenizer.json readable by the `tokenizers` library",
                remedy="re-export the tokenizer with tokenizers.Tokenizer.save()",
            ) from exc
        return cls(backend, eos_token_ids=eos_token_ids, source=str(path))

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the file's post-processor
        (a BOS, for instance)."""
        if not isinstance(text, str):
            raise RequestError("encode takes a string", value=type(text).__name__,
                               expected="str")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates (the CLI's undecodable bytes)
            raise RequestError("the text is not valid Unicode: it holds a lone surrogate at "
                               f"character {exc.start}", value=text[exc.start:exc.end],
                               expected="text of Unicode characters (valid UTF-8)",
                               remedy="pass the text as valid UTF-8") from None
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``. Ids the vocabulary does not hold render as nothing (the
        library's behaviour, so a model's padded vocabulary rows cannot crash a stream)."""
        ids = [int(token_id) for token_id in token_ids]
        negative = [token_id for token_id in ids if token_id < 0]
        if negative:
            raise RequestError("token ids must be >= 0", value=negative[0],
                               expected=f"ids in [0, {self.vocab_size})")
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return f"Tokenizer({self.source or 'in memory'}, vocab_size={self.vocab_size})"


class NoTokenizer:
    """Stands in for the tokenizer of a package that has none.

    Token-id APIs work without it; ``encode`` and ``decode`` raise :class:`RequestError`.
    """

    has_text = False
    vocab_size = None

    def __init__(self, *, eos_token_ids: Sequence[int] = (), package: str = "") -> None:
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)
        self.package = package  # the package root, for messages

    def _refuse(self, api: str) -> RequestError:
        return RequestError(
            f"{api} needs a tokenizer, and this package has none",
            file=self.package,
            expected="a tokenizer.json in the package (package.tokenizer.artifacts, "
            "or <root>/tokenizer.json)",
            remedy="pass token ids instead of text, or add tokenizer.json to the package",
        )

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        raise self._refuse("encoding text")

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        raise self._refuse("decoding token ids to text")

    def __repr__(self) -> str:
        return "NoTokenizer()"


def tokenizer_for(package: Package) -> Tokenizer | NoTokenizer:
    """The tokenizer of a loaded package, after the load-time checks V1 and V2 (module
    docstring)."""
    doc, plan = package.document, package.plan
    logits_width = package.logits_width
    declared = doc.package.tokenizer if doc.package and doc.package.tokenizer else None
    for eos_id in plan.eos_ids:
        if logits_width is not None and not 0 <= eos_id < logits_width:
            raise MetadataError(
                f"the EOS id {eos_id} is outside the target's vocabulary: its logits are "
                f"{logits_width} wide, so no run could stop on it",
                file=str(package.metadata_file), path=EOS_FIELD, value=eos_id,
                expected=f"an id in [0, {logits_width})",
                remedy="set the id of the end-of-sequence token the model was trained with")
    tokenizer = load_tokenizer(package.tokenizer_file, eos_token_ids=plan.eos_ids,
                               package=str(package.root))
    required = declared.vocab_size if declared else logits_width
    if tokenizer.vocab_size is not None and required and tokenizer.vocab_size < required:
        source = ("package.tokenizer.vocab_size declares" if declared else
                  "the target's logits are")
        raise MetadataError(
            f"the tokenizer holds {tokenizer.vocab_size} ids, but {source} {required}: ids "
            f"{tokenizer.vocab_size} to {required - 1} could not be decoded",
            file=str(package.tokenizer_file), value=tokenizer.vocab_size,
            expected=f"a tokenizer of at least {required} ids",
            remedy="ship the model's own tokenizer.json, or declare its true vocab_size")
    return tokenizer


def load_tokenizer(
    path: Path | None, *, eos_token_ids: Sequence[int] = (), package: str = ""
) -> Tokenizer | NoTokenizer:
    """The tokenizer at ``path``, or a :class:`NoTokenizer` when the package has none
    (``path is None``). Resolving and confining ``path`` is the package loader's job."""
    if path is None:
        return NoTokenizer(eos_token_ids=eos_token_ids, package=package)
    return Tokenizer.from_file(path, eos_token_ids=eos_token_ids)
