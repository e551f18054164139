"""Contract checks (runtime.md §3) with the verified-shape cache: a cached (contract, dtype,
shape) skips only the fixed checks it already passed; symbols bind and conflict per table."""

from __future__ import annotations

import numpy as np
import pytest

from speculant.errors import ContractError
from speculant.package.model import TensorContract
from speculant.session.contracts import SymbolTable
from speculant.tensors import Value

CACHE = TensorContract(dtype="float32", rank=4, shape=["batch", 2, "past", 8],
                       batch_layout={"kind": "request_aligned", "axis": 0})
MASK = TensorContract(dtype="int64", rank=2, shape=["batch", "past"])


def value(shape, dtype=np.float32) -> Value:
    return Value.host(np.zeros(shape, dtype))


def test_symbols_bind_per_table_on_every_check():
    for _ in range(2):  # the second table meets the shapes already verified
        table = SymbolTable("pass")
        table.check("past.0", CACHE, value((1, 2, 5, 8)))
        assert table.bound["past"][0] == 5
        with pytest.raises(ContractError, match="symbol 'past' is 5 from 'past.0' axis 2 but 6"):
            table.check("mask", MASK, value((1, 6), np.int64))


def test_a_cached_shape_does_not_hide_a_violation_of_another_contract():
    SymbolTable("a").check("past.0", CACHE, value((1, 2, 3, 8)))
    with pytest.raises(ContractError, match="axis 1 has extent 2, its contract fixes 4"):
        SymbolTable("b").check("x", TensorContract(dtype="float32", rank=4,
                                                   shape=[None, 4, None, 8]),
                               value((1, 2, 3, 8)))


@pytest.mark.parametrize("shape, dtype, message", [
    ((1, 3, 4, 8), np.float32, "axis 1 has extent 3, its contract fixes 2"),
    ((2, 2, 4, 8), np.float32, "2 rows on its request axis 0"),
    ((1, 2, 4), np.float32, "rank 3"),
    ((1, 2, 4, 8), np.float16, "dtype float16"),
])
def test_violations_raise_every_time(shape, dtype, message):
    for _ in range(2):  # a failed check is never cached
        with pytest.raises(ContractError, match=message):
            SymbolTable("pass").check("past.0", CACHE, value(shape, dtype))


def test_dynamic_symbols_bind_nothing():
    table = SymbolTable("package", dynamic=frozenset({"past"}))
    table.check("past.0", CACHE, value((1, 2, 5, 8)))
    table.check("past.1", CACHE, value((1, 2, 7, 8)))
    assert "past" not in table.bound and table.bound["batch"][0] == 1
