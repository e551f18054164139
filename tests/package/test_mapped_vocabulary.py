"""``speculative.vocabulary: {kind: mapped, artifact}`` at load: the map is read once and
admitted (A8: one distinct target id per proposer id), one test per message; and the
published document that declares it (catalogue 22) is no longer refused for it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from builders import definition as fx
from builders import write_chained_package
from builders.metadata import VOCABULARY_MAP
from speculant.errors import AdmissionError, MetadataError
from speculant.package import load_metadata_only, load_package

MAP = (0, 3, 5, 9, 17, 30)
PATH = "speculative.vocabulary.artifact"
CATALOGUE_22 = Path(__file__).parent / "catalogue" / "22-qwen3-chained-speculative-decoding.yaml"


@pytest.fixture(scope="module")
def mapped_root(tmp_path_factory) -> Path:
    return write_chained_package(tmp_path_factory.mktemp("mapped"), proposer_vocab_map=MAP)


def with_map(tmp_path: Path, mapped_root: Path, data: bytes, name: str = VOCABULARY_MAP) -> Path:
    root = tmp_path / "pair"
    shutil.copytree(mapped_root, root)
    (root / VOCABULARY_MAP).unlink()
    (root / name).write_bytes(data)
    if name != VOCABULARY_MAP:
        metadata = root / "inference_metadata.yaml"
        document = yaml.safe_load(metadata.read_text())
        document["speculative"]["vocabulary"]["artifact"] = name
        metadata.write_text(yaml.safe_dump(document, sort_keys=False))
    return root


def map_problem(root: Path):
    with pytest.raises((AdmissionError, MetadataError)) as info:
        load_package(root)
    hits = [p for p in info.value.problems if p.path == PATH]
    assert hits, info.value
    return hits[0]


def test_a_mapped_pair_loads_with_its_map(mapped_root: Path) -> None:
    package = load_package(mapped_root)
    assert package.document.speculative.vocabulary.kind == "mapped"
    assert np.fromfile(package.root / VOCABULARY_MAP, "<i8").tolist() == list(MAP)


def test_an_npy_map_loads(tmp_path: Path, mapped_root: Path) -> None:
    root = with_map(tmp_path, mapped_root, b"", "map.npy")
    np.save(root / "map.npy", np.asarray(MAP, np.int32))
    assert load_package(root).document.speculative.vocabulary.artifact == "map.npy"


def test_a_map_of_the_wrong_length(tmp_path: Path, mapped_root: Path) -> None:
    problem = map_problem(with_map(tmp_path, mapped_root,
                                   np.asarray(MAP[:-1], "<i8").tobytes()))
    assert problem.rule == "A8" and f"5 entries for {len(MAP)} proposer ids" in problem.message
    assert problem.file.endswith(VOCABULARY_MAP)


def test_a_map_outside_the_target_ids(tmp_path: Path, mapped_root: Path) -> None:
    ids = (*MAP[:-1], fx.VOCAB_SIZE)
    problem = map_problem(with_map(tmp_path, mapped_root, np.asarray(ids, "<i8").tobytes()))
    assert "outside the target's ids" in problem.message
    assert f"[0, {fx.VOCAB_SIZE})" in problem.expected


def test_a_negative_id(tmp_path: Path, mapped_root: Path) -> None:
    ids = (-1, *MAP[1:])
    problem = map_problem(with_map(tmp_path, mapped_root, np.asarray(ids, "<i8").tobytes()))
    assert "outside the target's ids" in problem.message and problem.value[0] == -1


def test_two_proposer_ids_on_one_target_id(tmp_path: Path, mapped_root: Path) -> None:
    ids = (*MAP[:-1], MAP[0])
    problem = map_problem(with_map(tmp_path, mapped_root, np.asarray(ids, "<i8").tobytes()))
    assert "two proposer ids to one target id" in problem.message


def test_bytes_that_are_not_int64_values(tmp_path: Path, mapped_root: Path) -> None:
    problem = map_problem(with_map(tmp_path, mapped_root, b"\x01" * 12))
    assert "12 bytes are not whole int64 values" in problem.message
    assert "raw little-endian int64" in problem.expected


def test_a_float_npy_map(tmp_path: Path, mapped_root: Path) -> None:
    root = with_map(tmp_path, mapped_root, b"", "map.npy")
    np.save(root / "map.npy", np.asarray(MAP, np.float32))
    assert "not a 1-D integer array" in map_problem(root).message


def test_a_missing_map(tmp_path: Path, mapped_root: Path) -> None:
    root = with_map(tmp_path, mapped_root, b"")
    (root / VOCABULARY_MAP).unlink()
    problem = map_problem(root)
    assert problem.kind is MetadataError and "does not exist" in problem.message


def test_a_map_outside_the_package(tmp_path: Path, mapped_root: Path) -> None:
    root = with_map(tmp_path, mapped_root, b"")
    outside = tmp_path / "elsewhere.i64"
    outside.write_bytes(np.asarray(MAP, "<i8").tobytes())
    (root / VOCABULARY_MAP).unlink()
    (root / VOCABULARY_MAP).symlink_to(outside)
    assert "outside the package folder" in map_problem(root).message


def test_a_mapped_vocabulary_without_its_artifact(tmp_path: Path, mapped_root: Path) -> None:
    root = with_map(tmp_path, mapped_root, np.asarray(MAP, "<i8").tobytes())
    metadata = root / "inference_metadata.yaml"
    document = yaml.safe_load(metadata.read_text())
    del document["speculative"]["vocabulary"]["artifact"]
    metadata.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(MetadataError) as info:
        load_package(root)
    assert any("mapped vocabulary needs artifact" in p.message for p in info.value.problems)


def test_catalogue_22_is_not_refused_for_its_mapped_vocabulary() -> None:
    document, unsupported = load_metadata_only(CATALOGUE_22)
    assert document.speculative.vocabulary.kind == "mapped"
    paths = {p.path for p in unsupported}
    assert not any(path.startswith("speculative.vocabulary") for path in paths), paths
    assert "speculative.proposal_execution.recurrent" in paths  # what still stops it
