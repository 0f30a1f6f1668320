"""Deprecated: ``tinydit.models.checkpoint`` moved to ``tinydit.checkpoints.checkpoint`` (models hold architecture
only); this name keeps working for one release, with a warning."""

import warnings

from tinydit.checkpoints.checkpoint import *  # noqa: F403
from tinydit.checkpoints.checkpoint import __all__  # noqa: F401
from tinydit.compiling import unwrap  # noqa: F401  (it lived here)

warnings.warn(
    "tinydit.models.checkpoint moved to tinydit.checkpoints.checkpoint; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
