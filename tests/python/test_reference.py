"""The Python reference helpers themselves (no server needed)."""

import json
import subprocess
import sys

import torch

import matutil as m


def test_seed_functions_match_known_values():
    # Same vectors as server/init/seed_test.cc.
    assert m.fnv1a64(b"") == 0xCBF29CE484222325
    assert m.fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert m.fnv1a64(b"foobar") == 0x85944171F73967E8
    assert m.splitmix64(0) == 0xE220A8397B1DCDAF
    s = m.derive_seed(7, "h.0.attn.c_attn.weight")
    assert s == m.splitmix64(7 ^ m.splitmix64(m.fnv1a64(b"h.0.attn.c_attn.weight")))
    assert 0 <= s < 2**64
    # torch accepts the whole uint64 range as a seed.
    torch.Generator().manual_seed(m.derive_seed(2**64 - 1, "x"))


def test_examples_are_up_to_date():
    r = subprocess.run([sys.executable, "examples/generate.py", "--check"],
                       cwd=m.REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_example_parameter_counts():
    def params(name):  # tied parameters count once, as in model.parameters()
        return sum(m.numel(t["shape"]) for t in m.load_json(name)["model"]["tensors"]
                   if t.get("kind") != "TENSOR_KIND_BUFFER" and not t.get("tieTo"))
    assert params("gpt2-small.json") == 124_439_808
    assert params("llama-1b.json") == 1_100_048_384


def test_every_example_tensor_is_covered():
    for name in ("mlp.json", "gpt2-small.json", "llama-small.json", "llama-1b.json"):
        model = m.load_json(name)["model"]
        inits = m.resolve_inits(model)
        assert len(inits) == len(model["tensors"])
    gpt2 = m.resolve_inits(m.load_json("gpt2-small.json")["model"])
    assert gpt2["transformer.ln_f.weight"][0] == "ones"
    assert gpt2["transformer.h.3.ln_2.weight"][0] == "ones"
    assert gpt2["transformer.h.3.ln_2.bias"][0] == "zeros"
    assert gpt2["transformer.h.3.attn.c_attn.bias"][0] == "zeros"
    assert gpt2["transformer.wte.weight"] == ("normal", {"mean": 0.0, "std": 0.02})
