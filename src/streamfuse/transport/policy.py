"""How much of a key frame the edge sends, and how finely, from what it measured of the link.

`ArticleKeepPolicy`: the article's rule, RTT > 200 ms or loss > 5% -> keep 30% of the patch grid,
else 70%. `DeadlineKeepPolicy` (the default): the bytes the measured bottleneck bandwidth
delivers within the deadline, after the bytes already queued ahead and the repair round trips
as likely as the loss makes them; a frame over that budget is first sent coarser (smaller),
then cut to its most important patches. `FixedKeepPolicy`: a constant ratio. Every policy
answers `fit(link, encode)` with the message to send; `encode(keep_ratio, scale_factor)` codes
the key frame. `EdgeReadPolicy` decides, per key frame, whether the edge reads the text itself
and sends lines instead of pixels (the split moved past the recognizer; `transport.textlines`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from streamfuse.qos.busy import BusyWindow
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.patches import PatchMessage
from streamfuse.transport.udp import LinkEstimate
from streamfuse.transport.wire import OVERHEAD

#: A coding step: (scale factor, grey levels of a noisy frame). The frame is sent `factor`
#: times smaller than its configured coding (`text_px`, or `noisy_text_px` for a camera's
#: noisy frame); `levels` None: a noisy frame drops to the clean frames' coding
#: (`text_px` x factor, `grey_levels`), as the policy did before its ladder was measured.
Step = tuple[float, int | None]
#: The configured coding (`encode_patches` with no coarser step).
FINEST: Step = (1.0, None)
#: `encode(keep_ratio, step)`: the key frame's patch message at that coding step.
Encoder = Callable[[float, Step], PatchMessage]
#: The deadline policy's first steps: 0.8 x and 0.65 x the clean frames' text size at 2 grey
#: levels for every frame (a noisy one too).
LEGACY_LADDER: tuple[Step, ...] = ((0.8, None), (0.65, None))
#: The deadline policy's coarser steps, finest first: `LEGACY_LADDER`, now measured
#: (benchmarks/cap_coding.py, two filmed dense documents): per byte, 2 grey levels at a larger
#: scale read better than 3 or 4 at a smaller one (26 px x 2 levels 1.0% CER in 32-42 KB,
#: 18 px x 4 levels 3.8% in 34-50 KB), so the steps stay at 2 levels (docs/edge-cloud.md).
LADDER: tuple[Step, ...] = LEGACY_LADDER


class KeepPolicy(ABC):
    name = ""

    @abstractmethod
    def keep(self, link: LinkEstimate, full_bytes: int, full_keep: float) -> float:
        """The share of the patch grid to keep, in (0, 1]."""

    def fit(self, link: LinkEstimate, encode: Encoder) -> PatchMessage:
        """The message to send: every text patch, cut to `keep` of the grid."""
        full = encode(1.0, FINEST)
        keep = self.keep(link, len(full.payload), full.keep_ratio)
        return full if keep >= full.keep_ratio else encode(keep, FINEST)


class FixedKeepPolicy(KeepPolicy):
    name = "fixed"

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio

    def keep(self, link: LinkEstimate, full_bytes: int, full_keep: float) -> float:
        return self.ratio


class ArticleKeepPolicy(KeepPolicy):
    """RTT > 200 ms or loss > 5% -> 30%, else 70% (the design article's rule)."""

    name = "article"

    def keep(self, link: LinkEstimate, full_bytes: int, full_keep: float) -> float:
        bad = (link.srtt_s is not None and link.srtt_s > 0.2) or link.loss > 0.05
        return 0.3 if bad else 0.7


class DeadlineKeepPolicy(KeepPolicy):
    """Send what arrives by the deadline: budget = bandwidth x (deadline - repair round trips
    - the time the bytes already queued ahead take), the expected loss's retransmissions paid
    from it, and `1 - headroom` of it held back for speech and estimation error.

    Over budget, the frame is first sent coarser (the first step of `ladder` that fits:
    smaller, fewer grey levels), and only then cut to its most important patches at the
    coarsest step (lost text is lost for good)."""

    name = "deadline"

    def __init__(
        self,
        deadline_s: float,
        min_keep: float,
        headroom: float = 0.7,
        *,
        ladder: tuple[Step, ...] = LADDER,
        fragment_bytes: int = 1_200 - OVERHEAD,
    ) -> None:
        self.deadline_s = deadline_s
        self.min_keep = min_keep
        self.headroom = headroom
        self.ladder = ladder
        self.fragment_bytes = fragment_bytes

    def budget_bytes(self, link: LinkEstimate) -> float | None:
        """Bytes this message may take (None: nothing measured yet, no limit)."""
        if link.bandwidth_bps is None:
            return None
        rtt = link.srtt_s or 0.0
        # One trip to deliver, on the path's own delay (the smallest recent RTT: the queue
        # our messages build is `queued_bytes`, counted next, and the smoothed RTT would count
        # it again, long after it drained).
        path = rtt if link.min_rtt_s is None else min(rtt, link.min_rtt_s)
        queued_s = 8.0 * link.queued_bytes / link.bandwidth_bps
        keep = self.headroom * link.bandwidth_bps / 8.0 * (1.0 - min(0.9, link.loss))
        # A repair (the receiver's NACK, the resend) takes about two trips on the path, and is
        # needed as often as a message this size loses a fragment: the allowance is that
        # chance x two trips, not two trips whenever any loss was seen (one tail drop in the
        # loss window cost every later frame ~0.2 s, a third of it where the smoothed RTT
        # held our own queue).
        time_s = max(0.0, self.deadline_s - path - queued_s)
        fragments = math.ceil(keep * time_s / self.fragment_bytes)
        repair = (1.0 - (1.0 - min(0.9, link.loss)) ** fragments) * 2.0 * path
        return keep * max(0.0, time_s - repair)

    def keep(self, link: LinkEstimate, full_bytes: int, full_keep: float) -> float:
        budget = self.budget_bytes(link)
        if budget is None or full_bytes <= 0:
            return full_keep  # nothing measured yet: send everything that matters
        share = min(1.0, budget / full_bytes)
        return max(self.min_keep, min(full_keep, full_keep * share))

    def fit(self, link: LinkEstimate, encode: Encoder) -> PatchMessage:
        full = encode(1.0, FINEST)
        budget = self.budget_bytes(link)
        if budget is None or len(full.payload) <= budget:
            return full
        smallest, step = full, FINEST
        for step in self.ladder:
            smallest = encode(1.0, step)
            if len(smallest.payload) <= budget:
                return smallest
        keep = self.keep(link, len(smallest.payload), smallest.keep_ratio)
        return smallest if keep >= smallest.keep_ratio else encode(keep, step)


@dataclass(frozen=True, slots=True)
class SplitDecision:
    """Where one key frame is read: at the edge (`edge_read`) or in the cloud (patches), why,
    and the predictions it was decided on (seconds; None: not measured)."""

    edge_read: bool
    reason: str
    patch_s: float | None = None
    read_s: float | None = None
    text_s: float | None = None
    busy: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            k: (round(v, 4) if isinstance(v, float) else v)
            for k, v in (
                ("edge_read", self.edge_read),
                ("reason", self.reason),
                ("patch_s", self.patch_s),
                ("read_s", self.read_s),
                ("text_s", self.text_s),
                ("busy", self.busy),
            )
        }


