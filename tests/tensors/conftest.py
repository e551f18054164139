"""Fixtures shared by the tensor-seam tests (and usable by any later CUDA test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from builders.transfer_guard import forbid_host_transfers


@pytest.fixture
def transfer_guard() -> Iterator[list[str]]:
    """Inside the test, ``cupy.asnumpy``, ``cupy.ndarray.get`` (and ``tolist``/``item``),
    device ``OrtValue.numpy()`` and ``IOBinding.copy_outputs_to_cpu()`` raise
    ``TransferGuardError`` (a ``ResidencyError``) unless called from the seam's ``download``.
    Yields the patched names."""
    with forbid_host_transfers() as patched:
        yield patched
