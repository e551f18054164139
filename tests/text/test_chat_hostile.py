"""Hostile chat templates (review 2026-12-07 §2a; issue 38): each of the probe's 36 templates
ends, within a generous deadline, in a typed error naming ``tokenizer_config.json`` or in the
text jinja2's sandbox gives; a template that loops on some messages costs that request a
RequestError and leaves the engine serving; renders are capped in output; the worker that
renders them is reused, and replaced when it is killed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

import speculant
from builders.writers import write_decoder_package
from speculant import MetadataError, RequestError, SpeculantError
from speculant.cli import full_app
from speculant.text.chat import (
    ChatTemplate,
    TemplateLimits,
    chat_template_of,
    load_chat_template,
)
from speculant.text.template_worker import worker_for

GENEROUS_S = 60.0  # far above the 2 s deadline: only a hang or a wedged worker reaches it
LOOP = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
# only characters of the fixture vocabulary (letters, space, parentheses, newline)
PLAIN = ("{% for m in messages %}({{ m.role }}) {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}(assistant) {% endif %}")
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
HI = [{"role": "user", "content": "hi"}]

# The probe's 36 templates, by the groups of its §2a table. The value: the text the template
# renders for HI, or None where it cannot render HI (then it is refused where it is read).
HOSTILE: dict[str, tuple[str, str | None]] = {
    # sandbox escapes: refused as unsafe, or Undefined (an empty text)
    "cycler_popen": ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", None),
    "joiner_popen": ("{{ joiner.__init__.__globals__.os.popen('id').read() }}", None),
    "namespace_popen": ("{{ namespace.__init__.__globals__.os.popen('id').read() }}", None),
    "lipsum_globals": ("{{ lipsum.__globals__['os'].popen('id').read() }}", None),
    "subclasses": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", None),
    "attr_filter": ("{{ (messages|attr('__class__')).__mro__ }}", None),
    "str_format": ("{{ '{0.__class__}'.format(messages) }}", ""),
    "percent_format": ("{{ '%s'|format(messages.__class__) }}", ""),
    "raise_exception_globals": ("{{ raise_exception.__globals__ }}", ""),
    "template_reference": ("{{ self._TemplateReference__context }}", ""),
    "loop_cycle": ("{% for m in messages %}{{ loop.cycle.__globals__ }}{% endfor %}", ""),
    "join_self": ("{{ ''.join.__self__ }}", ""),
    "subscript_dunder": ("{{ ''['__class__'] }}", ""),
    # file reads: no loader (a TypeError inside jinja2)
    "include": ("{% include '/etc/passwd' %}", None),
    "import": ("{% import '/etc/passwd' as p %}{{ p }}", None),
    "extends": ("{% extends '/etc/passwd' %}", None),
    # mutation of the caller's data: the immutable sandbox
    "append": ("{{ messages.append(1) }}", None),
    "pop": ("{{ messages.pop() }}", None),
    "update": ("{{ messages[0].update({'role': 'x'}) }}", None),
    # time and memory
    "range_1e9": ("{% for x in range(10**9) %}{% endfor %}", None),  # OverflowError
    "nested_range": (LOOP, None),  # the deadline
    "str_1e8": ("{{ 'a' * 10**8 }}", None),  # the output cap, or the deadline compiling it
    "str_3e9": ("{{ 'a' * 3*10**9 }}", None),  # MemoryError under the worker's cap
    "str_1e10": ("{{ 'a' * 10**10 }}", None),
    "list_1e9": ("{{ [1] * 10**9 }}", None),
    "tojson_indent_1e8": ("{{ messages|tojson(indent=10**8) }}", None),
    "tojson_indent_1e9": ("{{ messages|tojson(indent=10**9) }}", None),
    "recursive_macro": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", None),
    "int_5000_digits": ("{{ 10**5000 }}", None),  # ValueError: int-to-str digit limit
    "power_tower": ("{{ 10**10**8 }}", "1" + "0" * 80),  # left-associative: (10**10)**8
    "range_join": ("{{ range(100000)|join(',') }}", ",".join(map(str, range(100000)))),
    # ordinary
    "raise_exception": ("{{ raise_exception('nope') }}", None),
    "undefined_attribute": ("{{ messages[0].nope.deeper }}", None),
    "syntax_error": ("{% for %}", None),
    "tojson": ("{{ messages|tojson }}", json.dumps(HI)),
    "chatml": (CHATML, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
}


def within(seconds: float, call: Callable[[], object]) -> object:
    """``call()``'s result (or its exception), failing the test if it runs past ``seconds``."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 (handed to the test below)
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]


def test_the_corpus_is_the_probes_36():
    assert len(HOSTILE) == 36


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_template_is_refused_by_name_or_renders_the_sandboxs_text(name):
    source, expected = HOSTILE[name]
    file = f"/pkg/{name}/tokenizer_config.json"

    def load_and_render() -> str:
        template = chat_template_of({"chat_template": source, "eos_token": "</s>"}, file)
        return template.render(HI)

    if expected is None:
        with pytest.raises(MetadataError) as caught:
            within(GENEROUS_S, load_and_render)
        assert caught.value.paths == ["chat_template"] and file in str(caught.value)
        assert "Remedy" in str(caught.value)
    else:
        assert within(GENEROUS_S, load_and_render) == expected


def with_template(root: Path, source: str) -> Path:
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": source, "bos_token": "", "eos_token": "</s>"}), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    return write_decoder_package(tmp_path_factory.mktemp("hostile-chat") / "decoder")


# one template of each group of the probe's table, through `speculant generate --chat`
CLI_CASES = ["cycler_popen", "str_format", "include", "append", "range_1e9", "nested_range",
             "str_1e10", "tojson_indent_1e9", "recursive_macro", "int_5000_digits",
             "range_join", "raise_exception", "chatml"]


