"""Shared piece of the static INT8 quantization scripts (resolution head, OCR detector)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np


def calibration_reader(feeds: Iterable[dict[str, np.ndarray]]) -> Any:
    """An onnxruntime `CalibrationDataReader` that hands out `feeds` (input name -> array)."""
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it: Iterator[dict[str, np.ndarray]] = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    return _Reader()
