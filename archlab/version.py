"""The package version (in the run folder's environment record and every checkpoint)."""

__version__ = "0.1.0"
