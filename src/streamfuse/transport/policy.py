"""How much of a key frame the edge sends, from what it measured of the link.

`ArticleKeepPolicy`: the article's rule, RTT > 200 ms or loss > 5% -> keep 30% of the patch grid,
else 70%. `DeadlineKeepPolicy` (the default): keep the most-important patches that the measured
bottleneck bandwidth delivers within the deadline, after the round trips that loss repair costs.
`FixedKeepPolicy`: a constant ratio. Every policy answers `keep(estimate, full_bytes, full_keep)`:
the grid share to keep, given the message size and grid share when every text patch is kept.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from streamfuse.transport.config import TransportConfig
from streamfuse.transport.udp import LinkEstimate


class KeepPolicy(ABC):
    name = ""

    @abstractmethod
    def keep(self, link: LinkEstimate, full_bytes: int, full_keep: float) -> float:
        """The share of the patch grid to keep, in (0, 1]."""


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
    """Keep what fits the deadline: budget = bandwidth x (deadline - repair round trips),
    with the expected loss's retransmissions paid from it, and half of it held back for
    speech and estimation error."""

    name = "deadline"

    def __init__(self, deadline_s: float, min_keep: float, headroom: float = 0.5) -> None:
        self.deadline_s = deadline_s
        self.min_keep = min_keep
        self.headroom = headroom

    def keep(self, link: LinkEstimate, full_bytes: int, full_keep: float) -> float:
        if link.bandwidth_bps is None or full_bytes <= 0:
            return full_keep  # nothing measured yet: send everything that matters
        rtt = link.srtt_s or 0.0
        # One round trip to deliver, two more to repair what the loss takes (NACK + resend).
        rounds = 1.0 + (2.0 if link.loss > 0 else 0.0)
        time_s = max(0.0, self.deadline_s - rounds * rtt)
        budget = self.headroom * link.bandwidth_bps / 8.0 * time_s * (1.0 - min(0.9, link.loss))
        share = min(1.0, budget / full_bytes)
        return max(self.min_keep, min(full_keep, full_keep * share))


def make_keep_policy(config: TransportConfig) -> KeepPolicy:
    if config.keep_policy == "article":
        return ArticleKeepPolicy()
    if config.keep_policy == "fixed":
        return FixedKeepPolicy(config.fixed_keep)
    return DeadlineKeepPolicy(config.deadline_s, config.min_keep)


__all__ = [
    "ArticleKeepPolicy",
    "DeadlineKeepPolicy",
    "FixedKeepPolicy",
    "KeepPolicy",
    "make_keep_policy",
]
