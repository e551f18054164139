"""A request and its admission (runtime.md §2): what every pass will bind, decided once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from speculant.errors import RequestError
from speculant.package.model import TensorContract, WorkflowInput
from speculant.package.plan import LoadPlan
from speculant.tensors import NUMPY_DTYPES, Value
from speculant.tensors.sampling import Sampling

CONTROL_SEEDS = {"active": True, "done": False, "accepted_len": 0}
# The proposer kinds a request may name (the classes are chosen in speculative/factory.py).
PROPOSER_KINDS = ("chained", "draft", "prompt_lookup")


@dataclass(frozen=True)
class Request:
    """One decode request (token ids in, token ids out)."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    proposer: str | None = None  # None (plain decode), "auto" or one of PROPOSER_KINDS
    k: int | None = None  # drafts per round asked for
    stop_token_ids: tuple[int, ...] = ()  # added to the package's EOS ids
    stop_sequences: tuple[tuple[int, ...], ...] = ()  # token-id sequences that end the stream
    stop_on_eos: bool = True
    inputs: Mapping[str, np.ndarray] = field(default_factory=dict)  # caller values
    max_context: int | None = None
    seed: int = 0  # seeds the request's one generator (sampling draws)
    temperature: float = 0.0  # 0: greedy (argmax), bit-exact
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    min_p: float = 0.0
    ngram_range: tuple[int, int] = (1, 3)  # prompt lookup: n from max down to min


@dataclass
class Admitted:
    """What admission decided: fixed values, defaults to materialize, seeded controls."""

    fixed: dict[str, Value]  # workflow value -> value bound into every pass
    defaults: dict[str, WorkflowInput]  # materialized per pass at the pass's resolved shape
    controls: dict[str, Value]  # "active"/"done"/"accepted_len" -> current value
    context_cap: int | None  # M (runtime.md §13); None: no cap
    proposer: str | None  # resolved: None or one of PROPOSER_KINDS
    k: int  # drafts per round (0 when plain decode)
    sampling: Sampling | None = None  # T(row) in force; None: greedy


def literal_value(name: str, spec: WorkflowInput, shape: tuple[int, ...]) -> Value:
    """A default materialized at ``shape``: a scalar fills it, a list gives row-major data."""
    contract = spec.contract
    np_dtype = NUMPY_DTYPES[contract.dtype]
    default = spec.default
    if isinstance(default, list):
        array = np.asarray(default, dtype=np_dtype)
        if array.size != int(np.prod(shape)):
            raise RequestError(f"default of '{name}' has {array.size} elements, its shape "
                               f"{list(shape)} needs {int(np.prod(shape))}", path=name)
        array = array.reshape(shape)
    else:
        array = np.full(shape, default, dtype=np_dtype)
    return Value.host(array, contract.dtype)


def scalar_shape(contract: TensorContract, name: str) -> tuple[int, ...]:
    if contract.rank == 0:
        return ()
    if contract.rank == 1:
        return (1,)
    raise RequestError(f"'{name}' is a scalar role but its contract has rank {contract.rank}",
                       path=name, value=contract.rank, expected="rank 0 or 1")


def _caller_value(name: str, spec: WorkflowInput, array: np.ndarray) -> Value:
    array = np.asarray(array)
    dtype = spec.contract.dtype
    if array.dtype != NUMPY_DTYPES[dtype]:
        raise RequestError(f"caller value for '{name}' has dtype {array.dtype}, its contract "
                           f"says {dtype}", path=name, value=str(array.dtype), expected=dtype)
    return Value.host(array, dtype)


