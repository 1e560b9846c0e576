"""The model pool: a model is made once per key and shared by every job asking for that key."""

from __future__ import annotations

import pytest

from streamfuse.model_pool import ModelPool

pytestmark = pytest.mark.unit


def test_a_key_is_loaded_once_and_other_keys_apart() -> None:
    pool = ModelPool()
    made: list[str] = []

    def make(name: str) -> object:
        made.append(name)
        return object()

    a = pool.get(("asr", 0, "tiny.en"), lambda: make("a"))
    assert pool.get(("asr", 0, "tiny.en"), lambda: make("again")) is a
    b = pool.get(("asr", 1, "tiny.en"), lambda: make("b"))  # another stream slot
    assert b is not a
    assert made == ["a", "b"] and pool.loads == 2 and len(pool) == 2
