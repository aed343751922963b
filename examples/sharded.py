#!/usr/bin/env python3
"""Two ranks (gloo, on this machine), each materializing only its shards of
a model sharded with FSDP2 on the meta device, then checking through the
shard-composable fingerprints that the shards make one model.

    python examples/sharded.py --server 127.0.0.1:50051 [--ranks 2]
"""

import argparse
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import materializer
from materializer import fingerprint


def build():
    return nn.Sequential(nn.Embedding(1000, 256), nn.Linear(256, 1024), nn.GELU(),
                         nn.Linear(1024, 256), nn.LayerNorm(256))


def rank_main(rank, world, port, server):
    # The rendezvous store (rank 0 serves it) also carries the fingerprints.
    store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    with torch.device("meta"):
        model = build()
    fully_shard(model, mesh=mesh)                       # Shard(0) DTensors on meta
    result = materializer.materialize(model, server=server, seed=0)   # portable mode
    values = {}
    for name, p in model.named_parameters():
        box = result.spec[name].shard
        values[name] = fingerprint.of_tensor(p._local_tensor, full_shape=list(p.shape),
                                             offset=[o for o, _ in box])
        print(f"rank {rank}: {name} holds rows {box[0][0]}..{box[0][0] + box[0][1] - 1} "
              f"of {p.shape[0]}")
    # Each rank sends 8 bytes instead of its weights, through the store rather
    # than a gloo all_gather: a tensor handed to a gloo collective can be
    # freed by gloo's worker thread after the interpreter starts to exit,
    # and that thread then aborts the process (torch 2.11, about 1 run in
    # 100 here, when the collective is the last one before the barrier).
    store.set(f"fingerprint/{rank}", str(fingerprint.of_handle(values)))
    if rank == 0:
        combined = fingerprint.combine(int(store.get(f"fingerprint/{r}")) for r in range(world))
        print(f"shards of {world} ranks add up to model fingerprint {combined:#018x}")
    dist.barrier()            # no rank tears gloo down while another still talks
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args.ranks, port, args.server), nprocs=args.ranks)
    # The same model in one process has the same fingerprint.
    with torch.device("meta"):
        model = build()
    client = materializer.Client(args.server)
    result = materializer.materialize(model, client=client, seed=0, keep_handle=True)
    print(f"the full model in one process:  {client.describe(result.handle).fingerprint:#018x}")
    client.release(result.handle)
    client.close()


if __name__ == "__main__":
    main()
