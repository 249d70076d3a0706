"""A foreign-key table join whose foreign key is a function of the row's key and value
(``foreign_key_from_key_and_value=``, Kafka Streams 4.0's ``BiFunction`` extractor, KIP-1104),
and how ``join``/``left_join`` tell the two extractor forms apart.

The driver test follows the bi-function cases of Kafka Streams' SubscriptionSendProcessorSupplierTest
(``biFunctionLeftJoinShould…``/``biFunctionInnerJoinShould…``), whose extractor is
``(key, value) -> key + value.foreignKey`` (None without a foreign key): two rows with the same
foreign key in their values reach different right rows, which a value-only extractor cannot say.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamloop.errors import TopologyError
from streamloop.serdes import StringSerde
from streamloop.testing import TopologyTestDriver
from streamloop.topology.builder import StreamsBuilder
from streamloop.topology.fk_join import key_value_extractor

STR = StringSerde()
CONFIG = {"cache.max.bytes.buffering": 0, "default.key.serde": STR, "default.value.serde": STR}


def by_key_and_value(key: str, value: str) -> str | None:
    foreign = value.split("|")[1]
    return key + foreign if foreign else None


def by_value(value: str) -> str:
    return value.split("|")[1]


def joiner(left: str | None, right: str | None) -> str:
    return f"({left},{right})"


@pytest.mark.parametrize("left_join", [False, True], ids=["inner", "left"])
def test_the_foreign_key_from_the_key_and_the_value(left_join: bool) -> None:
    builder = StreamsBuilder()
    left = builder.table("left", key_serde=STR, value_serde=STR)
    right = builder.table("right", key_serde=STR, value_serde=STR)
    join = left.left_join if left_join else left.join
    join(right, foreign_key_from_key_and_value=by_key_and_value, joiner=joiner, materialized="store",
         name="j").to_stream().to("output")
    with TopologyTestDriver(builder.build(), CONFIG, partitions={"left": 2, "right": 3}) as driver:
        lefts, rights = driver.create_input_topic("left", STR, STR), driver.create_input_topic("right", STR, STR)
        output = driver.create_output_topic("output", STR, STR)

        def out() -> dict[str, Any]:
            return dict(output.read_key_values())

        def store() -> dict[str, Any]:
            return dict(driver.get_key_value_store("store").all())

        def subscriptions() -> set[tuple[str, str]]:
            """(foreign key, left key) of each subscription the right side keeps: an old foreign
            key unsubscribed with the key too (a stale one would not show in the output: its
            answers are dropped by their hash)."""
            found = set()
            for stored, _ in driver.get_key_value_store("j-subscription-store").all():
                size = int.from_bytes(stored[:4], "big")
                found.add((stored[4:4 + size].decode(), stored[4 + size:].decode()))
            return found

        rights.pipe_records([("lhs1rhs1", "R11"), ("lhs2rhs1", "R21")])
        lefts.pipe_records([("lhs1", "a|rhs1"), ("lhs2", "b|rhs1")])
        # Same foreign key in both values, each row joined with the right row of its own key.
        assert out() == store() == {"lhs1": "(a|rhs1,R11)", "lhs2": "(b|rhs1,R21)"}
        rights.pipe_input("lhs1rhs1", "R11'")
        assert out() == {"lhs1": "(a|rhs1,R11')"}
        lefts.pipe_input("lhs1", "a|rhs2")  # moves to lhs1rhs2, which has no row yet
        assert out() == {"lhs1": "(a|rhs2,None)" if left_join else None}
        rights.pipe_input("lhs1rhs2", "R12")
        rights.pipe_input("lhs1rhs1", "R11''")  # unsubscribed: reaches no one
        assert out() == {"lhs1": "(a|rhs2,R12)"}
        assert subscriptions() == {("lhs1rhs2", "lhs1"), ("lhs2rhs1", "lhs2")}
        lefts.pipe_input("lhs2", "b|")  # no foreign key
        assert out() == {"lhs2": "(b|,None)" if left_join else None}
        lefts.pipe_input("lhs1", None)
        rights.pipe_input("lhs2rhs1", None)  # lhs2 no longer subscribes to it
        assert out() == {"lhs1": None}
        assert store() == ({"lhs2": "(b|,None)"} if left_join else {})
        assert subscriptions() == set()


def test_the_value_only_extractor_is_wrapped_into_the_same_form() -> None:
    wrapped = key_value_extractor(by_value, None, "join()")
    assert wrapped("ignored key", "v|rhs7") == "rhs7"
    assert key_value_extractor(None, by_key_and_value, "join()") is by_key_and_value


def test_one_extractor_exactly() -> None:
    builder = StreamsBuilder()
    left, right = builder.table("left"), builder.table("right")
    with pytest.raises(TopologyError, match="got both"):
        left.join(right, by_value, joiner,  # type: ignore[call-overload]
                  foreign_key_from_key_and_value=by_key_and_value)
    with pytest.raises(TopologyError, match="got both"):
        left.left_join(right, joiner, foreign_key_extractor=by_value,  # type: ignore[call-overload]
                       foreign_key_from_key_and_value=by_key_and_value)
    with pytest.raises(TopologyError, match="got neither"):
        key_value_extractor(None, None, "join()")
    with pytest.raises(TypeError, match="foreign_key_from_key_and_value"):
        left.join(right, foreign_key_from_key_and_value=by_key_and_value)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="needs a callable"):
        left.join(right, foreign_key_from_key_and_value="key", joiner=joiner)  # type: ignore[arg-type]

    async def waits(key: Any, value: Any) -> Any:
        return value
    with pytest.raises(TopologyError, match="foreign_key_from_key_and_value must be a plain function"):
        left.left_join(right, foreign_key_from_key_and_value=waits, joiner=joiner)
    # The joiner may come positionally: with the key-and-value extractor it is a foreign-key join.
    left.join(right, joiner,  # type: ignore[call-overload]
              foreign_key_from_key_and_value=by_key_and_value, name="by-key")
    assert "by-key-subscription-registration-topic" in builder.build().repartition_topics()
