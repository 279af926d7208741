"""``python -m metricpipe.cli``: the ``metricpipe`` command."""

from metricpipe.cli import main

main()
