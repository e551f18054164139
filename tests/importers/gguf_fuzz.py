"""Crafted GGUF files: a mutation fuzzer over the tiny valid GGUF of ``gguf_models``.

The seed is written with ``gguf.GGUFWriter`` (a 2-layer Llama, 33 KB). :func:`header_slots`
finds where each part of its header lies (the counts, each key's length, type and value,
array item types and lengths, each tensor's ``n_dims``, dims, type and offset) by reading the
seed with gguf's reader. A mutant (:func:`mutants`, from a fixed seed) is the file with one
to three of: a header number set to a hostile value of its width (0, 1, the maximum, powers
of two, ...), header bytes flipped or overwritten with random ones, a header range cut out
or repeated, and, last, the file truncated. :func:`run_input` imports a file
(``import_model``, writing the package) under a time limit and returns its outcome:
``accepted``, ``typed`` (an ImporterError), ``other-typed`` (another SpeculantError),
``internal`` (anything else) or ``hang``.

``tests/importers/test_gguf_hostile.py`` runs a few hundred mutants;
``scripts/fuzz_gguf.py`` runs them for minutes and reports peak memory.
"""

from __future__ import annotations

import math
import random
import shutil
import signal
import struct
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
from gguf_models import random_weights, write_gguf

from speculant.errors import SpeculantError
from speculant_tools.importers import ImporterError, import_model

LIMIT_S = 20.0  # per input: generous; a bounded import of the seed takes well under 1 s
UNSIGNED = [0, 1, 2, 3, 4, 7, 8, 9, 16, 31, 32, 33, 255, 256, 1 << 15, 1 << 16, 1 << 20,
            1 << 25, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, 1 << 60,
            1 << 62, 1 << 63, (1 << 64) - 1, 10**6, 4 * 10**6]
FLOATS = [0.0, -0.0, -1.0, 1e-45, 1e-30, 3.4e38, math.inf, -math.inf, math.nan]


@dataclass(frozen=True)
class Slot:
    """One part of the header: ``count`` items of ``width`` bytes at ``offset``; ``kind``
    the numpy kind (``u``, ``i``, ``f``, ``b``) or ``s`` for a string's bytes."""

    label: str  # "<key or tensors.<name>>#<part index>"
    offset: int
    width: int
    count: int
    kind: str


def seed_file(path: Path) -> Path:
    return write_gguf(path, random_weights())


def header_slots(path: Path) -> dict[str, Slot]:
    """Every part of the header of the GGUF at ``path``, by label."""
    reader = gguf.GGUFReader(path)
    base = reader.data.ctypes.data
    fields = [(name, field) for name, field in reader.fields.items()]
    fields += [(f"tensors.{tensor.name}", tensor.field) for tensor in reader.tensors]
    slots = {}
    for name, field in fields:
        for index, part in enumerate(field.parts):
            kind = part.dtype.kind  # a name's or a string's bytes: uint8, several or part 1
            is_text = kind == "u" and part.itemsize == 1 and (part.size != 1 or index == 1)
            slots[f"{name}#{index}"] = Slot(f"{name}#{index}", part.ctypes.data - base,
                                            part.itemsize, part.size,
                                            "s" if is_text else kind)
    return slots


def patched(data: bytes, slot: Slot, value: int | float, item: int = 0) -> bytes:
    """``data`` with item ``item`` of ``slot`` set to ``value`` (wrapped to its width)."""
    offset = slot.offset + item * slot.width
    if slot.kind == "f":
        raw = struct.pack("<f" if slot.width == 4 else "<d", value)
    else:
        raw = (int(value) % (1 << (8 * slot.width))).to_bytes(slot.width, "little")
    return data[:offset] + raw + data[offset + slot.width:]


def _hostile_number(slot: Slot, rng: random.Random) -> int | float:
    if slot.kind == "f":
        return rng.choice(FLOATS + [rng.uniform(-1e6, 1e6)])
    top = 1 << (8 * slot.width)
    return rng.choice([v for v in UNSIGNED if v < top] + [top - 1, top // 2, -1 % top,
                                                           rng.randrange(top)])


def mutate(data: bytes, slots: list[Slot], header_end: int, rng: random.Random) -> bytes:
    """One mutant of ``data``: one to three header mutations, sometimes a truncation."""
    numbers = [s for s in slots if s.kind != "s"]
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        if op < 0.55:
            slot = rng.choice(numbers)
            data = patched(data, slot, _hostile_number(slot, rng), rng.randrange(slot.count))
        elif op < 0.75:
            buffer = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                buffer[rng.randrange(min(header_end, len(buffer)))] ^= 1 << rng.randrange(8)
            data = bytes(buffer)
        elif op < 0.85:
            start = rng.randrange(min(header_end, len(data)))
            length = rng.randint(1, 16)
            data = data[:start] + rng.randbytes(length) + data[start + length:]
        else:
            start = rng.randrange(min(header_end, len(data)))
            chunk = data[start:start + rng.randint(1, 64)]
            data = data[:start] + (chunk * 2 if rng.random() < 0.5 else b"") + \
                data[start + len(chunk):]
    if rng.random() < 0.1:
        data = data[:rng.randrange(len(data))]
    return data


def mutants(seed: bytes, slots: dict[str, Slot], header_end: int, rng_seed: int,
            count: int | None = None) -> Iterator[bytes]:
    """``count`` mutants of ``seed`` (endless with None), the same ones for the same
    ``rng_seed``."""
    rng = random.Random(rng_seed)
    listed = list(slots.values())
    index = 0
    while count is None or index < count:
        yield mutate(seed, listed, header_end, rng)
        index += 1


@dataclass
class Outcome:
    kind: str  # accepted, typed, other-typed, internal, hang
    detail: str = ""
    seconds: float = 0.0


class Hang(BaseException):
    """The time limit of one input passed."""


def _alarm(signum, frame) -> None:
    raise Hang


def run_input(path: Path, out: Path, limit_s: float = LIMIT_S) -> Outcome:
    """Import the GGUF at ``path`` into ``out`` (removed afterwards)."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    started = time.perf_counter()
    try:
        import_model(path, out)
        outcome = Outcome("accepted")
    except Hang:
        outcome = Outcome("hang")
    except ImporterError as error:
        outcome = Outcome("typed", str(error))
    except SpeculantError as error:
        outcome = Outcome("other-typed", f"{type(error).__name__}: {error}")
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # noqa: BLE001 (what the fuzzer looks for; tokenizers' panics are BaseExceptions)
        outcome = Outcome("internal", f"{type(error).__name__}: {error}\n"
                          + "".join(traceback.format_tb(error.__traceback__)[-3:]))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        shutil.rmtree(out, ignore_errors=True)
    outcome.seconds = time.perf_counter() - started
    return outcome


def header_end(path: Path) -> int:
    """Where the seed's tensor data begins."""
    return int(gguf.GGUFReader(path).data_offset)
