"""Package layer: a folder on disk -> typed, validated metadata, admitted against its graphs.

One module per feature (``top``, ``io``, ``steps``, ``state``, ``serving``, ``chain``), each
owning its rules, its unsupported cases, its admission and its part of the load plan;
``loader`` runs them in order.
"""

from speculant.package.document import read_document
from speculant.package.loader import (
    derive_plan,
    load_metadata_only,
    load_package,
    unsupported_problems,
    validate_document,
)
from speculant.package.package import Package
from speculant.package.plan import LoadPlan
from speculant.package.summary import summarize

__all__ = ["LoadPlan", "Package", "derive_plan", "load_metadata_only", "load_package",
           "read_document", "summarize", "unsupported_problems", "validate_document"]
