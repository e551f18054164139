"""Shape symbols and contract checks (docs/design/spec/runtime.md §3).

One `SymbolTable` per scope: a fixed extent must match, a symbol binds at first sight and must
agree afterwards, a ``request_aligned`` axis has extent 1 (one sequence per run), and symbols
declared *dynamic* (a cell's recurrence axis at package scope) bind and check nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speculant.errors import ContractError
from speculant.package.model import TensorContract
from speculant.tensors import Value

# (contract id, dtype, shape) -> (the contract, the (axis, symbol) pairs it binds): a value of
# that dtype and shape passed every fixed check of that contract once, so only its symbols
# need binding again. The entry holds the contract, so its id is not reused while it lives.
_VERIFIED: dict[tuple[int, str, tuple[int, ...]],
                tuple[TensorContract, tuple[tuple[int, str], ...]]] = {}
VERIFIED_LIMIT = 1 << 14  # distinct (contract, dtype, shape) triples kept; then start over


@dataclass
class SymbolTable:
    scope: str  # e.g. "invocation of 'target'" or "pass at C0=7"
    dynamic: frozenset[str] = frozenset()
    # symbol -> (extent, what bound it: a port name and its axis, or a description and None)
    bound: dict[str, tuple[int, str, int | None]] = field(default_factory=dict)

    def check(self, name: str, contract: TensorContract, value: Value) -> None:
        """Check ``value`` (bound as ``name``) against ``contract``; bind new symbols."""
        shape = value.shape
        key = (id(contract), value.dtype, shape)
        hit = _VERIFIED.get(key)
        if hit is not None and hit[0] is contract:
            symbols = hit[1]
        else:
            symbols = self._verify(name, contract, value.dtype, shape)
            if len(_VERIFIED) >= VERIFIED_LIMIT:
                _VERIFIED.clear()
            _VERIFIED[key] = (contract, symbols)
        bound = self.bound
        for axis, symbol in symbols:
            if symbol in self.dynamic:
                continue
            previous = bound.get(symbol)
            if previous is None:
                bound[symbol] = (shape[axis], name, axis)
            elif previous[0] != shape[axis]:
                self.bind(symbol, shape[axis], f"'{name}' axis {axis}")  # raises, with context

    def _verify(self, name: str, spec: TensorContract, dtype: str,
                shape: tuple[int, ...]) -> tuple[tuple[int, str], ...]:
        """Every check that depends on dtype and shape alone; the symbol axes to bind."""
        aligned = spec.batch_layout.axis if spec.batch_layout.kind == "request_aligned" \
            else None
        if dtype != spec.dtype:
            raise ContractError(
                f"{self.scope}: '{name}' has dtype {dtype}, its contract says "
                f"{spec.dtype}", path=name, value=dtype, expected=spec.dtype)
        if len(shape) != spec.rank:
            raise ContractError(
                f"{self.scope}: '{name}' has rank {len(shape)} (shape {list(shape)}), its "
                f"contract says {spec.rank}", path=name, value=shape,
                expected=f"rank {spec.rank}")
        symbols = []
        for axis, dim in enumerate(spec.dims):
            extent = shape[axis]
            if axis == aligned and extent != 1:
                raise ContractError(
                    f"{self.scope}: '{name}' has {extent} rows on its request axis {axis}; "
                    "speculant decodes one sequence per run", path=name, value=extent,
                    expected="1")
            if isinstance(dim, int):
                if dim != extent:
                    raise ContractError(
                        f"{self.scope}: '{name}' axis {axis} has extent {extent}, its contract "
                        f"fixes {dim}", path=name, value=extent, expected=str(dim))
            elif dim is not None:
                symbols.append((axis, dim))
        return tuple(symbols)

    def bind(self, symbol: str, extent: int, by: str) -> None:
        previous = self.bound.get(symbol)
        if previous is None:
            self.bound[symbol] = (extent, by, None)
        elif previous[0] != extent:
            first = previous[1] if previous[2] is None else f"'{previous[1]}' axis {previous[2]}"
            raise ContractError(
                f"{self.scope}: symbol '{symbol}' is {previous[0]} from {first} but "
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
