"""streamfuse: real-time multimodal stream processing within a latency budget.

The public library surface: typed frames, the pipeline runtime and stage base class, sources,
and the configuration objects. See the README for the architecture.
"""

from __future__ import annotations

__version__ = "0.1.0"
