"""The package version, a leaf every layer may read (the root re-exports it as ``tinydit.__version__``)."""

__version__ = "0.1.0"
