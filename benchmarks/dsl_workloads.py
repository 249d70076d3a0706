"""The DSL workloads of ``benchmarks/compare.py`` (issue #34): streamloop against Kafka Streams only.

Each has deterministic input (from a seed; timestamps relative to a base taken when the input is
made, so that they lie in the recent past where the broker keeps them), the same logic in
``benchmarks/peers/streamloop.py`` and ``benchmarks/java/StreamsBench.java``, and an expectation
computed here from the input, against which every run's output is checked:

- ``join``: orders and payments (two streams keyed by order id) joined within ``JOIN_WINDOW_MS``
  (grace ``JOIN_GRACE_MS``); exactly one result per order whose payment is at most the window apart.
- ``suppress``: orders counted per customer in tumbling windows of ``SUPPRESS_WINDOW_MS`` (no
  grace), ``suppress(until_window_closes)``: exactly one final count per (customer, window). A last
  record per partition, a window later, closes every window of the data.
- ``table-join``: the table of each customer's latest order joined with the customers table (both
  keyed by customer, both updating): each customer's final joined row.
- ``fk-join``: the table of orders keyed by order id (some orders updated, some moving to another
  customer) joined by its customer field with the customers table: each order's final joined row.
- ``session``: orders counted per customer in session windows of gap ``SESSION_GAP_MS``; every
  update and every merged session's tombstone goes out: the exact number of updates and the final
  live sessions.

Record cache off in both engines, as for the count of ``workloads.py``: every update goes out.
Values are JSON (orjson here, Jackson in Java); outputs are compared as parsed JSON.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from benchmarks.workloads import CUSTOMERS, PARTITIONS

JOIN_WINDOW_MS = 10_000
# The join's grace: how far one input may run ahead of the other in event time before a pair is
# lost. ``compare.py --join-grace-ms`` sets it for the peers it starts (through the environment).
JOIN_GRACE_ENV = "STREAMLOOP_BENCH_JOIN_GRACE_MS"
JOIN_GRACE_MS = int(os.environ.get(JOIN_GRACE_ENV, "60000"))
# An order every JOIN_SPACING_MS; its payment 0 to JOIN_MAX_DELAY_MS later (a third outside the window).
JOIN_SPACING_MS = 5
JOIN_MAX_DELAY_MS = 15_000
SUPPRESS_WINDOW_MS = 10_000
SESSION_GAP_MS = 2_000
# The customer updates among the table-join's and the fk-join's records.
TABLE_CUSTOMER_UPDATES = 0.05
FK_CUSTOMER_UPDATES = 0.0005
# The fk-join's order records that update an earlier order, and the share of those moving it.
FK_ORDER_UPDATES = 0.1
FK_MOVES = 0.5
TIERS = ("gold", "silver", "bronze")
PAYMENT_METHODS = ("card", "transfer", "wallet")



def parameters() -> dict[str, int]:
    """Passed to the Java peer as system properties, so that both engines run one set of parameters."""
    grace = int(os.environ.get(JOIN_GRACE_ENV, str(JOIN_GRACE_MS)))
    return {"join.window.ms": JOIN_WINDOW_MS, "join.grace.ms": grace,
            "suppress.window.ms": SUPPRESS_WINDOW_MS, "session.gap.ms": SESSION_GAP_MS}


Input = tuple[str, bytes, bytes, int]
"""One input record: topic role (an index into the workload's topics), key, value, timestamp."""


def paid(order: dict[str, Any], payment: dict[str, Any]) -> dict[str, Any]:
    """The stream-stream join's joiner."""
    return {"order": order["id"], "customer": order["customer"], "amount": order["amount"],
            "method": payment["method"]}


def enriched(order: dict[str, Any], customer: dict[str, Any]) -> dict[str, Any]:
    """The table-table and foreign-key joins' joiner."""
    return {"order": order["id"], "customer": customer["id"], "amount": order["amount"],
            "tier": customer["tier"], "version": customer["version"]}


def customer_of(order: dict[str, Any]) -> str:
    """The foreign-key join's extractor."""
    return str(order["customer"])


def window_key(customer: str, start: int) -> str:
    return f"{customer}@{start}"


def session_key(customer: str, start: int, end: int) -> str:
    return f"{customer}@{start}-{end}"


def partition_of(key: bytes) -> int:
    """The partition Kafka's default partitioner (murmur2) gives a key, as the input producer does."""
    from aiokafka.partitioner import murmur2

    return int(murmur2(key) & 0x7FFFFFFF) % PARTITIONS


@dataclass
class DslExpectation:
    """What a complete and correct output is, from the input.

    ``expected``: the last value per output key (parsed JSON; None: the key's last record is a
    tombstone). ``records_out``: the exact number of output records, or None when it depends on
    how the engine interleaves its inputs (then the output is read when it pauses, ``settle``).
    """

    records_in: int
    expected: dict[bytes, Any]
    records_out: int | None = None
    decode: Callable[[bytes], Any] = orjson.loads
    settle: bool = True
    counts = False
    _matched: int = field(default=0, init=False)
    _keys: list[bytes] = field(default_factory=list, init=False)

    def begin(self) -> None:
        """A new run's output is read: no key found yet (one expectation serves every peer's run)."""
        self._matched = 0

    def complete(self, _out_records: int, last_values: dict[bytes, Any]) -> bool:
        """Every expected key's last value is the expected one (keys found so stay found until
        ``verify``, which checks them all again)."""
        if not self._keys:
            self._keys = list(self.expected)
        while self._matched < len(self._keys):
            key = self._keys[self._matched]
            raw = last_values.get(key, ...)
            if raw is ... or self._value(raw) != self.expected[key]:
                return False
            self._matched += 1
        return True

    def _value(self, raw: bytes | None) -> Any:
        return None if raw is None else self.decode(raw)

    def verify(self, out_records: int, last_values: dict[bytes, Any]) -> str | None:
        """Why the output is wrong (the count, a key's value, a key that should not be there), or None."""
        if self.records_out is not None and out_records != self.records_out:
            return f"{out_records:,} output records, expected exactly {self.records_out:,}"
        wrong = [k for k, v in self.expected.items() if self._value(last_values.get(k)) != v]
        extra = [k for k, raw in last_values.items() if k not in self.expected and raw is not None]
        if wrong or extra:
            sample = [(k, last_values.get(k), self.expected.get(k)) for k in (wrong + extra)[:3]]
            return (f"{len(wrong):,} keys with a wrong last value, {len(extra):,} keys that should have none "
                    f"(key, got, expected: {sample})")
        return None


@dataclass(frozen=True)
class DslWorkload:
    name: str
    title: str
    topics: tuple[str, ...]
    """The roles of the input topics, in the order the peers take them (comma-separated)."""
    make: Callable[[int, int], list[Input]]
    expect: Callable[[list[Input]], DslExpectation]
    latency: bool = False

    def inputs(self, count: int) -> list[Input]:
        # Every timestamp in the recent past: a broker refuses those more than an hour ahead, and
        # deletes those older than a topic's retention (internal topics: 7 days by default).
        span = count * JOIN_SPACING_MS + JOIN_MAX_DELAY_MS + SUPPRESS_WINDOW_MS + 60_000
        base = (int(time.time() * 1000) - span) // 60_000 * 60_000
        return self.make(count, base)

    def expectation(self, inputs: list[Input]) -> DslExpectation:
        return self.expect(inputs)


def _customer(rng: random.Random) -> str:
    return f"customer-{rng.randrange(CUSTOMERS)}"


def _dumps(value: dict[str, Any]) -> bytes:
    return orjson.dumps(value)


# -- join ----------------------------------------------------------------------------------------

def make_join(count: int, base: int) -> list[Input]:
    rng = random.Random(7)
    orders: list[Input] = []
    payments: list[Input] = []
    for i in range(count // 2):
        key = f"order-{i}"
        at = base + i * JOIN_SPACING_MS
        order = {"id": key, "customer": _customer(rng), "amount": rng.randrange(100, 100_000)}
        orders.append(("orders", key.encode(), _dumps(order), at))
        payment = {"order": key, "method": rng.choice(PAYMENT_METHODS), "amount": order["amount"]}
        payments.append(("payments", key.encode(), _dumps(payment), at + rng.randrange(JOIN_MAX_DELAY_MS + 1)))
    # Each topic in time order, as records would arrive; interleaved by time when produced.
    return sorted(orders + payments, key=lambda r: r[3])


def expect_join(inputs: list[Input]) -> DslExpectation:
    orders = {k: (orjson.loads(v), at) for role, k, v, at in inputs if role == "orders"}
    expected: dict[bytes, Any] = {}
    for role, key, value, at in inputs:
        if role == "payments":
            order, order_at = orders[key]
            if abs(at - order_at) <= JOIN_WINDOW_MS:
                expected[key] = paid(order, orjson.loads(value))
    return DslExpectation(len(inputs), expected, records_out=len(expected), settle=False)


# -- suppress ------------------------------------------------------------------------------------

def _orders_by_customer(count: int, base: int, rng: random.Random) -> list[Input]:
    out = []
    for i in range(count):
        customer = _customer(rng)
        order = {"id": f"order-{i}", "customer": customer, "amount": rng.randrange(100, 100_000)}
        out.append(("orders", customer.encode(), _dumps(order), base + i))
    return out


def _closing_keys() -> list[bytes]:
    """One key per partition, for the records that close the last windows."""
    found: dict[int, bytes] = {}
    n = 0
    while len(found) < PARTITIONS:
        key = f"close-{n}".encode()
        found.setdefault(partition_of(key), key)
        n += 1
    return [found[p] for p in range(PARTITIONS)]


def make_suppress(count: int, base: int) -> list[Input]:
    data = _orders_by_customer(count, base, random.Random(7))
    # Stream time is per partition: a record a window past the last closes every window in its partition.
    last = data[-1][3] + SUPPRESS_WINDOW_MS
    return data + [("orders", key, b'{"close":true}', last) for key in _closing_keys()]


def expect_suppress(inputs: list[Input]) -> DslExpectation:
    closing = set(_closing_keys())
    counts: dict[bytes, int] = {}
    for _role, key, _value, at in inputs:
        if key not in closing:
            window = window_key(key.decode(), at - at % SUPPRESS_WINDOW_MS).encode()
            counts[window] = counts.get(window, 0) + 1
    return DslExpectation(len(inputs), dict(counts), records_out=len(counts), decode=int, settle=False)


# -- session -------------------------------------------------------------------------------------

def make_session(count: int, base: int) -> list[Input]:
    return _orders_by_customer(count, base, random.Random(7))


def expect_session(inputs: list[Input]) -> DslExpectation:
    # Records come in time order per key: a record within the gap of the key's session extends it
    # (its old session goes out as a tombstone, then the new one), else it starts a new session.
    sessions: dict[bytes, tuple[int, int, int]] = {}
    live: dict[bytes, Any] = {}
    updates = 0
    for _role, key, _value, at in inputs:
        current = sessions.get(key)
        if current is not None and at - current[1] <= SESSION_GAP_MS:
            start, end, n = current
            old = session_key(key.decode(), start, end).encode()
            live[old] = None
            sessions[key] = (start, at, n + 1)
            updates += 2
        else:
            sessions[key] = (at, at, 1)
            updates += 1
        start, end, n = sessions[key]
        live[session_key(key.decode(), start, end).encode()] = n
    return DslExpectation(len(inputs), live, records_out=updates, decode=int, settle=False)


# -- table-join and fk-join ----------------------------------------------------------------------

def _customer_row(name: str, version: int, rng: random.Random) -> bytes:
    return _dumps({"id": name, "tier": rng.choice(TIERS), "version": version})


def _with_customers(count: int, base: int, updates: float,
                    order: Callable[[int, random.Random], tuple[bytes, dict[str, Any]]]) -> list[Input]:
    """Every customer's row first, then orders with customer updates among them, one ms apart."""
    rng = random.Random(7)
    versions = dict.fromkeys((f"customer-{c}" for c in range(CUSTOMERS)), 0)
    out: list[Input] = [("customers", name.encode(), _customer_row(name, 0, rng), base + n)
                        for n, name in enumerate(versions)]
    for i in range(len(out), count):
        at = base + i
        if rng.random() < updates:
            name = _customer(rng)
            versions[name] += 1
            out.append(("customers", name.encode(), _customer_row(name, versions[name], rng), at))
        else:
            key, value = order(i, rng)
            out.append(("orders", key, _dumps(value), at))
    return out


def make_table_join(count: int, base: int) -> list[Input]:
    def order(i: int, rng: random.Random) -> tuple[bytes, dict[str, Any]]:
        customer = _customer(rng)
        return customer.encode(), {"id": f"order-{i}", "customer": customer, "amount": rng.randrange(100, 100_000)}

    return _with_customers(count, base, TABLE_CUSTOMER_UPDATES, order)


def make_fk_join(count: int, base: int) -> list[Input]:
    orders: list[dict[str, Any]] = []

    def order(i: int, rng: random.Random) -> tuple[bytes, dict[str, Any]]:
        if orders and rng.random() < FK_ORDER_UPDATES:
            earlier: dict[str, Any] = dict(orders[rng.randrange(len(orders))])
            earlier["amount"] = rng.randrange(100, 100_000)
            if rng.random() < FK_MOVES:
                earlier["customer"] = _customer(rng)
            return earlier["id"].encode(), earlier
        value: dict[str, Any] = {"id": f"order-{i}", "customer": _customer(rng), "amount": rng.randrange(100, 100_000)}
        orders.append(value)
        return value["id"].encode(), value

    return _with_customers(count, base, FK_CUSTOMER_UPDATES, order)


def _final_tables(inputs: list[Input]) -> tuple[dict[bytes, Any], dict[bytes, Any]]:
    tables: dict[str, dict[bytes, Any]] = {"orders": {}, "customers": {}}
    for role, key, value, _at in inputs:
        tables[role][key] = value
    return ({k: orjson.loads(v) for k, v in tables["orders"].items()},
            {k: orjson.loads(v) for k, v in tables["customers"].items()})


def expect_table_join(inputs: list[Input]) -> DslExpectation:
    orders, customers = _final_tables(inputs)
    expected = {k: enriched(o, customers[k]) for k, o in orders.items() if k in customers}
    return DslExpectation(len(inputs), expected)


def expect_fk_join(inputs: list[Input]) -> DslExpectation:
    orders, customers = _final_tables(inputs)
    expected = {k: enriched(o, customers[customer_of(o).encode()]) for k, o in orders.items()}
    return DslExpectation(len(inputs), expected)


DSL_WORKLOADS: dict[str, DslWorkload] = {
    w.name: w
    for w in (
        DslWorkload("join", f"(5) stream-stream join, {JOIN_WINDOW_MS // 1000} s window", ("orders", "payments"),
                    make_join, expect_join),
        DslWorkload("suppress", f"(6) windowed count ({SUPPRESS_WINDOW_MS // 1000} s), suppress until the "
                    "window closes", ("orders",), make_suppress, expect_suppress),
        DslWorkload("table-join", "(7) table-table join", ("orders", "customers"), make_table_join,
                    expect_table_join),
        DslWorkload("fk-join", "(8) foreign-key table join", ("orders", "customers"), make_fk_join, expect_fk_join),
        DslWorkload("session", f"(9) session-window count (gap {SESSION_GAP_MS // 1000} s)", ("orders",),
                    make_session, expect_session),
    )
}


def not_available(workload: str) -> str | None:
    """For the peers other than streamloop and Kafka Streams: the DSL workloads are not written for them."""
    if workload in DSL_WORKLOADS:
        return "not run: the DSL workloads are written for streamloop and Kafka Streams only"
    return None
