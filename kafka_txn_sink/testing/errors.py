"""The one error of the test bed."""

from __future__ import annotations


class TestbedError(RuntimeError):
    """A part of the test bed could not be fetched, started or reached in time."""
