"""Text <-> token ids through a package's ``tokenizer.json`` (metadata.md §2.4).

:class:`Tokenizer` wraps the ``tokenizers`` library. A package without a tokenizer still
loads; it gets a :class:`NoTokenizer`, whose text methods raise :class:`RequestError` while
everything that works on token ids carries on. :func:`load_tokenizer` picks the right one, so
callers never branch on ``None``.

The EOS ids come from the metadata (``package.tokenizer.special_tokens.eos``), not from the
tokenizer file: the package states its stop token, speculant does not guess it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import tokenizers

from speculant.errors import MetadataError, RequestError


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
    """Stands in for the tokenizer of a package that has none (metadata.md §2.4 rule 3).

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


def load_tokenizer(
    path: Path | None, *, eos_token_ids: Sequence[int] = (), package: str = ""
) -> Tokenizer | NoTokenizer:
    """The tokenizer at ``path``, or a :class:`NoTokenizer` when the package has none
    (``path is None``). Resolving and confining ``path`` is the package loader's job."""
    if path is None:
        return NoTokenizer(eos_token_ids=eos_token_ids, package=package)
    return Tokenizer.from_file(path, eos_token_ids=eos_token_ids)
