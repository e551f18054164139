"""`speculant chat`: a conversation with the package's model, as `ollama run` holds one.

Lines are read with prompt_toolkit on a terminal (editing, history kept in the user's data
folder, Alt-Enter for a new line) and plainly from a pipe. A line that starts with ``/`` is a
command, handled here and never sent to the model; ``\"\"\"`` opens a block of several lines,
closed by a line that ends with ``\"\"\"``. Ctrl-C during an answer stops the answer and keeps the
conversation, the part already shown becoming the assistant's turn; Ctrl-C or Ctrl-D at the
prompt leaves. An answer runs to the model's end of turn or the end of the context, unless
``max_new_tokens`` is set.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, TextIO

from speculant.errors import RequestError, SpeculantError
from speculant.speculative.kinds import widest_k
from speculant.workflow.options import GenerationOptions, parse_width

HISTORY_FILE = "chat_history"  # in platformdirs' user data folder of speculant
NO_CAP = sys.maxsize  # max_new_tokens where neither the context nor the caches bound an answer
BLOCK = '"""'
SETTABLE = ("temperature", "top_p", "top_k", "min_p", "seed", "max_new_tokens", "proposer",
            "k", "acceptance")
HELP = f"""commands (never sent to the model):
  /help, /?            this list
  /bye, /exit          leave (so do Ctrl-D and Ctrl-C at the prompt)
  /clear, /reset       forget the conversation (a --system message stays)
  /stats               the last answer's statistics
  /set                 show the settings
  /set NAME VALUE      change one: {", ".join(SETTABLE)}, system
                       (none clears seed, max_new_tokens, proposer)
input:
  {BLOCK}                  a block of several lines, until a line ending with {BLOCK}
  Alt-Enter            a new line without sending (on a terminal)
  Ctrl-C               during an answer: stop it; the part shown stays in the conversation
                       as the assistant's turn"""


class LineReader(Protocol):
    def read(self, prompt: str) -> str:
        """One input (maybe several lines); EOFError at the end, KeyboardInterrupt on Ctrl-C."""
        ...


class PlainReader:
    """Lines of a pipe or file (no terminal)."""

    def __init__(self, source: TextIO, echo: TextIO) -> None:
        self.source, self.echo = source, echo

    def read(self, prompt: str) -> str:
        self.echo.write(prompt)
        self.echo.flush()
        line = self.source.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")


class TerminalReader:
    """prompt_toolkit's line editor with a history file; Alt-Enter inserts a new line.
    ``input`` / ``output``: prompt_toolkit's (None: the terminal)."""

    def __init__(self, history_path: Path | None, input: Any = None, output: Any = None) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        bindings = KeyBindings()

        @bindings.add("escape", "enter")
        def _new_line(event: Any) -> None:
            event.current_buffer.insert_text("\n")

        history: Any = InMemoryHistory()
        if history_path is not None:
            try:
                history_path.parent.mkdir(parents=True, exist_ok=True)
                history_path.touch()
                history = FileHistory(str(history_path))
            except OSError:
                pass  # an unwritable data folder: this session's history only
        self.session = PromptSession(history=history, key_bindings=bindings, input=input,
                                     output=output, prompt_continuation="... ")

    def read(self, prompt: str) -> str:
        return self.session.prompt(prompt)


def default_history_path() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("speculant")) / HISTORY_FILE


def reader_for(stdin: TextIO, stdout: TextIO) -> LineReader:
    """The terminal's line editor where both ends are a terminal, plain lines otherwise."""
    if stdin.isatty() and stdout.isatty():
        return TerminalReader(default_history_path())
    return PlainReader(stdin, stdout)


