"""The one exception type for user mistakes.

Anything a user can cause (a bad argument, a missing data set, a checkpoint of another model) raises
``TinyDiTError`` with a message that names the bad value and the fix. The CLI prints that message as
one line and exits non-zero; everything else is a bug and keeps its traceback.
"""


class TinyDiTError(ValueError):
    """A user-facing error: the message names the problem and the fix."""
