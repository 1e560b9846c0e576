"""The edge-cloud split end to end on loopback: a cut of the demo clip goes from `run_edge`
through the fault proxy (5% loss, 50 +- 20 ms delay) to `serve_cloud`, whose OCR and ASR text
must match a local run of the same clip; the link record accounts for the faults."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from streamfuse.app import StreamfuseConfig, build_pipeline, run_job
from streamfuse.assets import demo_files
from streamfuse.evaluation import load_truth
from streamfuse.sinks import CollectSink
from streamfuse.testing.media import cut
from streamfuse.testing.netfault import FaultConfig
from streamfuse.text import wer
from streamfuse.transport.cloud import serve_cloud
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.edge import EdgeReport, run_edge

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def _local(clip: Path, config: StreamfuseConfig) -> CollectSink:
    sink = CollectSink()
    job = await build_pipeline([str(clip)], config, [sink])
    await run_job(job, [sink])
    return sink


async def _split(
    clip: Path, config: StreamfuseConfig, faults: FaultConfig
) -> tuple[CollectSink, dict[str, Any], EdgeReport]:
    sink = CollectSink()
    listening: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()
    transport = TransportConfig(deadline_s=1.5)
    cloud = asyncio.create_task(
        serve_cloud(
            "127.0.0.1",
            0,
            config,
            [sink],
            transport=transport,
            idle_timeout_s=60,
            on_listen=listening.set_result,
        )
    )
    host, port = await listening
    report = await run_edge(str(clip), host, port, transport=transport, faults=faults)
    _summary, link = await cloud
    return sink, link, report


def _texts(sink: CollectSink, kind: str) -> list[str]:
    return [r["text"].strip() for r in sink.of_type(kind)]


def test_cloud_reads_what_a_local_run_reads_through_a_lossy_link(tmp_path: Path) -> None:
    with demo_files() as files:
        clip = cut(files.clip, tmp_path / "cut.mp4", 18.0)  # three slides, ~17 s of speech
        truth_path = files.truth
    config = StreamfuseConfig()
    local = asyncio.run(_local(clip, config))
    faults = FaultConfig(loss=0.05, delay_ms=50, jitter_ms=20, seed=7)
    cloud, link, report = asyncio.run(_split(clip, config, faults))

    assert _texts(cloud, "ocr") == _texts(local, "ocr") and len(_texts(local, "ocr")) == 3
    # Speech: the cloud hears Opus, so Whisper may pick another word here and there; it must
    # be as right as the local run against the truth, give or take one word (~2.5% here).
    truth = load_truth(truth_path)
    reference = " ".join(u.text for u in truth.asr if u.t_end <= 18.0)
    local_wer = wer(reference, " ".join(_texts(local, "asr")))
    cloud_wer = wer(reference, " ".join(_texts(cloud, "asr")))
    assert local_wer < 0.2 and cloud_wer <= local_wer + 0.03
    # Same event contract: the cloud's OCR events carry the edge's frame index and reason.
    for a, b in zip(local.of_type("ocr"), cloud.of_type("ocr"), strict=True):
        assert (a["frame_index"], a["reason"], a["t_start"]) == (
            b["frame_index"],
            b["reason"],
            b["t_start"],
        )
    # The faults happened and were repaired within the deadline.
    assert report.proxy is not None and report.proxy["lost"] > 0
    assert report.sender["retransmits"] > 0
    assert link["late_dropped"] == 0 and link["undecodable"] == 0
    assert link["video_messages"] == report.key_frames == 3
    # Link state as events: the cloud's own and the edge's (relayed in-band), every 5 s of
    # media and a final one each; typed `link` records like any other event.
    links = cloud.parsed("link")
    roles = [(r.payload.role, r.payload.final) for r in links]  # type: ignore[attr-defined]
    assert ("edge", True) in roles and ("cloud", True) in roles
    assert sum(1 for role, final in roles if role == "cloud" and not final) >= 2
    edge_last = [r.payload for r in links if r.payload.role == "edge"][-1]  # type: ignore[attr-defined]
    assert edge_last.rtt_ms is not None and edge_last.rtt_ms >= 100  # 2 x 50 ms one way
    assert edge_last.bandwidth_bps is not None and edge_last.retransmits > 0
    assert report.link_events and report.link_events[-1]["final"]
    # Far fewer bytes than the clip itself (H.264 at the demo's settings).
    assert report.video_bytes + report.audio_bytes < clip.stat().st_size / 3