@dataclass
class ChatRepl:
    """One conversation: the engine, the settings (``options``; ``max_new_tokens`` None: no
    cap), the turns so far. ``say`` prints a notice (stderr); ``show_error`` an error;
    ``show_stats`` the last result's statistics."""

    engine: Any
    options: GenerationOptions
    reader: LineReader
    out: TextIO
    say: Callable[[str], None]
    show_error: Callable[[SpeculantError], None]
    show_stats: Callable[[Any], None]
    system: str | None = None
    max_new_tokens: int | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    last: Any = None  # the last answer's Generation

    def __post_init__(self) -> None:
        self.messages = self.opening()

    def opening(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def check(self) -> None:
        """Admit a first turn with these settings (nothing runs): a package without a chat
        template, or settings the engine refuses, are refused before the first turn."""
        prompt, options = self.turn(self.opening() + [{"role": "user", "content": "hi"}])
        self.engine.admit(prompt, options)

    def run(self) -> None:
        while True:
            try:
                text, is_block = self.read_input()
            except (EOFError, KeyboardInterrupt):
                self.out.write("\n")
                return
            if text.startswith("/") and not is_block:
                if self.command(text.strip()):
                    return
            elif text.strip():
                self.answer(text)

    def read_input(self) -> tuple[str, bool]:
        """The next input, and whether it was a \"\"\" block (sent as it is, even when it
        starts with /). Ctrl-C inside a block drops the block; the end of input ends it."""
        text = self.reader.read("> ")
        if not text.lstrip().startswith(BLOCK):
            return text, False
        first = text.lstrip()[len(BLOCK):]
        if first.rstrip().endswith(BLOCK):  # \"\"\"one line\"\"\"
            return first.rstrip()[:-len(BLOCK)], True
        lines = [first] if first.strip() else []
        try:
            while True:
                line = self.reader.read("... ")
                if line.rstrip().endswith(BLOCK):
                    lines.append(line.rstrip()[:-len(BLOCK)])
                    break
                lines.append(line)
        except KeyboardInterrupt:
            self.say("(block dropped)")
            return "", True
        except EOFError:
            pass
        return "\n".join(lines).strip("\n"), True

    # -- commands ---------------------------------------------------------------------------
    def command(self, line: str) -> bool:
        """Run ``line``'s command; True to leave."""
        name, _, rest = line.partition(" ")
        if name in ("/bye", "/exit", "/quit"):
            return True
        if name in ("/help", "/?"):
            self.say(HELP)
        elif name in ("/clear", "/reset"):
            self.messages, self.last = self.opening(), None
            self.say("(the conversation is cleared)")
        elif name == "/stats":
            if self.last is None:
                self.say("no answer yet")
            else:
                self.show_stats(self.last)
        elif name == "/set":
            self.set(rest.strip())
        else:
            self.say(f"unknown command {name}; /help lists them (a message that starts with "
                     f"/ can be sent in a {BLOCK} block)")
        return False

    def set(self, setting: str) -> None:
        name, _, value = setting.partition(" ")
        value = value.strip()
        if not name:
            shown = {f.name: getattr(self.options, f.name) for f in fields(GenerationOptions)
                     if f.name in SETTABLE}
            shown["max_new_tokens"] = self.max_new_tokens or "none (the rest of the context)"
            self.say("  ".join(f"{k}={v}" for k, v in shown.items()) +
                     f"  system={self.system!r}")
            return
        if name == "system":
            self.system = value or None
            self.messages = self.opening() + [m for m in self.messages if m["role"] != "system"]
            self.say("(system message set)" if value else "(system message cleared)")
            return
        if name not in SETTABLE or not value:
            self.say(f"usage: /set NAME VALUE, NAME one of {', '.join(SETTABLE)}, system")
            return
        before = (self.options, self.max_new_tokens)
        try:
            parsed = _parse_setting(name, value)
            if name == "max_new_tokens":
                self.max_new_tokens = parsed
            else:
                self.options = GenerationOptions.of(self.options, **{name: parsed})
            self.check()
        except SpeculantError as error:
            self.options, self.max_new_tokens = before
            self.show_error(error)
            return
        self.say(f"({name} = {parsed})")

    # -- an answer --------------------------------------------------------------------------
    def turn(self, messages: list[dict[str, str]]) -> tuple[str, GenerationOptions]:
        """The prompt of ``messages`` and the options of its answer: the settings with the
        end-of-turn stops and ``max_new_tokens`` set to the cap, else the rest of the
        context (an error where nothing is left)."""
        prompt, options = self.engine.prepare_chat(messages, self.options)
        room = answer_room(self.engine, len(self.engine.tokenizer.encode(prompt)), options)
        if room is not None and room < 1:
            raise RequestError("the conversation fills the context", path="messages",
                               remedy="/clear starts over")
        budget = [n for n in (room, self.max_new_tokens) if n is not None]
        return prompt, GenerationOptions.of(options, max_new_tokens=min(budget, default=NO_CAP))

    def answer(self, text: str) -> None:
        """Stream the answer to ``text``; Ctrl-C stops it, keeping the part shown."""
        asked = [*self.messages, {"role": "user", "content": text}]
        shown: list[str] = []
        pieces, is_stopped = None, False
        try:
            prompt, options = self.turn(asked)
            pieces = self.engine.stream(prompt, options)
            with pieces:
                for piece in pieces:
                    shown.append(piece)
                    self.out.write(piece)
                    self.out.flush()
        except KeyboardInterrupt:
            is_stopped = True
            if pieces is not None:
                pieces.close()
        except SpeculantError as error:
            self.out.write("\n" if shown else "")
            self.show_error(error)
            return
        self.out.write("\n")
        self.out.flush()
        if pieces is None:  # stopped before the answer began
            self.say("(stopped)")
            return
        self.last = pieces.result
        self.messages = [*asked, {"role": "assistant", "content": "".join(shown)}]
        if is_stopped:
            self.say("(stopped; the part shown stays in the conversation)")
        elif self.last.finish_reason == "length":
            self.say(f"(cut at max_new_tokens = {self.max_new_tokens}; /set max_new_tokens "
                     "none lifts it)" if self.max_new_tokens == len(self.last.token_ids) else
                     "(the conversation reached the end of the context; /clear starts over)")


def answer_room(engine: Any, num_prompt: int, options: GenerationOptions) -> int | None:
    """The most tokens an answer to a prompt of ``num_prompt`` tokens may take: what the
    context cap and the static caches (prompt + answer + k + 1 slots) leave; None: nothing
    bounds it."""
    plan = engine.package.plan
    caps = [] if plan.context_cap is None else [plan.context_cap - num_prompt]
    if plan.static is not None and plan.static.capacity is not None:
        caps.append(plan.static.capacity - num_prompt - 1 - widest_k(
            engine.proposer_sources, options.proposer, options.k))
    return min(caps) if caps else None


def _parse_setting(name: str, value: str) -> object:
    """A /set value as its option's type; ``none`` clears seed, max_new_tokens, proposer."""
    if value.lower() == "none" and name in ("seed", "max_new_tokens", "proposer"):
        return None
    try:
        if name in ("temperature", "top_p", "min_p"):
            return float(value)
        if name in ("top_k", "seed", "max_new_tokens"):
            number = int(value)
            if name == "max_new_tokens" and number < 1:
                raise ValueError
            return number
    except ValueError:
        raise RequestError(f"/set {name}: {value!r} is not a valid value", path=name,
                           value=value, expected="a number" if name != "max_new_tokens"
                           else "an integer >= 1, or none") from None
    return parse_width(value, is_text=True) if name == "k" else value
