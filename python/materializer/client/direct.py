"""FetchWeights received straight into the caller's memory.

grpcio hands every received message to Python as a new `bytes` object: the
kernel copies the bytes into gRPC's buffers, gRPC copies them into the
`bytes`, and the loader copies them once more into the module's tensors.
On loopback that path reached about half of a raw TCP stream of the same
bytes (bench/RESULTS.md, "Trainer SDK": grpcio receiving and dropping the
stream). This module speaks that one call itself, on a connection of its
own: HTTP/2 (RFC 9113; TLS with ALPN "h2" when the client uses TLS), gRPC's
length-prefixed messages on top, and the WeightChunk fields read as they
arrive, so that the bytes of each chunk's `data` go from the socket
straight into the memory the caller names (socket.recv_into): one copy, the
kernel's.

The call is the same call: the same FetchRequest, the same identity (the
development-mode metadata, a bearer token, or the client certificate), the
server's status and message on failure as an RpcError. What it does not
do: compression (none is asked for, a compressed message is an error),
more than one call per connection, server push (disabled in SETTINGS).
Header blocks are encoded and decoded with hpack (RFC 7541).

`Unsupported` is raised when the connection cannot be used this way (TLS
without "h2", a peer that is not speaking HTTP/2) before the first data
byte: the caller then uses grpcio.
"""

import os
import socket
import ssl
import struct
import tempfile
import threading
import urllib.parse

import grpc
import hpack

from materializer.client import wire
from materializer.errors import RpcError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113, section 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, \
    SETTINGS_MAX_FRAME_SIZE = 0x1, 0x2, 0x4, 0x5

MAX_WINDOW = (1 << 31) - 1
# Frames this client accepts: the largest HTTP/2 allows, so that a large
# chunk arrives in few frames (fewer headers to read between its bytes).
MAX_FRAME = (1 << 24) - 1
# Header blocks (the server's headers and trailers) are small; a larger one
# is refused rather than buffered.
MAX_HEADER_BLOCK = 1 << 20
# Windows are topped up once this many bytes were consumed.
WINDOW_REFILL = 64 << 20
STREAM_ID = 1
# Receives of at least this many bytes go straight into the caller's
# memory; smaller pieces through the read buffer.
DIRECT_MIN = 64 << 10
READ_BUFFER = 256 << 10
# Data is placed and handed to piece_done in pieces of at most this size,
# so the caller hashes each piece while it is still in the CPU cache.
PIECE = 512 << 10

# HTTP/2 error codes of RST_STREAM / GOAWAY -> gRPC status (gRPC's HTTP/2
# transport document).
_H2_ERRORS = {0x0: grpc.StatusCode.INTERNAL, 0x1: grpc.StatusCode.INTERNAL,
              0x2: grpc.StatusCode.INTERNAL, 0x3: grpc.StatusCode.INTERNAL,
              0x4: grpc.StatusCode.INTERNAL, 0x5: grpc.StatusCode.INTERNAL,
              0x6: grpc.StatusCode.INTERNAL, 0x7: grpc.StatusCode.UNAVAILABLE,
              0x8: grpc.StatusCode.CANCELLED, 0x9: grpc.StatusCode.INTERNAL,
              0xA: grpc.StatusCode.INTERNAL, 0xB: grpc.StatusCode.RESOURCE_EXHAUSTED,
              0xC: grpc.StatusCode.PERMISSION_DENIED, 0xD: grpc.StatusCode.INTERNAL}
_CODES = {c.value[0]: c for c in grpc.StatusCode}

_METHOD = "FetchWeights"


class Unsupported(Exception):
    """This connection cannot carry the call here; use grpcio instead."""


class ProtocolError(Exception):
    """The peer broke HTTP/2 or gRPC framing (a message saying how)."""


def _frame(kind, flags, stream, payload=b""):
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, stream) + payload


