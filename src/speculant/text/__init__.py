"""The text layer: tokenizer, streaming detokenizer."""

from speculant.text.detokenizer import IncrementalDetokenizer
from speculant.text.tokenizer import NoTokenizer, Tokenizer, load_tokenizer

__all__ = ["IncrementalDetokenizer", "NoTokenizer", "Tokenizer", "load_tokenizer"]
