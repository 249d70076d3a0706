"""The workloads of ``benchmarks/compare.py``: their input, their logic and what a complete output is.

Every peer runs the same logic on the same input topic:

- ``stateless``: JSON orders, keep ``amount >= 10``, add ``"vip": amount > 1000``.
- ``count``: count the orders of each customer (the record key); every update goes out.
- ``async-io``: each record waits 5 ms of simulated I/O, then goes out unchanged.
- ``spark``: streamloop only, a Spark batch stage against the per-record version
  (``benchmarks/spark_stage.py``, run when it is present).

An input value is a JSON order carrying ``ts``, the wall-clock time it was produced:
the stateless and async workloads pass it on, so the end-to-end latency of a record is
the output topic's append time (``LogAppendTime``) minus ``ts``.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

import orjson

PARTITIONS = 4
CUSTOMERS = 1000
IO_SECONDS = 0.005


def keep(order: dict) -> bool:
    return order["amount"] >= 10


def enrich(order: dict) -> dict:
    return {**order, "vip": order["amount"] > 1000}


async def simulated_io(value: bytes) -> bytes:
    """Stands for a call to another service: 5 ms of waiting, no CPU."""
    await asyncio.sleep(IO_SECONDS)
    return value


def order(i: int, rng: random.Random, ts: float, **extra: object) -> tuple[bytes, bytes]:
    """Key and value of the ``i``-th order; the key is the customer."""
    customer = f"customer-{rng.randrange(CUSTOMERS)}"
    value = {"id": i, "customer": customer, "amount": round(rng.expovariate(1 / 200), 2),
             "currency": "EUR", "ts": ts, **extra}
    return customer.encode(), orjson.dumps(value)


@dataclass
class Expectation:
    """What the output of one run holds once the peer has processed the whole input."""

    records_in: int
    records_out: int | None = None
    """Exact number of output records (stateless, async-io); None when updates may be merged."""
    final_counts: dict[bytes, int] = field(default_factory=dict)
    """count: the last value per key."""

    # Read the output as it grows (False), or only when it pauses (the DSL workloads' expectations).
    settle = False
    # The output is read as counts (ints), not as raw values.
    counts = True

    def begin(self) -> None:
        """A new run's output is read (nothing kept between runs here)."""

    def complete(self, out_records: int, last_values: dict[bytes, int]) -> bool:
        if self.records_out is not None:
            return out_records >= self.records_out
        return all(last_values.get(k) == n for k, n in self.final_counts.items())

    def verify(self, _out_records: int, _last_values: dict[bytes, int]) -> str | None:
        """Why a complete output is wrong, or None: these workloads check completeness only."""
        return None


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    records: int
    """Input records of a throughput run (default; --records scales the CPU-bound ones)."""
    latency_rate: int
    """Records/s of the latency run: below every peer's saturation, the same for all."""
    latency: bool = True

    def expectation(self, inputs: list[tuple[bytes, bytes]]) -> Expectation:
        if self.name == "stateless":
            return Expectation(len(inputs), sum(keep(orjson.loads(v)) for _, v in inputs))
        if self.name == "count":
            return Expectation(len(inputs), None, dict(Counter(k for k, _ in inputs)))
        return Expectation(len(inputs), len(inputs))

    def passes(self, value: bytes) -> bool:
        """Whether a record of this input leads to an output record (latency runs)."""
        return keep(orjson.loads(value)) if self.name == "stateless" else True


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("stateless", "(1) stateless JSON filter/map", 100_000, latency_rate=500),
        Workload("count", "(2) stateful count per key", 100_000, latency_rate=500, latency=False),
        Workload("async-io", "(3) async processor, 5 ms of I/O per record", 5_000, latency_rate=100),
    )
}


def make_inputs(count: int, seed: int = 7) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    return [order(i, rng, 0.0) for i in range(count)]
