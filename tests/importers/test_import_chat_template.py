"""A chat template is checked where it is imported (review 2026-12-07 §2e; issue 38): a GGUF's
``tokenizer.chat_template`` that loops, escapes the sandbox or does not compile is refused by
``speculant import`` with an ImporterError naming the file, before anything is written."""

from __future__ import annotations

import gguf_models
import pytest
from gguf_models import write_gguf

from speculant_tools.importers import ImporterError, import_model
from speculant_tools.importers.checkpoint import check_chat_template

LOOP = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize(("template", "reason"), [
    (LOOP, "within 2 s"),
    ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "unsafe"),
    ("{% for %}", "does not compile"),
    ("{% include '/etc/passwd' %}", "no loader"),
])
def test_a_gguf_template_that_cannot_render_is_refused_at_import(tmp_path, weights, monkeypatch,
                                                                  template, reason):
    monkeypatch.setattr(gguf_models, "CHAT_TEMPLATE", template)
    path = write_gguf(tmp_path / "hostile.gguf", weights)
    with pytest.raises(ImporterError) as caught:
        import_model(path, tmp_path / "out")
    assert caught.value.paths == ["chat_template"] and str(path) in str(caught.value)
    assert reason in str(caught.value) and "Remedy" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_a_folder_template_is_checked_alike():
    """The check every importer calls: tokenizer_config.json (with chat_template.jinja folded
    in) of a Hugging Face or onnxruntime-genai folder."""
    check_chat_template({"chat_template": gguf_models.CHAT_TEMPLATE}, "folder")
    check_chat_template({}, "folder")  # no template: nothing to check
    with pytest.raises(ImporterError) as caught:
        check_chat_template({"chat_template": "{{ raise_exception('never') }}"}, "folder")
    assert caught.value.paths == ["chat_template"] and "never" in str(caught.value)
