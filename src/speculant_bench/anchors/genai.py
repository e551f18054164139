"""The onnxruntime-genai anchor: the same target, exported by genai's own model builder from
the Hugging Face checkpoint, decoded by its ``Generator``.

    python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p fp32 -e cpu -c CACHE

(offline: ``-i`` a local folder, ``HF_HUB_OFFLINE=1``; ``-p`` the checkpoint's dtype, so
float32 packages are built ``fp32`` and float16 ones ``fp16``). Known pitfalls of the builder,
and what this module does about them:

- it ignores the tokenizer's BOS post-processor: the bench feeds token ids, never text;
- it takes *any* ``nn.Linear`` whose width equals the vocabulary size for the LM head
  (``has_lm_head``: ``out_features == vocab_size``), so a projection of that width would be
  wired as the head: :func:`lm_head_clashes` checks every projection width against the
  vocabulary before building, and the anchor is skipped when one matches;
- for CUDA in float32 it has no GroupQueryAttention (that kernel is float16/bfloat16 on CUDA)
  and falls back to the ``com.microsoft`` ``Attention`` op, which it leaves without its KV cache
  when the model has fewer KV heads than heads (the graph declares ``present.*`` outputs that
  no node produces, and ONNX Runtime refuses to load it): :func:`missing_outputs` checks the
  built graph, and the anchor is skipped with that reason (a float16 package, from
  ``speculant convert --dtype float16``, builds with GroupQueryAttention);
- its sessions take ONNX Runtime's default thread count: :func:`patch_config` writes
  ``intra_op_num_threads`` into every ``session_options`` block (target and draft);
- ``eos_token_id`` *and* ``pad_token_id`` end a decode, and neither may be left out:
  :func:`patch_config` sets ``eos_token_id`` to ``[]`` and ``pad_token_id`` to an id the
  reference greedy decode never emits (so, as long as genai's tokens equal the reference,
  every decode runs to N tokens; the record says whether each did).

On CUDA every mode also runs in genai's fastest configuration, CUDA graphs: the same models
with ``enable_cuda_graph: "1"`` in every decoder's CUDA provider options (and
``search.past_present_share_buffer``, which graph capture needs), in folders of their own
(``target-cuda-graph/``, ``cuda-graph/``) whose config is that edit and whose model files are
links to the built ones (:func:`cuda_graph_config`, :func:`link_variant`). A mode genai does
not capture is skipped with genai's own error on its first decode, as any failing mode is.

Modes: ``greedy`` (the target's config); ``ngram k`` (``ngram_size`` 4, i.e. the last 3 tokens
as speculant's prompt lookup, ``max_draft_tokens`` k, fixed width); ``draft k`` (a composite
config whose ``model.draft`` is the draft model, built by the same builder;
``max_draft_tokens`` k). ``k=auto`` is genai's adaptive width (``min_adaptive_k`` 1, up to
``ADAPTIVE_MAX_DRAFT_TOKENS``), the counterpart of speculant's ``k="auto"``. genai rejects
``..`` in config paths, so the composite config sits in the folder that holds ``target/`` and
``draft/``.

A prebuilt folder (``prebuilt``: the bench's ``--genai-model``) replaces the build of the
target: :func:`read_prebuilt` takes its builder config (``genai_config.builder.json`` where an
earlier bench run kept it, else ``genai_config.json``), and ``target-prebuilt/`` holds links
to its files under the patched config, so the folder itself is never written.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from speculant_bench.anchors.base import (
    AnchorDecode,
    AnchorError,
    AnchorRunner,
    AnchorSetup,
    fingerprint,
    is_current,
    mark,
)

BUILDER_MODULE = "onnxruntime_genai.models.builder"
PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}  # checkpoint → -p
BUILT_CONFIG = "genai_config.builder.json"  # the builder's config, kept as it wrote it
NGRAM_SIZE = 4  # genai matches the last ngram_size - 1 tokens: 3, as speculant's n_max
AUTO = "auto"  # the k of genai's adaptive width
ADAPTIVE_MAX_DRAFT_TOKENS = 8  # the widest default width of the bench (runners.KS)
PREBUILT = "target-prebuilt"  # links to a prebuilt folder's files, under the patched config
STATS_KEYS = ("rounds", "draft_tokens_proposed", "draft_tokens_evaluated",
              "draft_tokens_accepted", "correction_tokens", "bonus_tokens",
              "draft_forward_passes", "target_forward_passes")


# -- pure parts: checks, the builder's command line, the config edits ------------------------
def projection_widths(hf_config: dict) -> dict[str, int]:
    """Output width of each ``nn.Linear`` of a Llama layer (the modules the builder scans)."""
    hidden = hf_config["hidden_size"]
    heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hidden // heads
    kv_heads = hf_config.get("num_key_value_heads") or heads
    return {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim,
            "v_proj": kv_heads * head_dim, "o_proj": hidden,
            "gate_proj": hf_config["intermediate_size"],
            "up_proj": hf_config["intermediate_size"], "down_proj": hidden}


def lm_head_clashes(hf_config: dict) -> list[str]:
    """Projections whose width equals the vocabulary size: the builder would take each for
    the LM head. Empty when the checkpoint is safe to build."""
    vocab = hf_config["vocab_size"]
    return [name for name, width in projection_widths(hf_config).items() if width == vocab]


def builder_precision(hf_config: dict) -> str:
    """The builder's ``-p`` for a checkpoint: its own dtype (the same weights)."""
    dtype = hf_config.get("torch_dtype") or hf_config.get("dtype") or "float32"
    if dtype not in PRECISIONS:
        raise AnchorError(f"the checkpoint's dtype {dtype!r} has no builder precision; "
                          f"known: {', '.join(PRECISIONS)}")
    return PRECISIONS[dtype]


