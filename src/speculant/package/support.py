"""What a valid document may say but speculant v1 cannot execute: every `UnsupportedError`.

These are the "U" rules of metadata.md §6 and the *unsupported* keys of the §3–§4 tables.
``inspect --metadata-only`` reports them without failing; loading a runnable package raises
them. Each problem names the feature and its document path, and never passes silently
(§1 rule 2).
"""

from __future__ import annotations

from speculant.errors import Problem, ProblemCollector, UnsupportedError, shown
from speculant.package.model import FLOAT8_DTYPES, Document, TensorContract, Workflow
from speculant.package.rules import (
    SUPPORTED_CAPABILITIES,
    WF,
    borrowed_symbols,
    groups_of,
    owners,
    ports_of,
    position_symbol,
)

RUNTIME_ROLES = ("prompt_tokens", "max_output_tokens", "max_iterations", "seed",
                 "sampling_temperature", "sampling_top_k", "sampling_top_p", "sampling_min_p")
CONTROL_STEP_KINDS = ("sequence", "loop", "branch")
UNSUPPORTED_LAYOUTS = ("request_expanded", "token_packed", "runtime_sequence_state")
# generation.defaults keys that are only request defaults; every other key must be neutral.
NEUTRAL_DEFAULTS = {"min_length": (0,), "num_beams": (1,), "num_return_sequences": (1,),
                    "repetition_penalty": (1.0,), "length_penalty": (1.0,),
                    "diversity_penalty": (0.0,), "no_repeat_ngram_size": (0,),
                    "early_stopping": (False,)}
NAME_AXES_REMEDY = "give each sequence-like extent its own symbol: run `speculant metadata " \
                   "name-axes PACKAGE`, which republishes the document with distinct symbols"


def is_empty(value: object) -> bool:
    return value is None or value is False or value == {} or value == []


def unsupported_problems(doc: Document, file: str = "") -> list[Problem]:
    """Every `UnsupportedError` this document earns (empty when speculant can run it)."""
    out = ProblemCollector(file)
    _check_top_level(doc, out)
    if doc.pipeline is None:
        out.add(UnsupportedError, "a document without a pipeline section is not supported; "
                "speculant loads workflow packages only", path="pipeline",
                expected="a pipeline.workflow section")
        return out.problems
    wf = doc.workflow
    _check_workflow(wf, out)
    _check_contracts(doc, out)
    _check_components(doc, out)
    _check_state(doc, out)
    _check_steps(doc, out)
    _check_speculative(doc, out)
    return out.problems


def _unsupported(out: ProblemCollector, feature: str, path: str, value: object = None,
                 expected: str = "") -> None:
    out.add(UnsupportedError, f"{feature} is not supported by speculant", path=path,
            value=value, expected=expected)


# -- top level (§3) -----------------------------------------------------------------------
def _check_top_level(doc: Document, out: ProblemCollector) -> None:
    if doc.schema_version != "v1":
        _unsupported(out, f"schema_version '{doc.schema_version}'", "schema_version",
                     doc.schema_version, "v1")
    if doc.model is not None:
        for key in ("sharding", "runtime_configurable"):
            if not is_empty(getattr(doc.model, key)):
                _unsupported(out, f"model.{key}", f"model.{key}", getattr(doc.model, key),
                             "absent")
    if doc.package is not None and not is_empty(doc.package.constraint_languages):
        _unsupported(out, "package.constraint_languages", "package.constraint_languages",
                     doc.package.constraint_languages, "absent")
    if doc.generation is not None:
        if not is_empty(doc.generation.overrides):
            _unsupported(out, "generation.overrides", "generation.overrides",
                         doc.generation.overrides, "absent")
        defaults = doc.generation.defaults
        for key, neutral in NEUTRAL_DEFAULTS.items():
            value = getattr(defaults, key)
            if value is not None and value not in neutral:
                _unsupported(out, f"generation.defaults.{key} = {shown(value)}",
                             f"generation.defaults.{key}", value,
                             f"{neutral[0]!r} or absent")
    for key in ("profiles", "adapters", "preprocessing"):
        if not is_empty(getattr(doc, key)):
            _unsupported(out, f"'{key}'", key, None, "absent or empty")
    for index, capability in enumerate(doc.required_capabilities):  # rule 36
        if capability not in SUPPORTED_CAPABILITIES:
            _unsupported(out, f"required capability '{capability}'",
                         f"required_capabilities.{index}", capability,
                         "one of " + ", ".join(SUPPORTED_CAPABILITIES))


