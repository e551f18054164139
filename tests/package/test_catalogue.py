"""The published catalogue of the standard (onnx-genai's examples/inference_metadata/catalogue)
and onnx-genai's own test packages, copied into ``catalogue/`` (each file names its source).

Every document validates at the metadata level: never a MetadataError; what speculant cannot
execute is listed as UnsupportedError with its field path. Half of them are written in a later
revision of the standard than the published schema (contracts without ``rank``, ``family`` on
outputs, manifest ``ir_version``, ``padding``, schema v1.6 speculative forms): the schema
refuses them, speculant reads them (tests/package/test_later_revision.py). The support table
(docs/support.md) is checked against what speculant reports. No model weights: the graphs of
runnable documents are built from their declared ports.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from package_builders import SHARED, WF, write_package

from speculant.errors import UnsupportedError
from speculant.package import load_metadata_only, load_package

CATALOGUE = Path(__file__).parent / "catalogue"
DOCUMENTS = sorted(CATALOGUE.rglob("*.yaml"))
GROUPS = f"{WF}.serving.state_service.groups"

# Documents the published schema accepts (checked against it below, where ../shared exists);
# the others are written in a later revision.
SCHEMA_ACCEPTS = {"01-gemma4-text-decoder.yaml", "04-whisper-encoder-decoder.yaml",
                  "06-personaplex-full-duplex.yaml", "07-stable-diffusion-text-to-image.yaml",
                  "08-qwen-image-edit.yaml", "09-cogvideox-text-to-video.yaml",
                  "14-weathernext-rollout.yaml", "16-linear-attention-recurrent.yaml",
                  "18-static-cache-indexed-scatter.yaml",
                  "20-qwen3_5-hybrid-speculative-decoding.yaml",
                  "21-shared-prefix-pixel-flow.yaml", "23-gemma4-e2b-decoder.yaml",
                  "23-gemma4-e2b-moe-decoder.yaml", "24-gemma4-e2b-assistant-speculative.yaml"}
SUPPORT_TABLE = Path(__file__).resolve().parents[2] / "docs" / "support.md"
ROW = re.compile(r"^\| (?P<doc>[\w./-]+) \| .+ \| `(?P<path>[^`]+)` \|$")


def test_every_copied_document_has_its_source() -> None:
    assert len(DOCUMENTS) == 28
    for path in DOCUMENTS:
        assert path.read_text().startswith("# Source: justinchuby/onnx-genai "), path.name


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_every_document_validates_at_metadata_level(path: Path) -> None:
    _, unsupported = load_metadata_only(path)  # raises on any MetadataError
    for problem in unsupported:
        assert problem.kind is UnsupportedError and problem.path, problem.render()
        assert problem.path.split(".")[0] in ("pipeline", "speculative", "model", "package",
                                              "generation", "schema_version", "profiles",
                                              "adapters", "required_capabilities",
                                              "preprocessing"), problem.path


def test_the_support_table_names_what_stops_each_document() -> None:
    rows = {m["doc"]: m["path"] for line in SUPPORT_TABLE.read_text().splitlines()
            if (m := ROW.match(line))}
    for path in DOCUMENTS:
        name = str(path.relative_to(CATALOGUE).with_suffix(""))
        paths = {p.path for p in load_metadata_only(path)[1]}
        if paths:
            assert rows.get(name) in paths, (name, sorted(paths))
        else:
            assert name not in rows, f"{name} is runnable but has a row"
    assert len(rows) == sum(1 for p in DOCUMENTS if load_metadata_only(p)[1])


def test_the_classification_agrees_with_the_published_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema_file = SHARED / "conformance" / "inference_metadata.schema.json"
    if not schema_file.is_file():
        pytest.skip(f"no published schema at {schema_file} (a clone without ../shared)")
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    accepted = {p.name for p in DOCUMENTS
                if validator.is_valid(yaml.safe_load(p.read_text()))}
    assert accepted == SCHEMA_ACCEPTS


# -- the forms of issue 15, in the published documents ---------------------------------------
def test_a_loop_that_republishes_its_cells() -> None:
    # 14 emits `forecast`, a cell the loop carries, after the loop
    _, unsupported = load_metadata_only(CATALOGUE / "14-weathernext-rollout.yaml")
    assert f"{WF}.steps.0.kind" in {p.path for p in unsupported}


@pytest.mark.parametrize("name", ["07-stable-diffusion-text-to-image.yaml",
                                  "08-qwen-image-edit.yaml", "09-cogvideox-text-to-video.yaml"])
def test_a_loop_with_setup_steps(name: str) -> None:
    # the body reads the setup outputs (conditioning.*), the carried cell and loop.iteration
    _, unsupported = load_metadata_only(CATALOGUE / name)
    assert f"{WF}.steps.0.kind" in {p.path for p in unsupported}


def test_sharding_does_not_stop_a_single_device_load(tmp_path: Path) -> None:
    path = CATALOGUE / "23-gemma4-e2b-moe-decoder.yaml"
    doc = yaml.safe_load(path.read_text())
    assert doc["model"]["sharding"]
    _, unsupported = load_metadata_only(path)
    assert unsupported == []
    package = load_package(write_package(tmp_path, doc))  # graphs from the declared ports
    assert package.plan.target == "decoder"
    assert set(package.plan.cells) == set(doc["pipeline"]["workflow"]["state"])


def test_optional_inputs_and_discarded_outputs_are_unsupported_not_invalid() -> None:
    # 21: two optional inputs observed through present_as (no default, as the standard
    # requires), and read_only aliases naming the output they discard
    _, unsupported = load_metadata_only(CATALOGUE / "21-shared-prefix-pixel-flow.yaml")
    paths = {p.path for p in unsupported}
    assert {f"{WF}.inputs.request.image.present_as", f"{WF}.inputs.request.latent.present_as",
            f"{GROUPS}.conditional_prefix.ports.image_gen_denoiser.conditional_cache_0.output",
            f"{GROUPS}.unconditional_prefix.ports.image_gen_denoiser.unconditional_cache_1.output",
            } <= paths


def test_a_hybrid_speculative_document_lists_what_stops_it() -> None:
    _, unsupported = load_metadata_only(
        CATALOGUE / "20-qwen3_5-hybrid-speculative-decoding.yaml")
    paths = {p.path for p in unsupported}
    assert {f"{GROUPS}.linear_recurrence.kind", f"{GROUPS}.causal_conv.update.kind",
            "speculative.proposal_execution.kind"} <= paths


def test_a_later_revision_decoder_loads(tmp_path: Path) -> None:
    # 25 leaves out every contract's rank: the ports built from the shapes load as a package
    doc = yaml.safe_load((CATALOGUE / "25-gemma4-26b-a4b-moe-decoder.yaml").read_text())
    package = load_package(write_package(tmp_path, doc))
    assert package.plan.target == "decoder"
    assert set(package.plan.cells) == set(doc["pipeline"]["workflow"]["state"])
