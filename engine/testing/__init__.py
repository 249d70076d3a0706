"""Helpers for testing applications built on the engine."""

from engine.testing.waiting import eventually, eventually_async

__all__ = ["eventually", "eventually_async"]