# -- workflow, inputs, outputs (§4.3–§4.5) ------------------------------------------------
def _check_workflow(wf: Workflow, out: ProblemCollector) -> None:
    if not is_empty(wf.effects):
        _unsupported(out, "workflow effects", f"{WF}.effects", wf.effects, "absent or empty")
    if not is_empty(wf.manifest.adapter_abis):
        _unsupported(out, "manifest.adapter_abis", f"{WF}.manifest.adapter_abis",
                     wf.manifest.adapter_abis, "absent or empty")
    for index, capability in enumerate(wf.manifest.capabilities):  # rule 36
        if capability not in SUPPORTED_CAPABILITIES:
            _unsupported(out, f"capability '{capability}'",
                         f"{WF}.manifest.capabilities.{index}", capability,
                         "one of " + ", ".join(SUPPORTED_CAPABILITIES))
    for name, spec in wf.inputs.items():
        path = f"{WF}.inputs.{name}"
        role = spec.role
        if spec.source.kind == "request" and role.kind == "runtime" and role.role is not None \
                and role.role not in RUNTIME_ROLES:
            _unsupported(out, f"runtime role '{role.role}' on a request input",
                         f"{path}.role.role", role.role, "one of " + ", ".join(RUNTIME_ROLES))
        if spec.source.kind == "artifact":
            _unsupported(out, "an artifact input source", f"{path}.source", spec.source.path,
                         "request, application or literal")
        if spec.present_as is not None:
            _unsupported(out, "present_as", f"{path}.present_as", spec.present_as, "absent")
    for name, output in wf.outputs.items():
        path = f"{WF}.outputs.{name}"
        if output.role not in ("tensor", "tokens"):
            _unsupported(out, f"output role '{output.role}'", f"{path}.role", output.role,
                         "tensor or tokens")
        for key in ("value_range", "media"):
            if getattr(output, key) is not None:
                _unsupported(out, f"output {key}", f"{path}.{key}", None, "absent")
    if wf.serving is not None:  # rule 20 (U part)
        for control in ("active", "done", "accepted_len"):
            value = getattr(wf.serving, control)
            if value is not None and value not in wf.inputs:
                _unsupported(out, f"serving control '{value}' that is not a workflow input",
                             f"{WF}.serving.{control}", value,
                             "a workflow input (speculant seeds and evolves the controls)")


def _all_contracts(doc: Document) -> list[tuple[str, TensorContract]]:
    wf = doc.workflow
    found = [(f"{WF}.inputs.{n}.contract", i.contract) for n, i in wf.inputs.items()]
    found += [(f"{WF}.outputs.{n}.contract", o.contract) for n, o in wf.outputs.items()]
    found += [(f"{WF}.state.{n}.contract", c.contract) for n, c in wf.state.items()]
    for name, component in wf.components.items():
        inputs, outputs = ports_of(component)
        found += [(f"{WF}.components.{name}.ports.inputs.{p}", c) for p, c in inputs.items()]
        found += [(f"{WF}.components.{name}.ports.outputs.{p}", c) for p, c in outputs.items()]
    return found


def _bound_contracts(doc: Document) -> list[tuple[str, TensorContract]]:
    """Contracts of the ports and values speculant binds or reads."""
    wf = doc.workflow
    found = []
    for step in wf.steps:
        if step.kind == "invoke" and step.component in wf.components:
            inputs, outputs = ports_of(wf.components[step.component])
            path = f"{WF}.components.{step.component}.ports"
            found += [(f"{path}.inputs.{p}", inputs[p]) for p in step.inputs or {}
                      if p in inputs]
            found += [(f"{path}.outputs.{p}", outputs[p]) for p in step.outputs or {}
                      if p in outputs]
        if step.kind == "invoke":
            found += [(f"{WF}.inputs.{v}.contract", wf.inputs[v].contract)
                      for v in (step.inputs or {}).values() if v in wf.inputs]
        if step.kind == "emit" and step.output in wf.outputs:
            found.append((f"{WF}.outputs.{step.output}.contract",
                          wf.outputs[step.output].contract))
    found += [(f"{WF}.state.{n}.contract", c.contract) for n, c in wf.state.items()]
    return list(dict(found).items())


