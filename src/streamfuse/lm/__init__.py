"""Language-model runtime: Gemma 3 in torch over a KV slot pool; a scheduler (continuous
batching, chunked prefill, sink+window truncation), a session cache (versions, LRU eviction,
rollback), prompt-lookup speculative decoding, token importance and hierarchical dropping
(lm/dropping.py), incremental detokenization, and the answer stage.
Entry points: `load_model`, `LMEngine`, `LMConfig`.
"""

from __future__ import annotations

from streamfuse.lm.config import LMConfig, ModelConfig, PoolConfig, SchedulerConfig
from streamfuse.lm.engine import LMEngine, Request, RequestHandle
from streamfuse.lm.kv_pool import KVPool, Slot
from streamfuse.lm.loader import load_model
from streamfuse.lm.tokenizer import TextStream, Tokenizer

__all__ = [
    "KVPool",
    "LMConfig",
    "LMEngine",
    "ModelConfig",
    "PoolConfig",
    "Request",
    "RequestHandle",
    "SchedulerConfig",
    "Slot",
    "TextStream",
    "Tokenizer",
    "load_model",
]
