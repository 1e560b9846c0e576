"""Every metric name streamfuse records, dotted, with its unit. One place, so dashboards and
exporters agree."""

from __future__ import annotations

METER_NAME = "streamfuse"

STAGE_LATENCY = "streamfuse.stage.latency"  # s, per frame processed by a stage
STAGE_FRAMES = "streamfuse.stage.frames"  # {frame}, frames processed
STAGE_ERRORS = "streamfuse.stage.errors"  # {error}, frames that failed
QUEUE_DEPTH = "streamfuse.queue.depth"  # {frame}, data frames waiting at a stage's input
QUEUE_DROPPED = "streamfuse.queue.dropped"  # {frame}, dropped by an overload policy
EVENT_LATENCY = "streamfuse.event.latency"  # s, input arrival to event emission
OCR_RESOLUTION = "streamfuse.ocr.resolution"  # px, OCR input height
ASR_COMMIT_LATENCY = "streamfuse.asr.commit_latency"  # s, word end arrival to commit
