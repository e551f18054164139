"""Stop strings on the decoded text, across token boundaries; the stop text never emitted;
the request-scoped API (finish_reason, stream admission, close, per-request stats, threads)."""

from __future__ import annotations

import threading

import pytest

from builders import definition as fx
from builders.tokenizer import decode, encode
from speculant import RequestError
from speculant.workflow.stop_text import StopText


class WordTokenizer:
    """Ids are indexes into ``WORDS``; decoding concatenates them."""

    WORDS = ("", "ret", "urn", " x", "\n", "re", "turn", "é"[:1], "ab")
    has_text = True

    def decode(self, ids, *, skip_special_tokens=True):
        return "".join(self.WORDS[i] for i in ids)


def feed(stop, ids):
    text = StopText(WordTokenizer(), [], stop)
    pieces, stopped_at = [], None
    for position, token in enumerate(ids):
        if text.push(token):
            stopped_at = position
            pieces.append(text.take())
            break
        pieces.append(text.take())
    pieces.append(text.finish())
    return [p for p in pieces if p], stopped_at, text.text


def test_a_stop_string_across_two_tokens_stops_at_the_second():
    pieces, stopped_at, text = feed(["return"], [3, 1, 2, 3])  # " x" "ret" "urn" " x"
    assert stopped_at == 2 and text == " x" and "".join(pieces) == " x"


def test_a_stop_string_across_three_tokens_and_inside_one():
    assert feed(["eturn x"], [5, 6, 3, 4])[1:] == (2, "r")  # "re" "turn" " x"
    assert feed(["tur"], [6])[1:] == (0, "")  # inside one token


def test_text_that_may_start_a_stop_string_is_held_back_then_released():
    text = StopText(WordTokenizer(), [], ["return"])
    assert not text.push(1) and text.take() == ""  # "ret" may start "return"
    assert not text.push(8) and text.take() == "retab"  # "retab" cannot: released
    assert text.finish() == ""


def test_held_back_text_is_released_at_the_end():
    assert feed(["return"], [3, 1]) == ([" x", "ret"], None, " xret")


def test_the_earliest_stop_string_wins():
    assert feed(["x\n", "urn"], [1, 2, 3, 4])[1:] == (1, "ret")


# -- through the engine ----------------------------------------------------------------------
def test_finish_reason_stop_and_length(decoder_engine):
    engine = decoder_engine()
    assert engine.generate("def ", 5).finish_reason == "length"
    eos = engine.generate("a", 60)
    assert fx.EOS_ID in eos.token_ids and eos.finish_reason == "stop"
    full = engine.generate("def ", 30)
    stop = decode(full.token_ids[6:8])
    cut = engine.generate("def ", 30, stop=[stop])
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert engine.generate("def ", 30, max_context=12).finish_reason == "length"


def test_a_stream_never_emits_stop_text_and_matches_generate(decoder_engine):
    engine = decoder_engine()
    full = engine.generate("def ", 30).text
    stop = full[5:9]
    stream = engine.stream("def ", 30, stop=[stop])
    pieces = list(stream)
    assert "".join(pieces) == full[:full.index(stop)] == stream.result.text
    assert all(stop[:2] not in piece for piece in pieces[-1:])
    assert stream.result.text == engine.generate("def ", 30, stop=[stop]).text


def test_a_stream_is_admitted_before_its_first_piece(decoder_engine, passes):
    engine = decoder_engine()
    with pytest.raises(RequestError):
        engine.stream("def ", 0)
    with pytest.raises(RequestError):
        engine.stream("", 4)
    assert passes == []
    assert engine.generate("def ", 3).token_ids  # nothing left held


def test_a_closed_stream_has_a_result_and_frees_the_engine(decoder_engine):
    engine = decoder_engine()
    stream = engine.stream("def ", 20)
    next(stream)
    with pytest.raises(RequestError):
        stream.result  # noqa: B018 - not finished yet
    stream.close()
    assert stream.result.stats.stop_reason == "closed" and stream.result.token_ids
    assert len(engine.generate("def ", 20).token_ids) == 20


