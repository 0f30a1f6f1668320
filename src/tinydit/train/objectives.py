"""The objectives moved to ``tinydit.flow.objectives`` (one object per objective: its loss, the model's
inputs, its draws, its sampler, its checks); this path keeps working for a release, with a warning."""

import warnings

from tinydit.flow.objectives import (  # noqa: F401
    OBJECTIVES,
    Loss,
    Objective,
    StepBatch,
    StepLoss,
    flow_matching,
    mean_flow,
    shortcut,
)

warnings.warn(
    "tinydit.train.objectives is now tinydit.flow.objectives; import from there", DeprecationWarning, stacklevel=2
)
