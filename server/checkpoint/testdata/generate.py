"""Writes the checkpoint test fixtures with the real writers (torch.save,
safetensors, save_pretrained), so the readers are tested on what users have.

    .venv/bin/python server/checkpoint/testdata/generate.py

The files are committed; reader_fixtures_test.cc checks them, and the values
below are what it expects.
"""

import collections
import json
import os

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def state_dict():
    """Like Module.state_dict(): an OrderedDict with _metadata, and each
    kind of tensor the reader handles."""
    weight = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    embed = torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]],
                         dtype=torch.bfloat16)
    sd = collections.OrderedDict()
    sd["linear.weight"] = weight
    sd["linear.bias"] = torch.tensor([-1.0, 0.5, 2.0])
    sd["embed.weight"] = embed
    sd["lm_head.weight"] = embed                    # tied: one storage
    sd["row"] = weight[1]                           # a view: storage offset 2
    sd["steps"] = torch.tensor(7, dtype=torch.int64)  # 0-d
    sd["mask"] = torch.tensor([True, False, True, True, False])
    sd["scale"] = torch.tensor([0.5, 1.0, -2.0, 448.0]).to(
        torch.float8_e4m3fn)                        # _rebuild_tensor_v3
    sd["empty"] = torch.zeros(0, 3)
    sd["param"] = torch.nn.Parameter(                # _rebuild_parameter
        torch.tensor([1.5, -0.25], dtype=torch.float16))
    sd["column"] = torch.arange(4, dtype=torch.int32).reshape(4, 1)
    sd._metadata = collections.OrderedDict(
        [("", {"version": 1}), ("linear", {"version": 1})])
    return sd


def main():
    torch.save(state_dict(), os.path.join(HERE, "state_dict.pt"))
    # A plain dict (transformers' shards), pickle protocol 4 (FRAME,
    # SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL).
    torch.save({"a": torch.tensor([1.0, 2.0]),
                "b": torch.tensor([[3, 4]], dtype=torch.int16)},
               os.path.join(HERE, "protocol4.pt"), pickle_protocol=4)
    # A transposed view: not contiguous.
    torch.save({"t": torch.arange(12, dtype=torch.float32).reshape(3, 4).t()},
               os.path.join(HERE, "noncontiguous.pt"))
    save_file({"b": torch.tensor([1.0, 2.0, 3.0]),
               "a": torch.tensor([[1, 2], [3, 4]], dtype=torch.int64),
               "h": torch.tensor([0.5], dtype=torch.bfloat16)},
              os.path.join(HERE, "tiny.safetensors"),
              metadata={"format": "pt"})
    # The index save_pretrained writes for a tiny GPT-2 split at 50 KB.
    from transformers import GPT2Config, GPT2LMHeadModel
    import tempfile
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2,
                                       vocab_size=100, n_positions=32))
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder, max_shard_size="50KB")
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            index = f.read()
    with open(os.path.join(HERE, "gpt2.safetensors.index.json"), "w") as f:
        f.write(index)
    json.loads(index)


if __name__ == "__main__":
    main()
