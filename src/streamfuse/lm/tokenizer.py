"""Text <-> token ids for the runtime, backed by a `tokenizers` JSON file (fast, offline).

A GGUF file carries its vocabulary and scores; `Tokenizer.export_from_gguf` turns them into a
tokenizer.json once (through transformers' GGUF converter, the same path Hugging Face uses) and
the runtime loads that file afterwards. `TextStream` turns generated ids into text increments
without splitting multi-byte characters, decoding each token a bounded number of times.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from streamfuse.errors import ModelError


class Tokenizer:
    """Encode/decode with the model's special tokens resolved by name (<bos>, <eos>, ...)."""

    def __init__(self, backend: object) -> None:
        from tokenizers import Tokenizer as _Backend

        if not isinstance(backend, _Backend):
            raise ModelError(f"expected a tokenizers.Tokenizer, got {type(backend).__name__}")
        self._tok = backend
        self.bos_id = self._special("<bos>")
        self.eos_id = self._special("<eos>")
        self.pad_id = self._special("<pad>")
        end_of_turn = self._special("<end_of_turn>")
        self.stop_ids: tuple[int, ...] = tuple(
            i for i in (self.eos_id, end_of_turn) if i is not None
        )
        # Encode without the template's automatic <bos>: callers decide (add_bos=...).
        self._tok.no_truncation()

    def _special(self, text: str) -> int | None:
        tid = self._tok.token_to_id(text)
        return int(tid) if tid is not None else None

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        from tokenizers import Tokenizer as _Backend

        try:
            return cls(_Backend.from_file(str(path)))
        except Exception as e:
            raise ModelError(f"cannot load tokenizer {path}: {e}") from e

    @staticmethod
    def export_from_gguf(gguf_path: Path, out_path: Path) -> None:
        """Write tokenizer.json built from the GGUF vocabulary (slow, ~20 s; done once)."""
        try:
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
            hf.backend_tokenizer.save(str(out_path))
        except Exception as e:
            raise ModelError(f"cannot build a tokenizer from {gguf_path}: {e}") from e

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids = list(self._tok.encode(text, add_special_tokens=False).ids)
        if add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special))


class TextCodec(Protocol):
    """What text streaming needs from a tokenizer (`Tokenizer` or a test double)."""

    bos_id: int | None
    stop_ids: tuple[int, ...]

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str: ...


class TextStream:
    """Incremental detokenizer: `push(ids)` returns the text that became final with them.

    Decodes only a small window (vLLM's and Hugging Face's prefix-offset technique): the tokens
    since the previous final piece (`prefix`) and the new ones. Decoding the window twice, with
    and without the new tokens, and taking the difference keeps what depends on the left
    context right (a decoder dropping a leading space, multi-token characters); a window whose
    text ends in an incomplete UTF-8 character (U+FFFD from byte fallback) waits for more.
    Each token is decoded a bounded number of times, so streaming an answer is linear.
    """

    def __init__(self, tokenizer: TextCodec) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # tokens before this are in the emitted text
        self._text: list[str] = []

    def push(self, ids: list[int] | tuple[int, ...] | int) -> str:
        self._ids.extend([ids] if isinstance(ids, int) else ids)
        before = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return ""  # nothing final yet (an incomplete character, or only special tokens)
        new = text[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        self._text.append(new)
        return new

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._text)

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids) if ids else ""
