"""The published catalogue of the standard (onnx-genai's examples/inference_metadata/catalogue)
and onnx-genai's own test packages, copied into ``catalogue/`` (each file names its source).

A document the published schema accepts validates at the metadata level: never a
MetadataError; what speculant cannot execute is listed as UnsupportedError with its field path.
The index holds some documents only in an earlier or later revision of the standard, which the
published schema refuses (contracts without ``rank``, ``family`` on outputs, manifest
``ir_version``, schema v1.6 speculative forms); speculant refuses those too, naming the field.
No model weights: the graphs of runnable documents are built from their declared ports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from package_builders import SHARED, WF, write_package

from speculant.errors import MetadataError, UnsupportedError
from speculant.package import load_metadata_only, load_package

CATALOGUE = Path(__file__).parent / "catalogue"
DOCUMENTS = sorted(CATALOGUE.rglob("*.yaml"))
GROUPS = f"{WF}.serving.state_service.groups"

# Documents the published schema accepts (checked against it below, where ../shared exists).
VALID = {"01-gemma4-text-decoder.yaml", "04-whisper-encoder-decoder.yaml",
         "06-personaplex-full-duplex.yaml", "07-stable-diffusion-text-to-image.yaml",
         "08-qwen-image-edit.yaml", "09-cogvideox-text-to-video.yaml",
         "14-weathernext-rollout.yaml", "16-linear-attention-recurrent.yaml",
         "18-static-cache-indexed-scatter.yaml", "20-qwen3_5-hybrid-speculative-decoding.yaml",
         "23-gemma4-e2b-decoder.yaml", "23-gemma4-e2b-moe-decoder.yaml",
         "24-gemma4-e2b-assistant-speculative.yaml"}
# The others, and the key (last part of a reported path) that both the schema and speculant
# refuse in the revision the index holds.
REFUSED = {"02-cosmos3-edge-rollout.yaml": "rank", "03-qwen3_5-vlm.yaml": "rank",
           "05-wav2vec2-ctc.yaml": "padding", "10-lora-adapter-selection.yaml": "rank",
           "19-operator-abi-comparison.yaml": "rank",
           "11-speculative-proposer-verifier.yaml": "ir_version",
           "12-esm2-protein-encoder.yaml": "rank", "13-protbert-protein-encoder.yaml": "rank",
           "15-windowed-attention.yaml": "rank",
           "17-causal-convolution-recurrent.yaml": "onnx_opsets",
           "22-qwen3-chained-speculative-decoding.yaml": "family",
           "25-gemma4-26b-a4b-moe-decoder.yaml": "rank",
           "model-package-cpu.yaml": "family", "unsupported-candidate-tree.yaml": "identity"}


def test_every_copied_document_is_classified() -> None:
    assert {p.name for p in DOCUMENTS} == VALID | REFUSED.keys()
    for path in DOCUMENTS:
        assert path.read_text().startswith("# Source: justinchuby/onnx-genai "), path.name


@pytest.mark.parametrize("path", [p for p in DOCUMENTS if p.name in VALID], ids=lambda p: p.name)
def test_a_valid_document_validates_at_metadata_level(path: Path) -> None:
    _, unsupported = load_metadata_only(path)  # raises on any MetadataError
    for problem in unsupported:
        assert problem.kind is UnsupportedError and problem.path, problem.render()
        assert problem.path.split(".")[0] in ("pipeline", "speculative", "model", "package",
                                              "generation", "schema_version",
                                              "required_capabilities"), problem.path


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_document_the_schema_refuses_is_refused(name: str) -> None:
    path = next(p for p in DOCUMENTS if p.name == name)
    with pytest.raises(MetadataError) as info:
        load_metadata_only(path)
    assert REFUSED[name] in {p.path.split(".")[-1] for p in info.value.problems}, \
        info.value.paths


def test_the_classification_agrees_with_the_published_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema_file = SHARED / "conformance" / "inference_metadata.schema.json"
    if not schema_file.is_file():
        pytest.skip(f"no published schema at {schema_file} (a clone without ../shared)")
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    accepted = {p.name for p in DOCUMENTS
                if validator.is_valid(yaml.safe_load(p.read_text()))}
    assert accepted == VALID


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


def test_a_hybrid_speculative_document_lists_what_stops_it() -> None:
    _, unsupported = load_metadata_only(
        CATALOGUE / "20-qwen3_5-hybrid-speculative-decoding.yaml")
    paths = {p.path for p in unsupported}
    assert {f"{GROUPS}.linear_recurrence.kind", f"{GROUPS}.causal_conv.update.kind",
            "speculative.proposal_execution.kind"} <= paths
