"""Tensor contracts (docs/design/spec/metadata.md §4.2) and the base every typed metadata object
shares: closed objects, dtypes, and errors about one key."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from speculant.dtypes import DTYPE_NAMES

DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
                 "fp8_e4m3fn": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3",
                 "fp8_e5m2": "float8_e5m2"}


def normalize_dtype(name: str) -> str:
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_NAMES)} "
                         "(or the aliases fp32, fp16, bf16)")
    return name


def field_error(field: str, message: str) -> PydanticCustomError:
    """A validation error about one key of the object being validated: ``package.document``
    appends ``field`` to the error location so the reported path names the key itself."""
    return PydanticCustomError("field_error", "{message}", {"field": field, "message": message})


Dtype = Annotated[str, AfterValidator(normalize_dtype)]
NonEmpty = Annotated[str, Field(min_length=1)]
UInt = Annotated[int, Field(ge=0)]
Dim = int | str | None  # fixed extent, shape symbol, or unknown


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# -- contracts ---------------------------------------------------------------------------
class BatchLayout(Closed):
    kind: Literal["shared", "request_aligned", "request_expanded", "token_packed",
                  "runtime_sequence_state"] = "shared"
    axis: UInt | None = None
    factor: UInt | None = None  # request_expanded
    offsets: str | None = None  # token_packed
    owner: str | None = None  # token_packed

    @model_validator(mode="after")
    def _axis_for_aligned(self) -> BatchLayout:
        if self.kind == "request_aligned" and self.axis is None:
            raise field_error("axis", "request_aligned batch_layout needs 'axis'")
        if self.kind == "request_expanded" and self.factor == 0:
            raise field_error("factor", "request_expanded batch_layout with factor 0")
        return self


class Padding(Closed):
    """A padded axis (later revision): ``valid_lengths`` names the value holding each row's
    valid extent along ``dimension``."""

    dimension: NonEmpty
    valid_lengths: NonEmpty


class TensorContract(Closed):
    """``rank`` may be left out where ``shape`` is given (later revision): it is then
    ``len(shape)``; when both are present they must agree."""

    dtype: Dtype
    rank: UInt
    shape: list[Annotated[int, Field(ge=0)] | NonEmpty | None] | None = None
    optional: bool = False
    batch_layout: BatchLayout = BatchLayout()
    padding: list[Padding] = []

    @model_validator(mode="before")
    @classmethod
    def _rank_from_shape(cls, data: Any) -> Any:
        if isinstance(data, dict) and "rank" not in data:
            shape = data.get("shape")
            if not isinstance(shape, list):
                raise field_error("rank", "a contract needs 'rank' or a 'shape' list")
            data = {**data, "rank": len(shape)}
        return data

    @model_validator(mode="after")
    def _rank_matches_shape(self) -> TensorContract:
        if self.shape is not None and len(self.shape) != self.rank:
            raise field_error("rank", f"rank {self.rank} != len(shape) {len(self.shape)} for "
                              f"shape {self.shape}")
        if self.batch_layout.axis is not None and self.batch_layout.axis >= self.rank:
            raise field_error("batch_layout.axis",
                              f"batch_layout.axis {self.batch_layout.axis} >= rank {self.rank}")
        return self

    @property
    def dims(self) -> list[Dim]:
        return list(self.shape) if self.shape is not None else [None] * self.rank