def _check_contracts(doc: Document, out: ProblemCollector) -> None:
    for path, contract in _all_contracts(doc):
        if contract.batch_layout.kind in UNSUPPORTED_LAYOUTS:
            _unsupported(out, f"batch_layout '{contract.batch_layout.kind}'",
                         f"{path}.batch_layout.kind", contract.batch_layout.kind,
                         "shared or request_aligned")
    for path, contract in _bound_contracts(doc):
        if contract.dtype in FLOAT8_DTYPES:
            _unsupported(out, f"a {contract.dtype} value that speculant binds or reads",
                         f"{path}.dtype", contract.dtype, "a non-float8 dtype")


# -- components (§4.6, rule 11) -----------------------------------------------------------
def component_roles(doc: Document) -> tuple[str | None, str | None]:
    """(target, proposer) as §4.6 defines them; target ``None`` if it cannot be told."""
    spec = doc.speculative
    if spec is not None:
        return spec.target, spec.proposer
    components = list(doc.workflow.components)
    return (components[0] if len(components) == 1 else None), None


def _check_components(doc: Document, out: ProblemCollector) -> None:
    wf = doc.workflow
    target, proposer = component_roles(doc)
    for name, component in wf.components.items():
        path = f"{WF}.components.{name}"
        if name not in (target, proposer):
            what = "a component other than the speculative target and proposer" if \
                doc.speculative else "a workflow of more than one component without a " \
                "speculative section"
            _unsupported(out, f"{what} ('{name}')", path, name,
                         "exactly the target (and the speculative proposer)")
        if component.implementation.kind != "onnx":
            _unsupported(out, f"a {component.implementation.kind} implementation",
                         f"{path}.implementation.kind", component.implementation.kind, "onnx")
        if component.ports is None or (not component.ports.inputs
                                        and not component.ports.outputs):
            _unsupported(out, "inferred ports (no declared inputs or outputs)", f"{path}.ports",
                         None, "declared ports.inputs and ports.outputs")
        if component.application_overridable:
            _unsupported(out, "application_overridable: true",
                         f"{path}.application_overridable", True, "false or absent")
        for key in ("effects", "cache_affects_state", "row_scope"):
            if not is_empty(getattr(component, key)):
                _unsupported(out, f"component {key}", f"{path}.{key}", getattr(component, key),
                             "absent or empty")


# -- state and serving (§4.7, rules 17, 24, 25) -------------------------------------------
def _check_state(doc: Document, out: ProblemCollector) -> None:
    wf = doc.workflow
    target, _ = component_roles(doc)
    for name, cell in wf.state.items():
        path = f"{WF}.state.{name}"
        if cell.scope != "invocation":
            _unsupported(out, f"state scope '{cell.scope}'", f"{path}.scope", cell.scope,
                         "invocation")
        if cell.class_ != "semantic":
            _unsupported(out, f"state class '{cell.class_}'", f"{path}.class", cell.class_,
                         "semantic")
        if cell.management != "runtime" and cell.service_group is None:
            # (in a group it is a MetadataError, rule 17; absent means `workflow`)
            _unsupported(out, f"a '{cell.management}'-managed state cell",
                         f"{path}.management", cell.management, "runtime")
        if cell.release_boundary not in (None, "invocation"):
            _unsupported(out, f"release_boundary '{cell.release_boundary}'",
                         f"{path}.release_boundary", cell.release_boundary, "invocation")
        if cell.service_group is None:
            _unsupported(out, "a state cell without a service_group", f"{path}.service_group",
                         None, "the name of a state group")
        if cell.session is not None:
            _unsupported(out, "a state session lease", f"{path}.session", None, "absent")
    writers = owners(wf)
    for name in wf.state:  # rule 24 (U part)
        found = writers.get(name, [])
        if len(found) != 1:
            _unsupported(out, f"state cell '{name}' with {len(found)} owners "
                         f"({', '.join(c for c, _ in found) or 'none'})", f"{WF}.state.{name}",
                         [c for c, _ in found], "exactly one read_write alias with an output, "
                         "on the target")
        elif target is not None and found[0][0] != target:
            _unsupported(out, f"state cell '{name}' owned by '{found[0][0]}', not the target",
                         f"{WF}.state.{name}", found[0][0], f"owned by '{target}'")
    _check_owner_bindings(doc, out)
    for group_name, group in groups_of(wf).items():
        path = f"{WF}.serving.state_service.groups.{group_name}"
        if group.kind not in ("full_attention", "sliding_attention", "multi_latent_attention"):
            _unsupported(out, f"state group kind '{group.kind}'", f"{path}.kind", group.kind,
                         "full_attention, sliding_attention or multi_latent_attention")
        update = group.update.kind if group.update else "append"
        if update != "append":
            _unsupported(out, f"state update '{update}'", f"{path}.update.kind", update,
                         "append")
        if group.sequence_axis is None and update != "append":
            _unsupported(out, "a state group without sequence_axis", f"{path}.sequence_axis",
                         None, "the axis along which caches grow and roll back")
        if group.aliasing == "required":
            _unsupported(out, "aliasing: required", f"{path}.aliasing", group.aliasing,
                         "forbidden or permitted")
        for key in ("logical_lengths", "total_length", "checkpoint"):
            if getattr(group, key) is not None:
                _unsupported(out, f"group {key}", f"{path}.{key}", getattr(group, key),
                             "absent")


