"""The per-tensor digests a stream ends with (FETCH_DIGEST_TENSORS), as
both receivers read them: the grpcio path's chunk parser and the direct
receiver, entries split across frames and messages."""

import pytest

from materializer import digest
from materializer._proto import pb
from materializer.client.client import Chunk, parse_chunk
from test_sdk_direct import chunk_message, digests_message, fake_server, http2, receive


def _framed(msg):
    """A serialized message with gRPC's 5-byte prefix."""
    return b"\x00" + len(msg).to_bytes(4, "big") + msg


# -- parsing ------------------------------------------------------------------

def test_parse_chunk_reads_tensor_digests():
    raw = pb.WeightChunk(offset=9, total_bytes=9, tensor_digests=[
        pb.TensorDigest(name="h.0.w", digest="xxh3-128:" + "0" * 32),
        pb.TensorDigest(name="h.1.w", digest="xxh3-128:" + "1" * 32)]).SerializeToString()
    c = parse_chunk(raw)
    assert (c.offset, len(c.data), c.total_bytes, c.digest) == (9, 0, 9, "")
    assert c.tensor_digests == [("h.0.w", "xxh3-128:" + "0" * 32),
                                ("h.1.w", "xxh3-128:" + "1" * 32)]
    data = parse_chunk(pb.WeightChunk(offset=0, data=b"abc", total_bytes=9).SerializeToString())
    assert bytes(data.data) == b"abc" and data.tensor_digests == []
    # Built by hand, the old way: no digests.
    assert Chunk(0, b"", 0, "").tensor_digests == ()
    # An entry whose name runs past the entry.
    with pytest.raises(ValueError, match="TensorDigest"):
        parse_chunk(b"\x2a\x04\x0a\x05ab")


def test_direct_receiver_reads_digest_entries_split_across_frames():
    pairs = [(f"layers.{i}.weight", digest.of_bytes(bytes([i]))) for i in range(40)]
    m = chunk_message(0, bytes(range(200)), 200) + digests_message(200, pairs)
    # Frames of 7 bytes: cuts fall inside keys, lengths, names and digests.
    addr = fake_server(lambda: http2(*[m[i:i + 7] for i in range(0, len(m), 7)]))
    got = receive(addr, bytearray(200))
    assert got == [(0, 200, 200, "", []), (200, 0, 200, "", pairs)]


def test_direct_receiver_reads_digests_over_two_full_chunks():
    # More than 64 KiB of entries: the server sends them in several chunks,
    # each near the limit, split into frames anywhere.
    pairs = [(f"model.layers.{i}.mlp.down_proj.weight", digest.of_bytes(str(i).encode()))
             for i in range(1540)]
    first, second = digests_message(0, pairs[:770]), digests_message(0, pairs[770:])
    assert 60 << 10 < len(first) <= (64 << 10) + 5
    m = first + second
    addr = fake_server(lambda: http2(m[:1000], m[1000:70000], m[70000:]))
    assert receive(addr, bytearray(0)) == [(0, 0, 0, "", pairs[:770]),
                                           (0, 0, 0, "", pairs[770:])]


def test_fields_before_the_data_take_none_of_its_bytes():
    # Fields in any order are valid protobuf: a peer may send the digests
    # first. The data after them still lands whole in the destination.
    pairs = [("w", digest.of_bytes(b"w" * 100))]
    msg = (pb.WeightChunk(digest="xxh3-128:" + "f" * 32).SerializeToString()
           + pb.WeightChunk(tensor_digests=[pb.TensorDigest(name=n, digest=d)
                                            for n, d in pairs]).SerializeToString()
           + pb.WeightChunk(offset=0, data=b"w" * 100, total_bytes=100).SerializeToString())
    addr = fake_server(lambda: http2(_framed(msg)))
    dest = bytearray(100)
    assert receive(addr, dest) == [(0, 100, 100, "xxh3-128:" + "f" * 32, pairs)]
    assert bytes(dest) == b"w" * 100
