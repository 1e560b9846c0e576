"""Settings of the edge-cloud split (`TransportConfig`): patch tokens, speech coding, the link's
datagram size, deadline, retransmission and keep-ratio policy. One validated object, passed to
both ends; every field has bounds and a default that works on a loopback or a 5%-loss uplink.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

KeyPolicyKind = Literal["deadline", "article", "fixed"]


class TransportConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    patch_px: int = Field(16, ge=8, le=64, description="Side of a square patch token, pixels.")
    text_pad_px: int = Field(
        6, ge=0, le=64, description="Margin kept around each detected text box, pixels."
    )
    patch_codec: Literal["packed", "png", "jpeg"] = Field(
        "packed",
        description="Coding of the kept patches: packed (grey-level indices, 1/2/4 bits a "
        "pixel, LZMA-coded with the rest of the message), or a PNG / JPEG atlas.",
    )
    text_px: int = Field(
        26,
        ge=0,
        le=256,
        description="The frame is sent scaled so its smallest detected text line is this tall "
        "(never enlarged; 0: always full size). The recognizer reads lines at 48 px.",
    )
    noisy_text_px: int = Field(
        20,
        ge=0,
        le=256,
        description="`text_px` for noisy (camera) frames (0: full size), coded at "
        "`noisy_grey_levels`: the area-averaging downscale averages the sensor noise out too. "
        "On two camera-like clips 20 px at 4 levels read within 0.5 points of the original "
        "frames in half the bytes of full size at 2 levels (docs/edge-cloud.md).",
    )
    noisy_grey_levels: int = Field(
        4,
        ge=2,
        le=256,
        description="`grey_levels` for noisy (camera) frames. A camera's blurred strokes and "
        "mid-grey marks (coloured bullets) come out as heavy ink at 2 levels, which the "
        "recognizer reads as characters the original does not show (docs/edge-cloud.md).",
    )
    noisy_flat_span: int = Field(
        32,
        ge=0,
        le=255,
        description="Noisy frames: a patch whose grey range is under this (paper, no ink) is "
        "sent as one grey, no pixels (0: never).",
    )
    min_scale: float = Field(
        0.25, gt=0.0, le=1.0, description="The smallest scale `text_px` may choose."
    )
    grey_levels: int = Field(
        2,
        ge=2,
        le=256,
        description="Grey levels each patch is quantized to between its own darkest and "
        "brightest pixel (256: no quantization). Text needs few: ink and paper (2) held the demo's "
        "OCR within 1 point of the original frames' (docs/edge-cloud.md).",
    )
    denoise_px: int = Field(
        0,
        ge=0,
        le=9,
        description="Gaussian blur kernel (odd px, 0: off) before the grey quantization of a "
        "noisy frame (a camera's): sensor noise would otherwise flip pixels between levels and "
        "defeat the coding. Clean (rendered) frames are never blurred. Off by default: on the "
        "camera-like clip it saved bytes but cost OCR 0.5 points.",
    )
    denoise_min_sigma: float = Field(
        1.0, ge=0.0, le=50.0, description="Estimated noise (grey levels) from which to blur."
    )
    reuse_max_diff: float = Field(
        0.05,
        ge=0.0,
        le=0.5,
        description="A text patch that matches the cloud's copy of an earlier key frame "
        "(after the camera's global shift) to within this share of pixels is not sent again "
        "(0: always send every patch).",
    )
    key_gate: bool = Field(
        True,
        description="Send only the change detector's key frames whose text changed since the "
        "last key frame sent, compared after undoing the camera's shift, lighting and noise "
        "(`transport.keygate`): a camera's shake, lighting drift and the detector's timeout "
        "fire key frames that hold nothing new. False: send every key frame (as a local run "
        "reads them).",
    )
    key_gate_min_frac: float = Field(
        0.004,
        ge=0.0,
        le=1.0,
        description="Share of comparison blocks (16 px of a 1280 px frame) whose ink must "
        "differ for a key frame to be sent: 0.4%, as the change detector's `min_changed_frac`, "
        "ignores a moving pointer and catches a new line of text.",
    )
    key_gate_width_px: int = Field(
        640, ge=160, le=1920, description="Width the key-frame gate compares frames at."
    )
    jpeg_quality: int = Field(85, ge=10, le=100, description="JPEG quality of the patch atlas.")
    det_max_side_px: int = Field(
        960, ge=320, le=4096, description="Long side the edge's text detector runs at."
    )
    opus_bitrate_bps: int = Field(
        12_000,
        ge=6_000,
        le=128_000,
        description="Opus bitrate of the speech sent. On the demo, Whisper's WER is the same "
        "from 16 down to 10 kbit/s and breaks at 8 (docs/edge-cloud.md); 12 keeps a margin.",
    )
    speech_chunk_s: float = Field(
        0.6, ge=0.1, le=5.0, description="Speech is sent in messages of this much audio."
    )
    speech_pad_s: float = Field(
        0.3, ge=0.0, le=2.0, description="Audio kept before a speech start and after its end."
    )
    mtu_bytes: int = Field(
        1200, ge=256, le=65_000, description="Largest datagram sent (path MTU less headroom)."
    )
    deadline_s: float = Field(
        1.5, gt=0.0, le=60.0, description="A message later than this is dropped and counted."
    )
    keep_policy: KeyPolicyKind = Field(
        "deadline",
        description="deadline: keep what the measured bandwidth delivers within the deadline; "
        "article: RTT > 200 ms or loss > 5% -> keep 30% else 70%; fixed: `fixed_keep`.",
    )
    fixed_keep: float = Field(0.7, gt=0.0, le=1.0, description="Keep ratio of `fixed`.")
    lanes: bool = Field(
        True,
        description="Deliver in order per lane (control, speech, video) instead of per "
        "stream, and pace speech ahead of video: speech does not wait behind a key frame or a "
        "refinement part still crossing the link (docs/wire-format.md, lanes). False: one "
        "order for everything, as before (the benchmark's baseline).",
    )
    refine: bool = Field(
        True,
        description="After a key frame the deadline policy sent coarser, send the same frame "
        "at its finest coding in parts that each fit the deadline budget, each once the cloud "
        "acknowledged the message it copies from, until a newer key frame comes (which "
        "withdraws the part still waiting to be sent; `transport.refine`); the cloud reads it "
        "again. On the 200 kbit/s dense document it brings the cloud's read within a point of "
        "the local one ~3 s after each key frame, every message in time (docs/edge-cloud.md).",
    )
    refine_noisy_text_px: int = Field(
        26,
        ge=0,
        le=256,
        description="`noisy_text_px` of a refinement's parts (clean frames: `text_px`). On "
        "filmed dense documents (20 px type) the smallest line 26 px tall at 2 grey levels "
        "read 0.6 points from the original frames in fewer bytes than the noisy coding "
        "(20 px, 4 levels: 1.6 points; docs/edge-cloud.md).",
    )
    refine_noisy_grey_levels: int = Field(
        2, ge=2, le=16, description="`noisy_grey_levels` of a refinement's parts."
    )
    edge_read: bool = Field(
        True,
        description="Deadline policy only: when a key frame's pixels at their finest coding "
        "do not fit what the link carries by the deadline, the edge may read the text itself "
        "(its recognizer on the boxes its detector found) and send the lines instead "
        "(`transport.textlines`), if its measured recognizer cost and CPU headroom let the "
        "lines arrive in time (`policy.EdgeReadPolicy`); else the pixels go coarser as before. "
        "Never on a link that carries the pixels. docs/edge-cloud.md.",
    )
    edge_read_max_busy: float = Field(
        0.8,
        gt=0.0,
        le=1.0,
        description="The edge reads text only while its measured busy share (blocking work "
        "over the last 10 s, the read included) stays under this.",
    )
    min_keep: float = Field(
        0.05, gt=0.0, le=1.0, description="The deadline policy never keeps less than this."
    )
    send_rate_bps: float = Field(
        20e6, gt=0.0, description="Pacing rate of the sender before any bandwidth is measured."
    )
    initial_rto_s: float = Field(
        1.0, gt=0.0, le=10.0, description="RTO before the first RTT sample (RFC 6298: 1 s)."
    )
    min_rto_s: float = Field(
        0.05,
        gt=0.0,
        le=5.0,
        description="RTO floor (RFC 6298 says 1 s for TCP; a deadline of ~1 s needs less).",
    )
    link: Literal["auto", "udp", "tcp"] = Field(
        "auto",
        description="auto: UDP, and TCP to the same port when the cloud does not answer over "
        "UDP within `udp_timeout_s` (a network that blocks UDP); udp / tcp: only that.",
    )
    udp_timeout_s: float = Field(
        3.0, gt=0.0, le=60.0, description="How long the edge waits for the cloud over UDP."
    )
    link_report_s: float = Field(
        5.0,
        gt=0.0,
        le=3600.0,
        description="Each end reports the link's state (a `link` event) every this many "
        "seconds of media; the edge's reports travel in-band to the cloud's sinks.",
    )
    nack_delay_s: float = Field(
        0.03, ge=0.0, le=1.0, description="Reordering allowance before a gap is NACKed."
    )


__all__ = ["KeyPolicyKind", "TransportConfig"]
