"""The one error type of ``speculant train-drafter`` (loads without PyTorch or the exporter)."""

from speculant.errors import SpeculantError


class TrainDrafterError(SpeculantError):
    """A drafter cannot be trained for this input: its family, its files or the options."""
