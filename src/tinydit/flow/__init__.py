"""The flow-matching method: the straight path and its loss, guidance, samplers and time grids."""

from tinydit.flow.path import N_T_BINS, T_SAMPLINGS, flow_loss, interpolate, sample_t, t_bins, velocity_target

__all__ = ["N_T_BINS", "T_SAMPLINGS", "flow_loss", "interpolate", "sample_t", "t_bins", "velocity_target"]
