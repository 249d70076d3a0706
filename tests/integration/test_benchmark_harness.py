"""The benchmark harness measures a real peer process on the real broker, and reports failures.

Not a speed test: it checks that a run ends when the output is complete, that the
figures are there (records/s, peak RSS, latency percentiles), and that a peer that
dies is reported with its error instead of being left out.
"""

from __future__ import annotations

import uuid

import pytest

from benchmarks import measure
from benchmarks.broker_io import create_topics, produce
from benchmarks.peers import aiokafka_loop, streamloop
from benchmarks.workloads import WORKLOADS, make_inputs

pytestmark = pytest.mark.kafka


@pytest.mark.asyncio
@pytest.mark.parametrize("peer", [streamloop, aiokafka_loop], ids=["streamloop", "aiokafka"])
async def test_a_throughput_run_ends_when_the_output_is_complete(kafka_bootstrap: str, peer: object) -> None:
    workload = WORKLOADS["stateless"]
    source = f"bench-test-in-{uuid.uuid4().hex[:6]}"
    inputs = make_inputs(500)
    await create_topics(kafka_bootstrap, [source], [])
    await produce(kafka_bootstrap, source, inputs)

    run = await measure.throughput(peer, workload, kafka_bootstrap, source,  # type: ignore[arg-type]
                                   workload.expectation(inputs), timeout=90)

    assert run.records_per_s > 0 and run.seconds > 0
    assert run.peak_rss_bytes is not None and run.peak_rss_bytes > 10 * 2**20


@pytest.mark.asyncio
async def test_a_latency_run_gives_percentiles_of_the_stamped_records(kafka_bootstrap: str) -> None:
    run = await measure.latency(streamloop, WORKLOADS["async-io"], kafka_bootstrap, rate=50, seconds=1.0,
                                warmup=0.2, timeout=90)

    assert run.records >= 40
    assert 5.0 <= run.p50_ms <= run.p99_ms   # each record waits 5 ms of simulated I/O at least


class _DyingPeer:
    """A peer whose process exits at once with a message."""

    NAME = "dying peer"
    __name__ = "tests.dying_peer"

    @staticmethod
    def command(run: object) -> list[str]:
        import sys

        return [sys.executable, "-c", "import sys; sys.exit('cannot import the peer: no module named x')"]


@pytest.mark.asyncio
async def test_a_peer_that_dies_is_reported_with_its_error(kafka_bootstrap: str) -> None:
    workload = WORKLOADS["stateless"]
    source = f"bench-test-in-{uuid.uuid4().hex[:6]}"
    inputs = make_inputs(10)
    await create_topics(kafka_bootstrap, [source], [])

    with pytest.raises(measure.PeerFailed, match="dying peer exited with code 1: cannot import the peer"):
        await measure.throughput(_DyingPeer, workload, kafka_bootstrap, source,  # type: ignore[arg-type]
                                 workload.expectation(inputs), timeout=30)


@pytest.mark.asyncio
async def test_the_rebalance_pause_run_measures_both_protocols_on_the_memory_broker() -> None:
    from benchmarks import rebalance_pause

    settings = rebalance_pause.Settings(partitions=2, rate=200, warmup=0.6, after=0.3, timeout=30)
    results = await rebalance_pause.main_async(f"memory://bench-pause-{uuid.uuid4().hex[:6]}", settings)

    assert set(results) == {"eager", "cooperative"}
    for figures in results.values():
        assert figures is not None
        assert figures.produced > 0 and figures.processed >= figures.produced   # every record processed
        assert figures.settle_s >= 0 and figures.stayed_gap_ms > 0 and figures.moved_gap_ms > 0
        assert 0 <= figures.stayed_p50_ms <= figures.stayed_p99_ms <= figures.stayed_max_ms
