"""Labelled dataset for the resolution head, cached on disk.

Frame `i` of a dataset is `make_slide(np.random.default_rng([seed, i]))`, so only labels (one
JSON line per frame: the lowest readable rung and the OCR runs that found it) and grey
thumbnails need caching. Labelling runs rapidocr (two worker processes of one thread each by
default, at lower priority) and resumes from the cache file, since it is the expensive part.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamfuse.qos.ladder import DEFAULT_LADDER
from streamfuse.vision.reshead.preprocess import DEFAULT_INPUT_HW, grey_thumbnail
from tools.reshead.labels import RungLabeler, guess_rung
from tools.reshead.synth import make_slide

log = logging.getLogger(__name__)

DEFAULT_TEXT_PX = (12, 72)


@dataclass(frozen=True, slots=True)
class LabelledFrame:
    index: int
    label: int
    readable: bool
    min_text_px: int
    dark: bool
    ocr_cpu_s: float


def frame_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, index])


_WORKER: dict[str, Any] = {}


def _worker_init(nice: int, mode: str) -> None:
    if nice:
        os.nice(nice)
    logging.getLogger("RapidOCR").setLevel(logging.ERROR)
    _WORKER["labeler"] = RungLabeler(DEFAULT_LADDER, threads=1, mode=mode)  # type: ignore[arg-type]


def _label_one(args: tuple[int, int, tuple[int, int]]) -> dict[str, Any]:
    seed, index, text_px = args
    labeler: RungLabeler = _WORKER["labeler"]
    slide = make_slide(frame_rng(seed, index), min_text_px=text_px)
    h, w = slide.image.shape[:2]
    start = guess_rung(labeler.ladder, slide.min_text_px, w, h)
    res = labeler.label(slide.image, slide.lines, start=start)
    return {
        "index": index,
        "label": res.label,
        "readable": res.readable,
        "min_text_px": slide.min_text_px,
        "dark": slide.dark,
        "ocr_cpu_s": round(sum(t.seconds for t in res.tried), 4),
        "tried": [[t.rung_index, round(t.cer, 4)] for t in res.tried],
    }


def read_labels(path: Path) -> dict[int, LabelledFrame]:
    out: dict[int, LabelledFrame] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out[int(r["index"])] = LabelledFrame(
                    int(r["index"]),
                    int(r["label"]),
                    bool(r["readable"]),
                    int(r["min_text_px"]),
                    bool(r["dark"]),
                    float(r["ocr_cpu_s"]),
                )
    return out


def label_frames(
    path: Path,
    indices: Iterable[int],
    seed: int,
    workers: int = 2,
    nice: int = 10,
    text_px: tuple[int, int] = DEFAULT_TEXT_PX,
    mode: str = "det",
) -> dict[int, LabelledFrame]:
    """Label frames `indices` (skipping those already in `path`), appending to `path`.

    `mode` is `RungLabeler`'s: "det" (detector input limited, as the OCR stage reads) or "frame".
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    done = read_labels(path)
    todo = [i for i in indices if i not in done]
    if todo:
        log.info("labelling %d frames (%d cached) with %d workers", len(todo), len(done), workers)
        with (
            ProcessPoolExecutor(workers, initializer=_worker_init, initargs=(nice, mode)) as pool,
            path.open("a") as fh,
        ):
            jobs = ((seed, i, text_px) for i in todo)
            for n, rec in enumerate(pool.map(_label_one, jobs, chunksize=1), 1):
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                if n % 20 == 0:
                    log.info("labelled %d/%d", n, len(todo))
    return read_labels(path)


def thumbnails(
    indices: Iterable[int],
    seed: int,
    input_hw: tuple[int, int] = DEFAULT_INPUT_HW,
    text_px: tuple[int, int] = DEFAULT_TEXT_PX,
) -> np.ndarray:
    """Grey uint8 model-input thumbnails (N, h, w) of frames `indices`, regenerated from seeds."""
    return np.stack(
        [
            grey_thumbnail(make_slide(frame_rng(seed, i), min_text_px=text_px).image, input_hw)
            for i in indices
        ]
    )


def cached_thumbnails(
    path: Path,
    indices: list[int],
    seed: int,
    input_hw: tuple[int, int] = DEFAULT_INPUT_HW,
    text_px: tuple[int, int] = DEFAULT_TEXT_PX,
) -> np.ndarray:
    """`thumbnails`, cached in an .npz at `path`; missing frames are rendered and added."""
    cached: dict[int, np.ndarray] = {}
    if path.exists():
        with np.load(path) as z:
            if z["thumbs"].shape[1:] == tuple(input_hw):
                cached = {int(i): t for i, t in zip(z["indices"], z["thumbs"], strict=True)}
    missing = [i for i in indices if i not in cached]
    if missing:
        log.info("rendering %d thumbnails at %s", len(missing), input_hw)
        for i, t in zip(missing, thumbnails(missing, seed, input_hw, text_px), strict=True):
            cached[i] = t
        keys = sorted(cached)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            path, thumbs=np.stack([cached[i] for i in keys]), indices=np.asarray(keys)
        )
    return np.stack([cached[i] for i in indices])
