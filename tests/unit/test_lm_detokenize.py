"""Incremental detokenization: the streamed pieces add up to the full decode, in linear work."""

from __future__ import annotations

import pytest

from streamfuse.lm.tokenizer import TextStream

pytestmark = pytest.mark.unit


class ByteTokenizer:
    """One token per UTF-8 byte, like a byte-fallback vocabulary; like SentencePiece, the
    decoder drops one leading space. Counts the token ids it is asked to decode."""

    bos_id: int | None = None
    stop_ids: tuple[int, ...] = ()

    def __init__(self) -> None:
        self.decoded = 0

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        self.decoded += len(ids)
        text = bytes(ids).decode("utf-8", errors="replace")
        return text[1:] if text.startswith(" ") else text


TEXT = " Grüße, naïve café: 3 € — 😀 done ok"


def test_streamed_pieces_equal_the_full_decode_across_split_characters() -> None:
    tok = ByteTokenizer()
    ids = tok.encode(TEXT)
    stream = TextStream(tok)
    pieces = [stream.push([i]) for i in ids]
    assert "".join(pieces) == tok.decode(ids) == TEXT[1:]
    assert stream.text == TEXT[1:]
    assert not any("\ufffd" in p for p in pieces)  # a half character is never emitted
    # The 4-byte emoji arrives as one piece, on its last byte; the 3 bytes before give nothing.
    end = len(TEXT[: TEXT.index("😀") + 1].encode("utf-8"))
    assert pieces[end - 4 : end] == ["", "", "", "😀"]


def test_pushing_several_ids_at_once_gives_the_same_text() -> None:
    tok = ByteTokenizer()
    ids = tok.encode(TEXT)
    stream = TextStream(tok)
    pieces = [stream.push(ids[i : i + 3]) for i in range(0, len(ids), 3)]
    assert "".join(pieces) == TEXT[1:]


def test_decode_work_is_linear_in_the_answer_length() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("é ab " * 600)  # 3000 tokens, multi-byte characters among them
    stream = TextStream(tok)
    for i in ids:
        stream.push(i)
    assert stream.text == tok.decode(ids)
    # Each token is decoded a few times (its window, twice), not once per later token
    # (re-decoding the whole answer on every push would cost ~n^2 / 2 = 4.5 M here).
    assert tok.decoded < 8 * len(ids)
