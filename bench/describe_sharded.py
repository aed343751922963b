#!/usr/bin/env python3
"""What describe() costs one rank of a sharded model: llama-1b (the
checkpoint benchmark's config) built on the meta device with
materializer.hf.from_config, each parameter made a Shard(0) DTensor of a
WORLD-rank mesh (torch's fake process group: one process plays rank 1, no
other rank is needed), then materializer.describe(model). Next to it, in
the same run and interleaved: building that model on meta (from_config and
distribute_tensor), and describe() of the same model unsharded. One thread,
as each of four ranks on a 2-core host gets.

    .venv/bin/python bench/describe_sharded.py [--reps 7] [--world 4]

Prints medians (min-max) in milliseconds; nothing is written.
"""

import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--world", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=1, world_size=args.world, store=FakeStore())
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import materializer
    from materializer import hf
    from checkpoint import config  # the checkpoint benchmark's llama-1b
    mesh = init_device_mesh("cpu", (args.world,))

    def build(sharded):
        model = hf.from_config(config(), "LlamaForCausalLM", dtype=torch.bfloat16)
        if sharded:
            for full_name, p in list(model.named_parameters()):
                owner, _, name = full_name.rpartition(".")
                model.get_submodule(owner).register_parameter(
                    name, torch.nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))
        return model

    times = {"build on meta (sharded)": [], "describe, sharded": [],
             "describe, unsharded": []}
    for i in range(args.reps + 1):   # the first is a warm-up
        for sharded in ((True, False) if i % 2 else (False, True)):
            t0 = time.perf_counter()
            model = build(sharded)
            t1 = time.perf_counter()
            materializer.describe(model)
            t2 = time.perf_counter()
            if i:
                if sharded:
                    times["build on meta (sharded)"].append(t1 - t0)
                times["describe, sharded" if sharded else "describe, unsharded"].append(t2 - t1)
    print(f"llama-1b, {args.world} ranks (this process plays rank 1), one thread, "
          f"median of {args.reps} (min-max), ms")
    for name, xs in times.items():
        print(f"  {name}: {statistics.median(xs) * 1e3:.1f} "
              f"({min(xs) * 1e3:.1f}-{max(xs) * 1e3:.1f})")


if __name__ == "__main__":
    main()
