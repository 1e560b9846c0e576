"""Confidence calibration of OCR lines and ASR words, fitted on dev clips and scored on held-out
ones, and the joint estimate of terms both slide text and speech observe (F20).

Labelled runs (every clip through `streamfuse.app.build_pipeline`, offline, default models):
- OCR lines from assets/eval/ocr (`dev`: fit; `heldout` + `fresh`: other fonts, layouts and
  contents: score) and the bundled lecture (fit), each clip under several vision policies
  (`--variants`), plus the slides of the speech set drawn in other fonts/themes (fit for the dev
  clips, score for the held-out ones). A line is right when it equals its best-matching truth
  line of the slide on screen, spaces ignored ("39M" for "39 M" is right; `--line-cer` allows a
  few edits).
- ASR words from assets/eval/speech (`dev`: fit; `heldout`: other voices) and the bundled lecture
  (fit), plus the set's synthetic clips generated again (scripts/make_speech_set.py) at `--seeds`
  other seeds (other noise and pauses; each keeps its split, so held-out voices stay held out).
  A word is right when, after Whisper's English normalization,
  it sits in an `equal` block of the word alignment against the truth (rapidfuzz opcodes).
- Shared terms: an ASR content word spoken while a slide is on screen whose OCR reading holds a
  similar word (the two observed the same term). The event: "the spoken word is right". Speech's
  estimate is its calibrated p; the screen's is its line's calibrated conf when it spells the
  word the same, 1 - conf when it spells it differently; the joint is the entropy-weighted pool
  of both (`streamfuse.text.calibration.fit_joint`, fitted on dev terms).

Raw scores are `conf_raw` / `p_raw` (what the recognizers give); every sample also carries the
features the stages compute when they emit (`ocr_line_features` / `asr_word_features`, rebuilt
here from the records). Candidates - temperature, Platt, isotonic on the raw score; ridge
logistic regressions on all features or a compact set, three penalties each - are scored by
5-fold cross-validation on the fit samples with whole clips per fold, and the one with the
lowest cross-validated Brier score is shipped. Held-out samples never choose anything: on them
ECE (10 bins), Brier, AUROC, the spread of the probabilities and a clip-bootstrap 95 % interval
of ECE(calibrated) / ECE(raw) are reported. `--write-assets` stores the calibrators in the
package, `--plots DIR` draws reliability diagrams (matplotlib). Last line: one JSON object.

    python benchmarks/calibration.py [--quick] [--cache DIR] [--write-assets] [--plots DIR]
    python benchmarks/calibration.py --split fresh-a [--cache DIR] [--plots DIR]

`--split fresh-a` / `fresh-b` / `fresh-c` fits nothing: it scores the calibrators the package ships,
unchanged, on a fresh set of generated clips (scripts/fresh_sets.py: faces, layouts, topics,
voices and seeds no other clip uses), with the same labels and scores, plus a clip-bootstrap
interval of ECE(joint) / ECE(better single) on shared terms. `--ocr-only` collects and fits
the OCR line calibrator alone (no speech recognition); `--cv-by source` makes each source of
fit data one cross-validation fold.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OCR_SET = ROOT / "assets" / "eval" / "ocr"
SPEECH_SET = ROOT / "assets" / "eval" / "speech"
ASSET_DIR = ROOT / "src" / "streamfuse" / "assets" / "calibration"
sys.path.insert(0, str(ROOT / "scripts"))

log = logging.getLogger("bench.calibration")

# Vision policies every OCR clip is read under: each gives the recognizer other pixels, so the
# calibrator sees the errors of every operating point, not only the default's.
VARIANTS: dict[str, dict[str, Any]] = {
    "dynamic": {},
    "fixed640": {"policy": {"kind": "fixed", "det_max_side_px": 640}},
    "fixed480": {"policy": {"kind": "fixed", "det_max_side_px": 480}},
    "fixed960": {"policy": {"kind": "fixed", "det_max_side_px": 960}},
    "fixed320": {"policy": {"kind": "fixed", "det_max_side_px": 320}},
}
# Voices the fitting clips speak in: none of them is a held-out clip's voice (those are
# en-gb-scotland, en-gb-x-rp, en-gb-x-gbcwmd, en-gb-x-gbclan), but they span British, American
# and Caribbean English and espeak's voice variants, so the fit sees accents it finds hard.
FIT_VOICES = [
    "en-gb",
    "en-us+m3",
    "en-gb+f2",
    "en-029+m2",
    "en-us-nyc+f1",
    "en-gb+m7",
    "en-us+klatt",
    "en+f4",
    "en-gb+grandpa",
    "en-us+Andy",
    "en-029+f5",
    "en-us-nyc+m2",
    "en-gb+Gene",
    "en+Mr",
    "en-us+f2",
    "en-gb+klatt",
]
NOISES = [("white", 20), ("pink", 12), ("brown", 8), ("babble", 15), ("white", 8), ("none", None)]
STOPWORDS = frozenset(
    [
        "the",
        "a",
        "an",
        "and",
        "or",
        "of",
        "to",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "from",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "as",
        "into",
        "than",
        "then",
        "so",
        "we",
        "our",
        "you",
        "your",
        "they",
        "their",
        "he",
        "she",
        "his",
        "her",
        "has",
        "have",
        "had",
        "not",
        "no",
        "but",
        "if",
        "all",
        "any",
        "each",
        "every",
        "one",
        "two",
        "can",
        "will",
        "would",
        "could",
        "should",
        "may",
        "might",
        "do",
        "does",
        "did",
        "what",
        "which",
        "who",
        "when",
        "where",
        "how",
        "there",
        "here",
        "also",
        "more",
        "most",
        "some",
        "such",
        "only",
        "very",
    ]
)


@dataclass
class OcrSample:
    split: str  # fit | eval
    clip: str
    variant: str
    conf: float
    cer: float
    text: str
    truth: str
    feats: dict[str, float]  # streamfuse.text.calibration.ocr_line_features


@dataclass
class AsrSample:
    split: str
    clip: str
    p: float
    right: bool
    word: str
    t: float
    feats: dict[str, float]  # streamfuse.text.calibration.asr_word_features


# -- running the pipeline --------------------------------------------------------------------------


async def _run(clip: Path, *, ocr: bool, asr: bool, vision: dict[str, Any]) -> list[dict[str, Any]]:
    from streamfuse.app import StreamfuseConfig, build_pipeline, run_job
    from streamfuse.sinks import CollectSink

    # Raw scores only (`conf` = `conf_raw`): what is fitted must not depend on what is shipped.
    vision = {**vision, "ocr": {"calibrate": False}}
    config = StreamfuseConfig.model_validate(
        {
            "realtime": False,
            "ocr": ocr,
            "asr": asr,
            "vision": vision,
            "asr_config": {"calibrate": False},
        }
    )
    sink = CollectSink()
    job = await build_pipeline([str(clip)], config, [sink])
    await run_job(job, [sink])
    return sink.records


CACHE: Path | None = None  # --cache: one JSON file of records per run


def run_clip(
    clip: Path, *, ocr: bool, asr: bool, vision: dict[str, Any] | None = None, key: str = ""
) -> list[dict[str, Any]]:
    """The run's event records (from `CACHE` when it holds this `key`)."""
    path = CACHE / f"{key}.json" if CACHE is not None and key else None
    if path is not None and path.exists():
        return list(json.loads(path.read_text()))
    records = asyncio.run(_run(clip, ocr=ocr, asr=asr, vision=vision or {}))
    if path is not None:
        path.write_text(json.dumps(records))
    return records


# -- labelling -------------------------------------------------------------------------------------


def _raw(item: dict[str, Any], field: str) -> float:
    """The recognizer's own score: `<field>_raw` when the run calibrated, else `<field>`."""
    raw = item.get(f"{field}_raw")
    return float(item[field] if raw is None else raw)


def _collapse(s: str) -> str:
    return " ".join(s.split())


def line_features(rec: dict[str, Any], ln: dict[str, Any]) -> dict[str, float]:
    """An `ocr` record's line's calibration features, as the OCR stage computes them (its
    context among the record's lines included)."""
    from streamfuse.text.calibration import ocr_line_features
    from streamfuse.vision.layout import ocr_context_features

    lines = rec["lines"]
    i = next(k for k, other in enumerate(lines) if other is ln)
    context = ocr_context_features([(x["text"], x["box"]) for x in lines])[i]
    return ocr_line_features(
        ln["text"],
        ln["box"],
        _raw(ln, "conf"),
        scale=float(rec["scale"]),
        mean_conf=rec.get("mean_conf"),
        n_lines=len(rec["lines"]),
        gap_bridged=ln.get("gap_bridged"),  # absent in records from before the layout fields
        inferred_cuts=ln.get("inferred_cuts"),
        context=context,
    )


_TOKEN_COUNT: Any = None


def token_count(word: str) -> int:
    """Whisper's token count for `word` (the default model's tokenizer, as the ASR stage asks)."""
    global _TOKEN_COUNT
    if _TOKEN_COUNT is None:
        from streamfuse.audio import AsrConfig
        from streamfuse.audio.transcriber import WhisperTranscriber

        _TOKEN_COUNT = WhisperTranscriber(AsrConfig()).token_count
    return int(_TOKEN_COUNT(word))


