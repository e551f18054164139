"""Shape symbols and contract checks (runtime.md §3).

One `SymbolTable` per scope: a fixed extent must match, a symbol binds at first sight and must
agree afterwards, a ``request_aligned`` axis has extent 1 (one sequence per run), and symbols
declared *dynamic* (a cell's recurrence axis at package scope) bind and check nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speculant.errors import ContractError
from speculant.package.model import TensorContract
from speculant.tensors import Value


@dataclass
class SymbolTable:
    scope: str  # e.g. "invocation of 'target'" or "pass at C0=7"
    dynamic: frozenset[str] = frozenset()
    bound: dict[str, tuple[int, str]] = field(default_factory=dict)  # symbol -> (extent, by)

    def check(self, name: str, contract: TensorContract, value: Value) -> None:
        """Check ``value`` (bound as ``name``) against ``contract``; bind new symbols."""
        if value.dtype != contract.dtype:
            raise ContractError(
                f"{self.scope}: '{name}' has dtype {value.dtype}, its contract says "
                f"{contract.dtype}", path=name, value=value.dtype, expected=contract.dtype)
        if value.rank != contract.rank:
            raise ContractError(
                f"{self.scope}: '{name}' has rank {value.rank} (shape {list(value.shape)}), its "
                f"contract says {contract.rank}", path=name, value=value.shape,
                expected=f"rank {contract.rank}")
        aligned = contract.batch_layout.axis if contract.batch_layout.kind == "request_aligned" \
            else None
        for axis, (dim, extent) in enumerate(zip(contract.dims, value.shape, strict=True)):
            if axis == aligned and extent != 1:
                raise ContractError(
                    f"{self.scope}: '{name}' has {extent} rows on its request axis {axis}; "
                    "speculant decodes one sequence per run", path=name, value=extent,
                    expected="1")
            if isinstance(dim, int) and dim != extent:
                raise ContractError(
                    f"{self.scope}: '{name}' axis {axis} has extent {extent}, its contract fixes "
                    f"{dim}", path=name, value=extent, expected=str(dim))
            if isinstance(dim, str) and dim not in self.dynamic:
                self.bind(dim, extent, f"'{name}' axis {axis}")

    def bind(self, symbol: str, extent: int, by: str) -> None:
        previous = self.bound.get(symbol)
        if previous is None:
            self.bound[symbol] = (extent, by)
        elif previous[0] != extent:
            raise ContractError(
                f"{self.scope}: symbol '{symbol}' is {previous[0]} from {previous[1]} but "
                f"{extent} from {by}", path=symbol, value=extent, expected=str(previous[0]),
                remedy="if the package uses one symbol for different sequence-like axes, "
                "rename them with `speculant metadata name-axes PACKAGE`")

    def resolve(self, contract: TensorContract, what: str) -> tuple[int, ...]:
        """The concrete shape of ``contract`` under the bound symbols (for defaults)."""
        shape = []
        for axis, dim in enumerate(contract.dims):
            if isinstance(dim, int):
                shape.append(dim)
            elif isinstance(dim, str) and dim in self.bound:
                shape.append(self.bound[dim][0])
            elif contract.batch_layout.kind == "request_aligned" and \
                    contract.batch_layout.axis == axis:
                shape.append(1)
            else:
                raise ContractError(
                    f"{self.scope}: cannot materialize '{what}': axis {axis} ({dim!r}) is not "
                    "bound by any other input of the pass", path=what, value=dim,
                    expected="a fixed extent or a symbol bound by another input")
        return tuple(shape)
