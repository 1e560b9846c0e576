"""OCR lines on the layout dev slides (scripts/make_layout_dev_set.py): how many read lines are
right, per slide and in all, through the real OCR stage (rapidocr, default config).

Each slide is drawn in memory and read once as a key frame by `OcrStage` at a fixed detector
side (default: the frame's, 1280). A read line is right when it equals its best-matching truth
line, whitespace ignored (the OCR line label of benchmarks/calibration.py at `--line-cer 0`);
the slide's CER is the OCR set's (lines joined in order, docs/ocr-layout.md).

    PYTHONPATH=src python benchmarks/layout_dev.py [--side PX] [--only NAME ...] [--boxes]
                                                   [--set layout-dev|fresh-a]

`--set fresh-a` reads the 9 OCR slides of the calibration's fresh-a set (scripts/fresh_sets.py)
the same way, **to report only**: fresh-a has been looked at, and nothing may be chosen on it.
fresh-b is refused (it stays unseen until its pre-registered run, docs/calibration.md).

Prints one row per slide (lines right / read, CER, and each wrong line beside its truth), then
one JSON line: {"lines": n, "right": n, "line_accuracy": x, "edits": n, "chars": n, "cer": x,
"slides": {name: [right, read, cer]}}. Needs fonts-urw-base35 (the dev slides' faces);
fresh-a needs fonts-dejavu, fonts-liberation and fonts-freefont-ttf.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def read_slide(stage: Any, image: np.ndarray) -> list[str]:
    from streamfuse.testing import run_stage
    from streamfuse.vision import KeyFrame

    h, w = image.shape[:2]
    frame = KeyFrame(
        t_media=0.0, arrival_wall=0.0, image=image, changed_bbox=(0, 0, w, h), reason="first"
    )
    events = asyncio.run(run_stage(stage, [frame]))
    return [ln.text for ev in events[-1:] for ln in ev.payload.lines]


def main(argv: list[str] | None = None) -> int:
    import make_layout_dev_set as dev
    from streamfuse.text import cer, char_errors
    from streamfuse.vision import FixedResolution, OcrConfig, OcrStage

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=1280, help="detector side, pixels")
    parser.add_argument("--only", nargs="*", help="slide names")
    parser.add_argument("--boxes", action="store_true", help="print the engine's raw boxes")
    parser.add_argument(
        "--set", choices=["layout-dev", "fresh-a"], default="layout-dev", help="which slides"
    )
    args = parser.parse_args(argv)
    slides, render, truth_lines = dev.slides(), dev.render, dev.truth_lines
    if args.set == "fresh-a":
        import fresh_sets
        import make_ocr_hard_set as hard

        slides = list(fresh_sets.FRESH_A.ocr_slides)
        render = hard.render

        def truth_lines(slide: Any) -> list[str]:
            return list(slide.truth_lines())

    config = OcrConfig(calibrate=False)
    stage = OcrStage(config, policy=FixedResolution(args.side))
    total = right_total = edits_total = chars_total = 0
    per: dict[str, list[Any]] = {}
    for slide in slides:
        if args.only and slide.name not in args.only:
            continue
        image = np.asarray(render(slide).convert("RGB"))
        truth = truth_lines(slide)
        if args.boxes:
            stage.engine.load()
            for ln in stage.engine.read(image, args.side).lines:
                box = ", ".join(f"{v:.0f}" for v in ln.box)
                print(f"   box {ln.text!r} ({box}) {ln.conf:.3f}")
        lines = read_slide(stage, image)
        stage._streams.clear()  # every slide is a new text state
        ok = [
            min(cer(t, ln, ignore_whitespace=True) for t in truth) == 0.0 if truth else False
            for ln in lines
        ]
        joined, truth_joined = " ".join(lines), " ".join(truth)
        edits, chars = char_errors(truth_joined, joined)
        total += len(lines)
        right_total += sum(ok)
        edits_total += edits
        chars_total += chars
        per[slide.name] = [sum(ok), len(lines), round(edits / chars, 4)]
        print(f"{slide.name:28s} {sum(ok):2d}/{len(lines):2d} lines right  CER {edits / chars:.3f}")
        for ln, good in zip(lines, ok, strict=True):
            if not good:
                best = min(truth, key=lambda t: cer(t, ln, ignore_whitespace=True))
                print(f"    read {ln!r}\n    best {best!r}")
    result = {
        "lines": total,
        "right": right_total,
        "line_accuracy": round(right_total / max(1, total), 4),
        "edits": edits_total,
        "chars": chars_total,
        "cer": round(edits_total / max(1, chars_total), 4),
        "side": args.side,
        "set": args.set,
        "slides": per,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
