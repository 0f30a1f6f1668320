"""Deprecated: ``tinydit.models.pretrained`` moved to ``tinydit.checkpoints.pretrained`` (models hold architecture
only); this name keeps working for one release, with a warning."""

import warnings

from tinydit.checkpoints.pretrained import *  # noqa: F403
from tinydit.checkpoints.pretrained import __all__  # noqa: F401

warnings.warn(
    "tinydit.models.pretrained moved to tinydit.checkpoints.pretrained; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
