"""Parsing is bounded and every parse failure is typed (review D1, D2, D3, §2 case 22):
alias bombs, recursive aliases, deep nesting, lone surrogates, invalid UTF-8, and a metadata
file that is a symlink out of its package."""

from __future__ import annotations

import json
import os
import time

import pytest
from hostile_helpers import billion_laughs, laughs, one_line

from speculant import load
from speculant.errors import MetadataError
from speculant.package import load_metadata_only, load_package
from speculant.package.document import MAX_DEPTH, MAX_NODES


def refused(path, *words: str) -> MetadataError:
    """load_metadata_only(path) raises a MetadataError naming the file and ``words``, fast."""
    started = time.perf_counter()
    with pytest.raises(MetadataError) as caught:
        load_metadata_only(path)
    assert time.perf_counter() - started < 2.0
    message = str(caught.value)
    assert str(path) in message and "\n" not in message and len(message) < 1000, message
    for word in words:
        assert word in message, (word, message)
    return caught.value


def test_the_545_byte_billion_laughs_is_refused_at_parse_time(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(billion_laughs())
    assert path.stat().st_size == 545
    refused(path, f"more than {MAX_NODES:,} nodes with its aliases expanded")


@pytest.mark.parametrize("levels", [5, 6])
def test_a_bomb_under_the_budget_is_reported_with_a_small_message(tmp_path, levels):
    """9**5 and 9**6 strings as ``schema_version`` (within the node budget for 5 levels; the
    6-level one with its anchors is over it): typed, fast, a message of a few hundred
    characters (the review saw 35-80 MB messages for shallow bombs)."""
    path = tmp_path / "bomb.yaml"
    path.write_text(f"quantization: {laughs(levels)}\nschema_version: *l{levels}\n")
    refused(path, "schema_version" if levels == 5 else "aliases expanded")


def test_a_bomb_in_an_input_default_is_reported_with_a_small_message(tmp_path, decoder_copy):
    """The `default_problem` path (rules.py): the first bad element is echoed, bounded."""
    root = decoder_copy()
    metadata = root / "inference_metadata.yaml"
    text = metadata.read_text().replace("        default: 64", "        default: *l5")
    metadata.write_text(f"quantization: {laughs(5)}\n" + text)
    refused(metadata, "package.max_context")


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "recursive.yaml"
    path.write_text("quantization: {a: &r [1, *r]}\n")
    refused(path, "recursive alias at line 1")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
def test_deep_json_is_a_metadata_error_not_a_recursion_error(tmp_path, depth):
    path = tmp_path / "deep.json"
    path.write_text('{"quantization": {"a": ' + "[" * depth + "]" * depth + "}}")
    refused(path, f"more than {MAX_DEPTH} levels")


@pytest.mark.parametrize("style", ["flow", "block"])
def test_deep_yaml_is_a_metadata_error(tmp_path, style):
    path = tmp_path / "deep.yaml"
    if style == "flow":
        path.write_text("quantization: {a: " + "[" * 1000 + "]" * 1000 + "}\n")
    else:
        path.write_text("quantization:\n" + "".join(f"{' ' * i}k{i}:\n" for i in range(1, 600))
                        + " " * 600 + "end: 1\n")
    refused(path, "levels" if style == "block" else "")


def test_nesting_at_the_limit_is_accepted(tmp_path):
    path = tmp_path / "nested.json"
    depth = MAX_DEPTH - 2  # the root mapping and "quantization" are two levels
    path.write_text('{"quantization": {"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}}")
    document, _ = load_metadata_only(path)
    assert document.quantization


@pytest.mark.parametrize("text", ['{"schema_version": "\\ud800"}',
                                  '{"quantization": {"\\udfff": 1}}',
                                  '{"quantization": {"a": ["ok", "x\\ud83d"]}}'])
def test_a_lone_surrogate_in_json_is_refused(tmp_path, text):
    path = tmp_path / "surrogate.json"
    path.write_text(text)
    refused(path, "lone surrogate")


def test_a_surrogate_pair_in_json_is_text(tmp_path):
    path = tmp_path / "pair.json"
    path.write_text('{"quantization": {"emoji": "\\ud83d\\ude00"}}')
    document, _ = load_metadata_only(path)
    assert document.quantization == {"emoji": "\U0001f600"}


def test_inspect_metadata_only_of_a_lone_surrogate_prints_one_line(cli, tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"schema_version": "\\ud800"}')
    for extra in ((), ("--json",)):
        result = cli("inspect", "--metadata-only", path, *extra)
        assert result.exit_code == 2
        assert one_line(result).startswith("MetadataError:")


@pytest.mark.parametrize("name", ["inference_metadata.yaml", "inference_metadata.json"])
def test_invalid_utf8_in_the_metadata_file_is_typed(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b'{"schema_version": "v1\xff\xfe"}\n')
    refused(path, "UTF-8")


def test_invalid_utf8_in_tokenizer_json_is_typed_at_load(decoder_copy):
    root = decoder_copy()
    (root / "tokenizer.json").write_bytes(b'{"version": "1.0", "model": "\xff\xfe"}')
    with pytest.raises(MetadataError, match="cannot load the tokenizer"):
        load(root)


def test_a_metadata_file_linked_from_outside_the_package_is_refused(decoder_copy, tmp_path):
    root = decoder_copy()
    outside = tmp_path / "elsewhere.yaml"
    os.replace(root / "inference_metadata.yaml", outside)
    (root / "inference_metadata.yaml").symlink_to(outside)
    with pytest.raises(MetadataError, match="outside the package folder"):
        load_package(root)
    with pytest.raises(MetadataError, match="outside the package folder"):
        load_metadata_only(root)
    load_metadata_only(outside)  # the file itself, named directly, is no package: accepted


def test_a_metadata_file_linked_inside_the_package_is_accepted(decoder_copy):
    root = decoder_copy()
    os.replace(root / "inference_metadata.yaml", root / "decoder" / "meta.yaml")
    (root / "inference_metadata.yaml").symlink_to("decoder/meta.yaml")
    assert load_package(root).metadata_file.name == "inference_metadata.yaml"


def test_json_and_yaml_limits_agree(tmp_path):
    """One node budget for both formats: a JSON document of more than MAX_NODES nodes."""
    path = tmp_path / "wide.json"
    path.write_text(json.dumps({"quantization": {"a": [0] * (MAX_NODES + 1)}}))
    refused(path, f"more than {MAX_NODES:,} nodes")
