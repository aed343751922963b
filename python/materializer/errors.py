"""Exceptions of the package, one base class for all of them.

    try:
        materializer.materialize(model, server="...")
    except materializer.RpcError as e:       # the server said no
        print(e.code.name, e.message)       # e.g. RESOURCE_EXHAUSTED, "placement ..."
    except materializer.CaptureError as e:  # the model's init cannot be described
        for problem in e.problems: ...
"""


class Error(Exception):
    """Base class of every exception this package raises on purpose."""


class RpcError(Error):
    """A call to materializerd failed.

    `code` is the grpc.StatusCode, `message` the server's message (it names
    the field or tensor and the reason; for a connection that failed,
    gRPC's), `method` the RPC ("Materialize"), `target` the address.
    `call` is the SDK call it failed in ("materialize", "plan"; "" when the
    RPC was called directly), `hint` what to check (as matctl says it; ""
    when there is nothing to add) and `reason` the kind of failure the hint
    is for ("down", "tls_needed", "not_tls", "cert_required",
    "cert_refused", "untrusted_server", "token_refused", "token_needed",
    "identity_needed", "replica_down"; "" for the rest).
    """

    # Reasons for which no connection could be made (the RPC was not sent).
    CONNECT_REASONS = ("down", "tls_needed", "not_tls", "cert_required",
                       "cert_refused", "untrusted_server")
    # Reasons for which the server refused the caller's identity.
    IDENTITY_REASONS = ("token_refused", "token_needed", "identity_needed")

    def __init__(self, method, code, message, target="", *, call="", hint="", reason=""):
        self.method = method
        self.code = code
        self.message = message
        self.target = target
        self.call = call
        self.hint = hint
        self.reason = reason
        super().__init__(method, code, message, target)

    def __str__(self):
        code = getattr(self.code, "name", self.code)
        where = f" ({self.target})" if self.target else ""
        if self.reason in self.CONNECT_REASONS:
            text = (f"{self.call or self.method}: cannot connect to {self.target or 'the server'} "
                    f"({code}: {self.message})")
        elif self.reason in self.IDENTITY_REASONS:
            text = (f"{self.call or self.method}: {self.target or 'the server'} refused the "
                    f"caller's identity ({code}: {self.message})")
        else:
            text = f"{self.method}{where}: {code}: {self.message}"
            if self.call:
                text = f"{self.call}: {text}"
        return f"{text}; hint: {self.hint}" if self.hint else text

    def __reduce__(self):
        return (_rebuild_rpc_error, (self.method, self.code, self.message, self.target,
                                     self.call, self.hint, self.reason))


def _rebuild_rpc_error(method, code, message, target, call, hint, reason):
    return RpcError(method, code, message, target, call=call, hint=hint, reason=reason)


def in_call(error, call):
    """Marks an RpcError as raised in the SDK call `call` (the outermost
    one wins); returns it."""
    if isinstance(error, RpcError) and not error.call:
        error.call = call
    return error


class CaptureError(Error):
    """describe() could not turn the model's init into declarative steps.

    `problems` lists one line per tensor: its name, what happened to it (the
    op, the module class) and how to fix it (an override).
    """

    def __init__(self, summary, problems=()):
        self.problems = list(problems)
        text = summary
        if self.problems:
            text += "\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(text)


class LoadError(Error):
    """The handle's bytes could not be put into the module (a layout or
    shape that does not match, a digest mismatch, an export that cannot be
    mapped)."""


class CheckpointLayoutError(Error):
    """The checkpoint stores some of the model's tensors in another layout
    than the model holds them: transformers converts them while loading
    (experts stored one by one and merged into one tensor, halves
    concatenated, a transpose), which the server, reading tensors by name,
    does not do. Raised before anything is materialized; without it those
    tensors would have taken their random init."""
