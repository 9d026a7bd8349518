"""Stepwatch: an OpenTelemetry collector-side streaming evaluator for AI agents."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("stepwatch")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"