def _check_owner_bindings(doc: Document, out: ProblemCollector) -> None:
    """Rule 25: the target's invoke threads each owned cell through its alias ports."""
    wf = doc.workflow
    target, _ = component_roles(doc)
    invokes = [(i, s) for i, s in enumerate(wf.steps)
               if s.kind == "invoke" and s.component == target]
    if target is None or len(invokes) != 1:
        return
    index, step = invokes[0]
    path = f"{WF}.steps.{index}"
    for cell_name, found in owners(wf).items():
        cell = wf.state.get(cell_name)
        if cell is None or len(found) != 1 or found[0][0] != target:
            continue
        alias = found[0][1]
        bound = (step.inputs or {}).get(alias.input)  # type: ignore[attr-defined]
        if bound != cell.initializer:
            _unsupported(out, f"a target invoke that binds alias input '{alias.input}' of "  # type: ignore
                         f"cell '{cell_name}' to {bound!r} instead of its initializer",
                         f"{path}.inputs.{alias.input}", bound,  # type: ignore[attr-defined]
                         f"'{cell.initializer}'")
        if alias.output not in (step.outputs or {}):  # type: ignore[attr-defined]
            _unsupported(out, f"a target invoke that leaves alias output '{alias.output}' of "  # type: ignore
                         f"cell '{cell_name}' unbound", f"{path}.outputs.{alias.output}",  # type: ignore
                         None, "a binding for the alias output")


# -- steps (§4.8, rules 15, 16) -----------------------------------------------------------
def _check_steps(doc: Document, out: ProblemCollector) -> None:
    wf = doc.workflow
    target, proposer = component_roles(doc)
    proposer_values: set[str] = set()
    for index, step in enumerate(wf.steps):
        path = f"{WF}.steps.{index}"
        if step.kind in CONTROL_STEP_KINDS:
            out.add(UnsupportedError, f"unsupported step kind '{step.kind}' at {path}; "
                    "speculant executes invoke and emit steps only", path=f"{path}.kind",
                    value=step.kind, expected="invoke or emit")
        elif step.kind == "invoke" and step.component == proposer:
            proposer_values.update((step.outputs or {}).values())
        elif step.kind == "emit":
            if step.mode not in (None, "replace"):
                _unsupported(out, f"emit mode '{step.mode}'", f"{path}.mode", step.mode,
                             "replace")
            for key in ("axis", "when", "valid_length"):
                if getattr(step, key) is not None:
                    _unsupported(out, f"emit {key}", f"{path}.{key}", getattr(step, key),
                                 "absent")
            if step.value in proposer_values:
                _unsupported(out, f"an emit of proposer output '{step.value}'",
                             f"{path}.value", step.value, "a target output")
    for role, component in (("target", target), ("proposer", proposer)):
        if component is None:
            continue
        count = sum(1 for s in wf.steps if s.kind == "invoke" and s.component == component)
        if count != 1:
            _unsupported(out, f"{count} invokes of the {role} '{component}'", f"{WF}.steps",
                         count, f"exactly one invoke of the {role}")


