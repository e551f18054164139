"""16 clients at once, streaming and not, each get their own full answer."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from speculant import GenerationOptions

MODEL = "fixture"  # conftest.MODEL
NUM_CLIENTS = 16


def _request(i: int) -> dict:
    """Client i: its own prompt, length, proposer and mode."""
    return {"prompt": "abcdefghijklmnopqrstuvwxyz"[i:i + 5] + " ", "max_tokens": 8 + i,
            "proposer": ("chained", "prompt_lookup", None)[i % 3], "is_stream": i % 2 == 0}


def test_concurrent_clients_each_get_their_answer(client, engine):
    requests = [_request(i) for i in range(NUM_CLIENTS)]
    expected = [engine.generate(r["prompt"], GenerationOptions(max_new_tokens=r["max_tokens"],
                                                               proposer=r["proposer"]))
                for r in requests]
    assert len({e.text for e in expected}) == NUM_CLIENTS  # answers that could be mixed up

    def ask(r: dict) -> tuple[str, int]:
        fields = dict(model=MODEL, prompt=r["prompt"], max_tokens=r["max_tokens"],
                      extra_body={"proposer": r["proposer"]})
        if not r["is_stream"]:
            answer = client.completions.create(**fields)
            return answer.choices[0].text, answer.usage.completion_tokens
        chunks = list(client.completions.create(**fields, stream=True,
                                                stream_options={"include_usage": True}))
        return ("".join(c.choices[0].text for c in chunks if c.choices),
                chunks[-1].usage.completion_tokens)

    with ThreadPoolExecutor(NUM_CLIENTS) as pool:
        answers = list(pool.map(ask, requests))
    assert answers == [(e.text, len(e.token_ids)) for e in expected]
