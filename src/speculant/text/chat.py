"""A package's chat template: messages -> prompt text, rendered as transformers renders it.

The template comes from ``tokenizer_config.json`` beside ``tokenizer.json`` (keys
``chat_template``, ``bos_token``, ``eos_token``, as Hugging Face writes them). It is rendered
with jinja2 in a sandbox with transformers' settings (``trim_blocks``, ``lstrip_blocks``,
``raise_exception``, ``tojson``) and variables (``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token``, ``tools``), in a worker process that bounds each render's
time, output and memory (``template_worker.py``; :class:`TemplateLimits`). The end-of-turn
tokens — the special tokens the template writes right after an assistant message, and the
EOS token — stop generation in a chat.

A template is checked when it is read: a trial render of a one-message conversation, bounded
alike, must give text, or the template is refused with a :class:`MetadataError` naming its
file. At request time every failure of a render (the template's ``raise_exception``, the
sandbox, a deadline, the output cap, any exception) is a :class:`RequestError` naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from speculant.errors import MetadataError, RequestError
from speculant.text.template_worker import (
    DEFAULT_LIMITS,
    RenderFailure,
    TemplateLimits,
    worker_for,
)

CONFIG_NAME = "tokenizer_config.json"
ROLES_HINT = "a list of {'role': ..., 'content': str} dicts"
FIX = "fix chat_template in tokenizer_config.json (a chat template is code the package supplies)"
_SENTINEL = "\u2063speculant-turn-end\u2063"  # content that no template writes itself
TRIAL = ({"role": "user", "content": "hi"},)  # the conversation every template must render
TURN = ({"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL})

__all__ = ["DEFAULT_LIMITS", "ChatTemplate", "TemplateLimits", "chat_template_of", "check_messages",
           "load_chat_template"]


def _token_text(value: object) -> str:
    """``bos_token``/``eos_token`` as a string or an AddedToken dict ({"content": ...})."""
    if isinstance(value, Mapping):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class ChatTemplate:
    """A template that rendered the trial conversation (construction runs the trial and
    raises a :class:`MetadataError` naming ``file`` otherwise)."""

    source: str  # the jinja2 text
    bos_token: str
    eos_token: str
    file: str  # where it came from, for messages
    name: str = "default"
    limits: TemplateLimits = DEFAULT_LIMITS
    endings: tuple[str, ...] = field(default=(), init=False, compare=False)  # end_of_turn_texts

    def __post_init__(self) -> None:
        checked_limits(self.limits)
        try:
            self._render(TRIAL, add_generation_prompt=True)
        except RenderFailure as failure:
            raise _load_error(failure, self.file) from None
        try:
            turn = self._render(TURN, add_generation_prompt=False)
        except RenderFailure as failure:
            if failure.kind != "refused":
                raise _load_error(failure, self.file) from None
            turn = ""  # it refuses an assistant turn: no ending of its own
        after = turn.split(_SENTINEL, 1)[1] if _SENTINEL in turn else ""
        ending = after.split("\n", 1)[0].strip()
        object.__setattr__(self, "endings", tuple(
            t for t in dict.fromkeys((ending, self.eos_token)) if t))

    def render(self, messages: Sequence[Mapping[str, object]], *,
               add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, object]] | None = None) -> str:
        """The prompt text of ``messages``; ``tools``: function definitions in OpenAI's form
        (``{"type": "function", "function": {name, description, parameters}}``), the
        template's ``tools`` variable as transformers passes it. Any failure of the render
        is a :class:`RequestError` naming the template's file."""
        checked = check_messages(messages)
        try:
            return self._render(checked, add_generation_prompt=add_generation_prompt,
                                tools=tools)
        except RenderFailure as failure:
            raise _request_error(failure, self.file) from None

    def end_of_turn_texts(self) -> tuple[str, ...]:
        """Texts that end an assistant turn: what the template writes right after an
        assistant message's content (up to its first line break), and the EOS token (found
        by the trial render, once)."""
        return self.endings

    def _render(self, messages: Sequence[Mapping[str, object]], *,
                add_generation_prompt: bool,
                tools: Sequence[Mapping[str, object]] | None = None) -> str:
        return worker_for(self.limits).render(self.source, {
            "messages": list(messages), "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token, "eos_token": self.eos_token,
            "tools": None if tools is None else list(tools)})


