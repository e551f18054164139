"""The top-level sections (docs/design/spec/metadata.md §3): schema version, `model`,
`package.tokenizer`, `generation`, profiles, and the capabilities of the document and its manifest
(rules 2–5, 35, 36). Derives the EOS ids, the static context cap and the tokenizer file.

``model.sharding`` declares which distributed layouts are legal, not one that must be used:
it is informational, and a single-device load ignores it.

``manifest.capabilities`` lists what a reader must understand beyond what the document itself
shows (the published schema defaults it to ``[]``, and the catalogue's documents 02, 10, 13
list nothing while using steps, emits and serving). A feature the document uses is declared by
its use, so rule 35 refuses only a capability listed twice; rule 36 still lists every named
capability outside speculant's set as unsupported.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from speculant.errors import MetadataError, ProblemCollector, UnsupportedError, shown
from speculant.package.common import WF, check_path, is_empty, unsupported
from speculant.package.model import Document, TokenizerArtifact, Workflow
from speculant.package.paths import confine

SUPPORTED_CAPABILITIES = ("workflow_ssa", "typed_emit", "serving_service_contract",
                          "bounded_state_recurrence")
# generation.defaults keys that are only request defaults; every other key must be neutral.
NEUTRAL_DEFAULTS = {"min_length": (0,), "num_beams": (1,), "num_return_sequences": (1,),
                    "repetition_penalty": (1.0,), "length_penalty": (1.0,),
                    "diversity_penalty": (0.0,), "no_repeat_ngram_size": (0,),
                    "early_stopping": (False,)}
TOKENIZER_NAME = "tokenizer.json"
CHAT_CONFIG_NAME = "tokenizer_config.json"  # the chat template's file, beside the tokenizer


def check(doc: Document, out: ProblemCollector) -> None:
    """Rules 3–5 (M) and the top-level keys speculant does not execute (U, rules 2, 36)."""
    if doc.pipeline is not None and doc.model is not None and doc.model.io is not None:
        out.add(MetadataError, "model.io cannot be combined with a pipeline section",
                path="model.io", value=doc.model.io,
                expected="no model.io in a workflow package", rule="3")
    _check_tokenizer(doc, out)
    if doc.schema_version != "v1":
        unsupported(out, "2", f"schema_version '{doc.schema_version}'", "schema_version",
                    doc.schema_version, "v1")
    if doc.model is not None and not is_empty(doc.model.runtime_configurable):
        unsupported(out, "2", "model.runtime_configurable", "model.runtime_configurable",
                    doc.model.runtime_configurable, "absent")
    if doc.package is not None and not is_empty(doc.package.constraint_languages):
        unsupported(out, "2", "package.constraint_languages", "package.constraint_languages",
                    doc.package.constraint_languages, "absent")
    if doc.generation is not None:
        if not is_empty(doc.generation.overrides):
            unsupported(out, "2", "generation.overrides", "generation.overrides",
                        doc.generation.overrides, "absent")
        defaults = doc.generation.defaults
        for key, neutral in NEUTRAL_DEFAULTS.items():
            value = getattr(defaults, key)
            if value is not None and value not in neutral:
                unsupported(out, "2", f"generation.defaults.{key} = {shown(value)}",
                            f"generation.defaults.{key}", value, f"{neutral[0]!r} or absent")
    for key in ("profiles", "adapters", "preprocessing"):
        if not is_empty(getattr(doc, key)):
            unsupported(out, "2", f"'{key}'", key, None, "absent or empty")
    for index, capability in enumerate(doc.required_capabilities):
        if capability not in SUPPORTED_CAPABILITIES:
            unsupported(out, "36", f"required capability '{capability}'",
                        f"required_capabilities.{index}", capability,
                        "one of " + ", ".join(SUPPORTED_CAPABILITIES))
    if doc.pipeline is None:
        if doc.speculative is not None:
            out.add(MetadataError, "a 'speculative' section needs pipeline.workflow",
                    path="speculative", expected="a pipeline.workflow section", rule="26")
        out.add(UnsupportedError, "a document without a pipeline section is not supported; "
                "speculant loads workflow packages only", path="pipeline",
                expected="a pipeline.workflow section", rule="3")
        return
    _check_manifest(doc.workflow, out)


def _check_tokenizer(doc: Document, out: ProblemCollector) -> None:
    tokenizer = doc.package.tokenizer if doc.package else None
    if tokenizer is None or not tokenizer.artifacts:
        return
    for index, artifact in enumerate(tokenizer.artifacts):  # rule 4, P1
        check_path(artifact.location, f"package.tokenizer.artifacts.{index}.location", out)
    if canonical_tokenizer(tokenizer.artifacts) is None:
        out.add(MetadataError,
                "no canonical tokenizer artifact: none is named tokenizer.json and there are "
                f"{len(tokenizer.artifacts)}", path="package.tokenizer.artifacts",
                value=[a.location for a in tokenizer.artifacts],
                expected="an artifact named tokenizer.json, or exactly one artifact", rule="5")


def canonical_tokenizer(artifacts: list[TokenizerArtifact]) -> int | None:
    """Index of the declared tokenizer artifact speculant uses: the one named
    ``tokenizer.json``, else a sole artifact, else ``None``."""
    for index, artifact in enumerate(artifacts):
        if PurePosixPath(artifact.location.replace("\\", "/")).name == TOKENIZER_NAME:
            return index
    return 0 if len(artifacts) == 1 else None


def _check_manifest(wf: Workflow, out: ProblemCollector) -> None:
    listed = wf.manifest.capabilities
    path = f"{WF}.manifest.capabilities"
    duplicates = sorted({c for c in listed if listed.count(c) > 1})
    if duplicates:
        out.add(MetadataError, f"manifest.capabilities lists {duplicates} more than once",
                path=path, value=listed, expected="unique capability names", rule="35")
    for index, capability in enumerate(listed):
        if capability not in SUPPORTED_CAPABILITIES:
            unsupported(out, "36", f"capability '{capability}'", f"{path}.{index}", capability,
                        "one of " + ", ".join(SUPPORTED_CAPABILITIES))
    if not is_empty(wf.manifest.adapter_abis):
        unsupported(out, "2", "manifest.adapter_abis", f"{WF}.manifest.adapter_abis",
                    wf.manifest.adapter_abis, "absent or empty")
    if not is_empty(wf.effects):
        unsupported(out, "2", "workflow effects", f"{WF}.effects", wf.effects, "absent or empty")


# -- what load derives ----------------------------------------------------------------------
def eos_ids(doc: Document) -> tuple[int, ...]:
    tokenizer = doc.package.tokenizer if doc.package else None
    if tokenizer is not None and "eos" in tokenizer.special_tokens:
        return (tokenizer.special_tokens["eos"].id,)
    return ()


def context_cap(doc: Document) -> int | None:
    """The smaller of ``model.max_sequence_length`` and ``generation.defaults.max_length``."""
    caps = []
    if doc.model and doc.model.max_sequence_length:
        caps.append(doc.model.max_sequence_length)
    if doc.generation and doc.generation.defaults.max_length:
        caps.append(doc.generation.defaults.max_length)
    return min(caps) if caps else None


def resolve_tokenizer(doc: Document, root: Path, problems: ProblemCollector) -> Path | None:
    """Declared artifacts are confined and the canonical one used; otherwise
    ``<root>/tokenizer.json`` if present; otherwise none (text APIs then refuse). The
    ``tokenizer_config.json`` beside the one used, when present, is confined like them."""
    tokenizer = doc.package.tokenizer if doc.package else None
    declared = tokenizer.artifacts if tokenizer and tokenizer.artifacts else []
    if not declared:
        if not (root / TOKENIZER_NAME).exists():
            return None
        found = confine(root, TOKENIZER_NAME, "package.tokenizer", problems, what="tokenizer")
    else:
        resolved = [confine(root, a.location, f"package.tokenizer.artifacts.{i}.location",
                            problems, report_lexical=False, what="tokenizer artifact")
                    for i, a in enumerate(declared)]
        index = canonical_tokenizer(declared)  # None was reported by the rules (rule 5)
        found = resolved[index] if index is not None else None
    if found is not None and os.path.lexists(found.parent / CHAT_CONFIG_NAME):
        confine(root, str((found.parent / CHAT_CONFIG_NAME).relative_to(root)),
                "package.tokenizer", problems, what="chat template file",
                remedy=f"copy {CHAT_CONFIG_NAME} into the package folder, or remove it "
                       "(the package then has no chat template)")
    return found
