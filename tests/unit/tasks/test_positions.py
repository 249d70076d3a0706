"""``Positions`` with records in flight: the watermark a commit may take, across a PAUSE and a resume."""

from __future__ import annotations

from streamloop.records import TopicPartition
from streamloop.tasks.positions import Positions

TP = TopicPartition("in", 0)


def test_a_resume_forgets_what_was_done_above_the_paused_record() -> None:
    """Records 20-39 were done (a batch that paused at 20, capped there); the resume past 20 reads
    them again, so a smaller batch 21-30 done after it moves the position to 31, not to 40."""
    positions = Positions([TP])
    assert positions.advance_past(TP, 39, [], cap=20) == 20
    positions.rewind(TP, 21, 21)
    assert positions.next[TP] == 21
    assert positions.advance_past(TP, 30, [], cap=None) == 31


def test_a_resume_past_the_paused_record_counts_it_as_done_below_a_batch_in_flight() -> None:
    """Paused at 45 inside a batch 40-59 still running (the position held at its start, 40) and
    resumed past 45: when the batch's records below the pause are done, the position is 46."""
    positions = Positions([TP])
    positions.advance_past(TP, 39, [], cap=None)
    positions.rewind(TP, 46, 40)
    assert positions.next[TP] == 40
    assert positions.advance_past(TP, 44, [], cap=None) == 46


def test_a_resume_at_the_paused_record_reads_it_again() -> None:
    positions = Positions([TP])
    assert positions.advance_past(TP, 12, [15], cap=10) == 10
    positions.rewind(TP, 10, 10)
    assert positions.advance_past(TP, 9, [], cap=None) == 10
    assert positions.advance_past(TP, 10, [11], cap=None) == 11