@pytest.mark.parametrize("name", CLI_CASES)
def test_the_cli_reports_no_template_as_a_bug(decoder, tmp_path, name):
    root = with_template(Path(shutil.copytree(decoder, tmp_path / name)), HOSTILE[name][0])
    result = within(GENEROUS_S, lambda: CliRunner().invoke(full_app(), [
        "generate", str(root), "--chat", "--prompt", "hi", "--max-new-tokens", "4"]))
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if HOSTILE[name][1] is None:  # refused at load, naming the file
        assert result.exit_code == 2 and "tokenizer_config.json" in result.stderr


LOOPS_ON_REQUEST = ("{% if messages[-1].content == 'loop' %}" + LOOP + "{% endif %}" + PLAIN)


@pytest.fixture(scope="module")
def looping_engine(decoder, tmp_path_factory) -> speculant.Engine:
    root = Path(shutil.copytree(decoder, tmp_path_factory.mktemp("loops") / "pkg"))
    return speculant.load(with_template(root, LOOPS_ON_REQUEST))


def test_a_template_that_loops_on_a_request_is_a_request_error_and_the_engine_serves_on(
        looping_engine):
    """The probe's wedge: the nested range loop, reached only by some messages, so the
    package loads. The request gets a RequestError naming the file within the deadline; the
    next chat and the next completion are served."""
    expected = looping_engine.chat([{"role": "user", "content": "ab"}], 4)
    with pytest.raises(RequestError) as caught:
        within(GENEROUS_S, lambda: looping_engine.chat([{"role": "user", "content": "loop"}],
                                                       4))
    message = str(caught.value)
    assert "tokenizer_config.json" in message and "within 2 s" in message
    assert caught.value.paths == ["chat_template"]
    again = within(GENEROUS_S, lambda: looping_engine.chat([{"role": "user", "content": "ab"}],
                                                           4))
    assert again.token_ids == expected.token_ids
    assert within(GENEROUS_S, lambda: looping_engine.generate("ab", 4)).token_ids


def test_the_output_cap_is_a_request_error():
    template = ChatTemplate(PLAIN, "", "</s>", "/pkg/tokenizer_config.json",
                            limits=TemplateLimits(max_output_chars=100))
    assert template.render(HI) == "(user) hi\n(assistant) "
    with pytest.raises(RequestError) as caught:
        template.render([{"role": "user", "content": "a" * 200}])
    assert "more than 100 characters" in str(caught.value)
    assert "tokenizer_config.json" in str(caught.value) and "Remedy" in str(caught.value)


def test_one_worker_serves_every_render_and_a_killed_one_is_replaced():
    limits = TemplateLimits(deadline_s=5.0)  # a worker of its own
    template = ChatTemplate(PLAIN, "", "</s>", "/pkg/tokenizer_config.json", limits=limits)
    worker = worker_for(limits)
    first = worker._process.pid
    for _ in range(20):
        template.render(HI)
    assert worker._process.pid == first  # renders pay a round trip, not a process start
    os.kill(first, signal.SIGKILL)  # between renders
    assert template.render(HI) == "(user) hi\n(assistant) "
    assert worker._process.pid != first


def test_a_render_waits_for_a_busy_worker_a_bounded_time():
    limits = TemplateLimits(deadline_s=1.0)  # a worker of its own
    template = ChatTemplate(PLAIN, "", "</s>", "/pkg/tokenizer_config.json", limits=limits)
    worker = worker_for(limits)
    with worker._lock:  # as a slow render holds it
        with pytest.raises(RequestError) as caught:
            within(GENEROUS_S, lambda: template.render(HI))
    assert "busy" in str(caught.value) and "retry" in str(caught.value)
    assert template.render(HI) == "(user) hi\n(assistant) "


def test_messages_that_are_not_json_data_are_a_request_error():
    template = ChatTemplate(PLAIN, "", "</s>", "/pkg/tokenizer_config.json")
    with pytest.raises(RequestError) as caught:
        template.render([{"role": "user", "content": "hi", "tools": object()}])
    assert caught.value.paths == ["messages"]


@pytest.mark.parametrize("limits", [TemplateLimits(deadline_s=0),
                                    TemplateLimits(max_output_chars=-1),
                                    TemplateLimits(deadline_s=float("inf")),
                                    TemplateLimits(max_memory_bytes=float("nan"))])
def test_bad_limits_are_a_typed_error(limits):
    with pytest.raises(RequestError) as caught:
        load_chat_template(None, limits)
    assert caught.value.paths == ["template_limits"]


def test_the_worker_ends_with_its_parent():
    """The worker reads its requests from its parent's pipe: closing it ends the worker (a
    server that exits leaves no renderer behind)."""
    limits = TemplateLimits(deadline_s=7.0)
    ChatTemplate(PLAIN, "", "</s>", "/pkg/tokenizer_config.json", limits=limits)
    process = worker_for(limits)._process
    process.stdin.close()
    assert within(GENEROUS_S, process.wait) == 0


def test_every_failure_is_a_speculant_error():
    """The request-time mapping: each kind of failure a worker reports is typed."""
    template = ChatTemplate(
        "{% if messages|length > 2 %}{{ [1] * (messages|length * 10**9) }}{% endif %}" + PLAIN,
        "", "</s>",
        "/pkg/tokenizer_config.json")
    with pytest.raises(SpeculantError) as caught:
        template.render([*HI, *HI, *HI])
    assert isinstance(caught.value, RequestError) and "MemoryError" in str(caught.value)
    assert template.render(HI) == "(user) hi\n(assistant) "  # a fresh worker