def word_features(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, float]]]:
    """Every committed word of a run with its calibration features, as the ASR stage computes
    them when it emits the word's event (the stream's latest raw p, this event's included)."""
    from streamfuse.text.calibration import ASR_RECENT_WORDS, asr_core, asr_word_features

    out = []
    recent: list[float] = []
    for rec in records:
        if rec.get("type") != "asr":
            continue
        recent = (recent + [_raw(w, "p") for w in rec["words"]])[-ASR_RECENT_WORDS:]
        for w in rec["words"]:
            core = asr_core(w["word"])
            tokens = token_count(core) if core else 2
            out.append((w, asr_word_features(w["word"], _raw(w, "p"), recent, tokens)))
    return out


def ocr_samples(
    records: list[dict[str, Any]], truth: dict[str, Any], split: str, clip: str, variant: str
) -> list[OcrSample]:
    """Every line of every OCR reading, against the best-matching truth line of its slide."""
    from streamfuse.text import cer

    out = []
    for rec in records:
        if rec.get("type") != "ocr":
            continue
        slide = next((s for s in truth["ocr"] if s["t_start"] <= rec["t_start"] < s["t_end"]), None)
        if slide is None:
            continue
        for ln in rec["lines"]:
            text = _collapse(ln["text"])
            best = min(slide["lines"], key=lambda t: cer(t, text, ignore_whitespace=True))
            out.append(
                OcrSample(
                    split=split,
                    clip=clip,
                    variant=variant,
                    conf=_raw(ln, "conf"),
                    cer=cer(best, text, ignore_whitespace=True),
                    text=text,
                    truth=_collapse(best),
                    feats=line_features(rec, ln),
                )
            )
    return out


def _norm_tokens(text: str) -> list[str]:
    from streamfuse.text import normalize_english

    return normalize_english(text).split()


def asr_samples(
    records: list[dict[str, Any]], truth: dict[str, Any], split: str, clip: str
) -> list[AsrSample]:
    """Every committed word, right when all its normalized tokens align `equal` to the truth."""
    from rapidfuzz.distance import Levenshtein

    ref = _norm_tokens(" ".join(u["text"] for u in truth["asr"]))
    featured = word_features(records)
    words = [w for w, _ in featured]
    hyp: list[str] = []
    owner: list[int] = []
    for i, w in enumerate(words):
        toks = _norm_tokens(w["word"])
        hyp += toks
        owner += [i] * len(toks)
    hit = np.zeros(len(hyp), bool)
    for op in Levenshtein.opcodes(hyp, ref):
        if op.tag == "equal":
            hit[op.src_start : op.src_end] = True
    out = []
    for i, w in enumerate(words):
        mine = [k for k, o in enumerate(owner) if o == i]
        if not mine:
            continue  # punctuation or a filler the normalizer removes: nothing to be right about
        out.append(
            AsrSample(
                split=split,
                clip=clip,
                p=_raw(w, "p"),
                right=bool(hit[mine].all()),
                word=" ".join(hyp[k] for k in mine),
                t=float(w["t_start"]),
                feats=featured[i][1],
            )
        )
    return out


# -- the speech set's slides, drawn as a silent video --------------------------------------------

THEMES = [
    ((250, 250, 248), (25, 25, 35)),  # dark on white
    ((245, 245, 245), (195, 195, 200)),  # very low contrast
    ((30, 40, 70), (235, 235, 240)),  # light on navy
    ((245, 245, 245), (150, 150, 160)),  # low contrast grey
    ((250, 240, 200), (120, 60, 20)),  # brown on cream
]
HELDOUT_FONTS = [  # faces scripts/make_ocr_hard_set.py keeps for its held-out split
    ("dejavu-sans-condensed", "dejavu-sans-condensed-bold"),
    ("liberation-sans-italic", "liberation-narrow-bold"),
    ("dejavu-serif-condensed", "dejavu-serif-condensed-bold"),
    ("liberation-serif-italic", "liberation-mono-bold"),
]
SLIDE_FONTS = [  # (body, title) faces
    ("dejavu-sans", "dejavu-sans-bold"),
    ("liberation-serif", "liberation-serif-bold"),
    ("liberation-sans", "liberation-sans-bold"),
    ("liberation-narrow", "liberation-narrow"),
    ("dejavu-mono", "dejavu-mono"),
    ("dejavu-serif", "dejavu-serif-bold"),
]


def slide_video(
    truth: dict[str, Any], seed: int, path: Path, held_out: bool, fresh: Any = None
) -> list[tuple[float, float]]:
    """The clip's slides drawn in a theme and in fonts picked by `seed` (held-out clips draw
    from the faces the OCR set keeps for its held-out split; a `fresh` set's clips from its
    own faces, themes and layouts), each slide degraded its own way (drawn small, at a lower
    resolution scaled back up, blurred, grainy: the fit needs misreadings), 2 s each; returns
    each slide's span."""
    from PIL import Image, ImageDraw

    from make_demo_clip import TextBlock, _draw_block
    from make_ocr_hard_set import encode_stills

    rng = np.random.default_rng(seed)
    themes = THEMES if fresh is None else fresh.themes
    bg, ink = themes[int(rng.integers(len(themes)))]
    faces = fresh.slide_faces if fresh is not None else HELDOUT_FONTS if held_out else SLIDE_FONTS
    font, title_font = faces[int(rng.integers(len(faces)))]
    # (title x, y, align, body x, y, align, bullet): the fit and held-out clips' one layout
    lay: tuple[Any, ...] = (80, 70, "left", 100, 200, "left", None)
    if fresh is not None:
        lay = dataclasses.astuple(fresh.layouts[int(rng.integers(len(fresh.layouts)))])
    images = []
    for slide in truth["ocr"]:
        size = int(rng.choice([14, 17, 20, 24, 30]))
        img = Image.new("RGB", (1280, 720), bg)
        draw = ImageDraw.Draw(img)
        title, *body = slide["lines"]
        _draw_block(draw, TextBlock((title,), title_font, size + 14, ink, *lay[0:3]))
        _draw_block(draw, TextBlock(tuple(body), font, size, ink, *lay[3:6], bullet=lay[6]))
        images.append(degrade(img, rng))
    encode_stills(path, images, 2.0, 30)
    return [(2.0 * i, 2.0 * (i + 1)) for i in range(len(images))]


def degrade(img: Any, rng: np.random.Generator) -> Any:
    """Drawn at a lower resolution scaled back up, blurred, grainy, or none of these (the fit
    needs misreadings); every draw from `rng`."""
    from PIL import Image, ImageFilter

    scale = float(rng.choice([0.4, 0.5, 0.7, 1.0]))
    if scale < 1.0:
        small = img.resize((round(1280 * scale), round(720 * scale)), Image.BILINEAR)
        img = small.resize((1280, 720), Image.BILINEAR)
    blur = float(rng.choice([0.0, 0.7, 1.2]))
    if blur:
        img = img.filter(ImageFilter.GaussianBlur(blur))
    grain = float(rng.choice([0.0, 8.0, 16.0]))
    if grain:
        px = np.asarray(img, np.float32) + rng.normal(0.0, grain, (720, 1280, 1))
        img = Image.fromarray(np.clip(px, 0, 255).astype(np.uint8))
    return img


def redrawn_clip(seed: int, path: Path, held_out: bool, fresh: Any = None) -> dict[str, Any]:
    """Three slides of the OCR set (tables, code, photos with captions, columns, small print)
    drawn again in other faces, a little smaller, degraded as `degrade` does, 2 s each; returns
    the clip's truth. Fit clips redraw `dev` slides in fitting faces (the dev clips themselves
    are read without a single error: no misreading to fit on); held-out clips redraw `heldout`
    and `fresh` slides in the held-out faces (more independent held-out clips than the five);
    a `fresh` set's clips redraw its own slides in its own faces."""
    from make_demo_clip import AssetBuildError, TextBlock
    from make_ocr_hard_set import (
        Photo,
        Table,
        dev_slides,
        encode_stills,
        fresh_slides,
        heldout_slides,
        render,
    )

    rng = np.random.default_rng(seed)
    pairs = HELDOUT_FONTS if held_out else SLIDE_FONTS
    if fresh is not None:
        pairs = [(f, f) for f in fresh.faces]
    faces = sorted({f for pair in pairs for f in pair if "mono" not in f})
    monos = sorted({f for pair in pairs for f in pair if "mono" in f})
    slides = heldout_slides() + fresh_slides() if held_out else dev_slides()
    if fresh is not None:
        slides = list(fresh.ocr_slides)
    images, truth = [], []
    for i, k in enumerate(rng.choice(len(slides), 3, replace=False)):
        slide = slides[int(k)]
        shrink = float(rng.choice([0.75, 0.85, 1.0]))
        items = []
        for it in slide.items:
            pool = monos if "mono" in getattr(it, "font", "") else faces
            face = pool[int(rng.integers(len(pool)))]
            size = max(11, round(it.size_px * shrink))
            if isinstance(it, Table):
                it = dataclasses.replace(it, font=face, header_font=face, size_px=size)
            elif isinstance(it, (TextBlock, Photo)):
                it = dataclasses.replace(it, font=face, size_px=size)
            items.append(it)
        try:
            img = render(dataclasses.replace(slide, items=tuple(items)))
            lines = dataclasses.replace(slide, items=tuple(items)).truth_lines()
        except AssetBuildError:  # a caption no longer fits its photo in this face
            img, lines = render(slide), slide.truth_lines()
        images.append(degrade(img, rng))
        truth.append({"t_start": 2.0 * i, "t_end": 2.0 * (i + 1), "lines": lines})
    encode_stills(path, images, 2.0, 30)
    return {"ocr": truth}


