#!/usr/bin/env python3
"""A Hugging Face model from a config (nothing downloaded), initialized by
the server exactly as the library would, loaded into this process, and
one training step.

    pip install "./python[hf]"
    python examples/huggingface.py --server 127.0.0.1:50051 [--size small|1b] [--device cuda:0]
"""

import argparse
import math

import torch
import transformers

import materializer
from materializer import hf

SIZES = {
    "tiny": dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1000),
    "small": dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=8, vocab_size=32000),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    args = ap.parse_args()

    config = transformers.LlamaConfig(**SIZES[args.size], max_position_embeddings=2048,
                                      pad_token_id=0)
    model = hf.from_config(config, "AutoModelForCausalLM")      # on the meta device
    result = materializer.materialize(model, server=args.server, device=args.device, seed=0)
    print(result)

    ids = torch.randint(1, config.vocab_size, (2, 64), device=args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(input_ids=ids, labels=ids).loss
    print(f"loss at init {loss.item():.3f} (ln vocab = {math.log(config.vocab_size):.3f})")
    loss.backward()
    opt.step()


if __name__ == "__main__":
    main()
