"""``TaskId`` lives in ``engine.ids`` (the foundation); this name stays for code that imports it here."""

from engine.ids import TaskId

__all__ = ["TaskId"]
