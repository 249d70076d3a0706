"""Interactive queries over HTTP (``streamloop.web``) with two instances on a real broker: every key, a
range, a window fetch and the store's metadata asked through either instance; a key the other
instance owns is forwarded to the instance its ``application.server`` names."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamloop import KafkaStreams, StreamsBuilder, TimeWindows
from streamloop.serdes import StringSerde
from streamloop.state import Materialized
from streamloop.testing import eventually_async
from streamloop.web import SERVED_BY, StreamsHttpServer
from tests.support.apps import streams_config
from tests.support.cluster import Cluster
from tests.support.ports import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio]

STR = StringSerde()
PARTITIONS = 4
WORDS = [f"w{i:02d}" for i in range(24)]
AT = 5_000  # every record's timestamp: one window [5000, 6000)


def topology(source: str) -> Any:
    builder = StreamsBuilder()
    grouped = builder.stream(source, key_serde=STR, value_serde=STR).group_by_key(key_serde=STR)
    grouped.count(materialized=Materialized("counts", persistent=False))
    grouped.windowed_by(TimeWindows.of_size_with_no_grace(1000)).count(
        materialized=Materialized("per-second", persistent=False))
    return builder.build()




async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any, str]:
    async with session.get(url) as response:
        return response.status, await response.json(content_type=None), response.headers.get(SERVED_BY, "")


async def test_every_key_is_answered_through_either_instance(cluster: Cluster, names: Any, tmp_path: Path) -> None:
    source = names("words")
    await cluster.create_topics({source: PARTITIONS})
    # Each word i appears i % 3 + 1 times.
    records = [(word, "x") for i, word in enumerate(WORDS) for _ in range(i % 3 + 1)]
    await cluster.produce(source, records, STR, STR, partitions=PARTITIONS, timestamp=AT)
    expected = {word: i % 3 + 1 for i, word in enumerate(WORDS)}
    ports = [free_port(), free_port()]
    endpoints = [f"127.0.0.1:{port}" for port in ports]

    async with aiohttp.ClientSession() as session, AsyncExitStack() as stack:
        instances = []
        for endpoint, port in zip(endpoints, ports, strict=True):
            streams = KafkaStreams(topology(source), streams_config(
                cluster.bootstrap, names.app, application_server=endpoint, state_dir=str(tmp_path / str(port))))
            await stack.enter_async_context(StreamsHttpServer(streams, "127.0.0.1", port))
            await stack.enter_async_context(streams)
            instances.append(streams)
        urls = [f"http://{endpoint}" for endpoint in endpoints]

        async def both_hold_a_part() -> bool:
            for url in urls:
                status, body, _ = await get(session, f"{url}/stores/counts")
                if status != 200 or sorted(i["endpoint"] for i in body["instances"]) != sorted(endpoints) \
                        or not all(i["partitions"] for i in body["instances"]):
                    return False
            return all(s.state.name == "RUNNING" for s in instances)

        await eventually_async(both_hold_a_part, timeout=60, what="both instances hold a part of the store")

        async def every_key_through_both() -> bool:
            served: dict[tuple[str, str], str] = {}
            for url, asked in zip(urls, endpoints, strict=True):
                for word, count in expected.items():
                    status, body, served_by = await get(session, f"{url}/stores/counts/keys/{word}")
                    if (status, body) != (200, {"store": "counts", "key": word, "value": count}):
                        return False
                    served[(asked, word)] = served_by
            answers.update(served)
            return True

        answers: dict[tuple[str, str], str] = {}
        await eventually_async(every_key_through_both, timeout=60, what="every key counted, through both")
        for (asked, word), served_by in answers.items():
            owner = instances[0].query_metadata_for_key("counts", word, STR)
            assert owner is not None and served_by == owner.active_host.endpoint, (asked, word)
        assert any(asked != served_by for (asked, _word), served_by in answers.items())  # some were forwarded
        assert {served_by for served_by in answers.values()} == set(endpoints)  # both stores answered

        for url in urls:
            # A range gathers every instance's part.
            status, body, _ = await get(session, f"{url}/stores/counts/keys")
            assert status == 200 and not body["truncated"]
            assert {e["key"]: e["value"] for e in body["entries"]} == expected
            assert [e["key"] for e in body["entries"]] == sorted(expected)
            status, body, _ = await get(session, f"{url}/stores/counts/keys?from=w05&to=w08")
            assert [e["key"] for e in body["entries"]] == ["w05", "w06", "w07", "w08"]
            # A window fetch goes to the key's owner too.
            for word in ("w00", "w01", "w02", "w13"):
                status, body, _ = await get(session, f"{url}/stores/per-second/windows/{word}?from=0&to=10000")
                assert (status, body["windows"]) == (200, [{"start": AT, "end": AT + 1000, "value": expected[word]}])
