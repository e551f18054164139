"""The bounds of a GGUF file's header, checked before ``gguf.GGUFReader`` reads it.

The reader trusts every count the file declares: it walks ``tensor_count`` tensor infos and
``kv_count`` key-values, and every element of every metadata array, building a few numpy
views per element (about 1 KB each), and fails with an ``IndexError`` where a count runs past
the end of the file. :func:`check_header` walks the same layout (the GGUF v2/v3 header: magic,
version, the two counts, each key-value, each tensor info, then the aligned data) with
``struct`` alone, allocating nothing that grows with a declared count, and refuses, naming
the field, the value and the file:

* a count, a length or a tensor's data that runs past the end of the file;
* more than :data:`MAX_HEADER_ITEMS` key-values, array elements and tensor infos together,
  so that the reader's memory stays under about 1 GB (a Llama 3 vocabulary, its merges
  and token types are 0.54 M items; SmolLM2's 0.15 M);
* a value type or tensor type gguf does not define, more than ``GGML_MAX_DIMS`` (4)
  dimensions, a quantized row that is not whole blocks, a repeated key or tensor name, a key
  or name that is not UTF-8, a ``general.alignment`` that is not a power of two.

A file that passes can be read by the reader without an out-of-range read, and everything
the reader builds is bounded by the file's header.
"""

from __future__ import annotations

import mmap
import os
import struct
from math import prod
from pathlib import Path

from gguf.constants import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGMLQuantizationType,
    GGUFValueType,
)

from speculant.errors import shown
from speculant_tools.importers.checkpoint import ImporterError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # the layouts gguf's reader reads
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_HEADER_ITEMS = 1 << 20
MAX_ARRAY_DEPTH = 4  # arrays of arrays: ggml's files nest none
RESERVED_KEYS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")  # the reader's own
REMEDY = ("the file is damaged or was not written by a GGUF writer: download or convert it "
          "again (llama.cpp's convert_hf_to_gguf.py)")
SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
           GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
           GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
           GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}
MIN_VALUE_BYTES = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}  # a length, a type+count
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, a one-byte value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset
MAX_NAME_CHARS = 80  # a longer key or tensor name is shown bounded in messages


def printable(name: str) -> str:
    """A key or tensor name from the file as a message shows it: as it is where it is short
    and printable, else its bounded ``repr`` (no control characters reach a terminal)."""
    return name if len(name) <= MAX_NAME_CHARS and name.isprintable() else shown(name)


