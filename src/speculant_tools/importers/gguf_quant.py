"""GGUF tensor types: which import, and which stay quantized in the package.

Every type the ``gguf`` package dequantizes imports, through gguf's own code
(``gguf.quants.dequantize``): the float types (F32, F16, BF16; F64 narrowed to float32), the
legacy quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), the K-quants (Q2_K ... Q6_K; a Q4_K_M file is
a mixture of Q4_K and Q6_K tensors), the ternary TQ1_0/TQ2_0, the IQ types and MXFP4/NVFP4.
gguf names a class after each type it dequantizes (:func:`can_dequantize`); any other type
(Q8_K, the integer types) is refused naming the tensor, its type and the remedy.

A float32 package keeps a tensor quantized (:class:`NBits`, written as ONNX Runtime's
``MatMulNBits`` by ``int4.keep_nbits``) where that kernel computes with exactly the weights
gguf dequantizes and runs at float32 compute (accuracy level 1, which keeps speculation
exact) about as fast as the float32 MatMul. That is a block of codes times one scale, with no
zero point and 4-bit codes:

* Q4_0: blocks of 32, ``w = d * (q - 8)``: MatMulNBits 4-bit, block 32, the codes as they are;
* Q3_K: sub-blocks of 16, ``w = d * (sc - 32) * q3`` with ``q3`` in [-4, 3]: 4-bit, block 16,
  code ``q3 + 8``, scale ``d * (sc - 32)`` (exact in float32).

Every other type is widened to float32. Measured on this project's CPU (ONNX Runtime 1.32,
one thread, a 576 x 1536 weight, one token; docs/design/import.md): MatMul float32 90 us,
MatMulNBits 4-bit without zero points 184 us, 4-bit with float zero points (what Q4_1,
Q4_K and Q2_K's ``scale * q - min`` needs) 1867 us, 8-bit (what Q8_0, Q5_0, Q6_K need)
2177 us; ONNX Runtime's CPU kernel refuses 8-bit with float zero points (Q5_1, Q5_K). The
IQ, TQ and FP4 types use value grids MatMulNBits' affine codes cannot express.

The codes and scales are read with gguf's dequantizer too: the scales are the
dequantization of the blocks with every code set to one (the per-format bytes in
:data:`KEPT`), the codes are gguf's weights divided by them; :func:`nbits_of` checks that
``(code - 8) * scale`` gives back gguf's weights bit for bit before it keeps a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLOAT_TYPES = ("F32", "F16", "F64")  # gguf.quants.dequantize reads F32 and F16 directly
NBITS_ZERO = 8  # MatMulNBits' zero point for 4-bit codes when it has none


@dataclass(frozen=True)
class Kept:
    """How a block format becomes 4-bit codes: ``block_size`` weights per scale, and the
    byte ranges (within one ``block_bytes`` block) and the byte value that set every code to
    one."""

    block_size: int
    block_bytes: int
    unit_codes: tuple[tuple[int, int, int], ...]  # (start, stop, byte value)


KEPT = {
    "Q4_0": Kept(32, 18, ((2, 18, 0x99),)),  # d f16, 16 bytes of nibbles (q = 9 -> d * 1)
    "Q3_K": Kept(16, 110, ((0, 32, 0xFF), (32, 96, 0x55))),  # hmask: 1, 2-bit low: 1 -> q3 = 1
}


@dataclass(frozen=True)
class NBits:
    """A linear weight ``[N, K]`` as MatMulNBits holds it: ``w = (code - 8) * scale`` per
    block of ``block_size`` along K."""

    packed: np.ndarray  # [N, K / block_size, block_size / 2] uint8, low nibble first
    scales: np.ndarray  # [N, K / block_size] float32
    block_size: int

    def rows(self, order: np.ndarray) -> NBits:
        """The same weight with its output rows in ``order``."""
        return NBits(self.packed[order], self.scales[order], self.block_size)

    def weight(self) -> np.ndarray:
        """``[N, K]`` float32: what MatMulNBits computes with."""
        codes = np.stack([self.packed & 0x0F, self.packed >> 4], axis=-1)
        codes = codes.reshape(*self.scales.shape, self.block_size).astype(np.float32)
        return ((codes - NBITS_ZERO) * self.scales[..., None]).reshape(self.scales.shape[0], -1)


def can_dequantize(type_name: str) -> bool:
    """Whether gguf's numpy code dequantizes tensors of this type."""
    from gguf import quants

    return type_name in FLOAT_TYPES or isinstance(getattr(quants, type_name, None), type)


def dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """The tensor's values as float32, by gguf's dequantizer (F64 narrowed)."""
    from gguf import quants

    if qtype.name == "F64":
        return np.asarray(data, np.float32)
    return np.asarray(quants.dequantize(data, qtype), np.float32)


def nbits_of(data: np.ndarray, qtype, weight: np.ndarray) -> NBits | None:
    """The MatMulNBits form of a tensor of a :data:`KEPT` type whose dequantization
    (gguf's) is ``weight`` [N, K]; None for any other type, or where the codes would not give
    ``weight`` back bit for bit."""
    kept = KEPT.get(qtype.name)
    if kept is None or weight.ndim != 2:
        return None
    blocks = np.array(data, np.uint8).reshape(-1, kept.block_bytes)
    for start, stop, value in kept.unit_codes:
        blocks[:, start:stop] = value
    num_rows, num_blocks = weight.shape[0], weight.shape[1] // kept.block_size
    scales = dequantize(blocks, qtype).reshape(num_rows, num_blocks, kept.block_size)[..., 0]
    grouped = weight.reshape(num_rows, num_blocks, kept.block_size)
    with np.errstate(divide="ignore", invalid="ignore"):
        steps = np.where(scales[..., None] != 0, grouped / scales[..., None], 0)
    codes = np.rint(steps) + NBITS_ZERO
    if not (np.isfinite(codes).all() and codes.min() >= 0 and codes.max() <= 15):
        return None
    codes = codes.astype(np.uint8)
    nbits = NBits((codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8),
                  np.ascontiguousarray(scales, np.float32), kept.block_size)
    return nbits if np.array_equal(nbits.weight(), weight) else None
