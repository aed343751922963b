"""Command line: `python -m materializer plan FILE [--server ADDR]`.

FILE is a request file (proto3 JSON of a MaterializeRequest or
PlanRequest, as matctl reads), a Spec saved with Spec.save, or a Hugging
Face config.json (or a folder holding one). Prints bytes per dtype, the
largest tensor, the memory to train with Adam, and with --server, the
server's Plan: the arena size and which pool devices it fits on now.

The identity for --server: --tls-ca (or --tls), --tls-cert and --tls-key,
--token-file; each one left out is taken from matctl's variables
(MATERIALIZER_TLS_CA, MATERIALIZER_TLS_CERT, MATERIALIZER_TLS_KEY,
MATERIALIZER_TOKEN_FILE or MATERIALIZER_TOKEN, ...). A token is never
taken as an argument's value: it would show in process listings. Errors
(no connection, a refused identity, a missing optional package) are one
line on stderr and exit status 1.
"""

import argparse
import json
import sys

PROG = "python -m materializer"


def _parser():
    ap = argparse.ArgumentParser(prog=PROG, description="materializer trainer SDK tools")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="exact memory of a model, and where it fits")
    p.add_argument("file", help="request file, saved spec, or Hugging Face config.json / folder")
    p.add_argument("--server", help="materializerd address (or replicas, comma-separated): "
                   "ask its Plan where it fits now (MATERIALIZER_SERVER is not read here: "
                   "without --server no server is asked)")
    p.add_argument("--auto-class", help="transformers class for a config (default: "
                   "the config's architectures[0], else AutoModel)")
    p.add_argument("--dtype", help="dtype to build a config's model in (e.g. bfloat16)")
    p.add_argument("--placement", default="", help="placement to plan for (default auto)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--tls", action="store_true",
                   help="use TLS, trusting the system's roots (MATERIALIZER_TLS)")
    p.add_argument("--tls-ca", metavar="FILE",
                   help="CA bundle (PEM) the server's certificate chains to (MATERIALIZER_TLS_CA)")
    p.add_argument("--tls-cert", metavar="FILE",
                   help="mTLS: the client certificate (PEM), with --tls-key "
                   "(MATERIALIZER_TLS_CERT)")
    p.add_argument("--tls-key", metavar="FILE",
                   help="mTLS: the client's private key (MATERIALIZER_TLS_KEY)")
    p.add_argument("--tls-server-name", metavar="NAME",
                   help="the name in the server's certificate, when it is not the host in "
                   "--server (MATERIALIZER_TLS_SERVER_NAME)")
    p.add_argument("--token-file", metavar="FILE",
                   help="a file holding a bearer token, sent over TLS only "
                   "(MATERIALIZER_TOKEN_FILE; or MATERIALIZER_TOKEN holds the token itself)")
    # Deprecated: a token given as a value shows in process listings.
    p.add_argument("--token", help=argparse.SUPPRESS)
    p.add_argument("--connect-timeout", type=float, metavar="SECONDS",
                   help="how long to wait for a connection to the server (default 3; "
                   "MATERIALIZER_CONNECT_TIMEOUT)")
    return ap


def main(argv=None):
    args = _parser().parse_args(argv)
    from materializer.errors import RpcError
    try:
        return _plan(args)
    except RpcError as e:  # named as this command (_for_command_line)
        print(e, file=sys.stderr)
        sys.exit(1)
    except ModuleNotFoundError as e:
        if e.name != "transformers":
            raise
        _fail(e)
    except (ValueError, OSError) as e:  # a file that does not parse or cannot be read
        _fail(e)


def _fail(error):
    print(f"{PROG} plan: {error}", file=sys.stderr)
    sys.exit(1)


def _plan(args):
    from materializer.estimate import Estimate, load_input, table
    spec, _ = load_input(args.file, args.auto_class, args.dtype)
    est = Estimate(spec)
    plan = None
    if args.server:
        from materializer.client import Client
        from materializer.errors import RpcError
        tls, token, token_source = _identity(args)
        with Client(args.server, tls=tls, token=token, connect_timeout=args.connect_timeout,
                    session=False) as client:
            try:
                plan = client.plan(spec.to_proto() if spec.roots and spec.roots[0].steps
                                   else _shapes_only(spec), placement=args.placement or None,
                                   summary_only=True)   # the listing is not printed
            except RpcError as e:
                raise _for_command_line(e, args.server, tls, token_source) from None
    if args.json:
        out = est.as_dict()
        if plan is not None:
            out["plan"] = {"arena_bytes": plan.arena_bytes, "placement": plan.placement,
                           "devices": [{"device": d.device, "available_bytes": d.available_bytes,
                                        "fits": d.fits} for d in plan.devices]}
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        print(table(est, plan))
    return 0


def _identity(args):
    """(tls, token, where the token came from): the options, each one left
    out taken from matctl's variables."""
    from materializer.client import env
    tls = env.tls(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key,
                  server_name=args.tls_server_name, on=args.tls)
    if args.token is not None:
        print(f"{PROG} plan: warning: --token is deprecated (a token on the command line "
              "shows in process listings): use --token-file or MATERIALIZER_TOKEN",
              file=sys.stderr)
        return tls, args.token, "--token"
    token, source = env.token(args.token_file, f"--token-file={args.token_file}")
    return tls, token, source


def _for_command_line(error, server, tls, token_source):
    """The RpcError of the Plan call, named as this command, with its hint
    in the names of the options."""
    from materializer.client import hints
    error.call = f"{PROG} plan"
    if error.reason:
        error.hint = hints.hint(
            error.reason, error.target or server, hints.CLI,
            ca=tls.root_certificates_file if tls is not None else "",
            cert=tls.certificate_chain_file if tls is not None else "",
            token_source=token_source)
    return error


def _shapes_only(spec):
    """A ModelSpec for Plan when the input has no init (a config or a
    module walked for shapes): every tensor `empty`, which Plan sizes the
    same way."""
    from materializer.capture import Step
    from materializer.capture.schemes import empty
    for t in spec.tensors:
        if not t.tie_to and not t.steps:
            t.steps = [Step(empty(), None)]
    return spec.to_proto()


if __name__ == "__main__":
    sys.exit(main())
