"""Checkpoint sweep: Hugging Face model classes saved by save_pretrained and
loaded through the server, against transformers' own from_pretrained.

For each class (by default one per model type whose checkpoints
transformers converts while loading: renamed prefixes, experts stored one
by one), the smallest config of hf_sweep that builds under 5M parameters
is built on the CPU, every floating parameter is perturbed (so that no
init can equal a checkpoint value by chance), the model is saved with
save_pretrained under ROOT, and then loaded twice: by transformers'
from_pretrained, and by materializer.hf.from_pretrained through the
server. Outcomes:

  pass         every tensor equal, bit for bit, to from_pretrained's
  refused      CheckpointLayoutError (a layout the server cannot read yet)
               or CaptureError (an init describe() refuses), naming the tensor
  WRONG        a tensor differs: the worst outcome, the one this finds
  build-error  no small config builds, or save_pretrained or
               from_pretrained itself fails (not the service's business)

Usage (the server must read ROOT as its root NAME):

    materializerd --devices=cpu --checkpoint_roots=sw=/tmp/sweep-root &
    python tests/python/hf_checkpoint_sweep.py --server 127.0.0.1:50051 \\
        --root /tmp/sweep-root --root-name sw [--all-types] [--only REGEX]
"""

import argparse
import collections
import json
import logging
import os
import re
import shutil
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_sweep  # noqa: E402

MAX_PARAMETERS = 5_000_000


def converted_types():
    """The model types transformers converts checkpoints of while loading."""
    from transformers import conversion_mapping
    out = set()
    for name, model_type in hf_sweep.all_classes().items():
        try:
            if conversion_mapping.get_checkpoint_conversion_mapping(model_type):
                out.add(model_type)
        except Exception:  # noqa: BLE001 - a type the table cannot look up
            pass
    return out


def small_model(cls):
    for config in hf_sweep.small_configs(cls):
        try:
            with torch.device("meta"):
                plain = cls(config)
        except Exception:  # noqa: BLE001 - the next, larger config
            continue
        if sum(p.numel() for p in plain.parameters()) <= MAX_PARAMETERS:
            torch.manual_seed(0)
            model = cls(config)
            with torch.no_grad():
                for p in model.parameters():
                    if p.is_floating_point():
                        p.add_(torch.randn_like(p) * 0.1)
            return model
    return None


def check(name, server, root, root_name):
    """(outcome, detail) of one class."""
    import materializer as mz
    from materializer import hf
    try:
        cls = hf_sweep.model_class(name)
        model = small_model(cls)
    except Exception as e:  # noqa: BLE001 - the library's own configs
        return "build-error", f"config: {type(e).__name__}: {str(e)[:200]}"
    if model is None:
        return "build-error", f"no config under {MAX_PARAMETERS:,} parameters builds"
    path = os.path.join(root, name)
    shutil.rmtree(path, ignore_errors=True)
    try:
        try:
            model.save_pretrained(path)
            want = cls.from_pretrained(path)
        except Exception as e:  # noqa: BLE001 - the library's own failure
            return "build-error", f"transformers: {type(e).__name__}: {str(e)[:200]}"
        try:
            got, result = hf.from_pretrained(f"{root_name}/{name}", server=server,
                                             model_class=cls)
        except (mz.CheckpointLayoutError, mz.CaptureError) as e:   # loud, named
            lines = str(e).splitlines()
            return "refused", (lines[1] if len(lines) > 1 else lines[0]).strip()[:200]
        want_sd, got_sd = want.state_dict(), got.state_dict()
        differ = [k for k, t in want_sd.items()
                  if k not in got_sd or got_sd[k].dtype != t.dtype
                  or not torch.equal(got_sd[k], t)]
        report = result.checkpoint
        if differ:
            return "WRONG", (f"{len(differ)} of {len(want_sd)} tensors differ ({differ[:3]}); "
                             f"loaded {report.tensors_loaded}, unused keys "
                             f"{len(report.unused_keys)}")
        return "pass", f"{report.tensors_loaded} tensors loaded"
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--root", required=True, help="a folder the server reads as --root-name")
    p.add_argument("--root-name", required=True)
    p.add_argument("--all-types", action="store_true",
                   help="every model type, not only those transformers converts")
    p.add_argument("--only", help="a regex on class names")
    p.add_argument("--json", help="write the outcomes here")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    classes = hf_sweep.representative(hf_sweep.all_classes())
    if not args.all_types:
        types = converted_types()
        classes = {n: t for n, t in classes.items() if t in types}
    if args.only:
        classes = {n: t for n, t in classes.items() if re.search(args.only, n)}
    outcomes = {}
    t0 = time.perf_counter()
    for i, (name, model_type) in enumerate(classes.items(), 1):
        t = time.perf_counter()
        try:
            with hf_sweep._time_limit(120):
                outcome, detail = check(name, args.server, args.root, args.root_name)
        except Exception as e:  # noqa: BLE001 - the sweep's own failure, named
            outcome, detail = "WRONG", f"the sweep raised {type(e).__name__}: {str(e)[:200]}"
        outcomes[name] = {"model_type": model_type, "outcome": outcome, "detail": detail}
        print(f"[{i}/{len(classes)}] {outcome:12} {name} ({model_type}): {detail} "
              f"({time.perf_counter() - t:.1f} s)", flush=True)
    counts = collections.Counter(o["outcome"] for o in outcomes.values())
    print(f"{len(outcomes)} classes: " + ", ".join(f"{n} {k}" for k, n in counts.most_common())
          + f" ({time.perf_counter() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(outcomes, f, indent=1)
    return 1 if counts.get("WRONG") else 0


if __name__ == "__main__":
    sys.exit(main())