def admit(plan: LoadPlan, inputs_spec: Mapping[str, WorkflowInput], request: Request,
          *, vocab_size: int | None, static_context_cap: int | None,
          never_materialized: Sequence[str] = ()) -> Admitted:
    """Admit ``request`` (runtime.md §2.1-§2.4); raise `RequestError` naming what is wrong."""
    prompt = request.prompt_ids
    if len(prompt) == 0:
        raise RequestError("the prompt is empty", path="prompt_ids",
                           expected="at least one token id")
    if vocab_size is not None:
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise RequestError(f"prompt token ids {bad[:8]} are outside the vocabulary "
                               f"[0, {vocab_size})", path="prompt_ids", value=bad[:8],
                               expected=f"0 <= id < {vocab_size}")
    if request.max_new_tokens < 1:
        raise RequestError("max_new_tokens must be at least 1", path="max_new_tokens",
                           value=request.max_new_tokens, expected=">= 1")

    names_by_source = {spec.source.name: name for name, spec in inputs_spec.items()
                       if spec.source.kind == "application" and spec.source.name}
    undeclared = [n for n in request.inputs if n not in inputs_spec and n not in names_by_source]
    if undeclared:
        raise RequestError(f"caller values for undeclared inputs {sorted(undeclared)}",
                           value=sorted(undeclared), expected=f"one of {sorted(inputs_spec)}")
    controls_by_value = {value: control for control, value in plan.serving.items()}

    fixed: dict[str, Value] = {}
    defaults: dict[str, WorkflowInput] = {}
    controls: dict[str, Value] = {}
    for name, spec in inputs_spec.items():
        caller = request.inputs.get(name)
        if caller is None and spec.source.name is not None and spec.source.kind == "application":
            caller = request.inputs.get(spec.source.name)
        if name in plan.driver_bound:  # rule 1
            if caller is not None:
                raise RequestError(f"'{name}' is bound by speculant on every pass "
                                   f"({plan.driver_bound[name]}); a caller value is not allowed",
                                   path=name)
            continue
        control = controls_by_value.get(name)
        if control is not None:  # §2.2: caller > default > role seed
            if caller is not None:
                controls[control] = _caller_value(name, spec, caller)
            elif spec.default is not None:
                controls[control] = literal_value(name, spec, scalar_shape(spec.contract, name))
            else:
                seed = np.full(scalar_shape(spec.contract, name), CONTROL_SEEDS[control],
                               dtype=NUMPY_DTYPES[spec.contract.dtype])
                controls[control] = Value.host(seed, spec.contract.dtype)
            continue
        if caller is not None:  # rule 2
            fixed[name] = _caller_value(name, spec, caller)
        elif spec.source.kind == "request":  # rule 3
            fixed[name] = _request_role_value(name, spec, request)
        elif name in never_materialized:  # the chain builds it (§9.3)
            continue
        elif spec.default is not None:  # rule 4
            defaults[name] = spec
        elif spec.required:  # rule 6
            raise RequestError(f"missing required input '{name}'", path=name,
                               remedy=f"pass it as inputs={{'{name}': array}}")

    caps = [c for c in (static_context_cap, request.max_context) if c is not None]
    for value_name in plan.context_cap_inputs:
        value = fixed.get(value_name)
        if value is None and value_name in defaults:
            value = literal_value(value_name, defaults[value_name],
                                  scalar_shape(defaults[value_name].contract, value_name))
        if value is not None:
            caps.append(int(value.data.reshape(-1)[0]))
    context_cap = min(caps) if caps else None
    if context_cap is not None and len(prompt) >= context_cap:
        raise RequestError(f"the prompt fills the context: {len(prompt)} tokens, context cap "
                           f"{context_cap}", path="prompt_ids", value=len(prompt),
                           expected=f"fewer than {context_cap} tokens")
    proposer, k = _choose_proposer(plan, request)
    return Admitted(fixed, defaults, controls, context_cap, proposer, k,
                    sampling_of(request))


