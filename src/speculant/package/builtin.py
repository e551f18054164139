"""Built-in packages by name: ``speculant.load("demo")``, ``speculant generate smollm2``.

A name resolves through the ``speculant.packages`` entry-point group: each entry is a callable
that returns the package folder (building it on first use where it must, as the tools'
``smollm2`` does); one that takes a ``device`` argument is handed the device the package is
loaded for, and may return a folder made for it (``smollm2``: fused float32 kernels on the
CPU, the node-by-node graph elsewhere). ``demo`` is the runtime's own bundled pair. Where the
distribution is not installed (a checkout on ``PYTHONPATH``) there are no entry points, and
:data:`IN_TREE_PACKAGES` stands in for the ones the wheel declares.

    resolve_package("smollm2")        # -> Path of the cached package (for the CPU)
    resolve_package("smollm2", "cuda")  # -> the one made for CUDA
    resolve_package("some/folder")    # an existing path is returned as it is
    builtin_names()                   # ("demo", "smollm2")
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from importlib import import_module, resources
from importlib.metadata import entry_points
from pathlib import Path

from speculant.errors import MetadataError

GROUP = "speculant.packages"
IN_TREE_PACKAGES = {"smollm2": "speculant_tools.builtin:smollm2"}


def demo() -> Path:
    """The chained pair bundled inside the wheel."""
    return Path(str(resources.files("speculant") / "demo"))


def _entries() -> dict[str, str]:
    found = {entry.name: entry.value for entry in entry_points(group=GROUP)}
    return {"demo": "speculant.package.builtin:demo", **(found or IN_TREE_PACKAGES)}


def builtin_names() -> tuple[str, ...]:
    return tuple(sorted(_entries()))


def resolve_package(package: str | Path, device: str = "cpu") -> Path:
    """The folder of ``package``: an existing path as it is, else the built-in of that name
    (for ``device``). A name that is neither is returned unchanged (the loader reports the
    missing folder)."""
    path = Path(package)
    name = str(package)
    if path.exists() or name not in _entries():
        return path
    module_name, _, function = _entries()[name].partition(":")
    try:
        module = import_module(module_name)
    except ModuleNotFoundError as error:
        raise MetadataError(f"the built-in package {name!r} needs {module_name}, which is not "
                            "installed", path=name, value=error.name,
                            remedy="pip install speculant (the tools come with it)") from None
    builder: Callable[..., Path] = getattr(module, function)
    if "device" in inspect.signature(builder).parameters:
        return Path(builder(device=device))
    return Path(builder())
