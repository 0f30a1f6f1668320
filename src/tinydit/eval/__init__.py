"""Offline evaluation: feature networks, metrics, evaluation runs, prompt adherence, sweeps, reports, plots."""
