"""The server's Prometheus metrics, named after vLLM's (``vllm:*`` -> ``speculant:*``).

One registry per app, so that several servers in one process (tests) count apart. Counters
get prometheus-client's ``_total`` suffix in the exposition, as vLLM's do. With ``--max-batch``
above 1, :meth:`ServerMetrics.watch` adds the scheduler's: rows per step, rows in use and the
cache positions they hold, read when /metrics is scraped.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from speculant.speculative.scheduler import Entry, Scheduler

# Seconds; vLLM's buckets for time to first token and end-to-end latency.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
# Seconds per output token after the first; vLLM's, below 10 ms too (tiny models, CPU batches).
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0)


class ServerMetrics:
    """What /metrics exposes; ``observe_*`` are called once per request as it ends."""

    def __init__(self, model_name: str, max_batch: int = 1) -> None:
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
        self.queue_time = Histogram("speculant:request_queue_time_seconds", "From arrival "
                                    "to a slot of the engine (the admission queue)", labels,
                                    buckets=TTFT_BUCKETS, registry=r)
        self.time_per_output_token = Histogram(
            "speculant:request_time_per_output_token_seconds", "Per request of two tokens or "
            "more: from its first token to its last, over the tokens after the first", labels,
            buckets=TPOT_BUCKETS, registry=r)
        self.batch_size = Histogram("speculant:batch_size", "Rows in each batched target "
                                    "pass (one per scheduler step; --max-batch above 1)",
                                    labels, buckets=tuple(range(1, max_batch + 1)), registry=r)
        self.rows_used = Gauge("speculant:num_rows_used", "Rows of the batched caches "
                               "holding a request that decodes", labels, registry=r)
        self.kv_slots_used = Gauge("speculant:kv_slots_used", "Cache positions those rows "
                                   "hold: the sum of their consumed lengths", labels,
                                   registry=r)
        self.kv_slots_total = Gauge("speculant:kv_slots_total", "Cache positions of every "
                                    "row: rows x capacity", labels, registry=r)
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
        if len(result.token_ids) > 1:  # the engine's clocks: the tokens' commits
            self.time_per_output_token.labels(name).observe(
                (result.total_s - result.time_to_first_token_s) / (len(result.token_ids) - 1))
        stats = result.stats
        if stats.rounds:
            self.num_drafts.labels(name).inc(stats.rounds)
            self.num_draft_tokens.labels(name).inc(stats.drafts_proposed)
            self.num_accepted_tokens.labels(name).inc(stats.drafts_accepted)
            for position, count in enumerate(stats.accepted_at):
                self.accepted_per_pos.labels(name, str(position)).inc(count)

    def watch(self, scheduler: Scheduler) -> None:
        """Observe each step's rows, and read the rows in use (a stopped row waiting to leave
        at the next step is not) and their consumed lengths at each scrape."""
        name = self.model_name
        scheduler.step_observers.append(self.batch_size.labels(name).observe)

        def decoding() -> list[Entry]:
            return [e for e in list(scheduler.rows) if e is not None and not e.state.is_stopped]
        self.rows_used.labels(name).set_function(lambda: len(decoding()))
        self.kv_slots_used.labels(name).set_function(
            lambda: sum(e.state.consumed for e in decoding()))
        self.kv_slots_total.labels(name).set(scheduler.target.rows * scheduler.target.capacity)

    def observe_aborted(self, reason: str, latency_s: float) -> None:
        """A request that ended unfinished: ``abort`` (the client went away, or the decode
        failed) or ``timeout`` (its deadline passed)."""
        self.requests.labels(self.model_name, reason).inc()
        self.latency.labels(self.model_name).observe(latency_s)

    def observe_error(self, status: int) -> None:
        self.errors.labels(self.model_name, str(status)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
