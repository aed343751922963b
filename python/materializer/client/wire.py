"""The protobuf wire format, for the two fetch receivers that read
WeightChunk messages themselves instead of through the generated parser
(which would copy each chunk's payload): client.parse_chunk (grpcio's
messages) and direct._Message (bytes straight off the socket). Both parse
TensorDigest entries with tensor_digest() below."""


class WireError(ValueError):
    """Bytes that do not parse as the message they should be."""


def varint(buf, pos):
    """(value, next pos) of the varint at buf[pos], or None when buf ends
    inside it."""
    result = shift = 0
    while pos < len(buf):
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("a varint longer than 10 bytes")
    return None


def fields(buf, message):
    """(field number, wire type, value) of each field of the complete
    serialized `message` (its name, for errors) in buf: value is an int
    for a varint, a slice of buf for a length-delimited field, None for
    the fixed 32- and 64-bit types (skipped)."""
    cut = f"a {message} ended inside a field"
    pos, end = 0, len(buf)
    while pos < end:
        key = varint(buf, pos)
        if key is None:
            raise WireError(cut)
        tag, pos = key
        field, kind = tag >> 3, tag & 7
        if kind == 0:
            v = varint(buf, pos)
            if v is None:
                raise WireError(cut)
            value, pos = v
        elif kind == 2:
            v = varint(buf, pos)
            if v is None or v[1] + v[0] > end:
                raise WireError(cut)
            n, pos = v
            value, pos = buf[pos:pos + n], pos + n
        elif kind in (1, 5):
            pos += 8 if kind == 1 else 4
            if pos > end:
                raise WireError(cut)
            value = None
        else:
            raise WireError(f"{message}: wire type {kind}")
        yield field, kind, value


def tensor_digest(buf):
    """The (name, digest) of a serialized TensorDigest (fields: 1 name,
    2 digest)."""
    name = digest = ""
    for field, kind, value in fields(buf, "TensorDigest"):
        if kind == 2 and field == 1:
            name = bytes(value).decode("utf-8", "replace")
        elif kind == 2 and field == 2:
            digest = bytes(value).decode("ascii", "replace")
    return name, digest
