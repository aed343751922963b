#!/usr/bin/env python3
"""A plain PyTorch module, built on the meta device, initialized by the
server with the module's own init code, loaded into this process.

    pip install ./python
    ./dev serve &                      # or any materializerd
    python examples/torch_module.py --server 127.0.0.1:50051 [--device cuda:0]
"""

import argparse
import math

import torch
import torch.nn as nn

import materializer


class TinyLM(nn.Module):
    """Token embedding with a padding row, RoPE frequencies computed in the
    constructor, a learned temperature made from a Python float, a tied
    output head, and an init function of its own (scaled residual
    projections), as language models write them."""

    def __init__(self, vocab=1000, dim=256, layers=4, pad=0):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=pad)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"attn": nn.Linear(dim, 3 * dim), "proj": nn.Linear(dim, dim),
                           "norm": nn.LayerNorm(dim)}) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        head_dim = 64
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.temperature = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.layers = layers

    def init_weights(self):
        for block in self.blocks:
            nn.init.normal_(block["attn"].weight, std=0.02)
            nn.init.normal_(block["proj"].weight, std=0.02 / math.sqrt(2 * self.layers))
            nn.init.zeros_(block["attn"].bias)
            nn.init.zeros_(block["proj"].bias)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--transport", default="auto", choices=["auto", "stream", "shm", "ipc"])
    args = ap.parse_args()

    with materializer.meta_device():       # records constructor values (inv_freq, temperature)
        model = TinyLM()
    spec = materializer.describe(model, seed=0)
    print(spec.describe_steps().split("\n")[0], "...")   # what the server will do
    result = materializer.materialize(model, server=args.server, device=args.device,
                                      spec=spec, transport=args.transport)
    print(result)
    assert model.head.weight is model.embed.weight
    assert torch.all(model.embed.weight[0] == 0)         # the padding row survived the tie
    print("temperature", model.temperature.item(), "inv_freq[:3]", model.inv_freq[:3].tolist())


if __name__ == "__main__":
    main()