class _Cursor:
    """Reads the header's numbers in the file's byte order, refusing any read past the end."""

    def __init__(self, data: mmap.mmap | bytes, file: str) -> None:
        self.data, self.file, self.offset, self.order = data, file, 0, "<"
        self.num_items = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.offset

    def error(self, message: str, field: str, value: object = None,
              expected: str = "") -> ImporterError:
        return ImporterError(message, file=self.file, path=field, value=value,
                             expected=expected, remedy=REMEDY)

    def skip(self, num_bytes: int, field: str, value: object = None) -> int:
        """Move past ``num_bytes``; where they are not all in the file, refuse ``field``."""
        if num_bytes > self.remaining:
            raise self.error(f"the file ends here: {num_bytes} bytes needed at offset "
                             f"{self.offset}, {self.remaining} left", field, value)
        start, self.offset = self.offset, self.offset + num_bytes
        return start

    def number(self, code: str, field: str) -> int | float:
        start = self.skip(struct.calcsize(code), field)
        return struct.unpack_from(self.order + code, self.data, start)[0]

    def text(self, field: str) -> str:
        length = self.number("Q", f"{field} (its length)")
        start = self.skip(length, field, length)
        try:
            return bytes(self.data[start:self.offset]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.error("a name that is not UTF-8", field, f"offset {start}") from None

    def count(self, count: int, min_item_bytes: int, field: str) -> None:
        """``count`` more items, each at least ``min_item_bytes`` long, must fit the file
        and the item budget."""
        if count * min_item_bytes > self.remaining:
            raise self.error("declares more items than the file holds", field, count,
                             f"at most {self.remaining // min_item_bytes}")
        self.num_items += count
        if self.num_items > MAX_HEADER_ITEMS:
            raise self.error("the header holds more key-values, array elements and tensors "
                             "than the importer reads", field, count,
                             f"at most {MAX_HEADER_ITEMS} items in all")


def check_header(path: str | Path) -> None:
    """Refuse the GGUF at ``path`` unless its header fits the file (see the module)."""
    file = str(path)
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size == 0:  # mmap refuses an empty file
                _walk(_Cursor(b"", file))
            else:
                with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    _walk(_Cursor(data, file))
    except OSError as error:
        raise ImporterError(f"cannot read the GGUF file: {error}", file=file) from None


def _walk(cursor: _Cursor) -> None:
    if bytes(cursor.data[:len(MAGIC)]) != MAGIC:
        raise cursor.error("this file is not a GGUF file (no GGUF magic)", "GGUF.magic",
                           bytes(cursor.data[:len(MAGIC)]), "b'GGUF'")
    cursor.skip(len(MAGIC), "GGUF.magic")
    version = cursor.number("I", "GGUF.version")
    if version & 0xFFFF == 0:  # written on a machine of the other byte order
        cursor.order, version = ">", int.from_bytes(version.to_bytes(4, "little"), "big")
    if version not in VERSIONS:
        raise cursor.error("this GGUF version is not read", "GGUF.version", version,
                           " or ".join(map(str, VERSIONS)))
    num_tensors = cursor.number("Q", "GGUF.tensor_count")
    num_kvs = cursor.number("Q", "GGUF.kv_count")
    cursor.count(num_kvs, MIN_KV_BYTES, "GGUF.kv_count")
    keys = set(RESERVED_KEYS)
    alignment = GGUF_DEFAULT_ALIGNMENT
    for index in range(num_kvs):
        key = cursor.text(f"kv[{index}].key")
        label = printable(key)
        if key in keys:
            raise cursor.error("a key appears twice", label)
        keys.add(key)
        kind = _kind(cursor, label)
        if key == "general.alignment":
            if kind != GGUFValueType.UINT32:
                raise cursor.error("general.alignment must be a UINT32", key, kind.name)
            alignment = int(cursor.number("I", key))
            if alignment == 0 or alignment & (alignment - 1):
                raise cursor.error("the alignment must be a power of two", key, alignment)
        else:
            _value(cursor, kind, label)
    tensors = _tensor_infos(cursor, num_tensors)
    data_start = -(-cursor.offset // alignment) * alignment
    size = len(cursor.data)
    for raw_name, dims, kind, offset in tensors:
        name = printable(raw_name)
        block, block_bytes = GGML_QUANT_SIZES[kind]
        if dims and dims[0] % block:
            raise cursor.error(f"a {kind.name} row must be whole blocks of {block}",
                               f"tensors.{name}.dims", dims, f"dims[0] a multiple of {block}")
        num_bytes = prod(dims) * block_bytes // block
        if data_start + offset + num_bytes > size:
            raise cursor.error("the tensor's data runs past the end of the file",
                               f"tensors.{name}", {"offset": offset, "bytes": num_bytes},
                               f"offset + bytes <= {max(size - data_start, 0)}")


def _kind(cursor: _Cursor, field: str) -> GGUFValueType:
    raw = cursor.number("I", f"{field} (its type)")
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cursor.error("a value type GGUF does not define", field, raw,
                           "a GGUFValueType") from None


def _value(cursor: _Cursor, kind: GGUFValueType, field: str, depth: int = 0) -> None:
    if kind in SCALARS:
        cursor.skip(struct.calcsize(SCALARS[kind]), field)
    elif kind == GGUFValueType.STRING:
        length = cursor.number("Q", f"{field} (its length)")
        cursor.skip(length, field, length)
    else:  # an array: its item type, its length, its items
        if depth == MAX_ARRAY_DEPTH:
            raise cursor.error("arrays nest too deeply", field, depth,
                               f"at most {MAX_ARRAY_DEPTH} levels")
        item_kind = _kind(cursor, f"{field} (its items)")
        length = cursor.number("Q", f"{field} (its length)")
        if item_kind in SCALARS:
            cursor.count(length, 1, field)
            cursor.skip(length * struct.calcsize(SCALARS[item_kind]), field, length)
            return
        cursor.count(length, MIN_VALUE_BYTES[item_kind], field)
        for index in range(length):
            _value(cursor, item_kind, f"{field}[{index}]", depth + 1)


def _tensor_infos(cursor: _Cursor, num_tensors: int) -> list[tuple]:
    """(name, dims, type, offset) of each tensor info; the names distinct."""
    cursor.count(num_tensors, MIN_TENSOR_INFO_BYTES, "GGUF.tensor_count")
    tensors, names = [], set()
    for index in range(num_tensors):
        raw_name = cursor.text(f"tensors[{index}].name")
        name = printable(raw_name)
        if raw_name in names:
            raise cursor.error("a tensor name appears twice", f"tensors.{name}")
        names.add(raw_name)
        num_dims = cursor.number("I", f"tensors.{name}.n_dims")
        if num_dims > MAX_DIMS:
            raise cursor.error("a tensor has more dimensions than ggml allows",
                               f"tensors.{name}.n_dims", num_dims, f"at most {MAX_DIMS}")
        dims = [int(cursor.number("Q", f"tensors.{name}.dims")) for _ in range(num_dims)]
        raw = cursor.number("I", f"tensors.{name}.type")
        kind = GGMLQuantizationType._value2member_map_.get(raw)
        if kind not in GGML_QUANT_SIZES:
            raise cursor.error("a tensor type ggml does not define", f"tensors.{name}.type",
                               raw, "a GGMLQuantizationType")
        offset = cursor.number("Q", f"tensors.{name}.offset")
        tensors.append((raw_name, dims, kind, offset))
    return tensors
