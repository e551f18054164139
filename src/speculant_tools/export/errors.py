"""The exporter's error type (a leaf module: every export module raises it)."""

from __future__ import annotations

from speculant.errors import SpeculantError


class ExportError(SpeculantError):
    """Weights, configuration or a package cannot be exported, read back or converted."""
