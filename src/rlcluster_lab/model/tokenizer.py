"""Byte-level tokenizer: nothing to download, identical on every machine. Ids 0..255 are UTF-8
bytes, 256..258 pad, begin and end; the vocabulary is rounded up to 264 so it divides over 8, 4
or 2 devices."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np

PAD_ID = 256
BOS_ID = 257
EOS_ID = 258
VOCAB_SIZE = 264


class ByteTokenizer:
    """Maps text to UTF-8 byte ids and back."""

    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    vocab_size: int = VOCAB_SIZE

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Byte ids of ``text``, with BOS in front unless ``add_bos`` is False."""
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to the first EOS; special ids are dropped."""
        kept = itertools.takewhile(lambda i: i != self.eos_id, map(int, ids))
        return bytes(i for i in kept if 0 <= i < 256).decode("utf-8", errors="replace")

    def encode_batch_left_padded(
        self, texts: Sequence[str], length: int | None = None, add_bos: bool = True
    ) -> np.ndarray:
        """(len(texts), length) int32 ids, left-padded with ``pad_id`` (default: the longest text)."""
        encoded = [self.encode(t, add_bos=add_bos) for t in texts]
        longest = max((len(e) for e in encoded), default=0)
        if length is None:
            length = longest
        elif longest > length:
            idx = next(i for i, e in enumerate(encoded) if len(e) > length)
            raise ValueError(f"text {idx} encodes to {len(encoded[idx])} tokens, more than length={length}")
        out = np.full((len(texts), length), self.pad_id, dtype=np.int32)
        for row, ids in enumerate(encoded):
            out[row, length - len(ids) :] = ids
        return out
