"""Typed metadata: the subset of the ONNX Inference Metadata Standard speculant reads.

Every object is closed (``extra="forbid"``: an unknown key is a ``MetadataError``). Keys of the
standard that speculant does not execute are still known here, typed loosely, so that a
document using them parses and the feature that owns them can name them as unsupported.
Rules that need the whole document (SSA, aliases, the chain) live in the feature modules
(``io``, ``steps``, ``state``, ``serving``, ``chain``); this module checks only what one object
can check about itself.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from speculant.package.contract import (
    Closed,
    NonEmpty,
    TensorContract,
    UInt,
    field_error,
)


# -- workflow inputs and outputs -----------------------------------------------------------
class Role(Closed):
    kind: Literal["runtime", "opaque", "semantic"]
    version: str | None = None
    role: str | None = None


class Source(Closed):
    kind: Literal["request", "application", "literal", "artifact"]
    name: NonEmpty | None = None
    path: str | None = None

    @model_validator(mode="after")
    def _fields_per_kind(self) -> Source:
        if self.kind == "application" and self.name is None:
            raise field_error("name", "an application source needs 'name'")
        if self.kind == "artifact" and self.path is None:
            raise field_error("path", "an artifact source needs 'path'")
        return self


class WorkflowInput(Closed):
    contract: TensorContract
    role: Role
    source: Source
    required: bool = True
    default: Any = None
    present_as: Any = None
    externally_suppliable: bool | None = None


class OutputFamily(Closed):
    """How an output is delivered (later revision); ``materialized`` (one value per
    invocation) is what an output without ``family`` means."""

    kind: NonEmpty
    model_config = ConfigDict(extra="allow", frozen=True)  # other kinds' keys: unsupported


class WorkflowOutput(Closed):
    contract: TensorContract
    role: Literal["tensor", "tokens", "text", "image", "audio", "event", "video"]
    stage: Literal["pre_adapter", "post_adapter"]
    value_range: Any = None
    media: Any = None
    family: OutputFamily | None = None


# -- components -------------------------------------------------------------------------
class Implementation(Closed):
    kind: Literal["onnx", "adapter", "binding"]
    artifact: str | None = None
    model_config = ConfigDict(extra="allow", frozen=True)  # adapter/binding keys: unsupported


class Ports(Closed):
    inputs: dict[str, TensorContract] = {}
    outputs: dict[str, TensorContract] = {}
    roles: dict[str, Literal["token_ids", "inputs_embeds", "attention_mask", "position_ids",
                             "logits", "hidden_states", "encoder_hidden_states",
                             "audio_features"]] = {}


class ComponentContract(Closed):
    id: str
    version: str
    bindings: dict[str, str] = {}
    parameters: Any = None
    equivalence: Literal["bitwise", "distribution_preserving", "semantic"] = "semantic"


class Component(Closed):
    implementation: Implementation
    ports: Ports | None = None
    contract: ComponentContract | None = None
    application_overridable: bool | None = None
    effects: Any = None
    cache_affects_state: Any = None
    row_scope: Any = None


# -- state and serving ------------------------------------------------------------------
class Recurrence(Closed):
    kind: Literal["invariant", "growing", "bounded"]
    axis: UInt | None = None
    increment: str | None = None
    max: str | None = None

    @model_validator(mode="after")
    def _fields_per_kind(self) -> Recurrence:
        needed = {"invariant": (), "growing": ("axis", "increment", "max"),
                  "bounded": ("axis", "max")}[self.kind]
        missing = [k for k in needed if getattr(self, k) is None]
        if missing:
            raise field_error(missing[0], f"{self.kind} recurrence needs {', '.join(missing)}")
        return self


class StateCell(Closed):
    contract: TensorContract
    scope: Literal["invocation", "session"]
    initializer: NonEmpty
    recurrence: Recurrence
    class_: Literal["semantic", "advisory"] = Field("semantic", alias="class")
    # The standard's default is `workflow` (inference_metadata.schema.json); speculant needs
    # `runtime`, so an absent key is an unsupported cell, not a runtime cell without a
    # release_boundary (published example 18 relies on this reading).
    management: Literal["runtime", "workflow", "external"] = "workflow"
    release_boundary: Literal["invocation", "session", "row"] | None = None
    service_group: str | None = None
    session: Any = None


class StatePortAlias(Closed):
    input: NonEmpty
    output: NonEmpty | None = None
    access: Literal["read_write", "read_only"] = "read_write"
    role: Literal["key", "value", "combined"] | None = None
    layer: UInt | None = None


class GroupCapabilities(Closed):
    rollback_positions: UInt | None = None
    cascade: list[str] = []
    snapshot: bool | None = None
    fork: bool | None = None


class StateUpdate(Closed):
    kind: Literal["append", "replace", "indexed_scatter"] = "append"
    model_config = ConfigDict(extra="allow", frozen=True)  # indexed_scatter keys: unsupported


class StateReuse(Closed):
    prefix_reusable: bool | None = None
    evictable_prefix: bool | None = None


class StateGroup(Closed):
    kind: Literal["full_attention", "sliding_attention", "multi_latent_attention", "recurrent",
                  "cross_attention", "encoder"]
    layout: str
    sequence_axis: UInt | None = None
    update: StateUpdate | None = None
    capabilities: GroupCapabilities = GroupCapabilities()
    reuse: StateReuse | None = None
    aliasing: Literal["forbidden", "permitted", "required"] = "forbidden"
    logical_lengths: Any = None
    total_length: Any = None
    checkpoint: Any = None
    ports: dict[str, dict[str, StatePortAlias]] = {}


class StateService(Closed):
    groups: dict[str, StateGroup] = {}


class Serving(Closed):
    active: NonEmpty
    done: NonEmpty
    accepted_len: NonEmpty | None = None
    state_service: StateService


# -- steps ------------------------------------------------------------------------------
class LoopCarry(Closed):
    """A cell a loop carries: ``next`` (a body value) becomes the cell for the next
    iteration and, after the loop, the cell's value for the steps that follow."""

    cell: NonEmpty
    next: NonEmpty
    initial: str | None = None