def _tls_context(tls):
    """The TLS settings grpcio gets from the same TLS object: the server's
    certificate checked against `root_certificates` only when given (not
    also the system's roots), else the system's; the name checked; the
    client certificate for mTLS."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)   # CERT_REQUIRED, check_hostname
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    if tls.root_certificates:
        ctx.load_verify_locations(cadata=tls.root_certificates.decode("ascii"))
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if tls.certificate_chain:
        _load_cert_chain(ctx, tls.certificate_chain, tls.private_key)
    return ctx


def _load_cert_chain(ctx, chain, key):
    """ssl loads a certificate only from a file: write the PEM to one that
    only this process can open (a memfd on Linux, else a 0600 temporary
    file removed at once)."""
    pem = chain + b"\n" + key
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("materializer-client-cert", os.MFD_CLOEXEC)
        try:
            os.write(fd, pem)
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "client.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        ctx.load_cert_chain(path)


def _split_address(address):
    """'host:port' or '[v6]:port' -> (host, port)."""
    try:
        parsed = urllib.parse.urlsplit("//" + address)
        host, port = parsed.hostname, parsed.port
    except ValueError:
        host = port = None
    if host is None or port is None:
        raise Unsupported(f"address {address!r} is not host:port")
    return host, port


class DirectFetch:
    """One FetchWeights call received into caller-named memory.

    address: "host:port" of the server; request: the serialized
    FetchRequest; metadata: (key, value) pairs sent with it; tls: a TLS or
    None; tls_name: the name to check the certificate against when it is
    not the address's host; token: a bearer token (TLS only).
    idle_timeout: seconds without a byte from the server before the call
    fails with DEADLINE_EXCEEDED (the server sends a chunk at least every
    few seconds while it streams; this only catches a silent peer).

    run(place, piece_done, message_done) receives the stream:
      place(offset, n): writable memoryviews, n bytes together, for file
        bytes [offset, offset + n) (where a chunk's data goes);
      piece_done(views): those bytes arrived (hash them, count them);
      message_done(offset, length, total_bytes, digest, tensor_digests): a
        WeightChunk ended (check it; raise to stop); tensor_digests: its
        (name, digest) pairs, in the order sent (FETCH_DIGEST_TENSORS).
    cancel() from another thread ends run() with CANCELLED.
    """

    def __init__(self, address, request, metadata=(), tls=None, tls_name="", token=None,
                 connect_timeout=20.0, idle_timeout=300.0):
        self.address = address
        self._request = request
        self._metadata = list(metadata)
        self._tls = tls
        self._tls_name = tls_name
        self._token = token
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._sock = None          # guarded by _lock
        self._cancelled = False    # guarded by _lock
        self._buf = bytearray(READ_BUFFER)
        self._view = memoryview(self._buf)
        self._lo = self._hi = 0    # unread bytes: _buf[_lo:_hi]
        self.data_started = False  # a data byte went into caller memory

    # -- public ---------------------------------------------------------------

    def cancel(self):
        with self._lock:
            self._cancelled = True
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def run(self, place, piece_done, message_done):
        try:
            self._connect()
            self._send_request()
            self._receive(place, piece_done, message_done)
        except RpcError:
            raise
        except (ProtocolError, wire.WireError, OSError, hpack.HPACKError) as e:
            with self._lock:
                cancelled = self._cancelled
            if cancelled:
                raise RpcError(_METHOD, grpc.StatusCode.CANCELLED, "cancelled by the client",
                               self.address) from None
            if not self.data_started:
                raise Unsupported(f"{type(e).__name__}: {e}") from e
            code = (grpc.StatusCode.DEADLINE_EXCEEDED if isinstance(e, socket.timeout)
                    else grpc.StatusCode.UNAVAILABLE if isinstance(e, OSError)
                    else grpc.StatusCode.INTERNAL)
            raise RpcError(_METHOD, code, f"the stream broke: {e}", self.address) from None
        finally:
            self._close()

    # -- connection -----------------------------------------------------------

    def _connect(self):
        host, port = _split_address(self.address)
        sock = socket.create_connection((host, port), timeout=self._connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            name = self._tls.server_name or self._tls_name or host
            try:
                sock = _tls_context(self._tls).wrap_socket(sock, server_hostname=name)
            except ssl.SSLError as e:
                sock.close()
                raise Unsupported(f"TLS: {e}") from e
            if sock.selected_alpn_protocol() != "h2":
                sock.close()
                raise Unsupported("the server did not agree to HTTP/2 over TLS")
        sock.settimeout(self._idle_timeout)
        with self._lock:
            self._sock = sock
            if self._cancelled:
                raise RpcError(_METHOD, grpc.StatusCode.CANCELLED, "cancelled by the client",
                               self.address)

    def _close(self):
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _send(self, data):
        self._sock.sendall(data)

    def _send_request(self):
        settings = struct.pack(">HIHIHI", SETTINGS_ENABLE_PUSH, 0,
                               SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW,
                               SETTINGS_MAX_FRAME_SIZE, MAX_FRAME)
        host = self.address
        headers = [(":method", "POST"), (":scheme", "https" if self._tls else "http"),
                   (":path", "/materializer.v1.Materializer/FetchWeights"),
                   (":authority", host), ("content-type", "application/grpc"),
                   ("te", "trailers"), ("user-agent", "materializer-direct-fetch")]
        if self._token is not None:
            headers.append(("authorization", f"Bearer {self._token}"))
        headers += [(k.lower(), v) for k, v in self._metadata]
        block = hpack.Encoder().encode(headers)
        message = struct.pack(">BI", 0, len(self._request)) + self._request
        self._send(PREFACE + _frame(SETTINGS, 0, 0, settings)
                   + _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535))
                   + _frame(HEADERS, END_HEADERS, STREAM_ID, block)
                   + _frame(DATA, END_STREAM, STREAM_ID, message))

    # -- reading --------------------------------------------------------------

    def _fill(self, want):
        """At least `want` unread bytes in the buffer (want <= READ_BUFFER)."""
        if self._hi - self._lo >= want:
            return
        if want > READ_BUFFER:
            raise ProtocolError(f"a read of {want} bytes through the buffer")
        if self._lo:
            n = self._hi - self._lo
            self._buf[:n] = self._buf[self._lo:self._hi]
            self._lo, self._hi = 0, n
        while self._hi - self._lo < want:
            got = self._sock.recv_into(self._view[self._hi:])
            if not got:
                raise ConnectionResetError("the server closed the connection")
            self._hi += got

    def _read(self, n):
        """n bytes (n <= READ_BUFFER) as bytes."""
        self._fill(n)
        out = bytes(self._view[self._lo:self._lo + n])
        self._lo += n
        return out

    def _read_into(self, view):
        """Fills `view` from the buffer, then straight from the socket."""
        n = len(view)
        have = min(n, self._hi - self._lo)
        if have:
            view[:have] = self._view[self._lo:self._lo + have]
            self._lo += have
        pos = have
        while pos < n:
            if n - pos < DIRECT_MIN:
                k = min(n - pos, READ_BUFFER)
                self._fill(k)
                view[pos:pos + k] = self._view[self._lo:self._lo + k]
                self._lo += k
                pos += k
                continue
            got = self._sock.recv_into(view[pos:])
            if not got:
                raise ConnectionResetError("the server closed the connection")
            pos += got

    def _skip(self, n):
        while n:
            k = min(n, READ_BUFFER)
            self._fill(k)
            self._lo += k
            n -= k

    # -- the stream -----------------------------------------------------------

    def _receive(self, place, piece_done, message_done):
        decoder = hpack.Decoder()
        decoder.max_header_list_size = MAX_HEADER_BLOCK
        msg = _Message()
        consumed = 0          # DATA bytes not yet returned as window
        headers_seen = False
        block = None          # header block being assembled (HEADERS + CONTINUATION)
        block_end_stream = False
        while True:
            head = self._read(9)
            length = (head[0] << 16) | (head[1] << 8) | head[2]
            kind, flags = head[3], head[4]
            stream = struct.unpack(">I", head[5:9])[0] & 0x7FFFFFFF
            if length > MAX_FRAME:
                raise ProtocolError(f"a frame of {length} bytes (the limit is {MAX_FRAME})")
            if block is not None and kind != CONTINUATION:
                raise ProtocolError("a header block was interrupted")
            if kind == DATA:
                if stream != STREAM_ID or not headers_seen:
                    raise ProtocolError("DATA on an unexpected stream")
                pad = 0
                body = length
                if flags & PADDED:
                    pad = self._read(1)[0]
                    body -= 1 + pad
                    if body < 0:
                        raise ProtocolError("padding longer than the frame")
                self._data(body, msg, place, piece_done, message_done)
                self._skip(pad)
                consumed += length
                if consumed >= WINDOW_REFILL:
                    inc = struct.pack(">I", consumed)
                    self._send(_frame(WINDOW_UPDATE, 0, 0, inc)
                               + _frame(WINDOW_UPDATE, 0, STREAM_ID, inc))
                    consumed = 0
                if flags & END_STREAM:
                    raise ProtocolError("the stream ended without trailers")
            elif kind in (HEADERS, CONTINUATION):
                if stream != STREAM_ID:
                    raise ProtocolError("headers on an unexpected stream")
                payload = self._read_block(length)
                if kind == HEADERS:
                    if block is not None:
                        raise ProtocolError("a header block was interrupted")
                    payload = _strip_headers_frame(payload, flags)
                    block = bytearray()
                    block_end_stream = bool(flags & END_STREAM)
                elif block is None:
                    raise ProtocolError("CONTINUATION without HEADERS")
                block += payload
                if len(block) > MAX_HEADER_BLOCK:
                    raise ProtocolError("a header block larger than 1 MiB")
                if flags & END_HEADERS:
                    fields = dict((k.decode() if isinstance(k, bytes) else k,
                                   v.decode() if isinstance(v, bytes) else v)
                                  for k, v in decoder.decode(bytes(block)))
                    block = None
                    if not headers_seen:
                        headers_seen = True
                        status = fields.get(":status")
                        if status != "200":
                            raise self._http_error(status, fields)
                    if block_end_stream:
                        self._finish(fields, msg)
                        return
            elif kind == SETTINGS:
                if length % 6 or stream:
                    raise ProtocolError("a malformed SETTINGS frame")
                self._skip(length)    # nothing in them changes what this client sends
                if not flags & ACK:
                    self._send(_frame(SETTINGS, ACK, 0))
            elif kind == PING:
                if length != 8:
                    raise ProtocolError("a PING frame not of 8 bytes")
                opaque = self._read(8)
                if not flags & ACK:
                    self._send(_frame(PING, ACK, 0, opaque))
            elif kind == RST_STREAM:
                if length != 4:
                    raise ProtocolError("an RST_STREAM frame not of 4 bytes")
                raw = self._read(4)
                if stream == STREAM_ID:
                    code = struct.unpack(">I", raw)[0]
                    raise RpcError(_METHOD, _H2_ERRORS.get(code, grpc.StatusCode.INTERNAL),
                                   f"the server reset the stream (HTTP/2 error {code})",
                                   self.address)
            elif kind == GOAWAY:
                raw = self._read(min(length, READ_BUFFER))
                self._skip(length - len(raw))
                last = struct.unpack(">I", raw[:4])[0] & 0x7FFFFFFF if len(raw) >= 8 else 0
                code = struct.unpack(">I", raw[4:8])[0] if len(raw) >= 8 else 0
                if last < STREAM_ID or code != 0:
                    raise RpcError(_METHOD, grpc.StatusCode.UNAVAILABLE,
                                   f"the server is going away (HTTP/2 error {code})",
                                   self.address)
            elif kind == PUSH_PROMISE:
                raise ProtocolError("a PUSH_PROMISE although push is disabled")
            else:   # PRIORITY, WINDOW_UPDATE and unknown types: nothing to do
                self._skip(length)

    def _read_block(self, n):
        if n > MAX_HEADER_BLOCK:
            raise ProtocolError("a header frame larger than 1 MiB")
        out = bytearray()
        while n:
            k = min(n, READ_BUFFER)
            out += self._read(k)
            n -= k
        return bytes(out)

    def _data(self, n, msg, place, piece_done, message_done):
        """Consumes n bytes of the gRPC message stream."""
        while n:
            if msg.data_left:
                k = min(n, msg.data_left, PIECE)
                views = place(msg.pos, k)
                for v in views:
                    self._read_into(v)
                self.data_started = True
                piece_done(views)
                msg.pos += k
                msg.data_left -= k
                msg.left -= k
                n -= k
            elif msg.left is None:               # the 5-byte message prefix
                k = min(n, 5 - len(msg.prefix))
                msg.prefix += self._read(k)
                n -= k
                if len(msg.prefix) == 5:
                    if msg.prefix[0] != 0:
                        raise ProtocolError("a compressed message (none was asked for)")
                    msg.left = struct.unpack(">I", msg.prefix[1:])[0]
            else:
                # The WeightChunk's other fields (a few bytes before `data`,
                # some dozens after, the tensor digests at the end), read
                # from the buffer no further than the field being parsed
                # goes, so that no byte of `data` is taken for a field.
                k = min(n, msg.left, msg.need)
                msg.fields += self._read(k)
                n -= k
                msg.left -= k
                msg.parse()
            if msg.left == 0 and not msg.data_left:
                if msg.fields:
                    raise ProtocolError("a WeightChunk ended inside a field")
                message_done(msg.offset, msg.length, msg.total, msg.digest,
                             msg.tensor_digests)
                msg.reset()

    def _finish(self, fields, msg):
        if msg.left is not None or msg.prefix:
            raise ProtocolError("the stream ended inside a message")
        code = fields.get("grpc-status")
        if code is None:
            raise ProtocolError("trailers without grpc-status")
        status = _CODES.get(int(code), grpc.StatusCode.UNKNOWN)
        if status != grpc.StatusCode.OK:
            detail = urllib.parse.unquote(fields.get("grpc-message", ""))
            raise RpcError(_METHOD, status, detail, self.address)

    def _http_error(self, status, fields):
        if "grpc-status" in fields:   # trailers-only response carries the status
            code = _CODES.get(int(fields["grpc-status"]), grpc.StatusCode.UNKNOWN)
            return RpcError(_METHOD, code,
                            urllib.parse.unquote(fields.get("grpc-message", "")), self.address)
        return ProtocolError(f"HTTP status {status}")


def _strip_headers_frame(payload, flags):
    pos, end = 0, len(payload)
    if flags & PADDED:
        if not payload:
            raise ProtocolError("a padded HEADERS frame without its pad length")
        end -= payload[0]
        pos = 1
    if flags & PRIORITY_FLAG:
        pos += 5
    if pos > end:
        raise ProtocolError("HEADERS padding longer than the frame")
    return payload[pos:end]


class _Message:
    """One WeightChunk being received. Its small fields are parsed as they
    come; once the header of its `data` field is parsed, the data bytes go
    to caller memory (pos, data_left) instead of a buffer. Proto field
    numbers: 1 offset, 2 data, 3 total_bytes, 4 digest, 5 tensor_digests
    (each entry a field of its own: a TensorDigest, 1 name, 2 digest)."""

    # A field other than `data` this large is not a WeightChunk of ours.
    MAX_FIELD = 64 << 10

    def __init__(self):
        self.reset()

    def reset(self):
        self.prefix = b""       # the 5-byte gRPC message prefix, as it comes
        self.left = None        # message bytes not yet consumed
        self.fields = bytearray()
        self.offset = self.total = self.length = 0
        self.digest = ""
        self.tensor_digests = []
        self.need = 1           # bytes that would complete the field in `fields`
        self.data_seen = False
        self.data_left = 0
        self.pos = 0

    def parse(self):
        """Consumes the complete fields at the start of `fields`; stops at an
        incomplete one (setting `need`), or after the data field's header."""
        buf = self.fields
        if len(buf) > self.MAX_FIELD:
            raise ProtocolError("a WeightChunk field larger than 64 KiB")
        self.need = 1
        while buf:
            key = wire.varint(buf, 0)
            if key is None:
                return
            tag, p = key
            field, kind = tag >> 3, tag & 7
            if kind == 0:
                v = wire.varint(buf, p)
                if v is None:
                    return
                value, p = v
                if field == 1:
                    if self.data_seen:
                        raise ProtocolError("a chunk's offset came after its data")
                    self.offset = value
                elif field == 3:
                    self.total = value
            elif kind == 2:
                v = wire.varint(buf, p)
                if v is None:
                    return
                n, p = v
                if field == 2:
                    if self.data_seen:
                        raise ProtocolError("a WeightChunk with two data fields")
                    if n > self.left:
                        raise ProtocolError("a data field longer than its message")
                    self.data_seen = True
                    self.length = self.data_left = n
                    self.pos = self.offset
                    del buf[:p]
                    return
                if n > self.MAX_FIELD:
                    raise ProtocolError("a WeightChunk field larger than 64 KiB")
                if len(buf) - p < n:
                    self.need = p + n - len(buf)
                    return
                if field == 4:
                    self.digest = bytes(buf[p:p + n]).decode("ascii", "replace")
                elif field == 5:
                    self.tensor_digests.append(wire.tensor_digest(buf[p:p + n]))
                p += n
            elif kind == 1:
                if len(buf) - p < 8:
                    self.need = p + 8 - len(buf)
                    return
                p += 8
            elif kind == 5:
                if len(buf) - p < 4:
                    self.need = p + 4 - len(buf)
                    return
                p += 4
            else:
                raise ProtocolError(f"WeightChunk: wire type {kind}")
            del buf[:p]