def _request_role_value(name: str, spec: WorkflowInput, request: Request) -> Value:
    role = spec.role.role
    sampling = sampling_of(request)
    in_force = ({"sampling_temperature": 0.0, "sampling_top_k": 1, "sampling_top_p": 1.0,
                 "sampling_min_p": 0.0} if sampling is None else
                {"sampling_temperature": sampling.temperature, "sampling_top_k": sampling.top_k,
                 "sampling_top_p": sampling.top_p, "sampling_min_p": sampling.min_p})
    if role in ("max_output_tokens", "max_iterations"):
        number: float = request.max_new_tokens
    elif role == "seed":
        number = request.seed
    elif role in in_force:
        number = in_force[role]
    else:
        raise RequestError(f"request input '{name}' has role '{role}', which speculant does not "
                           "derive for a caller", path=name, value=role)
    shape = scalar_shape(spec.contract, name)
    return Value.host(np.full(shape, number, NUMPY_DTYPES[spec.contract.dtype]),
                      spec.contract.dtype)


def sampling_of(request: Request) -> Sampling | None:
    """The request's sampling settings, checked (runtime.md §17); None for greedy."""
    checks = (("temperature", request.temperature, request.temperature >= 0, ">= 0"),
              ("top_k", request.top_k, request.top_k >= 0, ">= 0 (0: no limit)"),
              ("top_p", request.top_p, 0 < request.top_p <= 1, "in (0, 1]"),
              ("min_p", request.min_p, 0 <= request.min_p <= 1, "in [0, 1]"),
              ("seed", request.seed, request.seed >= 0, "an integer >= 0"))
    for name, value, ok, expected in checks:
        if not ok:  # NaN fails every comparison, so it lands here too
            raise RequestError(f"{name} = {value} is outside its range", path=name,
                               value=value, expected=expected)
    if request.temperature == 0:
        return None
    return Sampling(float(request.temperature), int(request.top_k), float(request.top_p),
                    float(request.min_p))


def _choose_proposer(plan: LoadPlan, request: Request) -> tuple[str | None, int]:
    """Proposer choice and width checks of runtime.md §2.4 and §18.

    The bound on ``k``: ``max_proposal_width`` for the declared chained proposer; the
    smallest ``rollback_positions`` of the target's state groups for prompt lookup and a
    draft model (whose own groups are checked when it is attached to the request).
    """
    name, k = request.proposer, request.k
    if name is None:
        return None, 0
    if name == "auto":
        return None, 0  # resolved by the engine, which knows the auto-enable rule
    if name not in PROPOSER_KINDS:
        raise RequestError(f"unknown proposer '{name}'", path="proposer", value=name,
                           expected=f"one of {', '.join(map(repr, PROPOSER_KINDS))} or 'auto'")
    if name == "chained" and plan.chain is None:
        raise RequestError("this package declares no chained speculative contract "
                           "(no 'speculative' section with proposal_execution.kind: chained)",
                           path="speculative", value=name,
                           remedy="decode without a proposer, or use proposer='prompt_lookup'")
    if k is None or k < 1:
        raise RequestError(f"k must be at least 1 when a proposer is named, got {k}", path="k",
                           value=k, expected=">= 1")
    if name == "chained":
        bound, field_path = plan.rollback_bound, "speculative.max_proposal_width"
    else:
        bound, field_path = plan.undeclared_rollback_bound, "rollback_positions"
        if bound is None:
            raise RequestError(
                f"proposer '{name}' needs every state group of the target to declare "
                "capabilities.rollback_positions (the rollback bound), and this package does "
                "not", path="rollback_positions", value=name,
                remedy="declare rollback_positions on the target's state groups")
    if bound is not None and k > bound:
        raise RequestError(f"k = {k} exceeds {field_path} = {bound}", path=field_path,
                           value=k, expected=f"1 <= k <= {bound}")
    low, high = request.ngram_range
    if name == "prompt_lookup" and not 1 <= low <= high:
        raise RequestError(f"ngram_range = {request.ngram_range} is not (n_min, n_max) with "
                           "1 <= n_min <= n_max", path="ngram_range",
                           value=request.ngram_range, expected="1 <= n_min <= n_max")
    return name, k