class BranchOutput(Closed):
    """A value a branch publishes: the case's value, or ``default``."""

    cases: dict[str, str]
    default: str | None = None


STEP_FIELDS = {  # kind -> (allowed keys, required keys)
    "invoke": ({"component", "inputs", "outputs"}, ("component",)),
    "emit": ({"value", "output", "mode", "axis", "when", "valid_length"},
             ("value", "output", "mode")),
    "sequence": ({"steps"}, ("steps",)),
    "loop": ({"steps", "setup", "carried", "continue_when", "max_iterations", "iteration",
              "termination"}, ("steps", "continue_when", "max_iterations")),
    "branch": ({"predicate", "cases", "default", "outputs"}, ("predicate", "cases")),
}


class Step(Closed):
    """One workflow step, typed per kind. ``invoke`` and ``emit`` are executed; the
    control steps (``sequence``, ``loop``, ``branch``) are typed so that the values they
    publish are known, and are reported unsupported; other kinds keep their keys for rule 16."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: str
    # invoke
    component: str | None = None
    inputs: dict[str, str] | None = None
    outputs: dict[str, str | BranchOutput] | None = None  # branch: value -> BranchOutput
    # emit
    value: str | None = None
    output: str | None = None
    mode: Literal["replace", "append", "event"] | None = None
    axis: Any = None
    when: Any = None
    valid_length: Any = None
    # sequence, loop
    steps: list[Step] | None = None
    setup: list[Step] | None = None
    carried: list[LoopCarry] | None = None
    continue_when: str | None = None
    max_iterations: str | None = None
    iteration: Any = None
    termination: Literal["predicate", "generation_eos"] | None = None
    # branch
    predicate: str | None = None
    cases: dict[str, Step] | None = None
    default: Step | None = None

    @model_validator(mode="after")
    def _closed_for_known_kinds(self) -> Step:
        if self.kind not in STEP_FIELDS:
            return self
        allowed, required = STEP_FIELDS[self.kind]
        set_keys = {k for k in self.model_fields_set if k != "kind"}
        foreign = sorted((set_keys - allowed) | set(self.model_extra or {}))
        if foreign:
            raise PydanticCustomError(
                "unknown_keys", "unknown key(s) {keys} for a {kind} step",
                {"keys": foreign, "kind": self.kind})
        missing = [k for k in required if getattr(self, k) is None]
        if missing:
            raise field_error(missing[0], f"{self.kind} step needs {', '.join(missing)}")
        for port, bound in (self.outputs or {}).items():
            if self.kind == "branch" and isinstance(bound, str):
                raise field_error(f"outputs.{port}", "a branch output is a map "
                                  "{cases: {case: value}, default}, not a value name")
            if self.kind == "invoke" and not isinstance(bound, str):
                raise field_error(f"outputs.{port}", "an invoke output binds a value name")
        return self

    def invoke_outputs(self) -> dict[str, str]:
        """Port -> value of an invoke (``outputs`` holds only strings there)."""
        return {port: value for port, value in (self.outputs or {}).items()
                if isinstance(value, str)}


class Manifest(Closed):
    """``ir_version`` (the workflow IR's version) and ``onnx_opsets`` (domain -> opset the
    components use) are informational: ONNX Runtime checks each graph's own opset imports
    when it creates the session."""

    capabilities: list[str] = []
    adapter_abis: Any = None
    ir_version: str | None = None
    onnx_opsets: dict[str, Annotated[int, Field(ge=1)]] = {}


class Workflow(Closed):
    manifest: Manifest
    components: dict[str, Component]
    steps: list[Step]
    inputs: dict[str, WorkflowInput] = {}
    outputs: dict[str, WorkflowOutput] = {}
    state: dict[str, StateCell] = {}
    serving: Serving | None = None
    effects: Any = None


class Pipeline(Closed):
    workflow: Workflow


# -- package, model, generation ---------------------------------------------------------
class SpecialToken(Closed):
    id: UInt
    content: NonEmpty


class TokenizerArtifact(Closed):
    location: str


class Tokenizer(Closed):
    algorithm: NonEmpty
    vocab_size: Annotated[int, Field(ge=1)]
    byte_level: bool = False
    special_tokens: dict[str, SpecialToken] = {}
    artifacts: Annotated[list[TokenizerArtifact], Field(min_length=1)] | None = None


class PackageSection(Closed):
    tokenizer: Tokenizer | None = None
    constraint_languages: Any = None


class ModelSection(Closed):
    vocab_size: Annotated[int, Field(ge=1)] | None = None
    max_sequence_length: Annotated[int, Field(ge=1)] | None = None
    attention: dict[str, Any] | None = None
    mixture_of_experts: Any = None
    sharding: Any = None
    runtime_configurable: Any = None
    io: Any = None


class GenerationDefaults(Closed):
    do_sample: bool | None = None
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_k: UInt | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    max_length: Annotated[int, Field(ge=1)] | None = None
    min_length: UInt | None = None
    num_beams: Annotated[int, Field(ge=1)] | None = None
    num_return_sequences: Annotated[int, Field(ge=1)] | None = None
    repetition_penalty: float | None = None
    length_penalty: float | None = None
    diversity_penalty: float | None = None
    no_repeat_ngram_size: UInt | None = None
    early_stopping: Any = None


class Generation(Closed):
    defaults: GenerationDefaults = GenerationDefaults()
    overrides: Any = None


# -- speculative ------------------------------------------------------------------------
class Vocabulary(Closed):
    kind: Literal["identical", "subset", "mapped"]
    proposer_vocab_size: Annotated[int, Field(ge=1)] | None = None
    artifact: str | None = None

    @model_validator(mode="after")
    def _fields_per_kind(self) -> Vocabulary:
        if self.kind == "subset" and self.proposer_vocab_size is None:
            raise field_error("proposer_vocab_size", "subset vocabulary needs proposer_vocab_size")
        if self.kind == "mapped" and not self.artifact:
            raise field_error("artifact", "mapped vocabulary needs artifact (its map's file)")
        return self


class ValueRef(Closed):
    component: NonEmpty
    output: NonEmpty


class TokenEmbedding(Closed):
    component: NonEmpty
    table: str
    scale: float | None = None


class ProposalExecution(Closed):
    """``block`` or ``chained``, closed; another kind (later revision: ``candidate_tree``)
    keeps its keys, and ``chain`` reports it unsupported."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: NonEmpty = "block"
    token_embedding_input: str | None = None
    logits_output: str | None = None
    folded_carry_output: str | None = None
    folded_carry_seed: ValueRef | None = None
    token_embedding: TokenEmbedding | None = None
    recurrent: list[Any] = []

    @model_validator(mode="after")
    def _closed_for_known_kinds(self) -> ProposalExecution:
        if self.kind in ("block", "chained") and self.model_extra:
            raise PydanticCustomError(
                "unknown_keys", "unknown key(s) {keys} for a {kind} proposal execution",
                {"keys": sorted(self.model_extra), "kind": self.kind})
        return self


