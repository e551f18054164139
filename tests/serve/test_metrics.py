"""/metrics: the counters move as requests complete (vLLM's names, speculant's prefix)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from speculant import GenerationOptions

MODEL = "fixture"  # conftest.MODEL


def _samples(raw) -> dict[tuple, float]:
    status, headers, body = raw("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))):
            s.value for family in text_string_to_metric_families(body.decode())
            for s in family.samples}


def _delta(after: dict, before: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_metrics_move_as_requests_complete(client, engine, raw):
    options = GenerationOptions(max_new_tokens=12, proposer="chained", k=3)
    expected = engine.generate("hello world", options)
    before = _samples(raw)
    client.completions.create(model=MODEL, prompt="hello world", max_tokens=12,
                              extra_body={"proposer": "chained", "k": 3})
    list(client.completions.create(model=MODEL, prompt="hello world", max_tokens=12,
                                   stream=True, extra_body={"proposer": "chained", "k": 3}))
    client.completions.create(model=MODEL, prompt="hello", max_tokens=1)  # plain
    after = _samples(raw)

    def moved(name: str, **labels) -> float:
        return _delta(after, before, f"speculant:{name}", **labels)

    assert moved("request_success_total", finished_reason="length") == 3
    assert moved("generation_tokens_total") == 12 + 12 + 1
    assert moved("prompt_tokens_total") == 2 * expected.num_prompt_tokens + 5
    assert moved("time_to_first_token_seconds_count") == 3
    assert moved("e2e_request_latency_seconds_count") == 3
    assert moved("request_queue_time_seconds_count") == 3
    assert moved("request_time_per_output_token_seconds_count") == 2  # not the 1-token one
    assert 0 < moved("request_time_per_output_token_seconds_sum") < \
        moved("e2e_request_latency_seconds_sum")
    assert moved("batch_size_count") == 0  # one request at a time: no scheduler
    stats = expected.stats
    assert stats.rounds > 0
    assert moved("spec_decode_num_drafts_total") == 2 * stats.rounds
    assert moved("spec_decode_num_draft_tokens_total") == 2 * stats.drafts_proposed
    accepted = sum(stats.accepted_at)
    assert moved("spec_decode_num_accepted_tokens_total") == 2 * accepted
    for position, count in enumerate(stats.accepted_at):
        assert moved("spec_decode_num_accepted_tokens_per_pos_total",
                     position=str(position)) == 2 * count


def test_refusals_are_counted_by_status(client, raw):
    before = _samples(raw)
    raw("POST", "/v1/completions", "{", {"Content-Type": "application/json"})
    after = _samples(raw)
    assert _delta(after, before, "speculant:request_errors_total", status="400") == 1
    assert _delta(after, before, "speculant:request_success_total",
                  finished_reason="length") == 0
