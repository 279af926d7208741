"""The one exception type for bad user input, shared by kernels and the orchestration layer."""


class InputError(ValueError):
    """Bad user input: the message is one line saying what was expected, what arrived and the fix.

    The command line turns this into that line on stderr and exit code 2.
    """
