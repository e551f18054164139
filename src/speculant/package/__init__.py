"""Package layer: a folder on disk -> typed, validated metadata, admitted against its graphs."""

from speculant.package.document import read_document
from speculant.package.loader import load_metadata_only, load_package, summarize
from speculant.package.package import Package
from speculant.package.plan import LoadPlan, derive_plan

__all__ = ["LoadPlan", "Package", "derive_plan", "load_metadata_only", "load_package",
           "read_document", "summarize"]
