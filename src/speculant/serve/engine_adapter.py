"""The server's one door into the engine: the request-scoped API of notes/api.md.

The server codes against that contract only::

    engine.generate(prompt, options) / engine.chat(messages, options) -> result
    engine.stream(prompt, options) / engine.chat_stream(messages, options) -> stream
    stream: iterate for text pieces; stream.result once exhausted; stream.close() to stop
    result: text, token_ids, finish_reason ("stop" | "length"), num_prompt_tokens, stats

:func:`adapt` returns an engine that has it. Where the loaded engine already implements it
(``speculant.GenerationOptions`` exists) that is the engine itself; until then
:class:`_LegacyEngine` puts the contract over the old ``generate(prompt, max_new_tokens,
**kw)`` / ``decode(request)`` API. SHIM: once branch ``loop`` is merged, delete
``_LegacyEngine``, ``_LegacyStream``, the fallback ``GenerationOptions`` and
``accepted_drafts``'s fallback, and let :func:`adapt` return the engine.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import speculant
from speculant.errors import RequestError

HAS_REQUEST_API = hasattr(speculant, "GenerationOptions")

if HAS_REQUEST_API:
    GenerationOptions = speculant.GenerationOptions
else:  # SHIM: the fields of speculant/workflow/options.py (api.md), until `loop` lands

    @dataclass(frozen=True)
    class GenerationOptions:  # type: ignore[no-redef]
        max_new_tokens: int = 64
        proposer: str | None = None
        k: int | None = None
        temperature: float = 0.0
        top_p: float = 1.0
        top_k: int = 0
        min_p: float = 0.0
        seed: int = 0
        stop: tuple[str, ...] = ()
        stop_token_ids: tuple[int, ...] = ()
        stop_on_eos: bool = True


def load_engine(package: str, device: str = "cpu", draft: str | None = None,
                threads: int | None = None) -> Any:
    """``speculant.load``'s resolution (a folder, or a built-in name such as ``demo``);
    ``threads``: ONNX Runtime's intra-op threads per session (None: ORT's default)."""
    if package == "demo" and not Path(package).is_dir():
        # SHIM: until speculant.load resolves built-in names (branch `import`)
        from speculant.cli import demo_package

        package = str(demo_package())
    return adapt(speculant.load(package, device=device, draft=draft, threads=threads))


def adapt(engine: Any) -> Any:
    """An engine with the request-scoped API (the engine itself once it has one)."""
    if hasattr(engine, "chat_stream"):
        return engine
    return _LegacyEngine(engine)


def accepted_drafts(stats: Any) -> int:
    """``drafts_accepted`` of a DecodeStats (the old engine calls it ``accepted_drafts``)."""
    value = getattr(stats, "drafts_accepted", None)
    return int(value if value is not None else stats.accepted_drafts)


# -- SHIM: the contract over the old engine ------------------------------------------------
@dataclass
class _LegacyResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    num_prompt_tokens: int
    stats: Any
    time_to_first_token_s: float
    total_s: float


@dataclass
class _LegacyStream:
    """Pieces of one request; holds the engine from admission until exhausted or closed."""

    engine: Any
    prompt_ids: list[int]
    options: GenerationOptions
    lock: threading.Lock
    result: _LegacyResult | None = None
    _started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        from speculant.cli import default_width
        from speculant.text.detokenizer import IncrementalDetokenizer

        o = self.options
        k = o.k if o.k is not None or o.proposer is None else default_width(self.engine, o.proposer)
        request = self.engine.request(
            self.prompt_ids, o.max_new_tokens, proposer=o.proposer, k=k,
            stop_token_ids=o.stop_token_ids, stop_on_eos=o.stop_on_eos, seed=o.seed,
            temperature=o.temperature, top_k=o.top_k, top_p=o.top_p, min_p=o.min_p)
        self._detokenizer = IncrementalDetokenizer(self.engine.tokenizer,
                                                   context_ids=self.prompt_ids)
        self._tokens = self.engine.decode(request)
        self._ids: list[int] = []
        self._first: int | None = None
        self._held = self.lock.acquire()
        try:  # the old engine admits on the first step: take it now, before any piece
            self._first = next(self._tokens, None)
        except BaseException:
            self.close()
            raise
        self._first_at = time.perf_counter()

    def __iter__(self) -> Iterator[str]:
        text, emitted, is_stopped = "", 0, False
        while not is_stopped:
            token = self._first if self._first is not None else next(self._tokens, None)
            self._first = None
            if token is None:
                text += self._detokenizer.flush()
            else:
                self._ids.append(token)
                text += self._detokenizer.push(token)
            cut = _first_stop(text, self.options.stop)
            is_stopped = token is None or cut is not None
            end = cut if cut is not None else len(text) - (0 if is_stopped else
                                                           _held_back(text, self.options.stop))
            if end > emitted:
                yield text[emitted:end]
                emitted = end
        stats = self.engine.stats
        stats.drafts_accepted = stats.accepted_drafts
        reason = "length" if stats.stop_reason in ("max_new_tokens", "context_full") else "stop"
        if cut is not None:
            reason = "stop"
        self.result = _LegacyResult(text[:emitted], self._ids, reason, len(self.prompt_ids),
                                    stats, self._first_at - self._started,
                                    time.perf_counter() - self._started)
        self.close()

    def close(self) -> None:
        self._tokens.close()
        if self._held:
            self._held = False
            self.lock.release()


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _held_back(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` that may begin a stop string."""
    return max((n for s in stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                if s.startswith(text[-n:])), default=0)


class _LegacyEngine:
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.package = engine.package
        self.tokenizer = engine.tokenizer
        self.lock = threading.Lock()

    def stream(self, prompt: str | Sequence[int], options: GenerationOptions) -> _LegacyStream:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return _LegacyStream(self.engine, ids, options, self.lock)

    def chat_stream(self, messages: list[dict], options: GenerationOptions) -> _LegacyStream:
        text = _render_chat(self.package.tokenizer_file, messages)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return _LegacyStream(self.engine, ids, options, self.lock)

    def generate(self, prompt: str | Sequence[int], options: GenerationOptions) -> _LegacyResult:
        return _drain(self.stream(prompt, options))

    def chat(self, messages: list[dict], options: GenerationOptions) -> _LegacyResult:
        return _drain(self.chat_stream(messages, options))


def _drain(stream: _LegacyStream) -> _LegacyResult:
    for _ in stream:
        pass
    assert stream.result is not None
    return stream.result


def _render_chat(tokenizer_file: Path, messages: list[dict]) -> str:
    """The package's chat template, rendered as transformers does."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    config_path = Path(tokenizer_file).parent / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    if not config.get("chat_template"):
        raise RequestError("the package has no chat template", file=str(config_path),
                           path="chat_template",
                           remedy="add tokenizer_config.json with a chat_template beside "
                                  "tokenizer.json, or use /v1/completions")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(config["chat_template"]).render(
        messages=messages, add_generation_prompt=True, bos_token=config.get("bos_token", ""),
        eos_token=config.get("eos_token", ""))
