"""The committed speech evaluation set: every clip decodes, its truth fits its audio, and the
set holds what its benchmark claims (both splits, matched and mismatched slides, human speech)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SET = Path(__file__).resolve().parents[2] / "assets" / "eval" / "speech"


def test_every_clip_decodes_and_its_truth_lies_inside_its_audio() -> None:
    from faster_whisper import decode_audio

    from streamfuse.evaluation import load_truth

    clips = json.loads((SET / "set.json").read_text())["clips"]
    assert len(clips) >= 10
    for clip in clips:
        truth = load_truth(SET / f"{clip['name']}.truth.json")
        audio = decode_audio(str(SET / f"{clip['name']}.ogg"), sampling_rate=16_000)
        assert len(audio) / 16_000 == pytest.approx(truth.duration_s, abs=0.1), clip["name"]
        assert truth.asr and all(u.t_end <= truth.duration_s for u in truth.asr)
        assert truth.ocr and truth.ocr[-1].t_end == pytest.approx(truth.duration_s)
    assert {c["split"] for c in clips} == {"dev", "heldout"}
    for split in ("dev", "heldout"):
        mine = [c for c in clips if c["split"] == split]
        assert any(not c["slides_match_speech"] for c in mine)
        assert any(c["source"].startswith("moonshine-voice") for c in mine)  # human speech
    snrs = [c["snr_db"] for c in clips if c["snr_db"] is not None]
    assert min(snrs) <= 5 and max(snrs) >= 20
    assert sum(c["music_db"] is not None for c in clips) >= 3


def test_mismatched_slides_share_at_most_one_word_with_the_speech() -> None:
    paths = list(SET.glob("*offslide.truth.json"))
    assert len(paths) == 2
    for path in paths:
        truth = json.loads(path.read_text())
        shown = {w.lower() for s in truth["ocr"] for line in s["lines"] for w in line.split()}
        said = {w.lower().strip(".,'") for u in truth["asr"] for w in u["text"].split()}
        # Chemistry's "electron" is also on the mitochondria slides; nothing else is shared.
        assert len({w for w in shown & said if len(w) >= 5}) <= 1, path.name
