"""``speculant train-drafter PACKAGE OUT``: a chained drafter for a Llama target, trained on
requests the target itself writes (the ``train`` extra: PyTorch).

    from speculant_tools.train_drafter import TrainOptions, train_drafter
    report = train_drafter("smollm2", "out", TrainOptions(device="cuda", minutes=8))
    report = train_drafter("smollm2", "out", TrainOptions(device="cuda", resume=True))

The modules follow the data: ``source`` (the target's weights, tokenizer and chat template,
from any package speculant imports or exports) -> ``llama`` (the target in PyTorch) and
``generate`` (batched decoding with a KV cache) -> ``magpie`` and ``corpus`` (user requests
sampled from the chat template's user turn, deduplicated, split by request; the target's own
answers) -> ``drafter`` (the chained drafter the exporter writes) and ``objective``
(training-time test on top of a teacher-forced step) -> ``training`` (the loop, checkpoints)
-> ``acceptance`` (the runtime's greedy round, replayed) -> ``export`` (drafter.npz,
drafter_config.json, the pair package, the loss plot) -> ``pipeline`` (one deadline, resume).
docs/design/train-drafter.md states the invariants. Only ``options`` and ``source`` load
without PyTorch; the rest need it.
"""

from speculant_tools.train_drafter.errors import TrainDrafterError
from speculant_tools.train_drafter.options import TrainOptions

__all__ = ["TrainDrafterError", "TrainOptions", "train_drafter"]


def train_drafter(package, out, options: TrainOptions | None = None, console=None) -> dict:
    """See :func:`speculant_tools.train_drafter.pipeline.train_drafter` (imports PyTorch);
    ``options`` None: the defaults."""
    from speculant_tools.train_drafter.pipeline import train_drafter as run

    return run(package, out, options, console)
