"""Connection settings from the environment, under the names matctl reads
(client/cli/flag_table.cc), so that one set of variables serves both:

    MATERIALIZER_SERVER           the server, or several replicas ("h1:50051,h2:50051")
    MATERIALIZER_TLS              "true": TLS, trusting the system's roots
    MATERIALIZER_TLS_CA           CA bundle (PEM file) the server's certificate chains to
    MATERIALIZER_TLS_CERT         mTLS: the client certificate (PEM file), with ...
    MATERIALIZER_TLS_KEY          ... its private key
    MATERIALIZER_TLS_SERVER_NAME  the name in the server's certificate, when the
                                  address's host is not it
    MATERIALIZER_TOKEN            a bearer token (TLS only) ...
    MATERIALIZER_TOKEN_FILE       ... or a file holding one (not both)
    MATERIALIZER_CLIENT           the development-mode name (no TLS)

and the SDK's own MATERIALIZER_CONNECT_TIMEOUT (seconds to wait for a
connection; matctl does not wait). MATERIALIZER_ADDRESS, the SDK's old
name for MATERIALIZER_SERVER, is still read, with a DeprecationWarning.
"""

import os
import warnings

SERVER = "MATERIALIZER_SERVER"
OLD_SERVER = "MATERIALIZER_ADDRESS"
TLS_ON = "MATERIALIZER_TLS"
TLS_CA = "MATERIALIZER_TLS_CA"
TLS_CERT = "MATERIALIZER_TLS_CERT"
TLS_KEY = "MATERIALIZER_TLS_KEY"
TLS_SERVER_NAME = "MATERIALIZER_TLS_SERVER_NAME"
TOKEN = "MATERIALIZER_TOKEN"
TOKEN_FILE = "MATERIALIZER_TOKEN_FILE"
CLIENT = "MATERIALIZER_CLIENT"
CONNECT_TIMEOUT = "MATERIALIZER_CONNECT_TIMEOUT"

DEFAULT_SERVER = "127.0.0.1:50051"
# Seconds a call waits for a connection to the server before it fails.
DEFAULT_CONNECT_TIMEOUT_S = 3.0


def _get(name):
    """The variable's value, or None when it is unset or empty (as matctl
    treats an empty one)."""
    value = os.environ.get(name)
    return value if value else None


def server():
    """MATERIALIZER_SERVER, else MATERIALIZER_ADDRESS (deprecated), else
    127.0.0.1:50051."""
    value = _get(SERVER)
    if value is not None:
        return value
    old = _get(OLD_SERVER)
    if old is not None:
        warnings.warn(f"{OLD_SERVER} is deprecated: set {SERVER} (the name matctl "
                      f"reads too)", DeprecationWarning, stacklevel=3)
        return old
    return DEFAULT_SERVER


def flag(name):
    """A true/false variable as matctl reads it (true, false, 1, 0, yes,
    no); False when unset."""
    value = _get(name)
    if value is None:
        return False
    lower = value.lower()
    if lower in ("true", "1", "yes"):
        return True
    if lower in ("false", "0", "no"):
        return False
    raise ValueError(f'{name} must be true or false, not "{value}"')


def tls(ca=None, cert=None, key=None, server_name=None, on=False):
    """A TLS from the files given, each one left out taken from its
    variable (MATERIALIZER_TLS_CA, ...); None when neither asks for TLS
    (plaintext). on: TLS even without a CA (the system's roots), as
    MATERIALIZER_TLS=true."""
    from materializer.client.channel import TLS
    ca = ca or _get(TLS_CA)
    cert = cert or _get(TLS_CERT)
    key = key or _get(TLS_KEY)
    server_name = server_name or _get(TLS_SERVER_NAME)
    if not (on or flag(TLS_ON) or ca or cert or key or server_name):
        return None
    if (cert is None) != (key is None):
        raise ValueError(f"a client certificate needs its key and the key its certificate: "
                         f"give both (--tls-cert and --tls-key, or {TLS_CERT} and {TLS_KEY}), "
                         "or neither")
    return TLS(root_certificates=ca, certificate_chain=cert, private_key=key,
               server_name=server_name)


def token(path=None, path_source=""):
    """(token, where it came from): from the file `path` (a command line's;
    path_source names it, e.g. "--token-file=PATH"), else from
    MATERIALIZER_TOKEN_FILE or MATERIALIZER_TOKEN; (None, "") when none
    holds one. ValueError when both variables are set, or for a token file
    that does not hold one token."""
    if path:
        return read_token_file(path), path_source or str(path)
    path, inline = _get(TOKEN_FILE), _get(TOKEN)
    if path is not None and inline is not None:
        raise ValueError(f"both {TOKEN} and {TOKEN_FILE} are set; set one")
    if path is not None:
        return read_token_file(path), f"{TOKEN_FILE}={path}"
    if inline is not None:
        return inline, TOKEN
    return None, ""


def client_name():
    return _get(CLIENT)


def connect_timeout():
    """MATERIALIZER_CONNECT_TIMEOUT in seconds, else the default (3 s)."""
    value = _get(CONNECT_TIMEOUT)
    if value is None:
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f'{CONNECT_TIMEOUT} must be a number of seconds above 0, not "{value}"')
    return seconds


def read_token_file(path):
    """The token a file holds: one word on one line (surrounding
    whitespace ignored), as matctl reads --token_file. ValueError
    otherwise."""
    try:
        with open(os.fspath(path), encoding="utf-8") as f:
            text = f.read().strip()
    except OSError as e:
        raise ValueError(f"cannot read the token file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"the token file {path} is not text") from None
    if not text:
        raise ValueError(f"the token file {path} is empty")
    if "\n" in text:
        raise ValueError(f"the token file {path} holds more than one line; it must hold "
                         "only the token")
    return text
