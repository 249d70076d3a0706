"""KIP-663 and KIP-671 calls racing each other, on the memory broker: no hang, no record lost.

Hypothesis draws the storm (``tests/support/thread_races.py``): calls from outside (add, remove
with and without a timeout, close) and from inside stream threads (a processor that adds or
removes a thread, or fails and lets the handler answer), fired at once at random moments.

``STREAMLOOP_RACE_EXAMPLES=1000`` runs a long search (``make test`` runs a few).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.thread_races import INSIDE, OUTSIDE, RECORDS, Response, run_storm

EXAMPLES = int(os.environ.get("STREAMLOOP_RACE_EXAMPLES", "6"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(outside=st.lists(st.tuples(st.floats(0, 0.5), OUTSIDE), max_size=6),
       inside=st.lists(st.tuples(st.integers(0, RECORDS - 1), INSIDE), max_size=4, unique_by=lambda c: c[0]),
       answer=st.sampled_from([Response.REPLACE_THREAD, Response.SHUTDOWN_THREAD, Response.SHUTDOWN_CLIENT]))
def test_racing_thread_calls_never_hang_and_lose_no_record(outside, inside, answer) -> None:
    figures = run_storm(outside, inside, answer)
    assert figures.overruns == [], figures.overruns
    assert figures.errors == [], figures.errors
    assert figures.lost == 0
