"""How many examples a costly property test draws.

``make test`` runs the short count to stay inside CI's budget; ``make test-slow`` sets
``STREAMLOOP_EXAMPLES_SCALE`` to draw several times as many.
"""

from __future__ import annotations

import os

SCALE = max(1, int(os.environ.get("STREAMLOOP_EXAMPLES_SCALE", "1")))


def examples(short: int) -> int:
    """``short`` examples, times the scale the environment asks for."""
    return short * SCALE
