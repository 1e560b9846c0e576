"""`ResolutionHead`: predict from a frame the smallest ladder rung at which OCR stays correct.

Loads the INT8 ONNX model shipped next to this module (or any model + metadata pair) with
onnxruntime on one thread; `predict(frame)` costs about a millisecond on a laptop-class CPU core
(thumbnail included), far below one OCR read. The class is a rung of the ladder in the
metadata; the decision rule (see `tools.reshead.train.pick_rungs`) picks the
smallest rung whose predicted probability of reading correctly is at least `tau`.

The model was trained on 16:9 frames labelled at 1920x1080: the rung it names is an absolute
OCR detector input size for that content, which `det_side_px` caps at the frame's own size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamfuse.errors import ModelError
from streamfuse.models import ort_session_options
from streamfuse.qos.ladder import Ladder, Rung
from streamfuse.vision.reshead.preprocess import to_input

MODEL_DIR = Path(__file__).resolve().parent
INT8_MODEL = MODEL_DIR / "resolution_head.int8.onnx"
FP32_MODEL = MODEL_DIR / "resolution_head.fp32.onnx"
METADATA = MODEL_DIR / "resolution_head.json"


@dataclass(frozen=True, slots=True)
class HeadPrediction:
    """The chosen rung (index 0 = largest) and the class probabilities it came from."""

    rung_index: int
    rung: Rung
    probs: tuple[float, ...]

    @property
    def p_correct(self) -> float:
        """Predicted probability that OCR at the chosen rung reads the text correctly."""
        return float(sum(self.probs[self.rung_index :]))


class ResolutionHead:
    """The learned resolution predictor (F14), INT8 by default."""

    def __init__(
        self,
        model_path: Path = INT8_MODEL,
        metadata_path: Path = METADATA,
        tau: float | None = None,
        threads: int = 1,
    ) -> None:
        try:
            import onnxruntime as ort

            meta = json.loads(Path(metadata_path).read_text())
            opts = ort_session_options(intra_op_threads=threads)
            self._session: Any = ort.InferenceSession(
                str(model_path), opts, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # file, JSON and onnxruntime's own exception types
            raise ModelError(f"cannot load resolution head {model_path}: {e}") from e
        self.input_hw: tuple[int, int] = (int(meta["input_hw"][0]), int(meta["input_hw"][1]))
        self.ladder = Ladder(tuple(Rung(int(w), int(h)) for w, h in meta["ladder"]))
        self.tau = float(meta["tau"] if tau is None else tau)
        if not 0.0 < self.tau <= 1.0:
            raise ModelError(f"tau must be in (0, 1], got {self.tau}")
        self._input_name = self._session.get_inputs()[0].name

    def probabilities(self, frame: np.ndarray) -> np.ndarray:
        """Class probabilities (n_rungs,) for one RGB or grey uint8 frame."""
        logits = self._session.run(None, {self._input_name: to_input(frame, self.input_hw)})[0]
        z = logits[0] - logits[0].max()
        e = np.exp(z)
        return np.asarray(e / e.sum())

    def predict(self, frame: np.ndarray) -> HeadPrediction:
        p = self.probabilities(frame)
        tail = np.cumsum(p[::-1])[::-1]  # P(lowest readable rung >= j)
        ok = np.nonzero(tail >= self.tau - 1e-6)[0]
        idx = int(ok.max()) if len(ok) else 0
        return HeadPrediction(idx, self.ladder[idx], tuple(float(v) for v in p))

    def det_side_px(self, frame: np.ndarray) -> int:
        """Detector input long side for `frame`: the predicted rung fitted to the frame."""
        h, w = frame.shape[:2]
        return max(self.predict(frame).rung.size_for(w, h))
