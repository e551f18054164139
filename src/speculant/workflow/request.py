"""A request and its admission (docs/design/spec/runtime.md §2): what each pass binds, set once."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from speculant.errors import RequestError
from speculant.package.model import TensorContract, WorkflowInput
from speculant.package.plan import LoadPlan
from speculant.tensors import NUMPY_DTYPES, Value
from speculant.tensors.sampling import Sampling
from speculant.workflow.options import MIN_TEMPERATURE, GenerationOptions

CONTROL_SEEDS = {"active": True, "done": False, "accepted_len": 0}


@dataclass(frozen=True)
class Request:
    """One decode request: token ids in, the options it is decoded with, caller values."""

    prompt_ids: tuple[int, ...]
    options: GenerationOptions = GenerationOptions()  # checked (GenerationOptions.checked)
    inputs: Mapping[str, np.ndarray] = field(default_factory=dict)  # caller values


@dataclass(frozen=True)
class Admitted:
    """What admission decided, fixed for the whole decode: the values bound into every pass,
    the defaults materialized per pass, the serving controls' starting values (the decode
    state owns their current ones), the context cap, the sampling in force and the seed (the
    request's, or drawn fresh for it)."""

    fixed: Mapping[str, Value]  # workflow value -> value bound into every pass
    defaults: Mapping[str, WorkflowInput]  # materialized per pass at the pass's resolved shape
    initial_controls: Mapping[str, Value]  # "active"/"done"/"accepted_len" -> seeded value
    context_cap: int | None  # M: the context cap; None: no cap
    sampling: Sampling | None = None  # T(row) in force; None: greedy
    seed: int = 0  # >= 0: the request's seed, or a fresh one when it gave none


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
    try:
        array = np.asarray(array)
    except (TypeError, ValueError) as exc:  # ragged lists, objects numpy cannot hold
        raise RequestError(f"caller value for '{name}' is not an array: {exc}", path=name,
                           expected=f"a numpy array of {spec.contract.dtype}") from None
    dtype = spec.contract.dtype
    if array.dtype != NUMPY_DTYPES[dtype]:
        raise RequestError(f"caller value for '{name}' has dtype {array.dtype}, its contract "
                           f"says {dtype}", path=name, value=str(array.dtype), expected=dtype)
    return Value.host(array, dtype)


def admit_request(plan: LoadPlan, inputs_spec: Mapping[str, WorkflowInput], request: Request,
                  *, vocab_size: int | None, static_context_cap: int | None,
                  never_materialized: Sequence[str] = ()) -> Admitted:
    """Admit ``request`` ; raise `RequestError` naming what is wrong.
    Its options are already checked by type and range; a request without a seed gets a
    fresh one here (every ``seed``-role input can hold it), so that whatever uses the seed
    sees the same."""
    if request.options.seed is None:
        request = replace(request, options=replace(request.options,
                                                   seed=fresh_seed(inputs_spec.values())))
    prompt = request.prompt_ids
    if len(prompt) == 0:
        raise RequestError("the prompt is empty", path="prompt_ids",
                           expected="at least one token id")
    bad = [t for t in prompt if t < 0 or (vocab_size is not None and t >= vocab_size)]
    if bad:
        bounds = f"[0, {vocab_size})" if vocab_size is not None else "ids >= 0"
        raise RequestError(f"prompt token ids {bad[:8]} are outside the vocabulary {bounds}",
                           path="prompt_ids", value=bad[:8], expected=f"ids in {bounds}")
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
        if control is not None:  # caller > default > role seed
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
        elif name in never_materialized:  # the chain builds it
            continue
        elif spec.default is not None:  # rule 4
            defaults[name] = spec
        elif spec.required:  # rule 6
            raise RequestError(f"missing required input '{name}'", path=name,
                               remedy=f"pass it as inputs={{'{name}': array}}")

    caps = [c for c in (static_context_cap, request.options.max_context) if c is not None]
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
    return Admitted(fixed, defaults, controls, context_cap, sampling_of(request.options),
                    request.options.seed)


def fresh_seed(inputs: Iterable[WorkflowInput]) -> int:
    """A random seed in [0, 2^63), narrower where a ``seed``-role request input's dtype
    holds less (an integer dtype's maximum; 2^24 for a float, exact in float32)."""
    bound = 2**63 - 1
    for spec in inputs:
        if spec.source.kind == "request" and spec.role.role == "seed":
            dtype = NUMPY_DTYPES[spec.contract.dtype]
            bound = min(bound, int(np.iinfo(dtype).max) if np.issubdtype(dtype, np.integer)
                        else 2**24)
    return secrets.randbelow(bound + 1)


def _request_role_value(name: str, spec: WorkflowInput, request: Request) -> Value:
    role = spec.role.role
    sampling = sampling_of(request.options)
    in_force = ({"sampling_temperature": 0.0, "sampling_top_k": 1, "sampling_top_p": 1.0,
                 "sampling_min_p": 0.0} if sampling is None else
                {"sampling_temperature": sampling.temperature, "sampling_top_k": sampling.top_k,
                 "sampling_top_p": sampling.top_p, "sampling_min_p": sampling.min_p})
    if role in ("max_output_tokens", "max_iterations"):
        number: float = request.options.max_new_tokens
    elif role == "seed":
        number = request.options.seed
    elif role in in_force:
        number = in_force[role]
    else:
        raise RequestError(f"request input '{name}' has role '{role}', which speculant does not "
                           "derive for a caller", path=name, value=role)
    shape = scalar_shape(spec.contract, name)
    dtype = NUMPY_DTYPES[spec.contract.dtype]
    if np.issubdtype(dtype, np.integer) and not \
            np.iinfo(dtype).min <= number <= np.iinfo(dtype).max:
        raise RequestError(f"request input '{name}' (role '{role}') cannot hold {number} as "
                           f"{spec.contract.dtype}", path=name, value=number,
                           expected=f"at most {np.iinfo(dtype).max}")
    return Value.host(np.full(shape, number, dtype), spec.contract.dtype)


def sampling_of(options: GenerationOptions) -> Sampling | None:
    """The sampling settings in force (temperature at least MIN_TEMPERATURE); None for
    greedy. The options are checked already."""
    if options.temperature < MIN_TEMPERATURE:
        return None
    return Sampling(options.temperature, options.top_k, options.top_p, options.min_p)
