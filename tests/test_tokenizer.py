"""Byte tokenizer: round trips, specials and left padding."""

import numpy as np
import pytest

from rlcluster_lab.model.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer


def test_special_ids_and_vocab():
    tok = ByteTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (256, 257, 258, 264)
    assert (PAD_ID, BOS_ID, EOS_ID, VOCAB_SIZE) == (256, 257, 258, 264)
    assert tok.vocab_size % 8 == 0


def test_round_trip_unicode():
    tok = ByteTokenizer()
    text = "héllo, wörld ✓"
    ids = tok.encode(text)
    assert ids[0] == BOS_ID
    assert tok.decode(ids) == text


def test_encode_without_bos():
    assert ByteTokenizer().encode("ab", add_bos=False) == [97, 98]


def test_decode_stops_at_eos_and_skips_specials():
    tok = ByteTokenizer()
    ids = [PAD_ID, BOS_ID, 104, 105, EOS_ID, 106, 107]
    assert tok.decode(ids) == "hi"


def test_decode_invalid_utf8_is_replaced():
    assert ByteTokenizer().decode([0xFF, 97]) == "\ufffda"


def test_left_padding():
    tok = ByteTokenizer()
    batch = tok.encode_batch_left_padded(["ab", "abcd"])
    assert batch.dtype == np.int32
    assert batch.shape == (2, 5)
    assert batch[0].tolist() == [PAD_ID, PAD_ID, BOS_ID, 97, 98]
    assert batch[1].tolist() == [BOS_ID, 97, 98, 99, 100]


def test_left_padding_explicit_length():
    batch = ByteTokenizer().encode_batch_left_padded(["a"], length=4)
    assert batch.tolist() == [[PAD_ID, PAD_ID, BOS_ID, 97]]


def test_left_padding_too_long_raises():
    with pytest.raises(ValueError, match="length=3"):
        ByteTokenizer().encode_batch_left_padded(["abcdef"], length=3)
