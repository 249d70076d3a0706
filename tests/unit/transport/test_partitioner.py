"""The engine's own murmur2 puts every key where Kafka's Java client (and aiokafka) would."""

from __future__ import annotations

from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from streamloop.transport.partitioner import key_hash, murmur2


@given(st.binary(max_size=64))
def test_murmur2_is_kafkas(data: bytes) -> None:
    assert murmur2(data) == aiokafka_murmur2(data) & 0xFFFFFFFF


def test_known_partitions_of_the_java_client() -> None:
    """Values of org.apache.kafka.common.utils.Utils.murmur2 (its own tests), as unsigned ints."""
    assert murmur2(b"21") == (-973932308) & 0xFFFFFFFF
    assert murmur2(b"foobar") == (-790332482) & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-long-string") == (-985981536) & 0xFFFFFFFF
    assert murmur2(b"") == 275646681
    assert key_hash(b"foobar") == (-790332482) & 0x7FFFFFFF
