"""A raw ONNX Runtime driver for exported packages, both cache forms, no speculant runtime.

    target = StaticTarget(root, capacity=32)      # cache="static": one OrtValue per cell
    logits = target.run([7, 3, 41])              # [n, vocab] float32; length 0 -> 3
    target.rollback(2)                           # a length change: no byte moves
    logits = target.run([9])                     # overwrites slot 2, length 3

    reference = AppendedTarget(root)             # cache="appended": presents grow
    drafter = StaticDrafter(root)                # reads target.buffers (borrowed, no copy)

What the static driver writes per pass: ``input_ids`` [1, n], ``position_ids`` [1, n] =
``L + [0, n)``, ``cache_lengths`` [1] = ``L``; every layer's past and present are bound to the
same buffer ``[1, KV, capacity, d]``, so the graph writes its block at ``[L, L + n)`` in place.
Planted defects (``defect=``) are the mistakes the tests must catch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from speculant_tools.export import LlamaConfig
from speculant_tools.export.graphs import CONFIG_KEY

# (dtype, graph): the three target graphs a static package can have
FORMS = {"scatter-float32": ("float32", "explicit"), "gqa-float16": ("float16", "fused"),
         "gqa-float32": ("float32", "fused")}
STORAGE = {"float32": np.float32, "float16": np.float16}
STALE = 7.0  # what the buffers hold before any pass: a slot never written reads as this


def _session(path: Path, device: str = "cpu") -> ort.InferenceSession:
    """A session on the CPU, or (``device="cuda"``) on CUDA device 0."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    providers = ["CUDAExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    return ort.InferenceSession(str(path), options, providers=providers)


def _buffer(array: np.ndarray, device: str = "cpu") -> ort.OrtValue:
    """``array`` as an OrtValue on ``device`` (cpu, or CUDA device 0)."""
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), device, 0)


def _config(session: ort.InferenceSession) -> LlamaConfig:
    return LlamaConfig.from_json(session.get_modelmeta().custom_metadata_map[CONFIG_KEY])


def _dtype(session: ort.InferenceSession) -> type:
    return STORAGE["float16" if "float16" in session.get_outputs()[0].type else "float32"]


