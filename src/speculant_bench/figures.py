"""Figures of one repeat (one list of samples = one pass over the prompt set), shared by the
report of speculant's runners and of the anchors."""

from __future__ import annotations

from speculant_bench.run import Sample


def decode_tokens_per_s(samples: list[Sample]) -> float:
    """Tokens after the first over the time after the first: prefill and TTFT excluded."""
    return sum(len(s.token_ids) - 1 for s in samples) / sum(s.decode_s for s in samples)


def end_to_end_tokens_per_s(samples: list[Sample]) -> float:
    return sum(len(s.token_ids) for s in samples) / sum(s.total_s for s in samples)


def ttft_ms(samples: list[Sample]) -> float:
    return 1000 * sum(s.ttft_s for s in samples) / len(samples)
