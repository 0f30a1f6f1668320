"""The one exception type for user mistakes.

Anything a user can cause (a bad argument, a missing data set, a checkpoint of another model) raises
``TinyDiTError`` with a message that names the bad value and the fix. The CLI prints that message as
one line and exits non-zero; everything else is a bug and keeps its traceback.
"""


class TinyDiTError(ValueError):
    """A user-facing error: the message names the problem and the fix, on one line. A line break inside a value
    it names (a path typed as "a<newline>b") is shown as \\n, so that the CLI's one line stays one."""

    def __init__(self, message: str = ""):
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))
