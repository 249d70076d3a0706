"""Windowed metrics: Kafka's SampledStat/Rate arithmetic, driven by a hand-set clock."""

from __future__ import annotations

import math

import pytest

from streamloop.metrics import ProcessMeter, SampledStat, SensorSettings, ThreadSensors


def test_rate_counts_at_least_samples_minus_one_full_windows() -> None:
    stat = SampledStat(window_ms=1_000, samples=2, now_ms=0)
    stat.record(100.0, now_ms=200)
    # 200 ms elapsed, but the elapsed time is padded to one full window, as in Kafka.
    assert stat.rate(now_ms=200) == pytest.approx(100.0 / 1.2)


def test_rate_over_two_windows() -> None:
    stat = SampledStat(window_ms=1_000, samples=2, now_ms=0)
    for t in range(0, 2_000, 100):
        stat.record(10.0, now_ms=t)
    # 20 events of 10 in the live windows started at 0 and 1000; 1900 ms elapsed.
    assert stat.rate(now_ms=1_900) == pytest.approx(200.0 / 1.9)


def test_old_windows_expire() -> None:
    stat = SampledStat(window_ms=1_000, samples=2, now_ms=0)
    stat.record(500.0, now_ms=0)
    stat.record(10.0, now_ms=1_000)
    stat.record(10.0, now_ms=2_000)  # reuses the window of t=0
    assert stat.rate(now_ms=2_500) == pytest.approx(20.0 / 1.5)
    assert stat.rate(now_ms=10_000) == 0.0
    assert math.isnan(stat.avg(now_ms=10_000))
    assert math.isnan(stat.max(now_ms=10_000))


def test_avg_and_max_weight_by_count() -> None:
    stat = SampledStat(window_ms=1_000, samples=2, now_ms=0)
    stat.record(10.0, now_ms=0, count=10, peak=3.0)  # ten records, 10 ms in all
    stat.record(2.0, now_ms=500, count=1)
    assert stat.avg(now_ms=600) == pytest.approx(12.0 / 11)
    assert stat.max(now_ms=600) == 3.0


def test_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window_ms"):
        SampledStat(window_ms=0, samples=2, now_ms=0)


def test_process_meter_keeps_the_slowest_record() -> None:
    meter = ProcessMeter()
    meter.add(0, 999)  # an empty chunk changes nothing
    meter.add(10, 1_000)
    meter.add(2, 1_000)
    assert (meter.records, meter.nanos, meter.peak_nanos) == (12, 2_000, 500.0)


def test_thread_sensors_turn_totals_into_rates_and_latency() -> None:
    now = [0]
    sensors = ThreadSensors(SensorSettings(window_ms=1_000, samples=2), lambda: now[0])
    meter = ProcessMeter()
    values = sensors.values()
    assert values["process-rate"] == 0.0 and math.isnan(values["process-latency-avg"])
    for step in range(1, 21):  # 2 s: 100 records (2 ms each), 1 poll and 1 commit per 100 ms
        now[0] = step * 100
        meter.add(100, 1_000_000_000 if step == 7 else 100 * 2_000_000)
        sensors.sample(meter, polls=step, commits=step)
    values = sensors.values()
    # The window started at 1000 holds steps 10..19, the one started at 2000 step 20: 1100 ms.
    assert values["process-rate"] == pytest.approx(1_100 / 1.0)
    assert values["poll-rate"] == pytest.approx(11 / 1.0)
    assert values["commit-rate"] == pytest.approx(11 / 1.0)
    assert values["process-latency-avg"] == pytest.approx(2.0)
    assert values["process-latency-max"] == pytest.approx(2.0)  # step 7's window has expired
    now[0] = 2_050
    meter.add(1, 9_000_000)
    sensors.sample(meter, polls=20, commits=20)
    assert sensors.values()["process-latency-max"] == pytest.approx(9.0)