def layout_fit_clip(seed: int, path: Path) -> dict[str, Any]:
    """Three slides of scripts/calibration_fit_slides.py (tables without rules, two columns,
    quadrants, side-by-side captions, drawn bullets, symbol-heavy code) in fitting faces, a
    little smaller; every other clip degraded as `degrade` does; 2 s each; returns the truth."""
    from calibration_fit_slides import layout_fit_slides
    from make_demo_clip import AssetBuildError, TextBlock
    from make_layout_dev_set import Bullets, render, truth_lines
    from make_ocr_hard_set import Photo, Table, encode_stills

    rng = np.random.default_rng(seed)
    faces = sorted({f for pair in SLIDE_FONTS for f in pair if "mono" not in f})
    slides = layout_fit_slides()
    images, truth = [], []
    for i, k in enumerate(rng.choice(len(slides), 3, replace=False)):
        slide = slides[int(k)]
        shrink = float(rng.choice([0.8, 0.9, 1.0]))
        items = []
        for it in slide.items:
            face = faces[int(rng.integers(len(faces)))]
            if "mono" in getattr(it, "font", ""):
                face = it.font  # code stays monospaced
            size = max(12, round(it.size_px * shrink))
            if isinstance(it, Table):
                it = dataclasses.replace(it, font=face, header_font=face, size_px=size)
            elif isinstance(it, (TextBlock, Photo, Bullets)):
                it = dataclasses.replace(it, font=face, size_px=size)
            items.append(it)
        drawn = dataclasses.replace(slide, items=tuple(items))
        try:
            img, lines = render(drawn), truth_lines(drawn)
        except AssetBuildError:  # a cell no longer fits its column in this face
            img, lines = render(slide), truth_lines(slide)
        images.append(degrade(img, rng) if seed % 2 else img)
        truth.append({"t_start": 2.0 * i, "t_end": 2.0 * (i + 1), "lines": lines})
    encode_stills(path, images, 2.0, 30)
    return {"ocr": truth}


