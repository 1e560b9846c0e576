"""Scores the main job on a whole evaluation set: every media file with a `NAME.truth.json`
beside it, found under a folder (`streamfuse eval DIR`).

Each item runs through `build_pipeline` as `streamfuse run` does and is scored by
`streamfuse.evaluation.evaluate`; the set's figures pool the items (total edits over total
truth characters or words, latency percentiles over every event or word of every item), per
split and overall. An item's split is its `split` in a `set.json` beside it (the speech set's
manifest) or else the folder it lies in. OCR is scored only on items with a video stream and
speech only on items with audio (an audio-only speech item's truth may list the slides shown
meanwhile, for priming: nothing reads them from the file).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamfuse.errors import EvalError, StreamfuseError
from streamfuse.evaluation import as_records, evaluate, load_truth, word_commit_delays_ms
from streamfuse.stats import percentiles

if TYPE_CHECKING:
    from streamfuse.app import StreamfuseConfig

#: Media a set item may be (the truth file names the item: `NAME.truth.json`).
MEDIA_SUFFIXES = (".mp4", ".mkv", ".webm", ".mov", ".ts", ".ogg", ".wav", ".flac", ".mp3", ".m4a")
TRUTH_SUFFIX = ".truth.json"


@dataclass(frozen=True)
class EvalItem:
    name: str
    media: Path
    truth: Path
    split: str


def find_items(root: str | Path) -> list[EvalItem]:
    """The set's items under `root` (sorted by split, then name); raises `EvalError` naming a
    truth file without media, or a folder without any item."""
    root = Path(root)
    if not root.is_dir():
        raise EvalError(f"{root}: not a folder of media files with NAME.truth.json beside them")
    items = []
    for truth in sorted(root.rglob(f"*{TRUTH_SUFFIX}")):
        name = truth.name[: -len(TRUTH_SUFFIX)]
        media = [truth.with_name(name + s) for s in MEDIA_SUFFIXES]
        found = [m for m in media if m.is_file()]
        if not found:
            raise EvalError(
                f"{truth}: no media file {name}.* beside it ({', '.join(MEDIA_SUFFIXES)})"
            )
        items.append(EvalItem(name, found[0], truth, _split(truth, root)))
    if not items:
        raise EvalError(f"{root}: no *{TRUTH_SUFFIX} files (an item is MEDIA + NAME{TRUTH_SUFFIX})")
    return sorted(items, key=lambda i: (i.split, i.name))


def _split(truth: Path, root: Path) -> str:
    manifest = truth.parent / "set.json"
    if manifest.is_file():
        try:
            clips = json.loads(manifest.read_text())["clips"]
            name = truth.name[: -len(TRUTH_SUFFIX)]
            for clip in clips:
                if clip.get("name") == name and clip.get("split"):
                    return str(clip["split"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise EvalError(f"{manifest}: not a set manifest ({e})") from e
    rel = truth.parent.relative_to(root)
    return rel.parts[0] if rel.parts else "-"


async def run_item(
    item: EvalItem, config: StreamfuseConfig
) -> tuple[list[dict[str, Any]], bool, bool]:
    """The item's records (with the final `stats`), and whether it had video and audio."""
    from streamfuse.app import build_pipeline, run_job
    from streamfuse.sinks import CollectSink
    from streamfuse.sources.media import MediaSource

    sink = CollectSink()
    job = await build_pipeline([str(item.media)], config, [sink])
    await run_job(job, [sink])
    source = job.sources[0]
    assert isinstance(source, MediaSource)
    return [*sink.records, job.summary()], source.has_video, source.has_audio


