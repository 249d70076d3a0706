"""The benchmark page: figures, ratios to streamloop, and peers that did not run."""

from __future__ import annotations

from benchmarks.measure import LatencyRun, ThroughputRun
from benchmarks.report import PeerFigures, Report, WorkloadFigures, markdown
from benchmarks.workloads import WORKLOADS, Expectation, make_inputs


def _report(peers: list[PeerFigures], quick: bool = False) -> Report:
    return Report("python benchmarks/compare.py", "2026-11-23 00:00 UTC", ["a machine"], ["streamloop: 0.1.0"],
                  ["a method"], [WorkloadFigures("stateless", "(1) stateless", 1000, peers)], quick=quick)


def test_each_peer_has_min_median_max_and_ratios_to_streamloop() -> None:
    ours = PeerFigures("streamloop", "streamloop", "1 thread",
                       [ThroughputRun(r, 1.0, 40 * 2**20) for r in (900.0, 1000.0, 1100.0)],
                       LatencyRun(5.0, 20.0, 100, 50))
    theirs = PeerFigures("faust", "faust-streaming", "one agent",
                         [ThroughputRun(r, 1.0, 80 * 2**20) for r in (100.0, 200.0, 300.0)],
                         LatencyRun(50.0, 100.0, 100, 50))

    page = markdown(_report([ours, theirs]), "benchmarks.png", "benchmark-scripts.md")

    assert "| streamloop | 1 thread | 900 / 1,000 / 1,100 | 1.00× | 5.0 | 20.0 | 1.00× | 40 | 1.00× |" in page
    assert "| faust-streaming | one agent | 100 / 200 / 300 | 0.20× | 50.0 | 100.0 | 5.00× | 80 | 2.00× |" in page
    assert "Not final figures" not in page
    assert "![records per second and latency per peer](benchmarks.png)" in page


def test_a_peer_that_could_not_run_is_listed_with_its_error() -> None:
    ours = PeerFigures("streamloop", "streamloop", "1 thread", [ThroughputRun(1000.0, 1.0, None)])
    broken = PeerFigures("kafka-streams", "Kafka Streams (Java)", "num.stream.threads=1",
                         error="JavaPeerError: 'mvn' is not on PATH")

    page = markdown(_report([ours, broken], quick=True), "benchmarks.png", "benchmark-scripts.md")

    assert "| Kafka Streams (Java) | num.stream.threads=1 | **not run**: JavaPeerError: 'mvn' is not on PATH |" in page
    assert "Not final figures" in page


def test_a_count_is_complete_only_when_every_key_has_its_final_count() -> None:
    inputs = make_inputs(200)
    expect = WORKLOADS["count"].expectation(inputs)
    finals = dict(expect.final_counts)
    assert sum(finals.values()) == 200 and expect.records_out is None

    key = next(iter(finals))
    assert expect.complete(0, finals)
    assert not expect.complete(0, {**finals, key: finals[key] - 1})


def test_stateless_expects_one_output_per_kept_order() -> None:
    inputs = make_inputs(500)
    expect = WORKLOADS["stateless"].expectation(inputs)
    assert 0 < expect.records_out < 500  # type: ignore[operator]
    assert Expectation(10, 10).complete(10, {}) and not Expectation(10, 10).complete(9, {})


def test_a_latency_near_the_peers_saturation_is_flagged() -> None:
    slow = PeerFigures("quixstreams", "quixstreams", "one process", [ThroughputRun(150.0, 1.0, None)],
                       LatencyRun(400.0, 900.0, 100, 100))

    page = markdown(_report([slow]), "benchmarks.png", "benchmark-scripts.md")

    assert "| 400.0 ⚠ | 900.0 |" in page
    assert "⚠ quixstreams: the latency rate is above half of the throughput" in page


def test_each_peers_median_over_the_raw_loops_is_given_below_its_table() -> None:
    raw = PeerFigures("aiokafka", "raw aiokafka", "loop",
                      [ThroughputRun(r, 1.0, None) for r in (1000.0, 2000.0, 900.0)])
    ours = PeerFigures("streamloop", "streamloop", "1 thread", [ThroughputRun(r, 1.0, None) for r in (800.0, 900.0)])
    broken = PeerFigures("faust", "faust-streaming", "one agent", error="it crashed")

    page = markdown(_report([ours, raw, broken]), "benchmarks.png", "benchmark-scripts.md")

    assert "Median records/s × the bare aiokafka loop's (raw): streamloop **0.85×**, raw aiokafka **1.00×**." in page
    assert "× raw" not in markdown(_report([ours]), "benchmarks.png", "benchmark-scripts.md").split("## ")[2]