# -- speculative (§4.9, rules 27, 32, 33) -------------------------------------------------
def _check_speculative(doc: Document, out: ProblemCollector) -> None:
    spec = doc.speculative
    if spec is None:
        return
    wf = doc.workflow
    pe = spec.proposal_execution
    path = "speculative.proposal_execution"
    if pe.kind == "block":
        _unsupported(out, "block proposal execution", f"{path}.kind", pe.kind,
                     "chained (speculant runs chained proposers)")
    if spec.vocabulary.kind == "mapped":
        _unsupported(out, "a mapped vocabulary", "speculative.vocabulary.kind", "mapped",
                     "identical or subset")
    if pe.recurrent:
        _unsupported(out, "proposer-owned recurrent state", f"{path}.recurrent", None,
                     "absent or empty")
    if not is_empty(spec.shared_weights):
        _unsupported(out, "shared_weights", "speculative.shared_weights", None,
                     "absent or empty")
    for role in spec.port_bindings:
        if role != "target_hidden_context":
            _unsupported(out, f"port_bindings role '{role}'", f"speculative.port_bindings.{role}",
                         role, "target_hidden_context")
    if pe.kind == "chained" and pe.folded_carry_output is None:
        _unsupported(out, "a chained proposal without folded_carry_output",
                     f"{path}.folded_carry_output", None, "a proposer output port")
    if pe.kind == "chained":
        _check_chain_bindings(doc, out)
    # rule 33 (U part): every cell the target owns rolls back
    for cell_name, found in owners(wf).items():
        if len(found) == 1 and found[0][0] == spec.target \
                and cell_name not in spec.rollback_state:
            _unsupported(out, f"a target-owned cell '{cell_name}' missing from rollback_state",
                         "speculative.rollback_state", spec.rollback_state,
                         f"a list including '{cell_name}' (speculant reuses every cache, so "
                         "every one must roll back)")


def _check_chain_bindings(doc: Document, out: ProblemCollector) -> None:
    """Rule 32 (U parts), σ = κ included."""
    spec = doc.speculative
    assert spec is not None
    wf = doc.workflow
    pe = spec.proposal_execution
    kappas = borrowed_symbols(doc)
    sigma = position_symbol(doc)
    if sigma is not None and sigma in kappas.values():
        # metadata.md §6 rule 32 makes σ = κ a MetadataError. The published Gemma 4 E2B
        # speculative example (conformance 24) names every sequence-like axis `sequence`,
        # so σ = κ there, and published documents must validate at metadata level: speculant
        # therefore treats it as an UnsupportedError of a runnable load, with the remedy.
        ports = sorted(p for p, k in kappas.items() if k == sigma)
        out.add(UnsupportedError,
                f"the fused port '{pe.token_embedding_input}' and the borrowed cache ports "
                f"{ports} use one symbol '{sigma}' for the position axis (σ) and the borrowed "
                "cache axis (κ); speculant would narrow the borrowed caches to one position",
                path=f"{WF}.components.{spec.proposer}.ports.inputs.{pe.token_embedding_input}"
                ".shape", value=sigma, expected="distinct symbols for σ and κ",
                remedy=NAME_AXES_REMEDY)
    target_outputs = {}
    proposer_step = None
    for index, step in enumerate(wf.steps):
        if step.kind != "invoke":
            continue
        if step.component == spec.target:
            target_outputs = dict(step.outputs or {})
            seed = pe.folded_carry_seed
            if seed is not None and seed.output not in target_outputs:
                _unsupported(out, f"a target invoke that does not bind the seed output "
                             f"'{seed.output}'", f"{WF}.steps.{index}.outputs.{seed.output}",
                             None, "a binding for the folded_carry_seed output")
        elif step.component == spec.proposer and proposer_step is None:
            proposer_step = (index, step)
    if proposer_step is None:
        return
    index, step = proposer_step
    produced = set(target_outputs.values())
    for port, value in (step.inputs or {}).items():
        if port == pe.token_embedding_input or port in kappas or _is_borrowed(doc, port):
            continue
        if value not in wf.inputs and value not in produced:
            _unsupported(out, f"a proposer input '{port}' bound to '{value}', which is neither "
                         "a workflow input nor a target output",
                         f"{WF}.steps.{index}.inputs.{port}", value,
                         "a workflow input or a target output")


def _is_borrowed(doc: Document, port: str) -> bool:
    spec = doc.speculative
    assert spec is not None
    return any(alias.input == port and alias.access == "read_only"
               for group in groups_of(doc.workflow).values()
               for alias in group.ports.get(spec.proposer, {}).values())
