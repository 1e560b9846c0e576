"""Language-model runtime: Gemma 3 in torch over a KV slot pool, continuous batching, sink+window
truncation, LRU eviction of idle sessions, prompt-lookup speculative decoding, versioned
session contexts. Entry points: `load_model`, `LMEngine`, `LMConfig`.
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
