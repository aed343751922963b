"""What to check after a connection failed or credentials were refused:
the cases and words of matctl's hints (client/cli/hints.cc), naming the
settings where the error shows (the Python API, or the command line of
`python -m materializer`).

    reason = classify(code, message, tls=..., cert=..., token=...)
    text = hint(reason, target, API, tls=..., token_source="token=")
"""

import grpc

# How each setting is named in the Python API ...
API = {
    "server": "server= (or MATERIALIZER_SERVER)",
    "who": "the SDK",
    "tls": "tls=materializer.TLS(root_certificates=CA) (or MATERIALIZER_TLS_CA)",
    "no_tls": ("leave out tls= and the MATERIALIZER_TLS, MATERIALIZER_TLS_CA, "
               "MATERIALIZER_TLS_CERT and MATERIALIZER_TLS_KEY variables"),
    "cert": ("a client certificate (TLS(certificate_chain=..., private_key=...), "
             "or MATERIALIZER_TLS_CERT and MATERIALIZER_TLS_KEY)"),
    "ca": "TLS(root_certificates=...)",
    "server_name": "TLS(server_name=...)",
    "token": "token= (or MATERIALIZER_TOKEN, MATERIALIZER_TOKEN_FILE)",
    "replicas": "Client.replicas()",
}
# ... and on the command line of `python -m materializer`.
CLI = {
    "server": "--server",
    "who": "it",
    "tls": "--tls-ca (or --tls)",
    "no_tls": "leave out --tls, --tls-ca, --tls-cert and --tls-key",
    "cert": "a client certificate (--tls-cert and --tls-key)",
    "ca": "--tls-ca",
    "server_name": "--tls-server-name",
    "token": "--token-file (or MATERIALIZER_TOKEN)",
    "replicas": "`matctl replicas`",
}

_CERT_MARKS = ("certificate verify failed", "certificate_verify_failed",
               "certificate required", "certificate_required", "bad certificate",
               "bad_certificate", "unknown ca", "unknown_ca", "certificate expired",
               "certificate_expired")
_VERIFY_MARKS = ("certificate_verify_failed", "certificate verify failed")
_NOT_TLS_MARKS = ("wrong_version_number", "wrong version number", "ssl handshake failed",
                  "packet_length_too_long", "http_request")
_CLOSED_MARKS = ("socket closed", "connection reset", "end of tcp stream", "frame of size",
                 "frame_size_error", "tls", "ssl")
_DOWN_MARKS = ("connection refused", "failed to connect", "cannot look up",
               "dns resolution failed", "name resolution", "no route to host",
               "did not answer", "deadline exceeded", "no connection within")


def _has(text, marks):
    return any(m in text for m in marks)


def classify(code, message, *, tls, cert, token, connecting=False):
    """The reason for a failed call (see errors.RpcError.reason), or "".

    tls: the client used TLS; cert: with a client certificate; token: with
    a bearer token. connecting: the call failed before a connection was
    made (a DEADLINE_EXCEEDED then means nobody answered, not a slow
    call)."""
    text = (message or "").lower()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        if token:
            return "token_refused"
        # With a client certificate the handshake went through: the server
        # wants a token on every call as well.
        return "token_needed" if cert else "identity_needed"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and not connecting:
        return ""
    if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return ""
    if tls and (_has(text, _CERT_MARKS)
                or ("failed to connect" in text and "socket closed" in text)):
        if _has(text, _VERIFY_MARKS):
            return "untrusted_server"
        return "cert_refused" if cert else "cert_required"
    if tls and _has(text, _NOT_TLS_MARKS):
        return "not_tls"
    if not tls and _has(text, _CLOSED_MARKS):
        return "tls_needed"
    if ("replica " in text and "did not answer" in text and "no replica at" not in text):
        return "replica_down"
    if _has(text, _DOWN_MARKS):
        return "down"
    return ""


def hint(reason, target, names=API, *, ca="", cert="", token_source=""):
    """The hint for `reason` ("" for none). ca, cert: the files the client
    used (for the message); token_source: where the token came from
    ("token=", "MATERIALIZER_TOKEN", "--token-file=PATH")."""
    if reason == "token_refused":
        return (f"the server did not accept the token from {token_source or 'token='}; "
                "check that it is listed in the server's --token_file")
    if reason == "token_needed":
        return ("the server took the client certificate but wants a bearer token on every "
                f"call too: give {names['token']}")
    if reason == "identity_needed":
        return (f"the server wants an identity: a bearer token ({names['token']}) or "
                f"{names['cert']}")
    if reason == "untrusted_server":
        return (f"the server's certificate was not trusted: it must chain to "
                f"{ca or 'the system roots'} ({names['ca']}) and name the host in the "
                f"address (or {names['server_name']})")
    if reason == "cert_required":
        return ("the server closed the connection during the TLS handshake: it probably "
                f"requires a client certificate (mTLS): give {names['cert']}")
    if reason == "cert_refused":
        return ("the server closed the connection during the TLS handshake: it probably "
                f"refused the client certificate{' ' + cert if cert else ''}, which must "
                "chain to the server's client CA and be valid now")
    if reason == "not_tls":
        return ("the server does not seem to speak TLS (a development-mode server?): "
                f"{names['no_tls']}")
    if reason == "tls_needed":
        return (f"the server closed the connection: if it uses TLS, give {names['tls']} "
                "and an identity")
    if reason == "replica_down":
        return ("one replica is not answering; calls for its handles fail until it is "
                "back (and its handles are gone if it restarted), while the other "
                f"replicas keep serving: {names['replicas']} shows which answer")
    if reason == "down":
        return (f"no server answered at {target}. Is materializerd running there? "
                "`./dev serve` starts one on 127.0.0.1:50051; "
                f"{names['server']} points {names['who']} elsewhere")
    return ""