class Speculative(Closed):
    """``identity``/``version`` (later revision) name the speculative contract a document is
    written against; speculant implements ``onnx-genai.speculative`` version 1."""

    proposer: NonEmpty
    target: NonEmpty
    vocabulary: Vocabulary
    max_proposal_width: Annotated[int, Field(ge=1)]
    proposal_execution: ProposalExecution = ProposalExecution()
    port_bindings: dict[str, str] = {}
    shared_state: list[str] = []
    shared_weights: Any = None
    distribution_preserving: bool = False
    rollback_state: list[str] = []
    identity: NonEmpty | None = None
    version: NonEmpty | None = None
    verification: Any = None


class Document(Closed):
    """The root of ``inference_metadata.{yaml,yml,json}``."""

    schema_version: str = "v1"
    model: ModelSection | None = None
    package: PackageSection | None = None
    pipeline: Pipeline | None = None
    speculative: Speculative | None = None
    generation: Generation | None = None
    required_capabilities: list[str] = []
    profiles: Any = None
    adapters: Any = None
    preprocessing: Any = None
    quantization: dict[str, Any] | None = None
    hardware_requirements: dict[str, Any] | None = None

    @property
    def workflow(self) -> Workflow:
        assert self.pipeline is not None
        return self.pipeline.workflow
