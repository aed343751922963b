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
    the field or tensor and the reason), `method` the RPC ("Materialize").
    """

    def __init__(self, method, code, message, target=""):
        self.method = method
        self.code = code
        self.message = message
        self.target = target
        where = f" ({target})" if target else ""
        super().__init__(f"{method}{where}: {getattr(code, 'name', code)}: {message}")


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
