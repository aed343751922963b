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


def skip(buf, pos, wire):
    """The position after a field of wire type `wire` (not 2) whose value
    starts at buf[pos], or None when buf ends inside it."""
    if wire == 0:
        v = varint(buf, pos)
        return None if v is None else v[1]
    width = {1: 8, 5: 4}.get(wire)
    if width is None:
        raise WireError(f"wire type {wire}")
    return pos + width if pos + width <= len(buf) else None


def tensor_digest(buf):
    """The (name, digest) of a serialized TensorDigest (fields: 1 name,
    2 digest)."""
    name = digest = ""
    p = 0
    while p < len(buf):
        key = varint(buf, p)
        if key is None:
            raise WireError("a TensorDigest ended inside a field")
        tag, p = key
        field, wire = tag >> 3, tag & 7
        if wire == 2:
            v = varint(buf, p)
            if v is None or v[1] + v[0] > len(buf):
                raise WireError("a TensorDigest ended inside a field")
            n, p = v
            if field == 1:
                name = bytes(buf[p:p + n]).decode("utf-8", "replace")
            elif field == 2:
                digest = bytes(buf[p:p + n]).decode("ascii", "replace")
            p += n
        else:
            try:
                p = skip(buf, p, wire)
            except WireError as e:
                raise WireError(f"TensorDigest: {e}") from None
            if p is None:
                raise WireError("a TensorDigest ended inside a field")
    return name, digest