def builder_command(hf_dir: Path, out_dir: Path, cache_dir: Path, device: str,
                    python: str = sys.executable, precision: str = "fp32") -> list[str]:
    execution_provider = "cuda" if device.startswith("cuda") else "cpu"
    return [python, "-m", BUILDER_MODULE, "-i", str(hf_dir), "-o", str(out_dir), "-p",
            precision, "-e", execution_provider, "-c", str(cache_dir)]


def missing_outputs(model) -> list[str]:
    """Graph outputs of an ONNX model that no node, input or initializer produces."""
    graph = model.graph
    produced = ({o for node in graph.node for o in node.output}
                | {i.name for i in graph.input} | {t.name for t in graph.initializer})
    return [o.name for o in graph.output if o.name not in produced]


def unused_token_id(vocab_size: int, emitted: Iterable[int], avoid: Iterable[int] = ()) -> int:
    """The highest id below ``vocab_size`` that is neither emitted nor avoided."""
    taken = set(emitted) | set(avoid)
    for token in range(vocab_size - 1, -1, -1):
        if token not in taken:
            return token
    raise AnchorError("every token id of the vocabulary is emitted by the reference decode, "
                      "so none can serve as onnxruntime-genai's pad id (which ends a decode)")


def _decoder_blocks(config: dict) -> list[dict]:
    model = config["model"]
    return [model[key] for key in ("decoder", "draft") if isinstance(model.get(key), dict)]


def patch_config(config: dict, *, threads: int | None, pad_token_id: int,
                 device_id: int | None = None) -> dict:
    """A copy of a builder's ``genai_config.json`` with the bench's settings: the thread count
    in every session (when given), no EOS, a pad id that is never emitted, and the CUDA
    device (when given)."""
    patched = copy.deepcopy(config)
    for block in _decoder_blocks(patched):
        options = block.setdefault("session_options", {})
        if threads is not None:
            options["intra_op_num_threads"] = threads
        if device_id is not None:
            for provider in options.get("provider_options", []):
                if "cuda" in provider:
                    provider["cuda"]["device_id"] = str(device_id)
    patched["model"]["eos_token_id"] = []
    patched["model"]["pad_token_id"] = pad_token_id
    return patched


CUDA_GRAPH = "cuda graph"  # the variant's name in the runner names and the report


def cuda_graph_config(config: dict) -> dict:
    """A copy of a (patched) ``genai_config.json`` with CUDA graph capture on: the CUDA
    provider options of the decoder (and of the draft model's block) get
    ``enable_cuda_graph: "1"``, and the KV buffers are shared between past and present
    (``search.past_present_share_buffer``; genai captures only with static buffers). A
    config without a CUDA provider block cannot capture: AnchorError."""
    patched = copy.deepcopy(config)
    for block in _decoder_blocks(patched):
        providers = block.get("session_options", {}).get("provider_options", [])
        cuda = [entry["cuda"] for entry in providers if "cuda" in entry]
        if not cuda:
            raise AnchorError("onnxruntime-genai's CUDA graphs need the CUDA provider, and "
                              f"the {block.get('filename', 'decoder')} config has none "
                              f"(provider_options {providers})")
        for options in cuda:
            options["enable_cuda_graph"] = "1"
    patched.setdefault("search", {})["past_present_share_buffer"] = True
    return patched