def score_item(
    item: EvalItem, records: Sequence[dict[str, Any]], *, video: bool, audio: bool
) -> dict[str, Any]:
    """One item's row: its scores and the counts the set's pooled figures sum. An item whose
    truth has no slides (no speech) lacking a video (audio) stream is as it should be: that
    notice is not one of its errors."""
    from streamfuse.app import NO_AUDIO_NOTE, NO_VIDEO_NOTE

    truth = load_truth(item.truth)
    result = evaluate(truth, records)
    expected = [
        note
        for note, unscored in ((NO_VIDEO_NOTE, not truth.ocr), (NO_AUDIO_NOTE, not truth.asr))
        if unscored
    ]
    slides = result.get("ocr_slides", []) if video else []
    row: dict[str, Any] = {
        "name": item.name,
        "split": item.split,
        "ocr_cer": result["ocr_cer"] if video and slides else None,
        "ocr_edits": sum(s["edits"] for s in slides),
        "ocr_chars": sum(s["chars"] for s in slides),
        "asr_wer": result.get("asr_wer") if audio else None,
        "asr_edits": result.get("asr_edits", 0) if audio else 0,
        "asr_words": result.get("asr_words", 0) if audio else 0,
        "rtf": result.get("rtf"),
        "errors": [
            r["message"]
            for r in records
            if r["type"] == "error" and not any(r["message"].endswith(n) for n in expected)
        ],
    }
    lat = result.get("latency_ms", {})
    for kind in ("ocr", "asr"):
        if kind in lat:
            row[f"{kind}_p95_ms"] = lat[kind]["p95"]
    if "asr_word_latency_ms" in result:
        row["word_p50_ms"] = result["asr_word_latency_ms"]["p50"]
        row["word_p95_ms"] = result["asr_word_latency_ms"]["p95"]
    return row


def _pooled(rows: Sequence[dict[str, Any]], samples: Sequence[_Samples]) -> dict[str, Any]:
    ocr_chars = sum(r["ocr_chars"] for r in rows)
    asr_words = sum(r["asr_words"] for r in rows)
    out: dict[str, Any] = {
        "items": len(rows),
        "ocr_cer": sum(r["ocr_edits"] for r in rows) / ocr_chars if ocr_chars else None,
        "asr_wer": sum(r["asr_edits"] for r in rows) / asr_words if asr_words else None,
        "ocr_chars": ocr_chars,
        "asr_words": asr_words,
    }
    for key, values in (
        ("ocr_ms", [v for s in samples for v in s.ocr_ms]),
        ("asr_ms", [v for s in samples for v in s.asr_ms]),
        ("word_ms", [v for s in samples for v in s.word_ms]),
    ):
        if values:
            q = percentiles(values)
            out[f"{key}_p50"], out[f"{key}_p95"] = round(q["p50"], 1), round(q["p95"], 1)
    return out


@dataclass
class _Samples:
    """One item's raw latencies, pooled over the set."""

    ocr_ms: list[float]
    asr_ms: list[float]
    word_ms: list[float]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> _Samples:
        events = as_records(r for r in records if r["type"] in ("ocr", "asr"))
        realtime = any(r["type"] == "stats" and r.get("realtime") for r in records)
        return cls(
            [e.latency_ms for e in events if e.type == "ocr"],
            [e.latency_ms for e in events if e.type == "asr"],
            word_commit_delays_ms(events) if realtime else [],
        )


@dataclass
class SetResult:
    rows: list[dict[str, Any]]
    #: Pooled figures per split, and over every item under "all".
    splits: dict[str, dict[str, Any]]


async def evaluate_set(
    items: Sequence[EvalItem],
    config: StreamfuseConfig,
    *,
    events_dir: Path | None = None,
    progress: Callable[[EvalItem, dict[str, Any]], None] | None = None,
) -> SetResult:
    """Run and score every item; an item that cannot be opened scores as an error row (its
    truth fully missed), the set goes on. `events_dir`: keep each item's events there."""
    rows: list[dict[str, Any]] = []
    samples: dict[str, list[_Samples]] = defaultdict(list)
    by_split: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in items:
        try:
            records, video, audio = await run_item(item, config)
        except StreamfuseError as e:
            records = []
            row = {**score_item(item, [], video=True, audio=True), "errors": [str(e)]}
        else:
            row = score_item(item, records, video=video, audio=audio)
        if events_dir is not None:
            _save(events_dir / f"{item.name}.events.jsonl", records)
        rows.append(row)
        by_split[item.split].append(row)
        samples[item.split].append(_Samples.of(records))
        if progress is not None:
            progress(item, row)
    splits = {name: _pooled(rs, samples[name]) for name, rs in sorted(by_split.items())}
    splits["all"] = _pooled(rows, [s for ss in samples.values() for s in ss])
    return SetResult(rows, splits)


def _save(path: Path, records: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


__all__ = ["EvalItem", "SetResult", "evaluate_set", "find_items", "run_item", "score_item"]