def test_a_stream_opened_in_one_thread_is_consumed_in_another(decoder_engine):
    """A server's pattern: the handler thread opens (admits) the stream, a worker thread
    consumes it; the handler's next request waits its turn meanwhile."""
    engine = decoder_engine()
    expected = engine.generate("def ", 20).text
    stream = engine.stream("def ", 20)
    pieces: list[str] = []
    worker = threading.Thread(target=lambda: pieces.extend(stream))
    later: list[str] = []
    waiter = threading.Thread(target=lambda: later.append(engine.generate("def ", 20).text))
    waiter.start()
    waiter.join(0.1)
    assert waiter.is_alive() and later == []  # the open stream holds the engine
    worker.start()
    worker.join(30)
    waiter.join(30)
    assert "".join(pieces) == expected and later == [expected]


def test_each_result_carries_its_own_stats(chained_engine):
    engine = chained_engine()
    one = engine.generate("def ", 30, speculative=True, k=2)
    two = engine.generate("a", 10)
    assert one.stats is not two.stats and one.stats.rounds > 0 and two.stats.rounds == 0
    assert one.stats.committed == len(one.token_ids) and two.stats.committed == 10


def test_requests_from_several_threads_equal_a_serial_run(chained_engine):
    """Eight threads, three requests each, mixed settings: every result carries its own
    text, tokens and stats, equal to the same request run alone."""
    engine = chained_engine()
    requests = [("def ", dict(max_new_tokens=30, proposer="chained", k=2)),
                ("a", dict(max_new_tokens=20)),
                ("print(x) ", dict(max_new_tokens=25, proposer="prompt_lookup", k=3)),
                ("hello", dict(max_new_tokens=16, temperature=1.5, seed=7, stop=["e"]))]
    serial = {i: engine.generate(prompt, **options) for i, (prompt, options) in
              enumerate(requests)}
    results: list[tuple[int, object]] = []
    errors: list[BaseException] = []

    def client(offset: int) -> None:
        try:
            for j in range(3):
                i = (offset + j) % len(requests)
                prompt, options = requests[i]
                if j == 1:  # one streamed request per client
                    stream = engine.stream(prompt, **options)
                    text = "".join(stream)
                    assert text == stream.result.text
                    results.append((i, stream.result))
                else:
                    results.append((i, engine.generate(prompt, **options)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(results) == 24
    for i, result in results:
        expected = serial[i]
        assert result.token_ids == expected.token_ids and result.text == expected.text
        assert result.stats.trace == expected.stats.trace
        assert result.stats.committed == expected.stats.committed == len(result.token_ids)
    assert len({id(result.stats) for _, result in results}) == 24


def test_requests_are_served_in_arrival_order():
    from speculant.generation import Turns

    turns, served = Turns(), []
    first = turns.wait()

    def client(n: int) -> None:
        turn = turns.wait()
        served.append(n)
        turn.release()

    waiting = []
    for n in range(4):
        thread = threading.Thread(target=client, args=(n,))
        thread.start()
        thread.join(0.05)  # it takes its ticket before the next client arrives
        waiting.append(thread)
    assert served == []  # the first holder has not released yet
    first.release()
    for thread in waiting:
        thread.join(5)
    assert served == [0, 1, 2, 3]


def test_stop_token_ids_still_stop_on_ids(decoder_engine):
    engine = decoder_engine()
    full = engine.generate("def ", 30, stop_on_eos=False).token_ids
    stop_id = full[4]
    result = engine.generate("def ", 30, stop_token_ids=[stop_id])
    assert result.token_ids == full[:5] and result.finish_reason == "stop"
    assert encode(result.text) == [t for t in result.token_ids if t != fx.EOS_ID]
