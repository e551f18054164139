"""``python -m speculant ...``: the ``speculant`` command where no script is installed (for
example a checkout on ``PYTHONPATH``)."""

from speculant.cli import main

main()