def collect_layout_fit(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """OCR fit samples of `args.layout_fit` clips of the layout fit slides, each under one
    vision policy (seeds args.seed + 6000 + k: fit side)."""
    variants = args.variants.split(",")
    out: list[OcrSample] = []
    for k in range(args.layout_fit):
        seed = args.seed + 6000 + k
        video = workdir / f"layout-{seed}.mp4"
        truth = layout_fit_clip(seed, video)
        variant = variants[k % len(variants)]
        key = f"layout-{seed}-{variant}"
        recs = run_clip(video, ocr=True, asr=False, vision=VARIANTS[variant], key=key)
        out += ocr_samples(recs, truth, "fit", f"layout-{seed}", variant)
        log.info("layout fit clip %d: %d readings", k, len(recs))
    return [asdict(s) for s in out]


def collect_redraws(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """OCR samples of `args.redraws` redrawn clips per split (fit: dev slides; held-out:
    heldout and fresh slides), each clip under one vision policy."""
    variants = args.variants.split(",")
    out: list[OcrSample] = []
    for split, base in (("fit", 7000), ("eval", 8000)):
        for k in range(args.redraws):
            seed = args.seed + base + k
            video = workdir / f"redraw-{seed}.mp4"
            truth = redrawn_clip(seed, video, held_out=split == "eval")
            variant = variants[k % len(variants)]
            key = f"redraw-{seed}-{variant}"
            recs = run_clip(video, ocr=True, asr=False, vision=VARIANTS[variant], key=key)
            out += ocr_samples(recs, truth, split, f"redraw-{seed}", variant)
            log.info("redrawn %s clip %d: %d readings", split, k, len(recs))
    return [asdict(s) for s in out]


# -- collection -----------------------------------------------------------------------------------


def _speech_clips(
    seeds: int, fit_clips: int, seed: int, workdir: Path
) -> list[tuple[str, Path, dict[str, Any]]]:
    """(split, audio, truth) of the speech set; `fit_clips` more to fit on, in `FIT_VOICES`
    with other noise, speed and music; and the set's synthetic clips again at `seeds` other
    seeds (other noise samples and pauses), each in its own split (held-out voices score)."""
    manifest = json.loads((SPEECH_SET / "set.json").read_text())["clips"]
    out = []
    for c in manifest:
        truth = json.loads((SPEECH_SET / f"{c['name']}.truth.json").read_text())
        split = "fit" if c["split"] == "dev" else "eval"
        out.append((split, SPEECH_SET / f"{c['name']}.ogg", truth))
    import make_speech_set as mss

    rng = np.random.default_rng(seed)
    for i in range(fit_clips):
        base = mss.CLIPS[i % len(mss.CLIPS)]
        noise, snr = NOISES[int(rng.integers(len(NOISES)))]
        clip = dataclasses.replace(
            base,
            name=f"fit{i:02d}-{base.topic}",
            voice=FIT_VOICES[i % len(FIT_VOICES)],
            speed_wpm=int(rng.integers(130, 186)),
            noise=noise,
            snr_db=snr,
            music_db=-14 if rng.random() < 0.25 else None,
            split="dev",
        )
        truth = mss.build_clip(clip, seed + 500 + i, workdir, workdir)
        out.append(("fit", workdir / f"{clip.name}.ogg", truth))
    if seeds:
        for r in range(seeds):
            for i, clip in enumerate(mss.CLIPS):
                truth = mss.build_clip(clip, seed + 100 * (r + 1) + i, workdir, workdir)
                dst = workdir / f"{clip.name}-seed{r + 1}.ogg"
                (workdir / f"{clip.name}.ogg").rename(dst)
                out.append(("fit" if clip.split == "dev" else "eval", dst, truth))
    return out


def on_clip_times(
    vrecs: list[dict[str, Any]], spans: list[tuple[float, float]], truth: dict[str, Any]
) -> list[dict[str, Any]]:
    """The slide video's readings put back on the speech clip's own slide times."""
    shifted = []
    for rec in vrecs:
        if rec.get("type") != "ocr":
            continue
        i = next((j for j, (a, b) in enumerate(spans) if a <= rec["t_start"] < b), None)
        if i is None:
            continue
        s = truth["ocr"][i]
        shifted.append({**rec, "t_start": s["t_start"] + 1e-3 * (rec["t_start"] - spans[i][0])})
    return shifted


def collect(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from streamfuse.assets import demo_files

    ocr: list[OcrSample] = []
    asr: list[AsrSample] = []
    slides: list[dict[str, Any]] = []  # per speech clip: slide readings for the shared terms
    variants = args.variants.split(",")
    clips = [("fit", p) for p in sorted((OCR_SET / "dev").glob("*.mp4"))]
    clips += [
        ("eval", p) for s in ("heldout", "fresh") for p in sorted((OCR_SET / s).glob("*.mp4"))
    ]
    for split, clip in clips:
        truth = json.loads(clip.with_name(clip.stem + ".truth.json").read_text())
        for v in variants:
            t0 = time.perf_counter()
            recs = run_clip(clip, ocr=True, asr=False, vision=VARIANTS[v], key=f"{clip.stem}-{v}")
            ocr += ocr_samples(recs, truth, split, clip.stem, v)
            log.info("ocr %s %s: %.1f s", clip.stem, v, time.perf_counter() - t0)
    with demo_files() as demo:
        truth = json.loads(demo.truth.read_text())
        t0 = time.perf_counter()
        key = "lecture-ocr" if args.ocr_only else "lecture"
        recs = run_clip(demo.clip, ocr=True, asr=not args.ocr_only, key=key)
        ocr += ocr_samples(recs, truth, "fit", "lecture", "dynamic")
        if not args.ocr_only:
            asr += asr_samples(recs, truth, "fit", "lecture")
            slides.append({"clip": "lecture", "split": "fit", "truth": truth, "ocr": recs})
        log.info("lecture: %.1f s", time.perf_counter() - t0)
    for k, (split, audio, truth) in enumerate(
        _speech_clips(args.seeds, args.fit_clips, args.seed, workdir)
    ):
        t0 = time.perf_counter()
        recs = []
        if not args.ocr_only:
            recs = run_clip(audio, ocr=False, asr=True, key=f"asr-{audio.stem}")
            asr += asr_samples(recs, truth, split, audio.stem)
        video = workdir / f"slides-{audio.stem}.mp4"
        spans = slide_video(truth, args.seed + k, video, held_out=split == "eval")
        variant = ("dynamic", "fixed480", "fixed320")[k % 3]
        vrecs = run_clip(
            video,
            ocr=True,
            asr=False,
            vision=VARIANTS[variant],
            key=f"slides2-{audio.stem}-{args.seed + k}-{variant}",
        )
        shifted = on_clip_times(vrecs, spans, truth)
        ocr += ocr_samples(shifted, truth, split, f"slides-{audio.stem}", variant)
        if not args.ocr_only:
            runs = shifted + recs
            slides.append({"clip": audio.stem, "split": split, "truth": truth, "ocr": runs})
        log.info("speech %s: %.1f s", audio.stem, time.perf_counter() - t0)
    return {
        "ocr": [asdict(s) for s in ocr],
        "asr": [asdict(s) for s in asr],
        "shared_runs": slides,
    }


# -- shared terms ----------------------------------------------------------------------------------


def _content(word: str) -> bool:
    return len(word) >= 3 and word.isalpha() and word not in STOPWORDS


def shared_terms(run: dict[str, Any], ocr_cal: Any, asr_cal: Any) -> list[dict[str, Any]]:
    """ASR content words said while a slide is up whose reading holds a similar word: each
    with speech's calibrated p, the screen's estimate that the word is right, and the label."""
    from rapidfuzz.distance import Levenshtein

    truth, recs = run["truth"], run["ocr"]
    words = asr_samples(recs, truth, run["split"], run["clip"])
    readings = [r for r in recs if r.get("type") == "ocr"]
    out = []
    for w in words:
        if not _content(w.word):
            continue
        slide = next((s for s in truth["ocr"] if s["t_start"] <= w.t < s["t_end"]), None)
        if slide is None:
            continue
        on = [r for r in readings if slide["t_start"] <= r["t_start"] < slide["t_end"]]
        if not on:
            continue
        best: tuple[float, str, dict[str, Any]] | None = None
        for ln in on[-1]["lines"]:
            for tok in _norm_tokens(ln["text"]):
                sim = Levenshtein.normalized_similarity(tok, w.word)
                if best is None or sim > best[0]:
                    best = (sim, tok, ln)
        if best is None or best[0] < 0.75:
            continue
        ln = best[2]
        p_ocr = predict(ocr_cal, [line_features(on[-1], ln)], [_raw(ln, "conf")])[0]
        out.append(
            {
                "split": run["split"],
                "clip": run["clip"],
                "word": w.word,
                "ocr_word": best[1],
                "p_asr": float(predict(asr_cal, [w.feats], [w.p])[0]),
                "p_ocr": float(p_ocr if best[1] == w.word else 1.0 - p_ocr),
                "recent_mean_p": float(w.feats["recent_mean_p"]),
                "right": w.right,
            }
        )
    return out


# -- scoring ---------------------------------------------------------------------------------------

#: Ridge penalties the feature calibrators are tried with (picked by grouped cross-validation).
L2_GRID = (1e-3, 1e-2, 1e-1)
FOLDS = 5


def predict(cal: Any, feats: list[dict[str, float]], p: Iterable[float]) -> np.ndarray:
    """Calibrated probabilities: a `FeatureCalibrator` reads the features, a raw-score
    `Calibrator` the raw scores."""
    from streamfuse.text.calibration import FeatureCalibrator

    if isinstance(cal, FeatureCalibrator):
        return np.asarray(cal.apply(cal.matrix(feats)), float)
    return np.asarray(cal.apply(np.asarray(list(p), float)), float)


def _pairs(terms: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(n, 2) probabilities (speech, screen) and the labels of shared terms."""
    p = np.array([[t["p_asr"], t["p_ocr"]] for t in terms], float).reshape(-1, 2)
    return p, np.array([t["right"] for t in terms], float)


def _term_extra(terms: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """The per-term reliability features a logistic joint calibrator may read."""
    return {"recent_mean_p": np.array([t.get("recent_mean_p", 0.5) for t in terms], float)}


#: The joint candidates: the entropy pool (+ Platt), and ridge logistic regressions on the
#: screen's logit alone, on both logits, and on both logits plus speech's reliability.
JOINT_SETS = {
    "screen": ("logit_screen",),
    "speech+screen": ("logit_speech", "logit_screen"),
    "speech+screen+reliability": ("logit_speech", "logit_screen", "recent_mean_p"),
}


def joint_candidates() -> dict[str, Any]:
    """name -> fit(p, extra, y) of every joint candidate."""
    from streamfuse.text.calibration import fit_joint, fit_joint_logistic

    out: dict[str, Any] = {"entropy pool": lambda p, e, y: fit_joint(p, y)}
    for name, feats in JOINT_SETS.items():
        for l2 in L2_GRID:
            out[f"{name} l2={l2:g}"] = lambda p, e, y, f=feats, l2=l2: fit_joint_logistic(
                p, y, f, e, l2=l2
            )
    return out


def choose_joint(terms: list[dict[str, Any]], seed: int) -> tuple[Any, dict[str, Any]]:
    """Every joint candidate's out-of-fold ECE and Brier on the fit clips' shared terms (5
    folds of whole clips); the lowest Brier wins and is refitted on all of them."""
    from streamfuse.text.calibration import brier

    p, y = _pairs(terms)
    extra = _term_extra(terms)
    groups = np.array([t["clip"] for t in terms])
    names = np.unique(groups)
    fold_of = dict(
        zip(names, np.random.default_rng(seed).permutation(len(names)) % FOLDS, strict=True)
    )
    fold = np.array([fold_of[g] for g in groups])
    cv: dict[str, dict[str, float]] = {}
    fitters = joint_candidates()
    for name, fit in fitters.items():
        pred = np.empty(y.size)
        for k in range(FOLDS):
            test = fold == k
            if not test.any():
                continue
            train = {key: v[~test] for key, v in extra.items()}
            model = fit(p[~test], train, y[~test])
            pred[test] = model.apply(p[test], {key: v[test] for key, v in extra.items()})
        cv[name] = {"ece": round(fast_ece(pred, y), 4), "brier": round(brier(pred, y), 4)}
    chosen = min(cv, key=lambda k: cv[k]["brier"])
    joint = fitters[chosen](p, extra, y)
    joint = joint.model_copy(update={"target": "the spoken term is right (speech + screen)"})
    info = {
        "cv": cv,
        "chosen": chosen,
        "chosen_by": "cross-validated Brier (5 folds of whole fit clips)",
        "fit_terms": int(y.size),
        "fit_clips": len(names),
        "fit_positives": round(float(y.mean()), 4),
    }
    print(f"joint: {y.size} fit terms ({len(names)} clips), CV chose {chosen} ({cv[chosen]})")
    return joint, info


def _scores(p: Iterable[float], y: Iterable[bool]) -> dict[str, Any]:
    """ECE, Brier, AUROC (ranking: a calibrator that gave everyone the mean accuracy would have
    0.5) and the spread of the probabilities (sharpness: their standard deviation)."""
    from streamfuse.text.calibration import auroc, brier, ece

    pa, ya = np.asarray(list(p), float), np.asarray(list(y), float)
    a = auroc(pa, ya)
    return {
        "ece": round(ece(pa, ya), 4),
        "brier": round(brier(pa, ya), 4),
        "auroc": None if a is None else round(a, 4),
        "sd": round(float(pa.std()), 4),
        "n": int(pa.size),
    }


def fast_ece(p: np.ndarray, y: np.ndarray, n_bins: int = 10) -> float:
    """`streamfuse.text.calibration.ece` without the per-bin records (for the bootstrap)."""
    idx = np.clip(np.digitize(p, np.linspace(0, 1, n_bins + 1)[1:-1]), 0, n_bins - 1)
    n = np.bincount(idx, minlength=n_bins)
    gap = np.abs(np.bincount(idx, y, n_bins) - np.bincount(idx, p, n_bins))
    return float(gap.sum() / max(n.sum(), 1))


def bootstrap_ratio(
    raw: np.ndarray, cal: np.ndarray, y: np.ndarray, groups: np.ndarray, reps: int, seed: int
) -> dict[str, float]:
    """95 % interval of ECE(calibrated) / ECE(raw) on held-out, resampling whole clips (a
    clip's lines and words are not independent: one misread table row repeats under every
    vision policy), and the share of resamples where the ratio is at most 0.5."""
    rng = np.random.default_rng(seed)
    names = np.unique(groups)
    members = [np.flatnonzero(groups == g) for g in names]
    ratios = []
    for _ in range(reps):
        idx = np.concatenate([members[k] for k in rng.integers(len(names), size=len(names))])
        before = fast_ece(raw[idx], y[idx])
        ratios.append(fast_ece(cal[idx], y[idx]) / max(before, 1e-9))
    r = np.asarray(ratios)
    return {
        "lo": round(float(np.quantile(r, 0.025)), 3),
        "hi": round(float(np.quantile(r, 0.975)), 3),
        "p_le_half": round(float(np.mean(r <= 0.5)), 3),
        "clips": len(names),
        "reps": reps,
    }


#: Smaller feature sets also tried (a few dozen wrong lines cannot support ten weights).
COMPACT = {
    "ocr": ("logit_conf", "log_height_px", "width_per_char", "known_words"),
    "asr": ("logit_p", "recent_mean_p", "tokens", "known"),
}


#: Besides the line features, what the layout candidates read (OCR only): the layout's own
#: figures and the line's context among the reading's lines.
def _layout_extra() -> tuple[str, ...]:
    from streamfuse.text.calibration import OCR_CONTEXT_FEATURES, OCR_LAYOUT_FEATURES

    return OCR_LAYOUT_FEATURES + OCR_CONTEXT_FEATURES


#: What the stacked candidates read beside the isotonic map's logit (OCR only).
STACKED_LINE = ("cells", "width_per_char", "log_chars", "known_words", "symbols")


def candidates(
    names: list[str], compact: tuple[str, ...], base: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """name -> fit(p, x, y): the raw-score maps and the feature logistic regressions (on the
    `base` features - all of `names` when None - or the `compact` ones; x always holds all
    `names`). When `names` holds the layout features (OCR), also a logistic regression on
    base + layout features ("logistic-layout") and an isotonic map corrected by a logistic
    regression on its logit, the layout features and a few line features ("isotonic+layout")."""
    from streamfuse.text.calibration import FITTERS, fit_logistic, fit_stacked

    base = tuple(names) if base is None else base
    out: dict[str, Any] = {m: (lambda p, x, y, f=f: f(p, y)) for m, f in FITTERS.items()}
    cols = [names.index(f) for f in compact]
    bcols = [names.index(f) for f in base]
    extra = tuple(f for f in _layout_extra() if f in names)
    wide = list(base) + list(extra)
    wcols = [names.index(f) for f in wide]
    for l2 in L2_GRID:
        out[f"logistic l2={l2:g}"] = lambda p, x, y, l2=l2: fit_logistic(
            x[:, bcols], y, base, l2=l2
        )
        out[f"logistic-compact l2={l2:g}"] = lambda p, x, y, l2=l2: fit_logistic(
            x[:, cols], y, compact, l2=l2
        )
    if extra:
        for l2 in L2_GRID:
            out[f"logistic-layout l2={l2:g}"] = lambda p, x, y, l2=l2: fit_logistic(
                x[:, wcols], y, wide, l2=l2
            )
            out[f"isotonic+layout l2={l2:g}"] = lambda p, x, y, l2=l2: fit_stacked(
                x, y, names, extra + STACKED_LINE, l2=l2
            )
    return out


def grouped_cv(
    p: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    seed: int,
    feature_names: list[str],
    compact: tuple[str, ...],
    base: tuple[str, ...] | None = None,
) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """Each candidate's out-of-fold ECE and Brier on the fitting samples, folds made of whole
    clips (so a candidate is judged on clips it did not see, as held-out will judge it)."""
    from streamfuse.text.calibration import brier

    names = np.unique(groups)
    fold_of = dict(
        zip(names, np.random.default_rng(seed).permutation(len(names)) % FOLDS, strict=True)
    )
    fold = np.array([fold_of[g] for g in groups])
    scores = {}
    fitters = candidates(feature_names, compact, base)
    for name, fit in fitters.items():
        pred = np.empty_like(p)
        for k in range(FOLDS):
            test = fold == k
            if not test.any():
                continue
            model = fit(p[~test], x[~test], y[~test])
            pred[test] = _apply(model, x[test], p[test], feature_names)
        scores[name] = {"ece": round(fast_ece(pred, y), 4), "brier": round(brier(pred, y), 4)}
    return scores, fitters


def _apply(model: Any, x: np.ndarray, p: np.ndarray, names: list[str]) -> np.ndarray:
    """`model` on samples: x's columns are the features `names`, p the raw scores."""
    from streamfuse.text.calibration import FeatureCalibrator

    if isinstance(model, FeatureCalibrator):
        return np.asarray(model.apply(model.matrix_from(x, names)), float)
    return np.asarray(model.apply(p), float)


def _source(clip: str) -> str:
    if clip == "lecture":
        return "lecture"
    if clip.startswith("slides-"):
        return "slides drawn again"
    if clip.startswith("human-"):
        return "human reader"
    if clip.startswith("redraw-"):
        return "OCR set drawn again"
    if clip.startswith("layout-"):
        return "layout fit slides"
    head = clip.split("_")[0]
    if head in ("dev", "heldout", "fresh") or (head.startswith("fresh-") and "_" in clip):
        return "OCR set"  # a fresh set's OCR slides are named "<set>_NN"
    return "generated speech"


def calibrate(
    name: str,
    samples: list[dict[str, Any]],
    labels: np.ndarray,
    feature_names: tuple[str, ...],
    target: str,
    seed: int,
    method: str | None = None,
    cv_by: str = "clip",
    base: tuple[str, ...] | None = None,
) -> tuple[Any, dict[str, Any], dict[str, np.ndarray]]:
    """Fit every candidate on the fit samples, pick the one with the lowest grouped-CV Brier,
    score raw / chosen / every candidate on held-out. Returns the chosen calibrator, the
    result row and the held-out arrays (raw, chosen, labels) for plots."""
    names = list(feature_names)
    score_field = "conf" if name == "ocr" else "p"
    p = np.array([s[score_field] for s in samples], float)
    x = np.array([[s["feats"][f] for f in feature_names] for s in samples], float)
    fit = np.array([s["split"] == "fit" for s in samples])
    groups = np.array([s["clip"] for s in samples])
    y = labels.astype(float)
    # Folds of whole clips, or (--cv-by source) one fold per source: a candidate is then
    # judged on a kind of data it was not fitted on at all.
    folds_of = groups if cv_by == "clip" else np.array([_source(g) for g in groups])
    cv, fitters = grouped_cv(
        p[fit], x[fit], y[fit], folds_of[fit], seed, list(feature_names), COMPACT[name], base
    )
    # Chosen by the cross-validated Brier score, a proper score: it rewards calibration and
    # sharpness together (ECE alone is noisy across folds and blind to a constant predictor).
    chosen = min(cv, key=lambda k: cv[k]["brier"])
    if method is not None:  # a decision made outside this run (--ocr-method, --asr-method)
        if method not in cv:
            raise SystemExit(f"--{name}-method {method!r}: not one of {', '.join(cv)}")
        chosen = method
    cal = fitters[chosen](p[fit], x[fit], y[fit])
    cal = cal.model_copy(update={"target": target})
    ev = ~fit
    after = _apply(cal, x[ev], p[ev], names)
    row: dict[str, Any] = {
        "fit": {
            "n": int(fit.sum()),
            "positives": round(float(y[fit].mean()), 4),
            "clips": len(np.unique(groups[fit])),
        },
        "heldout": {
            "n": int(ev.sum()),
            "positives": round(float(y[ev].mean()), 4),
            "clips": len(np.unique(groups[ev])),
        },
        "cv": cv,
        "chosen": chosen,
        "chosen_by": f"cross-validated Brier (folds by {cv_by})"
        if method is None
        else "--method option",
        "raw": _scores(p[ev], y[ev]),
        "after": _scores(after, y[ev]),
        "ratio_ci": bootstrap_ratio(p[ev], after, y[ev], groups[ev], 1000, seed),
        "heldout_by_method": {},
    }
    # Where the held-out samples come from: the OCR set's clips vs the speech set's slides
    # drawn again; generated voices vs the human reader.
    source = np.array([_source(g) for g in groups[ev]])
    row["heldout_by_source"] = {
        src: {
            "raw": _scores(p[ev][source == src], y[ev][source == src]),
            "after": _scores(after[source == src], y[ev][source == src]),
        }
        for src in sorted(set(source))
    }
    grown = source == "OCR set drawn again"
    if grown.any():  # the held-out set as it was before the redrawn clips were added
        keep = ~grown
        row["heldout_before_growth"] = {
            "raw": _scores(p[ev][keep], y[ev][keep]),
            "after": _scores(after[keep], y[ev][keep]),
            "ratio_ci": bootstrap_ratio(
                p[ev][keep], after[keep], y[ev][keep], groups[ev][keep], 1000, seed
            ),
        }
    for m, f in fitters.items():  # every candidate on held-out, for the write-up (not to choose)
        row["heldout_by_method"][m] = _scores(
            _apply(f(p[fit], x[fit], y[fit]), x[ev], p[ev], names), y[ev]
        )
    if hasattr(cal, "coef"):
        row["coef"] = dict(zip(cal.features, [round(c, 3) for c in cal.coef], strict=True))
    if cv_by == "source":  # what each fold holds
        row["cv_folds"] = {
            src: int((folds_of[fit] == src).sum()) for src in sorted(set(folds_of[fit]))
        }
    print(
        f"{name:4s} held-out n={row['raw']['n']:5d} ({row['heldout']['clips']} clips)  "
        f"ECE raw {row['raw']['ece']:.4f} -> {chosen} {row['after']['ece']:.4f} "
        f"[ratio 95% CI {row['ratio_ci']['lo']:.2f}-{row['ratio_ci']['hi']:.2f}]  "
        f"Brier {row['raw']['brier']:.4f} -> {row['after']['brier']:.4f}  "
        f"AUROC {row['raw']['auroc']} -> {row['after']['auroc']}  (fit n={int(fit.sum())})"
    )
    arrays = {
        "raw": p[ev],
        "after": after,
        "y": y[ev],
        "platt": _apply(fitters["platt"](p[fit], x[fit], y[fit]), x[ev], p[ev], names),
    }
    return cal, row, arrays


def plot(path: Path, title: str, curves: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """A reliability diagram: accuracy per confidence bin for each curve, with bin counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from streamfuse.text.calibration import ece, reliability

    fig, (ax, hist) = plt.subplots(
        2, 1, figsize=(5.2, 6.0), gridspec_kw={"height_ratios": [3, 1]}, sharex=True
    )
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=1, label="perfect")
    for i, (label, (p, y)) in enumerate(curves.items()):
        bins = [b for b in reliability(p, y) if b.count]
        ax.plot(
            [b.mean_conf for b in bins],
            [b.accuracy for b in bins],
            marker="o",
            label=f"{label} (ECE {ece(p, y):.3f})",
        )
        hist.hist(p, bins=10, range=(0, 1), alpha=0.5, label=label, color=f"C{i}")
    ax.set_ylabel("fraction right")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    hist.set_xlabel("predicted probability")
    hist.set_ylabel("count")
    hist.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _calibrate_ocr(o: list[dict[str, Any]], args: argparse.Namespace) -> Any:
    """`calibrate` for OCR lines (right: read exactly), as `analyse` and --ocr-only fit it:
    the candidates of `candidates` on `OCR_FEATURES`, plus the layout ones."""
    from streamfuse.text.calibration import OCR_FEATURES

    return calibrate(
        "ocr",
        o,
        np.array([s["cer"] <= args.line_cer for s in o]),
        OCR_FEATURES + _layout_extra(),
        "the OCR line is read exactly (spaces ignored)",
        args.seed,
        args.ocr_method,
        args.cv_by,
        base=OCR_FEATURES,
    )


def analyse(data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from streamfuse.text.calibration import ASR_FEATURES

    result: dict[str, Any] = {}
    o, a = data["ocr"], data["asr"]
    ocr_cal, result["ocr"], ocr_arr = _calibrate_ocr(o, args)
    asr_cal, result["asr"], asr_arr = calibrate(
        "asr",
        a,
        np.array([s["right"] for s in a]),
        ASR_FEATURES,
        "the ASR word is right (Whisper-normalized alignment to the truth)",
        args.seed,
        args.asr_method,
        args.cv_by,
    )
    terms = [t for run in data["shared_runs"] for t in shared_terms(run, ocr_cal, asr_cal)]
    fit_t = [t for t in terms if t["split"] == "fit"]
    ev_t = [t for t in terms if t["split"] == "eval"]
    joint, p_joint, best = None, None, None
    result["shared"] = {"fit_terms": len(fit_t), "heldout_terms": len(ev_t)}
    if fit_t and ev_t:
        p_ev, y_ev = _pairs(ev_t)
        joint, result["shared"]["joint_choice"] = choose_joint(fit_t, args.seed)
        p_joint = joint.apply(p_ev, _term_extra(ev_t))
        single = {"asr": _scores(p_ev[:, 0], y_ev), "ocr": _scores(p_ev[:, 1], y_ev)}
        best = min(single, key=lambda k: single[k]["ece"])
        result["shared"].update(
            {
                "heldout_positives": round(float(y_ev.mean()), 4),
                "asr": single["asr"],
                "ocr": single["ocr"],
                "joint": _scores(p_joint, y_ev),
                "best_single": best,
            }
        )
        print(
            f"shared terms held-out n={len(ev_t)}: ECE speech {single['asr']['ece']:.4f}, "
            f"screen {single['ocr']['ece']:.4f}, joint {result['shared']['joint']['ece']:.4f}"
        )
    else:
        print(f"shared terms: {len(fit_t)} to fit, {len(ev_t)} held-out: no joint figures")
    if args.write_assets:
        ASSET_DIR.mkdir(parents=True, exist_ok=True)
        models: list[tuple[str, Any]] = [("ocr", ocr_cal), ("asr", asr_cal)]
        for name, model in models + ([("joint", joint)] if joint is not None else []):
            text = json.dumps(model.model_dump(mode="json"), indent=1) + "\n"
            (ASSET_DIR / f"{name}.json").write_text(text)
    if args.plots:
        args.plots.mkdir(parents=True, exist_ok=True)
        for kind, arr, what, title in (
            ("ocr", ocr_arr, "conf", "OCR lines"),
            ("asr", asr_arr, "p", "ASR words"),
        ):
            chosen = result[kind]["chosen"]
            plot(
                args.plots / f"{kind}.png",
                f"{title}, held-out (n={arr['y'].size})",
                {
                    f"raw {what}": (arr["raw"], arr["y"]),
                    "Platt on raw": (arr["platt"], arr["y"]),
                    f"shipped ({chosen})": (arr["after"], arr["y"]),
                },
            )
        if p_joint is not None:
            plot(
                args.plots / "shared.png",
                f"Shared terms, held-out (n={len(ev_t)})",
                {
                    "speech (calibrated)": (p_ev[:, 0], y_ev),
                    "screen (calibrated)": (p_ev[:, 1], y_ev),
                    "joint": (p_joint, y_ev),
                },
            )
        (args.plots / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    summary: dict[str, Any] = {}
    for m in ("ocr", "asr"):
        r = result[m]
        summary |= {
            f"ece_{m}_before": r["raw"]["ece"],
            f"ece_{m}_after": r["after"]["ece"],
            f"n_{m}_heldout": r["raw"]["n"],
            f"brier_{m}_before": r["raw"]["brier"],
            f"brier_{m}_after": r["after"]["brier"],
            f"auroc_{m}_before": r["raw"]["auroc"],
            f"auroc_{m}_after": r["after"]["auroc"],
            f"ece_{m}_ratio_ci95": [r["ratio_ci"]["lo"], r["ratio_ci"]["hi"]],
        }
    summary["ece_joint_shared"] = result["shared"]["joint"]["ece"] if best else None
    summary["ece_best_single_shared"] = result["shared"][best]["ece"] if best else None
    summary["n_shared_heldout"] = len(ev_t)
    result["summary"] = summary
    return result


# -- fresh test sets (scripts/fresh_sets.py) -------------------------------------------------------


def fresh_speech_clips(fs: Any) -> list[Any]:
    """The set's speech clips (make_speech_set.Clip): one per voice, its topics in turn; every
    fourth clip shows the next topic's slides (speech does not match the screen), one in eight
    has a 3-s silent gap; noise, SNR, speed and music drawn from the set's seed."""
    import make_speech_set as mss

    mss.TOPICS.update(fs.topics)
    topics = list(fs.topics)
    rng = np.random.default_rng(fs.seed + 100)
    out = []
    for k, voice in enumerate(fs.voices):
        topic = topics[k % len(topics)]
        noise, snr = NOISES[int(rng.integers(len(NOISES)))]
        speed = int(rng.integers(130, 186))
        music = -14 if rng.random() < 0.25 else None
        other = topics[(k + 1) % len(topics)] if k % 4 == 3 else None
        out.append(
            mss.Clip(
                name=f"{fs.name}-{k:02d}-{topic}",
                topic=topic,
                voice=voice,
                speed_wpm=speed,
                noise=noise,
                snr_db=snr,
                music_db=music,
                split="eval",
                slides_from=other,
                gap_s=3.0 if k % 8 == 5 else 0.0,
            )
        )
    return out


def collect_fresh(args: argparse.Namespace, fs: Any, workdir: Path) -> dict[str, Any]:
    """OCR and ASR samples of a fresh set, all in split "eval": its OCR slides drawn as the
    OCR set is (3 per clip, 4 s each, under every vision policy), drawn again degraded
    (`fs.redraws` clips), and its speech clips with their slides drawn as a silent video."""
    import make_speech_set as mss
    from make_ocr_hard_set import encode_stills, render

    variants = args.variants.split(",")
    ocr: list[OcrSample] = []
    asr: list[AsrSample] = []
    runs: list[dict[str, Any]] = []
    slides = fs.ocr_slides
    for k in range(0, len(slides), 3):
        group = slides[k : k + 3]
        name = f"{fs.name}_{k // 3 + 1:02d}"
        video = workdir / f"{name}.mp4"
        encode_stills(video, [render(s) for s in group], 4.0, 20)
        truth = {
            "ocr": [
                {"t_start": 4.0 * i, "t_end": 4.0 * (i + 1), "lines": s.truth_lines()}
                for i, s in enumerate(group)
            ]
        }
        for v in variants:
            recs = run_clip(video, ocr=True, asr=False, vision=VARIANTS[v], key=f"{name}-{v}")
            ocr += ocr_samples(recs, truth, "eval", name, v)
        log.info("%s: %d OCR samples so far", name, len(ocr))
    for k in range(fs.redraws):
        seed = fs.seed + 500 + k
        video = workdir / f"redraw-{seed}.mp4"
        truth = redrawn_clip(seed, video, held_out=True, fresh=fs)
        variant = variants[k % len(variants)]
        recs = run_clip(video, ocr=True, asr=False, vision=VARIANTS[variant], key=video.stem)
        ocr += ocr_samples(recs, truth, "eval", f"redraw-{seed}", variant)
    log.info("%s redrawn: %d OCR samples so far", fs.name, len(ocr))
    for k, clip in enumerate(fresh_speech_clips(fs)):
        t0 = time.perf_counter()
        truth = mss.build_clip(clip, fs.seed + 200 + k, workdir, workdir)
        audio = workdir / f"{clip.name}.ogg"
        recs = run_clip(audio, ocr=False, asr=True, key=f"asr-{clip.name}")
        asr += asr_samples(recs, truth, "eval", clip.name)
        video = workdir / f"slides-{clip.name}.mp4"
        spans = slide_video(truth, fs.seed + 300 + k, video, held_out=True, fresh=fs)
        variant = ("dynamic", "fixed480", "fixed320")[k % 3]
        vrecs = run_clip(
            video, ocr=True, asr=False, vision=VARIANTS[variant], key=f"slides-{clip.name}"
        )
        shifted = on_clip_times(vrecs, spans, truth)
        ocr += ocr_samples(shifted, truth, "eval", f"slides-{clip.name}", variant)
        runs.append({"clip": clip.name, "split": "eval", "truth": truth, "ocr": shifted + recs})
        log.info("speech %s (%s): %.1f s", clip.name, clip.voice, time.perf_counter() - t0)
    return {
        "ocr": [asdict(s) for s in ocr],
        "asr": [asdict(s) for s in asr],
        "shared_runs": runs,
    }


def shipped_calibrators() -> tuple[Any, Any, Any, dict[str, str]]:
    """The calibrators the package ships (OCR, ASR, joint) and the sha256 of their files."""
    import hashlib
    from importlib.resources import files

    from streamfuse.text.calibration import shipped, shipped_joint

    folder = files("streamfuse.assets") / "calibration"
    digests = {
        f"{k}.json": hashlib.sha256((folder / f"{k}.json").read_bytes()).hexdigest()
        for k in ("ocr", "asr", "joint")
    }
    return shipped("ocr"), shipped("asr"), shipped_joint(), digests


def score_fixed(
    data: dict[str, Any], ocr_cal: Any, asr_cal: Any, joint: Any, seed: int, line_cer: float = 0.0
) -> dict[str, Any]:
    """Raw vs calibrated on every sample of `data` with calibrators fixed beforehand: nothing
    is fitted or chosen here. Per modality the scores, the clip-bootstrap interval of
    ECE(calibrated) / ECE(raw) and the breakdown by source; on shared terms the single
    modalities, the joint estimate and the interval of ECE(joint) / ECE(better single)."""
    result: dict[str, Any] = {}
    arrays: dict[str, dict[str, np.ndarray]] = {}
    for kind, cal, samples, field in (
        ("ocr", ocr_cal, data["ocr"], "conf"),
        ("asr", asr_cal, data["asr"], "p"),
    ):
        p = np.array([s[field] for s in samples], float)
        if kind == "ocr":
            y = np.array([s["cer"] <= line_cer for s in samples], float)
        else:
            y = np.array([s["right"] for s in samples], float)
        after = predict(cal, [s["feats"] for s in samples], p)
        groups = np.array([s["clip"] for s in samples])
        source = np.array([_source(g) for g in groups])
        result[kind] = {
            "method": getattr(cal, "method", "logistic"),
            "n": int(p.size),
            "clips": len(np.unique(groups)),
            "positives": round(float(y.mean()), 4),
            "raw": _scores(p, y),
            "after": _scores(after, y),
            "ratio_ci": bootstrap_ratio(p, after, y, groups, 1000, seed),
            "by_source": {
                src: {
                    "raw": _scores(p[source == src], y[source == src]),
                    "after": _scores(after[source == src], y[source == src]),
                    "clips": len(np.unique(groups[source == src])),
                }
                for src in sorted(set(source))
            },
        }
        arrays[kind] = {"raw": p, "after": after, "y": y}
    terms = [t for run in data["shared_runs"] for t in shared_terms(run, ocr_cal, asr_cal)]
    result["shared"] = {"terms": len(terms)}
    if terms:
        pe, ye = _pairs(terms)
        pj = joint.apply(pe, _term_extra(terms))
        single = {"asr": _scores(pe[:, 0], ye), "ocr": _scores(pe[:, 1], ye)}
        best = min(single, key=lambda k: single[k]["ece"])
        groups = np.array([t["clip"] for t in terms])
        col = 0 if best == "asr" else 1
        result["shared"] |= {
            "positives": round(float(ye.mean()), 4),
            "clips": len(np.unique(groups)),
            **single,
            "joint": _scores(pj, ye),
            "best_single": best,
            # ECE(joint) / ECE(better single), resampling whole clips
            "ratio_ci": bootstrap_ratio(pe[:, col], pj, ye, groups, 1000, seed),
        }
        arrays["shared"] = {"asr": pe[:, 0], "ocr": pe[:, 1], "joint": pj, "y": ye}
    summary: dict[str, Any] = {}
    for m in ("ocr", "asr"):
        r = result[m]
        summary |= {
            f"ece_{m}_before": r["raw"]["ece"],
            f"ece_{m}_after": r["after"]["ece"],
            f"n_{m}_heldout": r["n"],
            f"brier_{m}_before": r["raw"]["brier"],
            f"brier_{m}_after": r["after"]["brier"],
            f"auroc_{m}_before": r["raw"]["auroc"],
            f"auroc_{m}_after": r["after"]["auroc"],
            f"ece_{m}_ratio_ci95": [r["ratio_ci"]["lo"], r["ratio_ci"]["hi"]],
        }
    sh = result["shared"]
    summary["ece_joint_shared"] = sh["joint"]["ece"] if terms else None
    summary["ece_best_single_shared"] = sh[sh["best_single"]]["ece"] if terms else None
    summary["n_shared_heldout"] = len(terms)
    summary["ece_joint_ratio_ci95"] = (
        [sh["ratio_ci"]["lo"], sh["ratio_ci"]["hi"]] if terms else None
    )
    result["summary"] = summary
    result["arrays"] = arrays
    return result


def run_fresh(args: argparse.Namespace) -> dict[str, Any]:
    """Score the shipped calibrators, unchanged, on the fresh set `args.split`."""
    from fresh_sets import FRESH_SETS

    fs = FRESH_SETS[args.split]
    ocr_cal, asr_cal, joint, digests = shipped_calibrators()
    print(
        f"{fs.name}: shipped calibrators " + ", ".join(f"{k} {v[:12]}" for k, v in digests.items())
    )
    key = f"{fs.name}-samples-{args.variants}.json"
    if CACHE is not None and (CACHE / key).exists():
        data = json.loads((CACHE / key).read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            data = collect_fresh(args, fs, Path(tmp))
        if CACHE is not None:
            (CACHE / key).write_text(json.dumps(data))
    result = score_fixed(data, ocr_cal, asr_cal, joint, args.seed, args.line_cer)
    arrays = result.pop("arrays")
    result["calibrators_sha256"] = digests
    for m in ("ocr", "asr"):
        r = result[m]
        print(
            f"{fs.name} {m}: n={r['n']} ({r['clips']} clips, {r['positives']:.1%} right)  ECE raw "
            f"{r['raw']['ece']:.4f} -> shipped ({r['method']}) {r['after']['ece']:.4f} "
            f"[ratio 95% CI {r['ratio_ci']['lo']:.2f}-{r['ratio_ci']['hi']:.2f}]  Brier "
            f"{r['raw']['brier']:.4f} -> {r['after']['brier']:.4f}  AUROC {r['raw']['auroc']} "
            f"-> {r['after']['auroc']}"
        )
    if args.plots:
        folder = args.plots / fs.name
        folder.mkdir(parents=True, exist_ok=True)
        for kind, what, title in (("ocr", "conf", "OCR lines"), ("asr", "p", "ASR words")):
            arr = arrays[kind]
            plot(
                folder / f"{kind}.png",
                f"{title}, {fs.name} (n={arr['y'].size})",
                {
                    f"raw {what}": (arr["raw"], arr["y"]),
                    f"shipped ({result[kind]['method']})": (arr["after"], arr["y"]),
                },
            )
        if "shared" in arrays:
            arr = arrays["shared"]
            plot(
                folder / "shared.png",
                f"Shared terms, {fs.name} (n={arr['y'].size})",
                {
                    "speech (calibrated)": (arr["asr"], arr["y"]),
                    "screen (calibrated)": (arr["ocr"], arr["y"]),
                    "joint": (arr["joint"], arr["y"]),
                },
            )
        (folder / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def analyse_ocr(data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """--ocr-only: fit and choose the OCR line calibrator on the fit clips (as `analyse`);
    the old held-out figures it prints were seen before and choose nothing."""
    o = data["ocr"]
    cal, row, _ = _calibrate_ocr(o, args)
    if args.write_assets:
        text = json.dumps(cal.model_dump(mode="json"), indent=1) + "\n"
        (ASSET_DIR / "ocr.json").write_text(text)
    summary = {
        "ocr_chosen": row["chosen"],
        "ocr_chosen_by": row["chosen_by"],
        "ocr_cv": row["cv"],
        "ocr_fit": row["fit"],
    }
    return {"ocr": row, "summary": summary}


def analyse_joint(data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """--joint-only: choose the joint calibrator on the fit clips' shared terms, with the OCR
    and ASR calibrators the package ships (refit the OCR one first); the old held-out terms'
    figures it prints were seen before and choose nothing."""
    ocr_cal, asr_cal, _, digests = shipped_calibrators()
    print(
        "with shipped "
        + ", ".join(f"{k} {v[:12]}" for k, v in digests.items() if k != "joint.json")
    )
    terms = [t for run in data["shared_runs"] for t in shared_terms(run, ocr_cal, asr_cal)]
    fit_t = [t for t in terms if t["split"] == "fit"]
    ev_t = [t for t in terms if t["split"] == "eval"]
    joint, info = choose_joint(fit_t, args.seed)
    if ev_t:
        p_ev, y_ev = _pairs(ev_t)
        info["old_heldout_seen_before"] = {
            "terms": len(ev_t),
            "asr": _scores(p_ev[:, 0], y_ev),
            "ocr": _scores(p_ev[:, 1], y_ev),
            "joint": _scores(joint.apply(p_ev, _term_extra(ev_t)), y_ev),
        }
    if args.write_assets:
        text = json.dumps(joint.model_dump(mode="json"), indent=1) + "\n"
        (ASSET_DIR / "joint.json").write_text(text)
    return {"summary": {f"joint_{k}": v for k, v in info.items()}}


def write_words() -> Path:
    """The common-word list the features use: every lower-case ASCII word of 4+ letters that
    the default Whisper model's BPE vocabulary holds as one word-initial token ("Ġword")."""
    import gzip

    from streamfuse.audio import AsrConfig
    from streamfuse.audio.models import resolve_whisper_model

    vocab = (resolve_whisper_model(AsrConfig().model) / "vocabulary.txt").read_text("utf-8")
    words = sorted(
        {
            t[1:]
            for t in vocab.splitlines()
            if t.startswith("\u0120")
            and t[1:].isascii()
            and t[1:].isalpha()
            and t[1:].islower()
            and len(t) >= 5
        }
    )
    head = (
        "# Lower-case words of 4+ letters that Whisper's byte-level BPE vocabulary (OpenAI "
        "Whisper, MIT; the GPT-2 vocabulary) holds as one word-initial token: a list of common "
        "English words for calibration features. Written by benchmarks/calibration.py "
        "--write-words.\n"
    )
    path = ASSET_DIR / "words.txt.gz"
    path.write_bytes(gzip.compress((head + "\n".join(words) + "\n").encode(), 9, mtime=0))
    return path


def verdicts(s: dict[str, Any]) -> None:
    """The acceptance checks, one line each."""
    for m in ("ocr", "asr"):
        before, after = s[f"ece_{m}_before"], s[f"ece_{m}_after"]
        ok = "meets" if after <= before / 2 else "MISSES"
        print(f"{m}: ECE after / before = {after / max(before, 1e-9):.2f} ({ok} <= 0.5)")
    if s["ece_joint_shared"] is None:
        ok = "no held-out shared terms"
    elif s["ece_joint_shared"] <= s["ece_best_single_shared"]:
        ok = "meets"
    else:
        ok = "MISSES"
    print(
        f"shared: joint ECE {s['ece_joint_shared']} vs best single "
        f"{s['ece_best_single_shared']} ({ok})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="2 vision policies, 2 fitting clips, no extra seeds"
    )
    parser.add_argument(
        "--variants", help="vision policies, comma-separated (" + ",".join(VARIANTS) + ")"
    )
    parser.add_argument("--seeds", type=int, help="extra seeds of the synthetic speech clips")
    parser.add_argument("--fit-clips", type=int, help="extra speech clips to fit on")
    parser.add_argument(
        "--redraws",
        type=int,
        help="OCR-set clips drawn again in other faces, per split (dev: fit; heldout+fresh: score)",
    )
    parser.add_argument(
        "--layout-fit",
        type=int,
        help="fit clips of the layout slides (scripts/calibration_fit_slides.py)",
    )
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--line-cer", type=float, default=0.0, help="CER a right line may have")
    parser.add_argument("--cache", type=Path, help="keep (and reuse) each run's records here")
    parser.add_argument("--write-assets", action="store_true", help="ship the fitted calibrators")
    parser.add_argument("--plots", type=Path, help="write reliability diagrams (PNG) here")
    for kind in ("ocr", "asr"):
        parser.add_argument(
            f"--{kind}-method",
            help=f"ship this {kind.upper()} candidate (e.g. isotonic), not the lowest CV Brier",
        )
    parser.add_argument(
        "--write-words", action="store_true", help="write the common-word list and stop"
    )
    parser.add_argument(
        "--ocr-only",
        action="store_true",
        help="collect and fit the OCR line calibrator only (no speech recognition)",
    )
    parser.add_argument(
        "--joint-only",
        action="store_true",
        help="choose the joint calibrator on the fit clips' shared terms with the shipped "
        "OCR and ASR calibrators (no OCR/ASR fit)",
    )
    parser.add_argument(
        "--cv-by",
        choices=["clip", "source"],
        default="clip",
        help="cross-validation folds: whole clips (default) or one per source of fit data",
    )
    parser.add_argument(
        "--split",
        default="heldout",
        help="heldout: fit on the fit clips, score the held-out ones (default); fresh-a, fresh-b, "
        "fresh-c: score the SHIPPED calibrators, unchanged, on a fresh set "
        "(scripts/fresh_sets.py), fitting nothing",
    )
    args = parser.parse_args(argv)
    if args.write_words:
        print(write_words())
        return 0
    if args.split != "heldout":
        from fresh_sets import FRESH_SETS

        if args.split not in FRESH_SETS:
            parser.error(f"--split {args.split}: heldout or one of {', '.join(FRESH_SETS)}")
        # A fresh set scores what ships and is never fitted or chosen on; a smaller run of it
        # would be a look at it all the same.
        for flag in (
            "quick",
            "write_assets",
            "ocr_method",
            "asr_method",
            "ocr_only",
            "joint_only",
        ):
            if getattr(args, flag):
                parser.error(f"--split {args.split} fits nothing: --{flag.replace('_', '-')}")
    if args.variants is None:
        args.variants = "dynamic,fixed320" if args.quick else ",".join(VARIANTS)
    if args.seeds is None:
        args.seeds = 0 if args.quick else 8
    if args.fit_clips is None:
        args.fit_clips = 2 if args.quick else 32
    if args.redraws is None:
        args.redraws = 0 if args.quick else 16
    if args.layout_fit is None:
        args.layout_fit = 0 if args.quick else 24
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    for noisy in ("RapidOCR", "onnxruntime", "streamfuse", "faster_whisper"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    from streamfuse.testing.machine import cpu_description

    print(f"CPU: {cpu_description()}")
    t0 = time.perf_counter()
    global CACHE
    if args.cache is not None:
        args.cache.mkdir(parents=True, exist_ok=True)
        CACHE = args.cache
    if args.split != "heldout":
        result = run_fresh(args)
        s = result["summary"]
        verdicts(s)
        out = {
            **s,
            "split": args.split,
            "elapsed_s": round(time.perf_counter() - t0, 1),
            "quick": False,
            "detail": {k: result[k] for k in ("ocr", "asr", "shared", "calibrators_sha256")},
        }
        print(json.dumps(out))
        return 0
    key = f"samples3-{args.variants}-{args.seeds}-{args.fit_clips}-{args.seed}.json"
    if args.ocr_only:
        key = key.replace(".json", "-ocr.json")
    if CACHE is not None and (CACHE / key).exists():
        data = json.loads((CACHE / key).read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            data = collect(args, Path(tmp))
        if CACHE is not None:
            (CACHE / key).write_text(json.dumps(data))
    if args.joint_only:
        result = analyse_joint(data, args)
        print(json.dumps({**result["summary"], "elapsed_s": round(time.perf_counter() - t0, 1)}))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        data["ocr"] += collect_redraws(args, Path(tmp))
        data["ocr"] += collect_layout_fit(args, Path(tmp))
    if args.ocr_only:
        result = analyse_ocr(data, args)
        print(json.dumps({**result["summary"], "elapsed_s": round(time.perf_counter() - t0, 1)}))
        return 0
    result = analyse(data, args)
    s = result["summary"]
    verdicts(s)
    out = {
        **s,
        "split": "heldout",
        "elapsed_s": round(time.perf_counter() - t0, 1),
        "quick": args.quick,
        "detail": {k: result[k] for k in ("ocr", "asr", "shared")},
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
