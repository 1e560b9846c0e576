"""How a key frame reads at each coding the keep policy can choose: bytes vs OCR accuracy.

For filmed dense documents (the 200 kbit/s case of benchmarks/edge_cloud.py, in two fonts and
text/noise seeds) and the filmed demo (camera-like clip), the key frames the edge sends (after
the key-frame gate) are coded at each step of a grid of (smallest text line height, grey
levels), rebuilt as the cloud rebuilds them and read by the same OCR engine; per coding: bytes
per key frame, CER against the local read of the original frame, and (documents) CER against
the page's true text. The deadline policy's coding ladder (`DeadlineKeepPolicy.ladder`) is
chosen from this table; docs/edge-cloud.md quotes it.

A coding "glyphPX" (e.g. glyph26) is the glyph-dictionary coding (`transport.glyphs`) of the
same 2-level text picture at smallest line PX px; suffixes set its match rule: hH (Hausdorff
px, 0 = exact), xX (largest share of differing pixels, %; 10 by default), tT (differing
pixels in a 2x2 block that count as a missing stroke), e.g. glyph26h1x20t3.

    python benchmarks/cap_coding.py [--quick] [--all-documents] [--no-camera] [--cache DIR]
        [--codings 20x4,16x4,glyph26,...]

Ends with one JSON line. Byte counts and CERs are deterministic; encode times are not.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pickle
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "benchmarks"))

from edge_cloud import (  # noqa: E402
    camera_clip,
    document_clip,
    document_pages,
    edge_sends,
    key_frames,
    mean_cer,
    read,
)
from streamfuse.assets import demo_files  # noqa: E402
from streamfuse.text import collapse_whitespace  # noqa: E402
from streamfuse.transport.config import TransportConfig  # noqa: E402
from streamfuse.transport.glyphs import MatchRule, decode_glyphs, encode_glyphs  # noqa: E402
from streamfuse.transport.patches import TextBoxes, decode_patches, encode_patches  # noqa: E402
from streamfuse.vision.ocr import RapidOcrEngine  # noqa: E402

FONTS = {
    "default": None,
    "dejavu": "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "liberation-serif": "/usr/share/fonts/truetype/liberation/LiberationSerif-Regular.ttf",
}
#: (name, font, text seed, camera noise seed)
DOCUMENTS = [("doc_default_s21", "default", 21, 7), ("doc_dejavu_s5", "dejavu", 5, 8)]
DOCUMENTS_FULL = DOCUMENTS + [("doc_serif_s9", "liberation-serif", 9, 9)]
#: Smallest text line height (px) x grey levels; "ladder": what the policy's ladder sends.
CODINGS = "20x4,16x4,14x4,12x4,18x3,16x3,14x3,26x2,20x2,17x2"


def log(msg: str) -> None:
    print(msg, flush=True)


def clip_frames(
    name: str, make: Any, cache: Path | None, engine: RapidOcrEngine, config: TransportConfig
) -> dict[str, Any]:
    """The key frames the edge sends of the clip `make(tmp_dir)` builds, their text boxes and
    the local read of each (cached under `cache/name.pkl`)."""
    path = None if cache is None else cache / f"{name}.pkl"
    if path is not None and path.is_file():
        with path.open("rb") as f:
            data: dict[str, Any] = pickle.load(f)
        return data
    with tempfile.TemporaryDirectory() as tmp:
        keys, _ = key_frames(make(Path(tmp)))
    sent = edge_sends(keys, config)
    detector = TextBoxes(config.det_max_side_px)
    frames = [keys[i] for i in sent]
    data = {
        "key_frames": len(keys),
        "frames": frames,
        "boxes": [detector(k.image) for k in frames],
        "refs": [read(engine, k.image) for k in frames],
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            pickle.dump(data, f)
    return data


def glyph_rule(coding: str) -> tuple[int, MatchRule]:
    """ "glyphPX[hH][xX][tT]": the glyph coding at smallest line PX px; optional match rule
    (Hausdorff px H, largest share of differing pixels X in %, thick-difference count T)."""
    m = re.fullmatch(r"glyph(\d+)(?:h(\d))?(?:x(\d+))?(?:t(\d))?", coding)
    if m is None:
        raise SystemExit(f"unknown coding {coding!r}")
    rule = MatchRule()
    if m[2] is not None:
        rule = dataclasses.replace(rule, hausdorff_px=int(m[2]))
    if m[3] is not None:
        rule = dataclasses.replace(rule, max_xor=int(m[3]) / 100)
    if m[4] is not None:
        rule = dataclasses.replace(rule, max_thick=int(m[4]))
    return int(m[1]), rule


def rebuilt(
    frame: Any, boxes: Any, coding: str, config: TransportConfig
) -> tuple[int, float, np.ndarray, float, float]:
    """(bytes, scale, the picture the cloud rebuilds, encode s, decode s) of `frame` at
    `coding`: "PXxLEVELS" (the patch coding, every text patch) or "glyphPX..." (glyphs)."""
    if coding.startswith("glyph"):
        px, rule = glyph_rule(coding)
        t = time.perf_counter()
        g = encode_glyphs(frame, boxes, config, px, rule)
        t_enc = time.perf_counter() - t
        t = time.perf_counter()
        image = decode_glyphs(g.payload, stream_id="s", arrival_wall=0).image
        return len(g.payload), g.scale, image, t_enc, time.perf_counter() - t
    message, t_enc = coded(frame, boxes, coding, config)
    t = time.perf_counter()
    image = decode_patches(message.payload, message.shape, stream_id="s", arrival_wall=0).image
    return len(message.payload), message.scale, image, t_enc, time.perf_counter() - t


def coded(frame: Any, boxes: Any, coding: str, config: TransportConfig) -> tuple[Any, float]:
    """The message of `frame` at `coding` ("PXxLEVELS", every text patch) and its encode time."""
    px, levels = (int(v) for v in coding.split("x"))
    cfg = config.model_copy(
        update={
            "text_px": px,
            "noisy_text_px": px,
            "grey_levels": levels,
            "noisy_grey_levels": levels,
        }
    )
    t = time.perf_counter()
    message = encode_patches(frame, boxes, 1.0, cfg)
    return message, time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 s clips, two documents")
    parser.add_argument("--cache", type=Path, default=None, help="keep key frames and reads")
    parser.add_argument("--codings", default=CODINGS)
    parser.add_argument("--no-camera", action="store_true", help="documents only")
    parser.add_argument(
        "--all-documents", action="store_true", help="the serif document too with --quick"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("RapidOCR", "onnxruntime"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    secs = 10.0 if args.quick else 20.0
    config, engine = TransportConfig(), RapidOcrEngine()
    clips: list[tuple[str, Any, list[list[str]] | None]] = []
    documents = DOCUMENTS if args.quick and not args.all_documents else DOCUMENTS_FULL
    for name, font, seed, noise in documents:

        def make(tmp: Path, font: str = font, seed: int = seed, noise: int = noise) -> Path:
            doc = document_clip(tmp / "doc.mp4", secs, fps=10, seed=seed, font=FONTS[font])
            return camera_clip(doc, tmp / "cam.mp4", secs, seed=noise)

        clips.append((f"{name}_{int(secs)}s", make, document_pages(secs, 4.0, seed)))
    if not args.no_camera:
        with demo_files() as files:
            demo = Path(files.clip)

            def make_camera(tmp: Path) -> Path:
                return camera_clip(demo, tmp / "cam.mp4", secs)

            clips.append((f"camera_demo_{int(secs)}s", make_camera, None))
            data = {name: clip_frames(name, m, args.cache, engine, config) for name, m, _ in clips}
    else:
        data = {name: clip_frames(name, m, args.cache, engine, config) for name, m, _ in clips}
    out: dict[str, Any] = {"quick": args.quick, "clips": {}}
    for name, _make, pages in clips:
        d = data[name]
        frames, boxes, refs = d["frames"], d["boxes"], d["refs"]
        truths = (
            None
            if pages is None
            else [" ".join(pages[min(len(pages) - 1, int(k.t_media / 4.0))]) for k in frames]
        )
        row: dict[str, Any] = {"key_frames": d["key_frames"], "sent": len(frames)}
        if truths is not None:
            row["local_cer_vs_truth"] = round(
                mean_cer(truths, [collapse_whitespace(r) for r in refs]), 4
            )
        log(f"{name}: {len(frames)} of {d['key_frames']} key frames sent; {row}")
        row["codings"] = {}
        for coding in args.codings.split(","):
            sizes, scales, hyps, secs_enc, secs_dec = [], [], [], [], []
            for frame, b in zip(frames, boxes, strict=True):
                size, scale, image, t_enc, t_dec = rebuilt(frame, b, coding, config)
                sizes.append(size)
                scales.append(round(scale, 3))
                hyps.append(read(engine, image))
                secs_enc.append(t_enc)
                secs_dec.append(t_dec)
            r = {
                "bytes": sizes,
                "scales": scales,
                "cer_vs_local": round(mean_cer(refs, hyps), 4),
                "encode_ms": round(1000 * sum(secs_enc) / len(secs_enc)),
                "decode_ms": round(1000 * sum(secs_dec) / len(secs_dec)),
            }
            if truths is not None:
                r["cer_vs_truth"] = round(
                    mean_cer(truths, [collapse_whitespace(h) for h in hyps]), 4
                )
            row["codings"][coding] = r
            log(f"  {coding:>6}: {r}")
        out["clips"][name] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
