"""``speculant import HEAD OUT --target PACKAGE``: EAGLE heads trained with
vllm-project/speculators (``config.json`` with ``speculators_config`` + safetensors) as
speculant's chained drafter beside the target they were trained for.

    from speculant_tools.importers.speculators import import_speculators
    import_speculators("Llama-speculator.eagle3/", "my-llama", "pair")

``checkpoint`` reads the format, ``graphs`` maps the head onto the chained step (and the
target's pass onto the head's cache), ``package`` writes the pair. What maps and what is
refused: docs/design/import.md.
"""

from speculant_tools.importers.speculators.checkpoint import (
    EagleHead,
    is_speculators_folder,
    read_speculators,
)
from speculant_tools.importers.speculators.package import import_speculators

__all__ = ["EagleHead", "import_speculators", "is_speculators_folder", "read_speculators"]