def checked_limits(limits: object) -> TemplateLimits:
    """``limits`` if every bound is a positive finite number, else a RequestError."""
    if not isinstance(limits, TemplateLimits):
        raise RequestError("template_limits must be a TemplateLimits", path="template_limits",
                           value=type(limits).__name__, expected="TemplateLimits(...)")
    try:
        return limits.checked()
    except ValueError as error:
        raise RequestError(str(error), path="template_limits", value=limits) from None


def _request_error(failure: RenderFailure, file: str) -> RequestError:
    reason = str(failure).rstrip(".")
    if failure.kind == "refused":
        return RequestError(f"the chat template refused the messages: {reason}",
                            path="messages", file=file,
                            expected=ROLES_HINT + " in the order the template accepts")
    if failure.kind == "data":
        return RequestError(f"the messages are {reason}", path="messages",
                            expected="strings, numbers, booleans, None, lists and dicts")
    if failure.kind == "deadline":
        return RequestError(f"the chat template {reason}", path="chat_template", file=file,
                            remedy=FIX + "; or raise the deadline (TemplateLimits.deadline_s, "
                                         "speculant serve --chat-template-deadline)")
    if failure.kind == "too_long":
        return RequestError(f"the chat template {reason}", path="chat_template", file=file,
                            remedy="send shorter messages, or raise the cap "
                                   "(TemplateLimits.max_output_chars, speculant serve "
                                   "--chat-template-max-chars)")
    if failure.kind == "busy":
        return RequestError(f"the chat template {reason}", path="chat_template", file=file,
                            remedy="retry: slow renders of this template held its worker")
    return RequestError(f"the chat template failed: {reason}", path="chat_template",
                        file=file, remedy=FIX)


def _load_error(failure: RenderFailure, file: str) -> MetadataError:
    what = ("does not compile" if failure.kind == "compile"
            else "cannot render a one-message conversation")
    reason = str(failure).rstrip(".")
    return MetadataError(f"the chat template {what}: {reason}", path="chat_template",
                         file=file, remedy=FIX)


def check_messages(messages: object) -> list[dict[str, str]]:
    """``messages`` as plain dicts of strings, or a :class:`RequestError` naming the entry."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise RequestError("messages must be a non-empty list", path="messages",
                           value=type(messages).__name__, expected=ROLES_HINT)
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RequestError(f"message {i} is not a dict", path=f"messages[{i}]",
                               value=type(message).__name__, expected=ROLES_HINT)
        entry = {}
        for key in ("role", "content"):
            value = message.get(key)
            if not isinstance(value, str):
                raise RequestError(f"message {i} has no text '{key}'",
                                   path=f"messages[{i}].{key}", value=type(value).__name__,
                                   expected="a str")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise RequestError(f"message {i} '{key}' is not valid Unicode",
                                   path=f"messages[{i}].{key}",
                                   expected="text without lone surrogates") from None
            entry[key] = value
        checked.append({**{k: v for k, v in message.items() if isinstance(k, str)}, **entry})
    return checked


def load_chat_template(tokenizer_file: Path | None,
                       limits: TemplateLimits = DEFAULT_LIMITS) -> ChatTemplate | None:
    """The template in ``tokenizer_config.json`` beside ``tokenizer_file`` (None: none),
    checked by its trial render."""
    checked_limits(limits)
    if tokenizer_file is None:
        return None
    path = tokenizer_file.parent / CONFIG_NAME
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MetadataError(f"cannot read {CONFIG_NAME}: {exc}", file=str(path),
                            expected="a JSON object") from None
    return chat_template_of(config, str(path), limits)


def chat_template_of(config: object, file: str,
                     limits: TemplateLimits = DEFAULT_LIMITS) -> ChatTemplate | None:
    """The template of a ``tokenizer_config.json`` mapping (None: it has none), checked by
    its trial render; ``file`` names where the mapping came from in every error. The
    importers call it before they write a package."""
    if not isinstance(config, dict):
        raise MetadataError(f"{CONFIG_NAME} is not a JSON object", file=file,
                            value=type(config).__name__, expected="a JSON object")
    template, name = config.get("chat_template"), "default"
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        name = "default" if "default" in named else next(iter(named), "default")
        template = named.get(name)
    if template is None:
        return None
    if not isinstance(template, str):
        raise MetadataError("chat_template is not a string", path="chat_template",
                            file=file, value=type(template).__name__, expected="str")
    return ChatTemplate(template, _token_text(config.get("bos_token")),
                        _token_text(config.get("eos_token")), file, str(name), limits)