class StaticTarget:
    """The target (or a decoder package's ``decoder``) of a ``cache="static"`` package."""

    def __init__(self, root: Path, capacity: int, component: str = "target",
                 defect: str | None = None, device: str = "cpu") -> None:
        self.session = _session(Path(root) / component / "model.onnx", device)
        self.config, self.dtype = _config(self.session), _dtype(self.session)
        c = self.config
        shape = (1, c.num_key_value_heads, capacity, c.head_dim)
        # [1, KV, capacity, d] per layer and part, allocated once
        self.buffers = {(i, part): _buffer(np.full(shape, STALE, self.dtype), device)
                        for i in range(c.num_hidden_layers) for part in ("key", "value")}
        self.length = 0  # L: the valid slots [0, L) of every buffer
        self.defect = defect  # "stale_length": rollback forgets to set the length
        self.last_outputs: dict[str, ort.OrtValue] = {}

    def run(self, ids: list[int]) -> np.ndarray:
        """One pass over ``ids`` at the current length; returns logits [n, vocab] float32."""
        n, start = len(ids), self.length
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", np.array([ids], np.int64))
        binding.bind_cpu_input("position_ids", np.arange(start, start + n, dtype=np.int64)[None])
        binding.bind_cpu_input("cache_lengths", np.array([start], np.int64))
        binding.bind_output("logits")
        binding.bind_output("hidden_states")
        for (i, part), buffer in self.buffers.items():
            binding.bind_ortvalue_input(f"past_key_values.{i}.{part}", buffer)
            binding.bind_ortvalue_output(f"present.{i}.{part}", buffer)
        self.session.run_with_iobinding(binding)
        names = ["logits", "hidden_states",
                 *(f"present.{i}.{part}" for i, part in self.buffers)]
        self.last_outputs = dict(zip(names, binding.get_outputs(), strict=True))
        self.length = start + n
        return self.last_outputs["logits"].numpy()[0].astype(np.float32)

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` slots: a length change, nothing is copied or cleared."""
        assert 0 <= length <= self.length
        if self.defect != "stale_length":
            self.length = length

    def cells(self, length: int | None = None) -> dict[tuple[int, str], np.ndarray]:
        """Each buffer's valid slots ``[0, length)`` (default: the current length), copied."""
        length = self.length if length is None else length
        return {key: buffer.numpy()[:, :, :length] for key, buffer in self.buffers.items()}


class AppendedTarget:
    """The reference: the same model in the appended form, presents carried as numpy."""

    def __init__(self, root: Path, component: str = "target") -> None:
        self.session = _session(Path(root) / component / "model.onnx")
        self.config, self.dtype = _config(self.session), _dtype(self.session)
        c = self.config
        empty = np.zeros((1, c.num_key_value_heads, 0, c.head_dim), self.dtype)
        self.caches = {(i, part): empty for i in range(c.num_hidden_layers)
                       for part in ("key", "value")}

    @property
    def length(self) -> int:
        return self.caches[0, "key"].shape[2]

    def run(self, ids: list[int]) -> np.ndarray:
        start, n = self.length, len(ids)
        feeds = {"input_ids": np.array([ids], np.int64),
                 "attention_mask": np.ones((1, start + n), np.int64),
                 "position_ids": np.arange(start, start + n, dtype=np.int64)[None]}
        feeds.update({f"past_key_values.{i}.{part}": value
                      for (i, part), value in self.caches.items()})
        names = [o.name for o in self.session.get_outputs()]
        outputs = dict(zip(names, self.session.run(names, feeds), strict=True))
        self.caches = {(i, part): outputs[f"present.{i}.{part}"] for i, part in self.caches}
        self.hidden_states = outputs["hidden_states"]
        return outputs["logits"][0].astype(np.float32)

    def rollback(self, length: int) -> None:
        self.caches = {key: value[:, :, :length] for key, value in self.caches.items()}


class StaticDrafter:
    """The chained drafter of a static pair: its borrowed caches are bound to the target's
    buffers themselves (``defect="wrong_layer"``: layer 0's instead of the last layer's)."""

    def __init__(self, root: Path, defect: str | None = None, device: str = "cpu") -> None:
        self.session = _session(Path(root) / "assistant" / "model.onnx", device)
        self.defect = defect

    def step(self, target: StaticTarget, fused: np.ndarray, position: int,
             length: int) -> np.ndarray:
        """One step on ``fused`` [1, 1, 2H] at ``position``, reading slots ``[0, length)``
        of the target's last layer; returns logits [vocab] float32 (and keeps
        ``self.state``, the projected state [1, 1, H], the next step's carry)."""
        return self.step_rows(target, fused, [position], [length])[0]

    def step_rows(self, target: StaticTarget | BatchedTarget, fused: np.ndarray,
                  positions: list[int], lengths: list[int]) -> np.ndarray:
        """One step of ``B`` rows: row ``b`` on ``fused[b]`` [1, 2H] at ``positions[b]``,
        reading slots ``[0, lengths[b])`` of row ``b`` of the target's last-layer buffers
        [B, KV, capacity, d]; returns logits [B, vocab] float32 (``self.state`` [B, 1, H])."""
        layer = 0 if self.defect == "wrong_layer" else target.config.num_hidden_layers - 1
        binding = self.session.io_binding()
        binding.bind_cpu_input("inputs_embeds", fused)
        binding.bind_cpu_input("position_ids", np.array(positions, np.int64)[:, None])
        binding.bind_cpu_input("cache_lengths", np.array(lengths, np.int64))
        binding.bind_ortvalue_input("shared_kv.key", target.buffers[layer, "key"])
        binding.bind_ortvalue_input("shared_kv.value", target.buffers[layer, "value"])
        binding.bind_output("logits")
        binding.bind_output("projected_state")
        self.session.run_with_iobinding(binding)
        logits, self.state = (value.numpy() for value in binding.get_outputs())
        return logits[:, -1].astype(np.float32)


def appended_drafter_step(root: Path, reference: AppendedTarget, fused: np.ndarray,
                          position: int, length: int) -> np.ndarray:
    """The appended drafter's step on the reference's last layer cut to ``length``."""
    session = _session(Path(root) / "assistant" / "model.onnx")
    last = reference.config.num_hidden_layers - 1
    feeds = {"inputs_embeds": fused, "position_ids": np.array([[position]], np.int64),
             "attention_mask": np.ones((1, length), np.int64),
             "shared_kv.key": reference.caches[last, "key"][:, :, :length],
             "shared_kv.value": reference.caches[last, "value"][:, :, :length]}
    return session.run(["logits"], feeds)[0][0, -1].astype(np.float32)


def greedy(model, prompt: list[int], num_new: int) -> list[int]:
    """Greedy tokens of either driver (prefill, then one-token passes)."""
    token = int(np.argmax(model.run(list(prompt))[-1]))
    tokens = [token]
    while len(tokens) < num_new:
        token = int(np.argmax(model.run([token])[-1]))
        tokens.append(token)
    return tokens


def chained(target: StaticTarget, drafter: StaticDrafter, table: np.ndarray, prompt: list[int],
            num_new: int, k: int) -> tuple[list[int], int]:
    """Greedy speculative decoding with the chained drafter on static caches (runtime.md
    §5, §8–§12 with every rollback a length change): ``table`` [V, H] is the embedding table
    already scaled, in the currency. Returns the committed tokens and the drafts accepted."""
    logits = target.run(list(prompt))
    hidden = target.last_outputs["hidden_states"].numpy()  # [1, n, H]
    pending, out, num_accepted = int(np.argmax(logits[-1])), [], 0
    seed, carry, length = prompt[-1], hidden[:, -1:], len(prompt)  # the chain context
    out.append(pending)
    while len(out) < num_new:
        last, step_carry, drafts = seed, carry, []
        for j in range(k + 1):  # the bootstrap step, then k drafts
            fused = np.concatenate([table[last][None, None], step_carry], axis=-1)
            row = drafter.step(target, fused, length - 1, length)
            step_carry = drafter.state
            if j == 0:
                last = pending
            else:
                last = int(np.argmax(row))
                drafts.append(last)
        block, start = [pending, *drafts], target.length
        rows = target.run(block)  # the verify pass: slots [start, start + k + 1)
        hidden = target.last_outputs["hidden_states"].numpy()
        choices = [int(np.argmax(r)) for r in rows]
        kept = 1
        while kept <= k and block[kept] == choices[kept - 1]:
            kept += 1
        num_accepted += kept - 1
        out += [*block[1:kept], choices[kept - 1]]
        target.rollback(start + kept)  # the rejected drafts' slots stay, masked
        seed, carry, length = block[kept - 1], hidden[:, kept - 1:kept], start + kept
        pending = choices[kept - 1]
    return out[:num_new], num_accepted


class BatchedTarget:
    """A batched target (``export/batched.py``): ``rows`` requests, each with its own length,
    over buffers ``[rows, KV, capacity, d]`` (``fill``: what they hold before any pass).

    ``run(blocks)`` pads the rows' blocks to the widest on the right and binds
    ``block_lengths`` to each row's width (``defect="full_block_lengths"``: the width ``W``
    for every row, so padding is written); past and present share one buffer per cell.
    """

    def __init__(self, model_path: Path, rows: int, capacity: int, fill: np.ndarray,
                 defect: str | None = None, device: str = "cpu") -> None:
        self.session = _session(model_path, device)
        self.config, self.dtype = _config(self.session), _dtype(self.session)
        c = self.config
        assert fill.shape == (c.num_hidden_layers, 2, rows, c.num_key_value_heads, capacity,
                              c.head_dim)
        self.buffers = {(i, part): _buffer(fill[i, j].astype(self.dtype), device)
                        for i in range(c.num_hidden_layers)
                        for j, part in enumerate(("key", "value"))}
        self.lengths = np.zeros(rows, np.int64)  # L_b
        self.defect = defect
        self.presents: dict[tuple[int, str], ort.OrtValue] = {}

    def run(self, blocks: list[list[int]]) -> list[np.ndarray]:
        """One pass; ``blocks[b]`` the row's tokens (empty: a padding row). Returns each
        row's logits [W_b, vocab] float32."""
        rows, width = len(blocks), max(len(block) for block in blocks)
        ids = np.zeros((rows, width), np.int64)
        for b, block in enumerate(blocks):
            ids[b, :len(block)] = block
        widths = np.array([len(block) for block in blocks], np.int64)
        positions = self.lengths[:, None] + np.arange(width, dtype=np.int64)[None]
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("position_ids", positions)
        binding.bind_cpu_input("cache_lengths", self.lengths.copy())
        binding.bind_cpu_input("block_lengths", np.full(rows, width, np.int64)
                               if self.defect == "full_block_lengths" else widths)
        binding.bind_output("logits")
        binding.bind_output("hidden_states")
        for (i, part), buffer in self.buffers.items():
            binding.bind_ortvalue_input(f"past_key_values.{i}.{part}", buffer)
            binding.bind_ortvalue_output(f"present.{i}.{part}", buffer)
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        self.presents = dict(zip(self.buffers, outputs[2:], strict=True))
        self.lengths = self.lengths + widths
        logits = outputs[0].numpy().astype(np.float32)
        return [logits[b, :len(block)] for b, block in enumerate(blocks)]

    def snapshot(self) -> np.ndarray:
        """Every buffer's bytes, [layers, 2, rows, KV, capacity, d] (a copy)."""
        c = self.config
        return np.stack([np.stack([self.buffers[i, part].numpy() for part in ("key", "value")])
                         for i in range(c.num_hidden_layers)])


def batched_against_alone(root: Path, blocks: list[list[int]], capacity: int = 24,
                          component: str = "target") -> list[float]:
    """One ragged pass of ``{component}/batched.onnx`` over ``blocks`` (every row at length
    0, its buffers zero) beside each row's pass alone on ``{component}/model.onnx``: the
    largest |Δ| of each row's logits (0.0 for an empty, padding row). The check a command's
    output gets that its batched graph computes with the batch-1 graph's weights."""
    root = Path(root)
    session = _session(root / component / "batched.onnx")
    c = _config(session)
    fill = np.zeros((c.num_hidden_layers, 2, len(blocks), c.num_key_value_heads, capacity,
                     c.head_dim))
    rows = BatchedTarget(root / component / "batched.onnx", len(blocks), capacity,
                         fill).run(blocks)
    return [float(np.abs(row - StaticTarget(root, capacity, component).run(block)).max())
            if block else 0.0 for row, block in zip(rows, blocks, strict=True)]
