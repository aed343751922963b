"""Command line: `python -m materializer plan FILE [--server ADDR]`.

FILE is a request file (proto3 JSON of a MaterializeRequest or
PlanRequest, as matctl reads), a Spec saved with Spec.save, or a Hugging
Face config.json (or a folder holding one). Prints bytes per dtype, the
largest tensor, the memory to train with Adam, and with --server, the
server's Plan: the arena size and which pool devices it fits on now.
"""

import argparse
import json
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m materializer",
                                 description="materializer trainer SDK tools")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="exact memory of a model, and where it fits")
    p.add_argument("file", help="request file, saved spec, or Hugging Face config.json / folder")
    p.add_argument("--server", help="materializerd address: ask its Plan where it fits now")
    p.add_argument("--auto-class", help="transformers class for a config (default: "
                   "the config's architectures[0], else AutoModel)")
    p.add_argument("--dtype", help="dtype to build a config's model in (e.g. bfloat16)")
    p.add_argument("--placement", default="", help="placement to plan for (default auto)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--token", help="bearer token (with --tls-ca)")
    p.add_argument("--tls-ca", help="CA certificate of the server (PEM file)")
    args = ap.parse_args(argv)

    from materializer.estimate import Estimate, load_input, table
    spec, _ = load_input(args.file, args.auto_class, args.dtype)
    est = Estimate(spec)
    plan = None
    if args.server:
        from materializer.client import TLS, Client
        tls = TLS(root_certificates=args.tls_ca) if args.tls_ca else None
        with Client(args.server, tls=tls, token=args.token, session=False) as client:
            plan = client.plan(spec.to_proto() if spec.roots and spec.roots[0].steps
                               else _shapes_only(spec), placement=args.placement or None)
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
