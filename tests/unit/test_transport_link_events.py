"""Link state as events: the cloud end emits typed `link` records (its own counts every few
seconds of media, the edge's measurements relayed in-band, a final one), each valid against the
committed event schema; a malformed relayed report is counted, not emitted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from streamfuse.events import LinkPayload, parse_record
from streamfuse.transport.cloud import CloudSource
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.udp import UdpReceiver, UdpSender
from streamfuse.transport.wire import Kind, Modality, Packet

pytestmark = pytest.mark.unit

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "docs" / "events.schema.json").read_text()
)


def test_cloud_emits_its_own_and_the_edges_link_events() -> None:
    async def run() -> tuple[list[dict[str, Any]], dict[str, Any], int]:
        config = TransportConfig()
        rx = await UdpReceiver.listen("127.0.0.1", 0, config)
        tx = await UdpSender.connect(*rx.address, config)
        records: list[dict[str, Any]] = []
        source = CloudSource(rx, on_record=records.append, report_every_s=1.0)
        control = Packet(kind=Kind.CONTROL, modality=Modality.JSON)
        opening = {"op": "open", "stream_id": "cam", "video": False, "audio": False}
        await tx.send_reliable(control, json.dumps(opening).encode(), 5)
        await source.open()
        edge = LinkPayload(role="edge", deadline_s=1.5, rtt_ms=40.0, bandwidth_bps=2e5)
        tx.send(control, json.dumps({"op": "link", **edge.fields()}).encode())
        tx.send(control, json.dumps({"op": "link", "deadline_s": 1.5, "loss": 5}).encode())
        for t in (0.5, 1.2, 2.5):
            tx.send(Packet(media_time_us=round(t * 1e6)), b"x")
        await tx.send_reliable(control, b'{"op": "end"}', 5)
        async for _frame in source.frames():
            pass
        final = source.link_record(final=True)
        await tx.close()
        await source.close()
        return records, final, source.undecodable

    records, final, undecodable = asyncio.run(run())
    for record in [*records, final]:
        jsonschema.validate(record, SCHEMA)
    parsed = [parse_record(r).payload for r in records]
    edge = [p for p in parsed if isinstance(p, LinkPayload) and p.role == "edge"]
    cloud = [p for p in parsed if isinstance(p, LinkPayload) and p.role == "cloud"]
    assert len(edge) == 1 and edge[0].rtt_ms == 40.0 and edge[0].bandwidth_bps == 2e5
    assert undecodable == 1  # loss=5 is no share: counted, not emitted
    # Media 1.2 s and 2.5 s crossed the 1 s reporting period; records carry the media time.
    assert len(cloud) == 2 and [r["t_start"] for r in records if r["role"] == "cloud"] == [
        1.2,
        2.5,
    ]
    assert final["final"] and final["role"] == "cloud" and final["delivered"] >= 6
    assert final["transport"] == "udp"
