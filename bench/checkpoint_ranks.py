#!/usr/bin/env python3
"""One rank of bench/checkpoint.py --ranks N: N processes on this host (gloo),
each timing, in interleaved repetitions,

  hf + shard   from_pretrained(folder, dtype=bfloat16) of the whole model,
               then each parameter replaced by this rank's Shard(0) rows
               (a DTensor over its own copy; the full model is dropped);
  sdk Shard(0) the model on the meta device with Shard(0) DTensor
               parameters, then materializer.materialize(model,
               checkpoint=...): the server reads each rank's rows;

  sdk Shard(0), pool  (with POOL_SERVER, JSON: server, proto, threads,
               pool, root) the same against a server rank 0 starts for each
               of these repetitions with a shared-memory pool
               (bench/run.py's pooled_service: warmed up by one load of the
               checkpoint, and with the adaptive pool (auto) by one load of
               each rank's shard, which teaches it its size; pool full)
               and stops after it;
  sdk Shard(0), huge pages  (with HUGE_ADDRESS) the same against a
               long-running server whose --shm_dir is a huge-page tmpfs;
  sdk Shard(0), pool, huge pages  (POOL_SERVER's huge_shm_dir) the pooled
               server with that --shm_dir;

each followed by the first write of this rank's weights. Every repetition
starts at a barrier and ends at one; rank 0 writes the wall times, every
rank's peak RSS growth and every rank's phases (seconds: hf = load, shard;
sdk = build on meta, materialize; both = first write, then the wait at the
last barrier) to OUT (JSON lines).

    checkpoint_ranks.py RANK WORLD PORT ADDRESS FOLDER CHECKPOINT REPS OUT [POOL_SERVER|null [HUGE_ADDRESS]]
"""

import gc
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

from checkpoint import config, warm_up_load  # noqa: E402
from sdk import _status as status, rss_peak_reset, write_once  # noqa: E402


def shard_rows(model, mesh, rank, world):
    from torch.distributed.tensor import DTensor, Shard
    for full_name, p in list(model.named_parameters()):
        owner, _, name = full_name.rpartition(".")
        local = torch.chunk(p.detach(), world, dim=0)[rank].clone()
        model.get_submodule(owner).register_parameter(name, torch.nn.Parameter(
            DTensor.from_local(local, mesh, [Shard(0)], run_check=False)))


def hf_path(folder, mesh, rank, world):
    """The model and its phases in seconds."""
    import transformers
    t0 = time.perf_counter()
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    t1 = time.perf_counter()
    shard_rows(model, mesh, rank, world)
    gc.collect()
    return model, {"load": t1 - t0, "shard": time.perf_counter() - t1}


def sdk_path(client, checkpoint, mesh):
    import materializer
    from materializer import hf
    from torch.distributed.tensor import Shard, distribute_tensor
    t0 = time.perf_counter()
    model = hf.from_config(config(), "LlamaForCausalLM", dtype=torch.bfloat16)
    for full_name, p in list(model.named_parameters()):
        owner, _, name = full_name.rpartition(".")
        model.get_submodule(owner).register_parameter(
            name, torch.nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))
    t1 = time.perf_counter()
    done = materializer.materialize(model, client=client, checkpoint=checkpoint, progress=False)
    phases = {"build on meta": t1 - t0, "materialize": time.perf_counter() - t1}
    # materialize's own split: describe, the server's Materialize, load.
    phases.update({f"materialize: {k}": v for k, v in done.seconds.items() if k != "total"})
    return model, phases


def main():
    rank, world, port, address, folder, checkpoint, reps, out = sys.argv[1:9]
    pool_server = json.loads(sys.argv[9]) if len(sys.argv) > 9 else None
    huge_address = sys.argv[10] if len(sys.argv) > 10 and sys.argv[10] else None
    rank, world, reps = int(rank), int(world), int(reps)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import materializer
    import transformers
    transformers.utils.logging.disable_progress_bar()
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    client = materializer.Client(address)
    huge_client = materializer.Client(huge_address) if huge_address else None
    records = []
    for i in range(reps + 1):   # the first is a warm-up
        order = (["hf + shard", "sdk Shard(0)"] + (["sdk Shard(0), pool"] if pool_server else [])
                 + (["sdk Shard(0), huge pages"] if huge_client else [])
                 + (["sdk Shard(0), pool, huge pages"]
                    if pool_server and pool_server.get("huge_shm_dir") else []))
        random.Random(i).shuffle(order)
        for path in order:
            gc.collect()
            block = pooled = None
            if ", pool" in path:
                box = [None]
                if rank == 0:
                    import run as bench_run
                    block = bench_run.pooled_service(
                        pool_server["server"], pool_server["proto"], pool_server["threads"],
                        pool_server["pool"],
                        extra_args=[f"--checkpoint_roots={pool_server['root']}"]
                        + ([f"--shm_dir={pool_server['huge_shm_dir']}"]
                           if path.endswith("huge pages") else []),
                        warm_up=warm_up_load)
                    psvc = block.__enter__()
                    box[0] = psvc.address
                dist.broadcast_object_list(box, src=0)
                pooled = materializer.Client(box[0])
                if pool_server["pool"] == "auto":
                    # An adaptive pool learns its size from exports: each
                    # rank loads its shard once, as the first job on a
                    # long-running server would, and the pool refills.
                    warm, _ = sdk_path(pooled, checkpoint, mesh)
                    del warm
                    gc.collect()
                    dist.barrier()
                    if rank == 0:
                        psvc.wait_pool_full()
                    dist.barrier()
            base = rss_peak_reset()
            dist.barrier()
            t0 = time.perf_counter()
            if path == "hf + shard":
                model, phases = hf_path(folder, mesh, rank, world)
            else:
                model, phases = sdk_path(
                    pooled or (huge_client if path.endswith("huge pages") else client),
                    checkpoint, mesh)
            phases["first write"] = write_once(model)
            t_written = time.perf_counter()
            local = sum(p._local_tensor.numel() * p._local_tensor.element_size()
                        for p in model.parameters())
            dist.barrier()
            wall = time.perf_counter() - t0
            # The wait at the last barrier: the slowest rank's lead.
            phases["wait for the other ranks"] = time.perf_counter() - t_written
            high = status("VmHWM")
            del model
            gc.collect()
            # Growth above the lower of the levels before and after: memory
            # of the previous path that is freed only during this one (the
            # hf path's shards outlived `del` and a collection on some ranks,
            # 0.55 GB) would otherwise count in the base and hide this
            # path's own growth (a rank holding its 0.55 GB shard read 0).
            peak = high - min(base, status("VmRSS"))
            if pooled is not None:
                pooled.close()
                dist.barrier()
                if block is not None:
                    block.__exit__(None, None, None)
            peaks = [None] * world
            dist.all_gather_object(peaks, peak)
            every = [None] * world
            dist.all_gather_object(every, phases)
            if rank == 0 and i > 0:
                records.append({"path": path, "wall": wall, "peaks": peaks,
                                "local_bytes": local, "phases": every})
            if rank == 0:
                print(f"ranks {world} {'rep' if i else 'warm-up'} {i}: {path} {wall:.3f} s, "
                      f"peak RSS per rank {[round(p / 1e9, 2) for p in peaks]} GB, "
                      f"phases of rank 0 {({k: round(v, 3) for k, v in phases.items()})}",
                      file=sys.stderr, flush=True)
    client.close()
    if huge_client:
        huge_client.close()
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
