"""The server's Prometheus metrics, named after vLLM's (``vllm:*`` -> ``speculant:*``).

One registry per app, so that several servers in one process (tests) count apart. Counters
get prometheus-client's ``_total`` suffix in the exposition, as vLLM's do.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Seconds; vLLM's buckets for time to first token and end-to-end latency.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0)


class ServerMetrics:
    """What /metrics exposes; ``observe_*`` are called once per request as it ends."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ("model_name",)
        r = self.registry
        self.requests = Counter("speculant:request_success", "Requests ended, by reason "
                                "(stop, length; abort: the client went away; timeout: the "
                                "deadline passed)",
                                (*labels, "finished_reason"), registry=r)
        self.errors = Counter("speculant:request_errors", "Requests refused or failed, by "
                              "HTTP status", (*labels, "status"), registry=r)
        self.prompt_tokens = Counter("speculant:prompt_tokens", "Prompt tokens of finished "
                                     "requests", labels, registry=r)
        self.generation_tokens = Counter("speculant:generation_tokens", "Generated tokens of "
                                         "finished requests", labels, registry=r)
        self.running = Gauge("speculant:num_requests_running", "Requests decoding now",
                             labels, registry=r)
        self.waiting = Gauge("speculant:num_requests_waiting", "Requests waiting for the "
                             "engine", labels, registry=r)
        self.ttft = Histogram("speculant:time_to_first_token_seconds", "From arrival to the "
                              "first token", labels, buckets=TTFT_BUCKETS, registry=r)
        self.latency = Histogram("speculant:e2e_request_latency_seconds", "From arrival to "
                                 "the last token", labels, buckets=LATENCY_BUCKETS, registry=r)
        self.num_drafts = Counter("speculant:spec_decode_num_drafts", "Speculative rounds "
                                  "(one proposal each)", labels, registry=r)
        self.num_draft_tokens = Counter("speculant:spec_decode_num_draft_tokens", "Draft "
                                        "tokens proposed", labels, registry=r)
        self.num_accepted_tokens = Counter("speculant:spec_decode_num_accepted_tokens",
                                           "Draft tokens accepted", labels, registry=r)
        self.accepted_per_pos = Counter("speculant:spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each block position "
                                        "(0: the first draft)", (*labels, "position"),
                                        registry=r)

    def observe_finished(self, result: Any, ttft_s: float, latency_s: float) -> None:
        name = self.model_name
        self.requests.labels(name, result.finish_reason).inc()
        self.prompt_tokens.labels(name).inc(result.num_prompt_tokens)
        self.generation_tokens.labels(name).inc(len(result.token_ids))
        self.ttft.labels(name).observe(ttft_s)
        self.latency.labels(name).observe(latency_s)
        stats = result.stats
        if stats.rounds:
            self.num_drafts.labels(name).inc(stats.rounds)
            self.num_draft_tokens.labels(name).inc(stats.drafts_proposed)
            self.num_accepted_tokens.labels(name).inc(stats.drafts_accepted)
            for position, count in enumerate(stats.accepted_at):
                self.accepted_per_pos.labels(name, str(position)).inc(count)

    def observe_aborted(self, reason: str, latency_s: float) -> None:
        """A request that ended unfinished: ``abort`` (the client went away, or the decode
        failed) or ``timeout`` (its deadline passed)."""
        self.requests.labels(self.model_name, reason).inc()
        self.latency.labels(self.model_name).observe(latency_s)

    def observe_error(self, status: int) -> None:
        self.errors.labels(self.model_name, str(status)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
