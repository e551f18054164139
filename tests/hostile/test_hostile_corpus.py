"""The package-corruption corpus (``corruption.CASES``) through the CLI: `inspect` runs the
same admission as `generate` (sessions and tokenizer included), so each case is refused by
both, with exit 2 and exactly one line on stderr, never a traceback."""

from __future__ import annotations

import pytest
from corruption import CASES
from hostile_helpers import one_line

ERROR_NAMES = ("MetadataError:", "UnsupportedError:", "AdmissionError:")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, decoder_template):
    """Each case written once (module scope): name -> package folder."""
    import shutil
    folders = {}
    for name, corrupt in CASES.items():
        root = tmp_path_factory.mktemp("corpus") / name
        shutil.copytree(decoder_template, root)
        corrupt(root)
        folders[name] = root
    return folders


def test_the_uncorrupted_package_passes_both_commands(cli, decoder_template):
    assert cli("inspect", decoder_template).exit_code == 0
    result = cli("generate", decoder_template, "--prompt", "def ", "--max-new-tokens", "4")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", ["inspect", "generate"])
def test_every_corruption_is_one_typed_line(cli, corpus, case, command):
    extra = ("--prompt", "def ", "--max-new-tokens", "4") if command == "generate" else ()
    result = cli(command, corpus[case], *extra)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    line = one_line(result)
    assert line.startswith(ERROR_NAMES), line
    assert len(line) < 3000, line


@pytest.mark.parametrize("case", ["graph_unknown_op", "external_truncated",
                                  "external_length_huge", "external_offset_negative",
                                  "external_length_folded"])
def test_the_installed_command_prints_one_line_where_onnx_runtime_refuses(corpus, case):
    """ONNX Runtime logs on file descriptor 2 itself, which CliRunner cannot see: run the
    console script for the cases it refuses and count every line of the real stderr."""
    import subprocess
    import sys
    from pathlib import Path
    script = Path(sys.executable).parent / "speculant"
    result = subprocess.run([str(script), "inspect", str(corpus[case])], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("AdmissionError:")