def link_variant(source: Path, folder: Path, config: dict,
                 entries: Sequence[str] | None = None) -> Path:
    """``folder`` with ``genai_config.json`` = ``config`` and a link to each entry of
    ``source`` (default: every file but its config and stamp), so genai loads the built model
    files under another config without copying them."""
    folder.mkdir(parents=True, exist_ok=True)
    names = entries if entries is not None else [
        p.name for p in sorted(source.iterdir())
        if p.name not in ("genai_config.json", BUILT_CONFIG) and not p.name.startswith(".")]
    for name in names:
        link = folder / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to((source / name).resolve())
    (folder / "genai_config.json").write_text(json.dumps(config, indent=4))
    return folder


def compose_draft_config(target: dict, draft: dict, *, target_subdir: str = "target",
                         draft_subdir: str = "draft", k: int = 4) -> dict:
    """The target's config with ``model.draft`` = the draft's decoder block; filenames point
    into the two subfolders of the folder the composite config is written to."""
    if target["model"]["vocab_size"] != draft["model"]["vocab_size"]:
        raise AnchorError(f"the draft's vocabulary ({draft['model']['vocab_size']}) differs "
                          f"from the target's ({target['model']['vocab_size']})")
    composite = copy.deepcopy(target)
    decoder = composite["model"]["decoder"]
    decoder["filename"] = f"{target_subdir}/{decoder['filename']}"
    block = copy.deepcopy(draft["model"]["decoder"])
    block["filename"] = f"{draft_subdir}/{block['filename']}"
    composite["model"]["draft"] = block
    composite["speculative"] = {"max_draft_tokens": k}
    return composite


def speculative_options(mode: str, k: int | str) -> dict | None:
    """``GeneratorParams.set_speculative_options`` keywords of a mode (None: greedy); k =
    ``auto``: genai's adaptive width, its cooldown left at genai's default."""
    if mode == "greedy":
        return None
    fixed = ({"max_draft_tokens": ADAPTIVE_MAX_DRAFT_TOKENS, "min_adaptive_k": 1}
             if k == AUTO else {"max_draft_tokens": k, "min_adaptive_k": 0, "cooldown": False})
    if mode == "ngram":
        return {"ngram_size": NGRAM_SIZE, **fixed}
    if mode == "draft":
        return fixed
    raise ValueError(f"unknown onnxruntime-genai anchor mode {mode!r}")


def device_id(device: str) -> int | None:
    return int(device.split(":", 1)[1]) if device.startswith("cuda:") else None


