"""A package's chat template: messages -> prompt text, rendered as transformers renders it.

The template comes from ``tokenizer_config.json`` beside ``tokenizer.json`` (keys
``chat_template``, ``bos_token``, ``eos_token``, as Hugging Face writes them). It is rendered
with jinja2 in a sandbox with transformers' settings (``trim_blocks``, ``lstrip_blocks``,
``raise_exception``, ``tojson``) and variables (``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token``). The end-of-turn tokens — the special tokens the template writes
right after an assistant message, and the EOS token — stop generation in a chat.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from speculant.errors import MetadataError, RequestError

CONFIG_NAME = "tokenizer_config.json"
ROLES_HINT = "a list of {'role': ..., 'content': str} dicts"
_SENTINEL = "\u2063speculant-turn-end\u2063"  # content that no template writes itself


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _token_text(value: object) -> str:
    """``bos_token``/``eos_token`` as a string or an AddedToken dict ({"content": ...})."""
    if isinstance(value, Mapping):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # the jinja2 text
    bos_token: str
    eos_token: str
    file: str  # where it came from, for messages
    name: str = "default"
    compiled: jinja2.Template = field(default=None, repr=False, compare=False)  # type: ignore

    def __post_init__(self) -> None:
        if self.compiled is None:  # compiled once; one that does not compile is refused
            object.__setattr__(self, "compiled", _compile(self.source, self.file))

    def render(self, messages: Sequence[Mapping[str, object]], *,
               add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages``; a template's ``raise_exception`` or a render
        failure is a :class:`RequestError` naming the template's file."""
        checked = check_messages(messages)
        try:
            return self.compiled.render(messages=checked,
                                        add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except jinja2.exceptions.TemplateError as exc:
            raise RequestError(f"the chat template refused the messages: {exc}",
                               path="messages", file=self.file,
                               expected=ROLES_HINT + " in the order the template accepts") \
                from None

    def end_of_turn_texts(self) -> tuple[str, ...]:
        """Texts that end an assistant turn: what the template writes right after an
        assistant message's content (up to its first line break), and the EOS token."""
        messages = [{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": _SENTINEL}]
        try:
            text = self.compiled.render(messages=messages, add_generation_prompt=False,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except jinja2.exceptions.TemplateError:
            text = ""
        after = text.split(_SENTINEL, 1)[1] if _SENTINEL in text else ""
        ending = after.split("\n", 1)[0].strip()
        return tuple(t for t in dict.fromkeys((ending, self.eos_token)) if t)


def _compile(source: str, file: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    environment.filters["tojson"] = lambda value, indent=None, **_: json.dumps(
        value, ensure_ascii=False, indent=indent)
    environment.globals["raise_exception"] = _raise_exception
    try:
        return environment.from_string(source)
    except jinja2.exceptions.TemplateError as exc:
        raise MetadataError(f"the chat template does not compile: {exc}",
                            path="chat_template", file=file,
                            remedy="fix chat_template in tokenizer_config.json") from None


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


def load_chat_template(tokenizer_file: Path | None) -> ChatTemplate | None:
    """The template in ``tokenizer_config.json`` beside ``tokenizer_file`` (None: none)."""
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
    if not isinstance(config, dict):
        raise MetadataError(f"{CONFIG_NAME} is not a JSON object", file=str(path),
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
                            file=str(path), value=type(template).__name__, expected="str")
    return ChatTemplate(template, _token_text(config.get("bos_token")),
                        _token_text(config.get("eos_token")), str(path), str(name))
