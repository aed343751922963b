"""Connections: one gRPC channel per target, with identity and keepalive.

A `Connection` holds the credentials and options and opens a channel per
address on first use: the client's one server, or each replica of a set
(replicas.py), all with the same identity.
"""

import os
import threading
import time

import grpc

# Client keepalive: the server accepts pings every 5 s and drops a
# connection that does not answer within 10 s; pinging an idle Attach
# stream every 10 s keeps a dead server from holding a trainer forever.
KEEPALIVE_MS = 10_000
# Describe of a model with very many tensors can exceed gRPC's default
# 4 MiB; fetch chunks are below 4 MiB by contract.
MAX_RECEIVE_BYTES = 256 << 20
CLIENT_KEY = "x-materializer-client"
# Reconnect backoff: gRPC's default starts at 1 s and grows 1.6 times per
# attempt, so a server that comes up a moment after a refused attempt could
# be found only after the connect timeout (3 s); attempts at most a second
# apart find it within about a second.
RECONNECT_BACKOFF_MS = (200, 1_000)


def _read(value):
    """bytes as given; a str is a file path."""
    if value is None or isinstance(value, (bytes, bytearray)):
        return value
    with open(os.fspath(value), "rb") as f:
        return f.read()


def _path(value):
    """The file path an argument of TLS names, or "" for PEM bytes."""
    if value is None or isinstance(value, (bytes, bytearray)):
        return ""
    return os.fspath(value)


class TLS:
    """TLS (and mTLS) settings. Each argument is PEM bytes or a file path.

    root_certificates: the CA that signed the server's certificate (None:
      the system roots). certificate_chain + private_key: the client's
      certificate for mTLS (its identity is the certificate's first SAN, else
      its CN). server_name: the name to check the server's certificate
      against when it differs from the address's host.
    """

    def __init__(self, root_certificates=None, certificate_chain=None,
                 private_key=None, server_name=None):
        if (certificate_chain is None) != (private_key is None):
            raise ValueError("TLS: certificate_chain and private_key go together")
        self.root_certificates = _read(root_certificates)
        self.certificate_chain = _read(certificate_chain)
        self.private_key = _read(private_key)
        self.server_name = server_name
        # The files, for messages ("" when given as bytes or not given).
        self.root_certificates_file = _path(root_certificates)
        self.certificate_chain_file = _path(certificate_chain)

    def credentials(self):
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain)


class Connection:
    """Channels to materializerd targets with one identity.

    Identity: mTLS (tls with a client certificate), a bearer token (needs
    tls; sent as `authorization: Bearer ...` with every call), or, without
    TLS, the development mode, where `client_name` is sent as the
    x-materializer-client metadata (servers accept it on loopback only).
    Thread-safe.
    """

    def __init__(self, tls=None, token=None, client_name=None, options=(),
                 token_source="token="):
        if token is not None and tls is None:
            raise ValueError(f"the token from {token_source} needs TLS (pass tls=TLS(...), "
                             "or set MATERIALIZER_TLS_CA); the server refuses tokens in "
                             "the clear")
        if token is not None and (not token or any(c <= " " or c > "~" for c in token)):
            # It travels as an HTTP/2 header value; anything else would fail
            # every call with an opaque error.
            raise ValueError(f"the token from {token_source} is empty, or contains a space "
                             "or a character outside printable ASCII; a token is one word")
        if client_name is not None and tls is not None:
            raise ValueError("client_name is the development-mode identity; "
                             "with TLS the identity comes from the certificate "
                             "or the token")
        self.tls = tls
        self.token = token
        self.token_source = token_source if token is not None else ""
        self.client_name = client_name
        self._options = [
            ("grpc.keepalive_time_ms", KEEPALIVE_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
            ("grpc.max_send_message_length", -1),
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
            *options,
        ]
        if tls is not None and tls.server_name:
            self._options.append(("grpc.ssl_target_name_override", tls.server_name))
        self._lock = threading.Lock()
        # (target, tls_name, lane) -> grpc.Channel; guarded by _lock
        self._channels = {}

    def channel(self, target, lane=0, tls_name=""):
        """The channel to `target`. Lanes other than 0 are channels with a
        TCP connection of their own (parallel fetch streams). `tls_name`:
        the name the server's certificate is checked against when `target`
        is an address found by looking that name up (the caller's
        TLS.server_name wins)."""
        key = (target, tls_name, lane)
        with self._lock:
            ch = self._channels.get(key)
            if ch is None:
                ch = self._open(target, lane, tls_name)
                self._channels[key] = ch
            return ch

    def _open(self, target, lane=0, tls_name=""):
        options = list(self._options)
        if lane:
            options.append(("grpc.use_local_subchannel_pool", 1))
        if tls_name and self.tls is not None and not self.tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls_name))
        if self.tls is None:
            return grpc.insecure_channel(target, options=options)
        creds = self.tls.credentials()
        if self.token is not None:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(self.token))
        return grpc.secure_channel(target, creds, options=options)

    def wait_for_connection(self, channel, timeout, failure_seen=False):
        """Waits up to `timeout` seconds for `channel` to connect, or for a
        connection attempt to fail, starting one when it has none. Returns
        READY, TRANSIENT_FAILURE, or None when neither happened in time.
        failure_seen: the channel's current failure was returned already:
        wait for it to connect, or for a later attempt to fail."""
        return _wait_for_connection(channel, timeout, failure_seen)

    def metadata(self, extra=()):
        md = list(extra)
        if self.client_name is not None:
            md.append((CLIENT_KEY, self.client_name))
        return tuple(md)

    def close(self):
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()


# The states of a channel, by the number gRPC's core gives them.
_STATES = {state.value[0]: state for state in grpc.ChannelConnectivity}


def _wait_for_connection(channel, timeout, failure_seen):
    """See Connection.wait_for_connection.

    It asks gRPC's core channel (`channel._channel`) for the state, in the
    caller's thread: the public API reports states only to subscribers,
    through a polling thread that can outlive the channel's close (and
    then dies with a "Channel closed!" traceback)."""
    ready = grpc.ChannelConnectivity.READY
    failure = grpc.ChannelConnectivity.TRANSIENT_FAILURE
    core = getattr(channel, "_channel", None)
    if core is None or not hasattr(core, "watch_connectivity_state"):
        # Not a channel of grpcio's own kind: readiness is all it tells.
        try:
            grpc.channel_ready_future(channel).result(timeout=max(timeout, 0.0))
            return ready
        except grpc.FutureTimeoutError:
            return None
    end = time.monotonic() + max(timeout, 0.0)
    raw = core.check_connectivity_state(True)  # True: connect when idle
    while True:
        state = _STATES.get(raw)
        if state is ready:
            return ready
        if state is failure and not failure_seen:
            return failure
        if state is not failure:
            failure_seen = False  # a new attempt: its failure is news
        left = end - time.monotonic()
        if left <= 0:
            return None
        core.watch_connectivity_state(raw, time.time() + min(left, 0.5))
        raw = core.check_connectivity_state(True)
