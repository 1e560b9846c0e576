"""The KV-cache slot pool (F7): fixed slots, preallocated once, acquire / release.

Per layer, keys and values live in one tensor of shape (slots, kv_heads, max_tokens, head_dim)
allocated at construction; a sequence owns a `Slot` and its cached length. Decoding writes into
these tensors in place and never reallocates them (static shapes, so a GPU graph could replay).
Callers see only opaque `Slot` handles: `acquire() -> Slot | None`, `release(slot)`.
A released slot's handle goes stale (its generation no longer matches) so late writers are caught.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch import Tensor

from streamfuse.errors import CapacityError


@dataclass(frozen=True, slots=True)
class Slot:
    """Handle to one slot. `generation` changes on every acquire, so stale handles are detected."""

    index: int
    generation: int


class KVPool:
    """N slots x max_tokens of K/V for every layer, plus per-slot lengths."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        max_tokens: int,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if min(num_layers, num_slots, num_kv_heads, head_dim, max_tokens) < 1:
            raise CapacityError(
                f"KV pool dimensions must be positive, got layers={num_layers} slots={num_slots} "
                f"kv_heads={num_kv_heads} head_dim={head_dim} max_tokens={max_tokens}"
            )
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.max_tokens = max_tokens
        shape = (num_slots, num_kv_heads, max_tokens, head_dim)
        self.k: list[Tensor] = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.v: list[Tensor] = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self._lengths = [0] * num_slots
        self._generation = [0] * num_slots
        self._owned = [False] * num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._lock = threading.Lock()

    # -- allocation ------------------------------------------------------------------------
    def acquire(self) -> Slot | None:
        """Take a free slot (length 0), or None when every slot is owned."""
        with self._lock:
            if not self._free:
                return None
            index = self._free.pop()
            self._owned[index] = True
            self._generation[index] += 1
            self._lengths[index] = 0
            return Slot(index, self._generation[index])

    def release(self, slot: Slot) -> None:
        """Give a slot back; its contents are dropped at once. Releasing twice is an error."""
        with self._lock:
            self._check(slot)
            self._owned[slot.index] = False
            self._generation[slot.index] += 1
            self._lengths[slot.index] = 0
            self._free.append(slot.index)

    def is_live(self, slot: Slot) -> bool:
        """True while `slot` is still owned by whoever acquired it."""
        return self._owned[slot.index] and self._generation[slot.index] == slot.generation

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def used_tokens(self) -> int:
        """Cached tokens held by owned slots (the occupancy gauge reads it)."""
        with self._lock:
            return sum(n for n, owned in zip(self._lengths, self._owned, strict=True) if owned)

    # -- per-slot lengths ------------------------------------------------------------------
    def length(self, slot: Slot) -> int:
        self._check(slot)
        return self._lengths[slot.index]

    def set_length(self, slot: Slot, length: int) -> None:
        """Set the number of valid cached tokens (a rollback is just a shorter length)."""
        self._check(slot)
        if not 0 <= length <= self.max_tokens:
            raise CapacityError(f"slot length {length} outside [0, {self.max_tokens}]")
        self._lengths[slot.index] = length

    # -- memory ----------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def storage_pointers(self) -> list[int]:
        """Data pointers of every K/V tensor (tests check they never change)."""
        return [t.data_ptr() for t in self.k + self.v]

    def _check(self, slot: Slot) -> None:
        if not (0 <= slot.index < self.num_slots) or not self.is_live(slot):
            raise CapacityError(f"stale or foreign KV slot handle {slot}")
