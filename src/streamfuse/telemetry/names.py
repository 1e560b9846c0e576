"""Every metric name and span attribute streamfuse records, dotted, with its unit. One place, so
dashboards, exporters and trace queries agree.

A Prometheus scrape shows a metric with dots as underscores, its unit as a suffix and counters
with `_total` (`streamfuse.stage.latency` in s -> `streamfuse_stage_latency_seconds`).
"""

from __future__ import annotations

METER_NAME = "streamfuse"
TRACER_NAME = "streamfuse"

# -- metrics: name  # unit, meaning --------------------------------------------------------------
STAGE_LATENCY = "streamfuse.stage.latency"  # s, per frame processed by a stage
STAGE_FRAMES = "streamfuse.stage.frames"  # {frame}, frames processed
STAGE_ERRORS = "streamfuse.stage.errors"  # {error}, frames that failed
QUEUE_DEPTH = "streamfuse.queue.depth"  # {frame}, data frames waiting at a stage's input
QUEUE_DROPPED = "streamfuse.queue.dropped"  # {frame}, dropped by an overload policy
EVENT_LATENCY = "streamfuse.event.latency"  # s, input arrival to event emission
OCR_RESOLUTION = "streamfuse.ocr.resolution"  # px, OCR input height
OCR_DET_SIDE = "streamfuse.ocr.det_side"  # px, detector long side of a read (the ladder rung)
ASR_COMMIT_LATENCY = "streamfuse.asr.commit_latency"  # s, word end arrival to commit
ASR_EFFORT = "streamfuse.asr.effort"  # {rung}, effort rung of a full-window ASR pass
ASR_REVISIONS = "streamfuse.asr.revisions"  # {revision}, corrections at utterance ends
LM_TOKENS = "streamfuse.lm.tokens"  # {token}, tokens through the LM engine (kind=prefill|decode)
LM_DECODE_RATE = "streamfuse.lm.decode_rate"  # {token}/s, decode tokens per forward second
LM_KV_SLOTS = "streamfuse.lm.kv.slots"  # 1, share of the KV pool's slots in use
LM_KV_TOKENS = "streamfuse.lm.kv.tokens"  # 1, share of the KV pool's token capacity in use
PROCESS_CPU_TIME = "streamfuse.process.cpu.time"  # s, CPU time of the process (mode=user|system)
PROCESS_CPU_UTILIZATION = "streamfuse.process.cpu.utilization"  # 1, CPU share of all cores
MODEL_INFO = "streamfuse.model.info"  # 1, one series per stage running a model, labelled with it
SERVE_SESSIONS = "streamfuse.serve.sessions"  # {session}, sessions running (live=true|false)
SERVE_REFUSED = "streamfuse.serve.refused"  # {request}, sessions refused (reason=limit|input)

# -- span attributes ------------------------------------------------------------------------------
ATTR_STAGE = "streamfuse.stage"  # the source or stage name (`ocr:lecture`)
ATTR_STREAM_ID = "streamfuse.stream_id"
ATTR_FRAME_TYPE = "streamfuse.frame.type"  # the frame class processed or released
ATTR_T_MEDIA = "streamfuse.t_media"  # s, media time of that frame
ATTR_BUSY = "streamfuse.busy_s"  # s, the stage's own work (no downstream waits)
ATTR_QUEUE_WAIT = "streamfuse.queue_wait_s"  # s, the frame's wait in the stage's input queue
ATTR_FAILED = "streamfuse.failed"  # the call raised (the runner made an error event of it)
ATTR_FLUSHED = "streamfuse.flushed"  # the call was the stage's end-of-stream flush
ATTR_EVENT_TYPE = "streamfuse.event.type"  # `ocr`, `asr`, `error`...
ATTR_EVENT_LATENCY = "streamfuse.event.latency_s"  # s, input arrival to emission
ATTR_MODEL_NAME = "streamfuse.model.name"  # the model a stage runs (`PP-OCRv6_det_small+...`)
ATTR_MODEL_PRECISION = "streamfuse.model.precision"  # its weights / compute type (`int8`, `fp32`)
ATTR_MODEL_RUNTIME = "streamfuse.model.runtime"  # the packages running it, with their versions