# -- building and running ---------------------------------------------------------------------
def build(hf_dir: Path, out_dir: Path, cache_dir: Path, device: str) -> tuple[list[str], bool]:
    """Run the builder (offline) into ``out_dir``, its log beside it, and keep its config as
    ``genai_config.builder.json``; skipped when an earlier run built the same checkpoint with
    the same command there. Returns the command and whether the earlier build was reused."""
    command = builder_command(hf_dir, out_dir, cache_dir, device,
                              precision=builder_precision(_hf_config(hf_dir)))
    made_from = fingerprint(hf_dir, extra=" ".join(command[1:]))
    if is_current(out_dir, made_from) and (out_dir / BUILT_CONFIG).is_file():
        return command, True
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    log = out_dir.with_name(out_dir.name + ".builder.log")
    with log.open("w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                              check=False)
    if done.returncode != 0 or not (out_dir / "genai_config.json").is_file():
        tail = log.read_text().strip().splitlines()[-6:]
        raise AnchorError(f"the onnxruntime-genai model builder failed on {hf_dir} (exit "
                          f"{done.returncode}): {' | '.join(tail)}")
    check_graph(out_dir, command)
    (out_dir / BUILT_CONFIG).write_text((out_dir / "genai_config.json").read_text())
    mark(out_dir, made_from)
    return command, False


def check_graph(out_dir: Path, command: Sequence[str]) -> None:
    """Refuse a built model whose declared outputs are not all produced (ONNX Runtime would
    refuse to load it), naming them and the builder's precision and device."""
    import onnx

    config = json.loads((out_dir / "genai_config.json").read_text())
    model = onnx.load(str(out_dir / config["model"]["decoder"]["filename"]),
                      load_external_data=False)
    missing = missing_outputs(model)
    if missing:
        ops = sorted({n.op_type for n in model.graph.node if "Attention" in n.op_type})
        raise AnchorError(
            f"the onnxruntime-genai builder ({' '.join(command[command.index('-p'):][:4])}) "
            f"wrote "
            f"a graph that declares {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}"
            f" ({len(missing)} outputs) that no node produces (attention op: "
            f"{', '.join(ops) or 'none'}), which ONNX Runtime refuses to load; for CUDA in "
            "float32 the builder has no GroupQueryAttention and leaves the fallback Attention "
            "op without its KV cache. A float16 package (speculant convert --dtype float16) "
            "builds with GroupQueryAttention")


def read_prebuilt(folder: Path) -> dict:
    """The builder config of a genai model folder made beforehand; AnchorError naming the
    folder and what is missing otherwise."""
    folder = Path(folder)
    for name in (BUILT_CONFIG, "genai_config.json"):
        if (folder / name).is_file():
            config = json.loads((folder / name).read_text())
            break
    else:
        raise AnchorError(f"{folder} holds no genai_config.json: not a folder onnxruntime-"
                          "genai's model builder wrote (python -m onnxruntime_genai.models."
                          "builder -i HF_DIR -o FOLDER -p fp32 -e cpu)")
    decoder = config.get("model", {}).get("decoder", {}).get("filename")
    if not decoder or not (folder / decoder).is_file():
        raise AnchorError(f"{folder}/genai_config.json names the decoder {decoder!r}, which is "
                          "not in the folder")
    return config


def _hf_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def prepare(setup: AnchorSetup, *, target_hf: Path | None, draft_hf: Path | None, work: Path,
            device: str, threads: int | None, proposers: Sequence[str],
            ks: Sequence[int | str], emitted: set[int], prebuilt: Path | None = None) -> None:
    """Build (or take ``prebuilt``), configure and load the genai models; add the genai
    runners to ``setup``."""
    import numpy as np
    import onnxruntime_genai as og

    for folder in (target_hf if prebuilt is None else None, draft_hf):
        if folder is None:
            continue
        config = _hf_config(folder)
        clashes = lm_head_clashes(config)
        if clashes:
            raise AnchorError(
                f"{folder}: vocabulary size {config['vocab_size']} equals the width of "
                f"{', '.join(clashes)}; the builder would wire that projection as the LM head")
    root = work / "genai"
    root.mkdir(parents=True, exist_ok=True)
    cache = work / "genai-cache"
    target_dir = root / ("target" if prebuilt is None else PREBUILT)
    builds = {} if prebuilt is not None else {
        "target": build(target_hf, target_dir, cache, device)}
    use_draft = draft_hf is not None and "draft" in proposers and prebuilt is None
    if use_draft:
        builds["draft"] = build(draft_hf, root / "draft", cache, device)

    built = read_prebuilt(prebuilt) if prebuilt is not None else \
        json.loads((target_dir / BUILT_CONFIG).read_text())
    vocab = built["model"]["vocab_size"]
    eos = built["model"].get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else [eos]
    pad = unused_token_id(vocab, emitted, avoid=[e for e in eos_ids if e is not None])
    target_config = patch_config(built, threads=threads, pad_token_id=pad,
                                 device_id=device_id(device))
    if prebuilt is None:
        (target_dir / "genai_config.json").write_text(json.dumps(target_config, indent=4))
    else:
        link_variant(Path(prebuilt), target_dir, target_config)
    setup.info["genai"] = {
        "versions": {"onnxruntime-genai": og.__version__},
        "builder_commands": {name: command for name, (command, _) in builds.items()},
        "reused_builds": [name for name, (_, reused) in builds.items() if reused],
        "prebuilt": str(prebuilt) if prebuilt is not None else None,
        "precision": (builds["target"][0][builds["target"][0].index("-p") + 1]
                      if prebuilt is None else "as built"),
        "lm_head_check": ("no projection width equals the vocabulary size "
                          f"({vocab}): {projection_widths(_hf_config(target_hf))}"
                          if prebuilt is None else "not made (a prebuilt folder: the "
                          "= greedy column shows it decodes the same weights)"),
        "config_patch": {"intra_op_num_threads": threads, "eos_token_id": [],
                         "pad_token_id": pad},
        "ngram_size": NGRAM_SIZE,
        "folder": str(root),
    }

    folders = {"target": target_dir}
    if use_draft:
        draft_built = json.loads((root / "draft" / BUILT_CONFIG).read_text())
        composite = patch_config(compose_draft_config(built, draft_built,
                                                      target_subdir=target_dir.name),
                                 threads=threads, pad_token_id=pad, device_id=device_id(device))
        (root / "genai_config.json").write_text(json.dumps(composite, indent=4))
        folders["composite"] = root
    if device.startswith("cuda"):
        folders.update(cuda_graph_folders(root, target_config,
                                          composite if use_draft else None, target_dir))
        setup.info["genai"]["cuda_graph"] = {"enable_cuda_graph": "1",
                                             "past_present_share_buffer": True}
    models = {}
    for which, folder in folders.items():
        try:
            models[which] = og.Model(str(folder))
        except Exception as error:  # noqa: BLE001 - genai's own refusal is the reason
            if not which.endswith(GRAPH_SUFFIX):
                raise
            setup.skip("genai", f"genai ({CUDA_GRAPH})", f"{type(error).__name__}: {error}")
    setup.cleanup.append(models.clear)

    def decoder(model, options: dict | None):
        def decode(prompt: Sequence[int], n: int, count: bool = False) -> AnchorDecode:
            started = time.perf_counter()
            params = og.GeneratorParams(model)
            params.set_search_options(do_sample=False, max_length=len(prompt) + n)
            if options is not None:
                params.set_speculative_options(**options)
            generator = og.Generator(model, params)
            generator.append_tokens(np.asarray([list(prompt)], dtype=np.int32))
            generator.generate_next_token()
            first = time.perf_counter()
            while not generator.is_done():
                generator.generate_next_token()
            total = time.perf_counter() - started
            tokens = [int(t) for t in generator.get_sequence(0)[len(prompt):]]
            counts = {}
            if count and options is not None:
                stats = generator.get_speculative_stats()
                counts["genai_stats"] = {key: stats[key] for key in STATS_KEYS if key in stats}
            return AnchorDecode(tokens, total, first - started, counts)
        return decode

    for mode, k, which in runner_modes(proposers, ks, use_draft, device):
        if which not in models:
            continue
        options = speculative_options(mode, k)
        is_graph = which.endswith(GRAPH_SUFFIX)
        settings = {**(options or {}), **({"enable_cuda_graph": "1"} if is_graph else {})}
        setup.runners.append(AnchorRunner("genai", mode, k, decoder(models[which], options),
                                          settings, CUDA_GRAPH if is_graph else ""))


GRAPH_SUFFIX = "+cuda_graph"  # model keys of the CUDA-graph variant


def runner_modes(proposers: Sequence[str], ks: Sequence[int], use_draft: bool,
                 device: str) -> list[tuple[str, int, str]]:
    """(mode, k, model key) of every genai runner: greedy, n-gram per k (with prompt lookup),
    draft model per k (with a draft); on CUDA each again on the CUDA-graph models."""
    modes = [("greedy", 0, "target")]
    if "prompt_lookup" in proposers:
        modes += [("ngram", k, "target") for k in ks]
    if use_draft:
        modes += [("draft", k, "composite") for k in ks]
    if device.startswith("cuda"):
        modes += [(mode, k, which + GRAPH_SUFFIX) for mode, k, which in modes]
    return modes


def cuda_graph_folders(root: Path, target_config: dict, composite: dict | None,
                       target_dir: Path | None = None) -> dict[str, Path]:
    """The CUDA-graph variants' folders: ``root/target-cuda-graph`` (links to the target's
    files) and, with a draft, ``root/cuda-graph`` (links to ``target/`` and ``draft/``)."""
    folders = {"target" + GRAPH_SUFFIX: link_variant(
        target_dir or root / "target", root / "target-cuda-graph",
        cuda_graph_config(target_config))}
    if composite is not None:
        folders["composite" + GRAPH_SUFFIX] = link_variant(
            root, root / "cuda-graph", cuda_graph_config(composite), ["target", "draft"])
    return folders
