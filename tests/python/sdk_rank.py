"""One rank of test_sdk_distributed.py: builds the test model on the meta
device, shards it (FSDP2's fully_shard, or distribute_tensor with the
Shard(1) weights, Shard(0) biases, a Replicate embedding), materializes its own shards through the server and
saves {name: (box, local tensor)} for the test to compare."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

import materializer as mz  # noqa: E402


class Net(nn.Module):
    """Sizes that do not divide by 2 or 4 (uneven last shards)."""


    def __init__(self, padding=True):
        super().__init__()
        self.emb = nn.Embedding(11, 6, padding_idx=3 if padding else None)
        self.up = nn.Linear(6, 10)
        self.down = nn.Linear(10, 7)

    def forward(self, ids):
        return self.down(torch.relu(self.up(self.emb(ids))))



class Derived(nn.Module):
    """Derived values: a weight-normalized convolution (g = ||v|| per
    output channel) and a state-space dt bias, both written by init code."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3)
        nn.utils.parametrizations.weight_norm(self.conv, name="weight", dim=0)
        self.dt = nn.Linear(5, 9)

    def init_weights(self):
        import math
        w = self.conv.parametrizations.weight
        nn.init.normal_(w.original1, std=0.5)
        w.original0.copy_(torch.norm_except_dim(w.original1, 2, 0))
        u = torch.rand(9, device="meta")
        dt = torch.exp(u * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        self.dt.bias.copy_(dt + torch.log(-torch.expm1(-dt)))


def mixtral_config():
    import transformers
    return transformers.MixtralConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, vocab_size=256)


def mixtral_on_meta():
    import transformers
    from materializer import hf
    return hf.from_config(mixtral_config(), transformers.MixtralForCausalLM)


def main():
    rank, world, port, address, mode, out = sys.argv[1:7]
    checkpoint = sys.argv[7] if len(sys.argv) > 7 else None
    rank, world = int(rank), int(world)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    if mode == "moe":
        model = mixtral_on_meta()
    else:
        with torch.device("meta"):
            model = Derived() if mode == "derived" else Net(padding=mode != "shard1")
    if mode == "moe":
        # The fused experts by experts (each rank its own, assembled from
        # the checkpoint's per-expert tensors) and down_proj by columns;
        # the rest whole on each rank.
        for full_name, p in list(model.named_parameters()):
            owner, _, name = full_name.rpartition(".")
            placement = (Shard(0) if name == "gate_up_proj" else
                         Shard(2) if name == "down_proj" else Replicate())
            model.get_submodule(owner).register_parameter(
                name, nn.Parameter(distribute_tensor(p, mesh, [placement])))
    elif mode == "derived":
        # v by columns (no rank holds a whole row, which its g needs), g and
        # the dt bias by rows, the rest whole.
        placements = {"conv.parametrizations.weight.original1": Shard(1),
                      "conv.parametrizations.weight.original0": Shard(0),
                      "dt.bias": Shard(0), "dt.weight": Shard(1)}
        for full_name, p in list(model.named_parameters()):
            owner, _, name = full_name.rpartition(".")
            module = model.get_submodule(owner)
            placement = placements.get(full_name, Replicate())
            module.register_parameter(
                name, nn.Parameter(distribute_tensor(p, mesh, [placement])))
    elif mode == "checkpoint":
        # Every placement at once: the embedding whole on each rank, up by
        # rows, down by columns, the biases by rows.
        placements = {"emb.weight": Replicate(), "up.weight": Shard(0),
                      "down.weight": Shard(1), "up.bias": Shard(0),
                      "down.bias": Shard(0)}
        for full_name, p in list(model.named_parameters()):
            owner, _, name = full_name.rpartition(".")
            module = model.get_submodule(owner)
            module.register_parameter(
                name, nn.Parameter(distribute_tensor(p, mesh, [placements[full_name]])))
    elif mode == "fsdp":
        from torch.distributed.fsdp import fully_shard
        fully_shard(model, mesh=mesh)                 # Shard(0) everywhere
    else:
        for module in model.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                if module is model.emb:
                    placement = Replicate()             # the whole tensor on each rank
                else:
                    placement = Shard(p.dim() - 1)      # columns; biases by rows
                module.register_parameter(
                    name, nn.Parameter(distribute_tensor(p, mesh, [placement])))
    # Both deliveries: FSDP2 through shared memory, the other through the stream.
    # The stream in parts of at most 16 bytes (each shard but the smallest
    # and the empty ones a part of its own): the bytes must not depend on it.
    result = mz.materialize(model, server=address, seed=77,
                            transport="shm" if mode == "fsdp" else "stream",
                            part_bytes=0 if checkpoint else 16, checkpoint=checkpoint)
    saved = {}
    for name, p in model.named_parameters():
        box = result.spec[name].shard
        saved[name] = (box, p._local_tensor.detach().clone(), str(p.placements))
    saved["__transport__"] = result.transport
    saved["__parts__"] = result.parts
    if result.checkpoint is not None:
        saved["__read__"] = result.checkpoint.bytes_read_from_files
    if mode == "fsdp":
        with torch.no_grad():   # FSDP2 all-gathers the shards this rank loaded
            saved["__output__"] = model(torch.tensor([[1, 3, 5, 10]])).detach().clone()
    torch.save(saved, out)
    dist.barrier()            # no rank tears gloo down while another still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
