"""A node's `StreamHost` loads the OCR and speech models once for all the streams it runs
(`share_models`), not once per stream, and its streams read and hear what they did with models
of their own. Runs the host in-process (no Ray): the sharing is the host's, not the cluster's."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streamfuse.app import StreamfuseConfig
from streamfuse.audio.transcriber import WhisperTranscriber
from streamfuse.scale.ray import StreamHost
from streamfuse.testing.media import cut
from streamfuse.testing.records import committed_words, slide_texts
from streamfuse.vision.ocr import RapidOcrEngine

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHORT = Path(__file__).resolve().parents[2] / "assets" / "test" / "short.mp4"
STREAMS = 3


def _count_loads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Models actually loaded (a load call on an engine not loaded yet), whoever loads them."""
    loads: Counter[str] = Counter()
    ocr_load, asr_load = RapidOcrEngine.load, WhisperTranscriber.load

    def count_ocr(self: RapidOcrEngine) -> None:
        loads["ocr"] += self._engine is None
        ocr_load(self)

    def count_asr(self: WhisperTranscriber) -> None:
        loads["asr"] += self._model is None
        asr_load(self)

    monkeypatch.setattr(RapidOcrEngine, "load", count_ocr)
    monkeypatch.setattr(WhisperTranscriber, "load", count_asr)
    return loads


async def _host_run(host: StreamHost, clip: Path) -> list[dict[str, Any]]:
    config = StreamfuseConfig().model_dump_json()
    ids = [f"{i}:clip" for i in range(STREAMS)]
    for sid in ids:
        await host.start(sid, str(clip), config, STREAMS, 64)

    async def drain(sid: str) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        while True:
            batch, final = await host.pull(sid, 64, 0.5)
            records += batch
            if final is not None:
                return records

    return [r for batch in await asyncio.gather(*(drain(s) for s in ids)) for r in batch]


@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-stream"])
def test_a_host_loads_the_models_once_for_its_streams(
    share: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clip = cut(SHORT, tmp_path / "clip.mp4", 5.0)
    loads = _count_loads(monkeypatch)
    host = StreamHost(share_models=share)
    records = asyncio.run(_host_run(host, clip))
    per_node = 1 if share else STREAMS
    assert loads == {"ocr": per_node, "asr": per_node}
    assert host.memory()["models_loaded"] == ({"ocr": 1, "asr": 1} if share else {})
    # Every stream got the whole run out of the shared models: the same words and slides.
    words = [committed_words(records, f"{i}:clip") for i in range(STREAMS)]
    slides = [slide_texts(records, f"{i}:clip") for i in range(STREAMS)]
    assert words[0] and slides[0]
    assert all(w == words[0] for w in words) and all(s == slides[0] for s in slides)
    assert not [r for r in records if r["type"] == "error"]