class EdgeReadPolicy:
    """Where the split falls for one key frame (Neurosurgeon-style: the cut that finishes
    soonest given the link and the edge's compute, decided per frame from measurements).

    Patches (the cloud reads) unless all of: a bandwidth is measured; the frame's finest
    coding is over the deadline policy's budget (its predicted transfer, `patch_s`, does not
    fit the deadline); the edge's recognizer, at its measured cost per recognizer pixel
    (`observe_read`, an EWMA; the prior is `TextReader.load`'s timed line) on this frame's
    boxes, plus the text message's transfer behind the bytes already queued, fits `headroom`
    of the deadline; and the edge's measured busy share over the last `window_s` (its own
    blocking work: detector, coding, reads; `observe_work`) plus that read stays under
    `max_busy` (it must not fall behind real time). A good link never gets past the second
    test: today's split is unchanged there."""

    def __init__(
        self,
        deadline_s: float,
        *,
        prior_s_per_px: float | None = None,
        headroom: float = 0.7,
        max_busy: float = 0.8,
        window_s: float = 10.0,
        line_bytes: int = 80,
        smoothing: float = 0.5,
    ) -> None:
        self.deadline_s = deadline_s
        self.cost_s_per_px = prior_s_per_px
        self.headroom = headroom
        self.max_busy = max_busy
        self.window_s = window_s
        self.line_bytes = line_bytes
        self.smoothing = smoothing
        self._work = BusyWindow(window_s)  # the edge's blocking work, wall time

    def observe_read(self, width_px: float, seconds: float) -> None:
        """The edge read boxes of `width_px` recognizer pixels in `seconds` (wall)."""
        if width_px <= 0 or seconds <= 0:
            return
        sample = seconds / width_px
        a = self.smoothing
        prev = self.cost_s_per_px
        self.cost_s_per_px = sample if prev is None else (1 - a) * prev + a * sample

    def observe_work(self, seconds: float, now: float) -> None:
        """The edge spent `seconds` (wall) of blocking work, ending at `now`."""
        self._work.add(now, seconds)

    def busy_share(self, now: float) -> float:
        """Share of the last `window_s` the edge spent on its blocking work."""
        return min(1.0, self._work.busy_s(now) / self.window_s)

    def decide(
        self,
        link: LinkEstimate,
        budget_bytes: float | None,
        full_bytes: int,
        width_px: float,
        n_lines: int,
        now: float,
    ) -> SplitDecision:
        if budget_bytes is None or link.bandwidth_bps is None:
            return SplitDecision(False, "no bandwidth measured")
        bytes_per_s = link.bandwidth_bps / 8.0
        patch_s = full_bytes / bytes_per_s
        if full_bytes <= budget_bytes:
            return SplitDecision(False, "pixels fit", patch_s=patch_s)
        if self.cost_s_per_px is None:
            return SplitDecision(False, "read cost not measured", patch_s=patch_s)
        read_s = self.cost_s_per_px * width_px
        rtt = link.srtt_s or 0.0
        path = rtt if link.min_rtt_s is None else min(rtt, link.min_rtt_s)
        text_s = path + (link.queued_bytes + self.line_bytes * n_lines) / bytes_per_s
        busy = self.busy_share(now)
        common = {"patch_s": patch_s, "read_s": read_s, "text_s": text_s, "busy": busy}
        if read_s + text_s > self.headroom * self.deadline_s:
            return SplitDecision(False, "read too slow", **common)
        if busy + read_s / self.window_s > self.max_busy:
            return SplitDecision(False, "edge busy", **common)
        return SplitDecision(True, "edge read", **common)


def make_keep_policy(config: TransportConfig) -> KeepPolicy:
    if config.keep_policy == "article":
        return ArticleKeepPolicy()
    if config.keep_policy == "fixed":
        return FixedKeepPolicy(config.fixed_keep)
    return DeadlineKeepPolicy(
        config.deadline_s, config.min_keep, fragment_bytes=config.mtu_bytes - OVERHEAD
    )


__all__ = [
    "FINEST",
    "LADDER",
    "LEGACY_LADDER",
    "ArticleKeepPolicy",
    "DeadlineKeepPolicy",
    "EdgeReadPolicy",
    "Encoder",
    "FixedKeepPolicy",
    "KeepPolicy",
    "SplitDecision",
    "Step",
    "make_keep_policy",
]
