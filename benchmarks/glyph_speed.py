"""Encode and decode time of the glyph coding (`transport.glyphs`): the first implementation
(commit 80cbd52, loaded from git at run time) against the current one, side by side on the
same key frames in one run, and a check that both send the same bytes and rebuild the same
picture.

The pages are the key frames that benchmarks/cap_coding.py caches (`--cache DIR`: one
`NAME.pkl` per clip, e.g. `python benchmarks/cap_coding.py --quick --all-documents --cache
/tmp/glyph-cache --codings glyph34` builds the three filmed dense documents); without a cache
a synthetic page of OpenCV text stands in.

    python benchmarks/glyph_speed.py [--cache DIR] [--clips doc_] [--px 34] [--repeat 1]

Times: the median over pages of the best of `--repeat` runs, wall (perf_counter) and CPU
(process_time) seconds. Ends with one JSON line; exits 1 if any payload differs.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))

from streamfuse.transport import glyphs as new_glyphs  # noqa: E402
from streamfuse.transport.config import TransportConfig  # noqa: E402
from streamfuse.vision.frames import KeyFrame  # noqa: E402

#: The first implementation: one numpy comparison per candidate shape, a call per coded bit.
BASELINE = "80cbd52"


def old_glyphs() -> ModuleType:
    """`transport/glyphs.py` as of `BASELINE`, imported as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{BASELINE}:src/streamfuse/transport/glyphs.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    name = "glyphs_baseline"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, f.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    Path(f.name).unlink()
    return module


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def synthetic_page() -> tuple[KeyFrame, list[tuple[int, int, int, int]]]:
    """A 1080p page of 24 lines of OpenCV text with sensor noise (no cache needed)."""
    import cv2

    rng = np.random.default_rng(11)
    image = np.full((1080, 1920), 230, dtype=np.uint8)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "0123456789"]
    boxes = []
    for i in range(24):
        y = 40 + i * 42
        text = " ".join(rng.choice(words, size=12))
        cv2.putText(image, text, (30, y), cv2.FONT_HERSHEY_SIMPLEX, 0.9, 30, 2, cv2.LINE_AA)
        boxes.append((24, y - 26, 1890, y + 8))
    image = np.clip(image + rng.normal(0, 4.0, image.shape), 0, 255).astype(np.uint8)
    rgb = np.ascontiguousarray(np.repeat(image[..., None], 3, axis=2))
    return KeyFrame(stream_id="s", t_media=0.0, image=rgb, index=0), boxes


def pages(cache: Path | None, clips: str) -> list[tuple[str, KeyFrame, Any]]:
    out: list[tuple[str, KeyFrame, Any]] = []
    if cache is not None:
        for path in sorted(cache.glob("*.pkl")):
            if not path.stem.startswith(clips):
                continue
            with path.open("rb") as f:
                data = pickle.load(f)
            for i, (frame, boxes) in enumerate(zip(data["frames"], data["boxes"], strict=True)):
                out.append((f"{path.stem}#{i}", frame, boxes))
    if not out:
        frame, boxes = synthetic_page()
        out.append(("synthetic", frame, boxes))
    return out


def timed(fn: Any, repeat: int) -> tuple[Any, float, float]:
    """(result, best wall s, best CPU s) of `repeat` calls of `fn()`."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        result = fn()
        cpus.append(time.process_time() - c)
        walls.append(time.perf_counter() - w)
    return result, min(walls), min(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None, help="cap_coding.py's cache")
    parser.add_argument("--clips", default="doc_", help="cached clips whose name starts so")
    parser.add_argument("--px", type=int, default=34, help="smallest text line (glyphPX)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per page and coder")
    args = parser.parse_args()
    config = TransportConfig()
    coders = {"old": old_glyphs(), "new": new_glyphs}
    print(f"cpu: {cpu_model()}  python {platform.python_version()}  numpy {np.__version__}")
    rows: list[dict[str, Any]] = []
    same = True
    for name, frame, boxes in pages(args.cache, args.clips):
        row: dict[str, Any] = {"page": name}
        got: dict[str, tuple[bytes, str]] = {}
        for label, module in coders.items():
            encode = partial(module.encode_glyphs, frame, boxes, config, args.px)
            message, enc_wall, enc_cpu = timed(encode, args.repeat)
            decode = partial(module.decode_glyphs, message.payload, stream_id="s", arrival_wall=0)
            decoded, dec_wall, dec_cpu = timed(decode, args.repeat)
            picture = hashlib.sha256(decoded.image.tobytes()).hexdigest()
            got[label] = (message.payload, picture)
            row[label] = {
                "bytes": len(message.payload),
                "encode_s": round(enc_wall, 4),
                "encode_cpu_s": round(enc_cpu, 4),
                "decode_s": round(dec_wall, 4),
                "decode_cpu_s": round(dec_cpu, 4),
            }
        row["same_payload"] = got["old"][0] == got["new"][0]
        row["same_picture"] = got["old"][1] == got["new"][1]
        same = same and row["same_payload"] and row["same_picture"]
        o, n = row["old"], row["new"]
        print(
            f"{name:24s} {n['bytes']:6d} B  encode {o['encode_s']:.3f} -> {n['encode_s']:.3f} s"
            f" (cpu {o['encode_cpu_s']:.3f} -> {n['encode_cpu_s']:.3f})  decode"
            f" {o['decode_s']:.3f} -> {n['decode_s']:.3f} s  same bytes {row['same_payload']}"
            f" same picture {row['same_picture']}",
            flush=True,
        )
        rows.append(row)

    def median(label: str, key: str) -> float:
        return round(statistics.median(r[label][key] for r in rows), 4)

    summary: dict[str, Any] = {"cpu": cpu_model(), "pages": len(rows), "px": args.px}
    for key in ("encode_s", "encode_cpu_s", "decode_s", "decode_cpu_s"):
        old, new = median("old", key), median("new", key)
        summary[key] = {"old": old, "new": new, "speedup": round(old / max(new, 1e-9), 2)}
    summary["same_payload"] = all(r["same_payload"] for r in rows)
    summary["same_picture"] = all(r["same_picture"] for r in rows)
    print(
        f"median of {len(rows)} pages: encode {summary['encode_s']['old']:.3f} ->"
        f" {summary['encode_s']['new']:.3f} s ({summary['encode_s']['speedup']}x), decode"
        f" {summary['decode_s']['old']:.3f} -> {summary['decode_s']['new']:.3f} s"
        f" ({summary['decode_s']['speedup']}x)"
    )
    print(json.dumps({"glyph_speed": summary, "rows": rows}))
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
