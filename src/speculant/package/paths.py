"""Path confinement (docs/design/spec/metadata.md §2.3): a package names only files in its root.

P1 is lexical and needs only the document (``lexical_problem``); P2 and P3 need the folder
(``confine``). Each failure is a ``MetadataError`` naming the path and the document field.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

from speculant.errors import MetadataError, ProblemCollector


def lexical_problem(location: str) -> str | None:
    """P1: why ``location`` is refused before touching the disk, or ``None``."""
    if not location:
        return "the path is empty"
    if PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute() \
            or PureWindowsPath(location).drive:
        return f"the path '{location}' is absolute"
    if ".." in location.replace("\\", "/").split("/"):
        return f"the path '{location}' contains a '..' component"
    return None


def check_lexical(location: str, path: str, problems: ProblemCollector, what: str = "",
                  file: str | None = None) -> bool:
    """Record a P1 violation of ``location`` (document field ``path``); True when it passes."""
    reason = lexical_problem(location)
    if reason is not None:
        problems.add(MetadataError, f"{what}: {reason}" if what else reason, path=path,
                     value=location, file=file,
                     expected="a relative path inside the package folder, without '..'")
    return reason is None


def confine(root: Path, location: str, path: str, problems: ProblemCollector, *,
            base: Path | None = None, report_lexical: bool = True,
            what: str = "file", file: str | None = None, remedy: str = "") -> Path | None:
    """The resolved file ``location`` names (relative to ``base``, default the root), or
    ``None`` after recording why it is refused (P1–P3). ``root`` must already be a realpath.

    ``report_lexical=False`` skips reporting P1 (the document checks already did) but still
    refuses the path. ``file`` overrides the collector's file (e.g. the model that names an
    external-data location); ``remedy`` is what each refusal tells the user to do."""
    if lexical_problem(location) is not None:
        if report_lexical:
            check_lexical(location, path, problems, what, file)
        return None
    joined = (base or root) / location
    resolved = Path(os.path.realpath(joined))
    if not resolved.is_relative_to(root):
        problems.add(MetadataError,
                     f"{what} '{location}' resolves to {resolved}, outside the package folder "
                     f"{root}", path=path, value=location,
                     expected="a path whose every symlink stays inside the package folder",
                     file=file, remedy=remedy)
        return None
    if not resolved.exists():
        problems.add(MetadataError, f"{what} '{location}' does not exist in {root}", path=path,
                     value=location, expected="an existing regular file", file=file,
                     remedy=remedy)
        return None
    if not resolved.is_file():
        problems.add(MetadataError, f"{what} '{location}' is not a regular file", path=path,
                     value=location, expected="an existing regular file", file=file,
                     remedy=remedy)
        return None
    return resolved


def confine_external_data(root: Path, external: list[tuple[str, str]], model_file: Path,
                          path: str, problems: ProblemCollector) -> None:
    """Confine the external-data ``(tensor name, location)`` pairs of the binary model
    ``model_file`` (relative to its folder): one problem per distinct location, naming how
    many initializers it holds, rather than one per initializer."""
    by_location: dict[str, list[str]] = {}
    for tensor_name, location in external:
        by_location.setdefault(location, []).append(tensor_name)
    for location, names in by_location.items():
        others = f" (and {len(names) - 1} more in that file)" if len(names) > 1 else ""
        what = f"external data of initializer '{names[0]}'{others}"
        resolved = confine(root, location, path, problems, base=model_file.parent,
                           file=str(model_file), what=what)
        links = resolved.stat().st_nlink if resolved is not None else 1
        if links > 1:  # ONNX refuses to read it
            problems.add(MetadataError, f"{what} '{location}' has {links} "
                         "hard links; ONNX refuses to read such a file (a possible hard-link "
                         "attack)", path=path, value=location, file=str(model_file),
                         expected="a file with one link",
                         remedy="copy the file into the package instead of hard-linking it")
