#!/usr/bin/env python3
"""Writes the example request files of this folder (stdlib only).

Each file is the proto3 JSON mapping of a materializer.v1.MaterializeRequest
(see proto/materializer/v1/materializer.proto). The output is deterministic:
running this script twice gives byte-identical files.

    python3 examples/generate.py            # (re)write every example
    python3 examples/generate.py --check    # exit 1 if a file is stale
"""

import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Every example uses this root seed (a uint64; a string in proto3 JSON).
SEED = 1234


# ---------------------------------------------------------------------------
# Small builders for the proto3 JSON objects.
# ---------------------------------------------------------------------------

def zeros():
    return {"zeros": {}}


def ones():
    return {"ones": {}}


def constant(val):
    return {"constant": {"val": val}}


def uniform(a, b):
    return {"uniform": {"a": a, "b": b}}


def normal(mean, std):
    return {"normal": {"mean": mean, "std": std}}


def rule(pattern, init):
    return {"pattern": pattern, "init": init}


def param(name, shape, dtype, module_type, init=None):
    t = {"name": name, "shape": list(shape), "dtype": dtype,
         "moduleType": module_type}
    if init is not None:
        t["init"] = init
    return t


def buffer(name, shape, dtype, module_type, persistent=True):
    return {"name": name, "shape": list(shape), "dtype": dtype,
            "kind": "TENSOR_KIND_BUFFER", "persistent": persistent,
            "moduleType": module_type}


def request(tensors, rules, label, seed=SEED, rng=None):
    """rng: None for the server's default (portable), or "RNG_MODE_TORCH"
    for values bit for bit equal to torch.nn.init's."""
    names = [t["name"] for t in tensors]
    assert len(names) == len(set(names)), "duplicate tensor names"
    model = {
        "tensors": tensors,
        "initRules": rules,
        # uint64 is a JSON string in the proto3 mapping.
        "seed": str(seed),
    }
    if rng is not None:
        model["rng"] = rng
    return {
        "model": model,
        "placement": {"device": "auto"},
        "label": label,
    }


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def count_params(req):
    """Parameters, tied ones counted once (as model.parameters() does)."""
    return sum(numel(t["shape"]) for t in req["model"]["tensors"]
               if t.get("kind", "TENSOR_KIND_PARAMETER") != "TENSOR_KIND_BUFFER"
               and not t.get("tieTo"))


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------

def mlp():
    """A small float32 MLP: Linear -> LayerNorm -> Linear -> LayerNorm -> Linear.

    Linear layers carry their own per-tensor init (torch's default
    nn.Linear bound 1/sqrt(fan_in), as uniform(-bound, bound)); LayerNorms
    are covered by init rules.
    """
    dims = [784, 512, 256, 10]
    tensors = []
    for i, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])):
        bound = 1.0 / math.sqrt(fan_in)
        tensors.append(param(f"net.fc{i}.weight", [fan_out, fan_in], "float32",
                             "Linear", uniform(-bound, bound)))
        tensors.append(param(f"net.fc{i}.bias", [fan_out], "float32",
                             "Linear", uniform(-bound, bound)))
        if i < len(dims) - 2:
            tensors.append(param(f"net.norm{i}.weight", [fan_out], "float32",
                                 "LayerNorm"))
            tensors.append(param(f"net.norm{i}.bias", [fan_out], "float32",
                                 "LayerNorm"))
    rules = [
        rule("net.norm*.weight", ones()),
        rule("net.norm*.bias", zeros()),
    ]
    return request(tensors, rules, "mlp example")


GPT2_PARAMS = 124_439_808


def gpt2_small():
    """Hugging Face GPT2LMHeadModel("gpt2"): its state_dict names and shapes,
    lm_head.weight tied to transformer.wte.weight."""
    vocab, n_pos, d, n_layer = 50257, 1024, 768, 12
    dt = "float32"
    t = [
        param("transformer.wte.weight", [vocab, d], dt, "Embedding"),
        param("transformer.wpe.weight", [n_pos, d], dt, "Embedding"),
    ]
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        t += [
            param(p + "ln_1.weight", [d], dt, "LayerNorm"),
            param(p + "ln_1.bias", [d], dt, "LayerNorm"),
            param(p + "attn.c_attn.weight", [d, 3 * d], dt, "Conv1D"),
            param(p + "attn.c_attn.bias", [3 * d], dt, "Conv1D"),
            param(p + "attn.c_proj.weight", [d, d], dt, "Conv1D"),
            param(p + "attn.c_proj.bias", [d], dt, "Conv1D"),
            param(p + "ln_2.weight", [d], dt, "LayerNorm"),
            param(p + "ln_2.bias", [d], dt, "LayerNorm"),
            param(p + "mlp.c_fc.weight", [d, 4 * d], dt, "Conv1D"),
            param(p + "mlp.c_fc.bias", [4 * d], dt, "Conv1D"),
            param(p + "mlp.c_proj.weight", [4 * d, d], dt, "Conv1D"),
            param(p + "mlp.c_proj.bias", [d], dt, "Conv1D"),
        ]
    lm_head = param("lm_head.weight", [vocab, d], dt, "Linear")
    lm_head["tieTo"] = "transformer.wte.weight"
    t += [
        param("transformer.ln_f.weight", [d], dt, "LayerNorm"),
        param("transformer.ln_f.bias", [d], dt, "LayerNorm"),
        lm_head,
    ]
    # First match wins: LayerNorm weights before the "*.weight" catch-all.
    rules = [
        rule("*.ln_*.weight", ones()),
        rule("*.bias", zeros()),
        rule("*.weight", normal(0.0, 0.02)),
    ]
    # Torch mode: the weights equal what GPT-2's own init code draws.
    req = request(t, rules, "gpt2-small (124M)", rng="RNG_MODE_TORCH")
    assert count_params(req) == GPT2_PARAMS, count_params(req)
    return req


def llama(label, vocab, hidden, intermediate, layers, heads, kv_heads, dt,
          rotary_buffers, tie_embeddings, rng=None):
    """LLaMA-shaped (Hugging Face LlamaForCausalLM state_dict names)."""
    head_dim = hidden // heads
    t = [param("model.embed_tokens.weight", [vocab, hidden], dt, "Embedding")]
    for i in range(layers):
        p = f"model.layers.{i}."
        t += [
            param(p + "self_attn.q_proj.weight", [heads * head_dim, hidden], dt,
                  "Linear"),
            param(p + "self_attn.k_proj.weight", [kv_heads * head_dim, hidden],
                  dt, "Linear"),
            param(p + "self_attn.v_proj.weight", [kv_heads * head_dim, hidden],
                  dt, "Linear"),
            param(p + "self_attn.o_proj.weight", [hidden, heads * head_dim], dt,
                  "Linear"),
            param(p + "mlp.gate_proj.weight", [intermediate, hidden], dt,
                  "Linear"),
            param(p + "mlp.up_proj.weight", [intermediate, hidden], dt,
                  "Linear"),
            param(p + "mlp.down_proj.weight", [hidden, intermediate], dt,
                  "Linear"),
            param(p + "input_layernorm.weight", [hidden], dt, "LlamaRMSNorm"),
            param(p + "post_attention_layernorm.weight", [hidden], dt,
                  "LlamaRMSNorm"),
        ]
        if rotary_buffers:
            t.append(buffer(p + "self_attn.rotary_emb.inv_freq",
                            [head_dim // 2], "float32",
                            "LlamaRotaryEmbedding", persistent=False))
    lm_head = param("lm_head.weight", [vocab, hidden], dt, "Linear")
    if tie_embeddings:
        # tie_word_embeddings (as in Llama 3.2 1B): one storage, two names.
        lm_head["tieTo"] = "model.embed_tokens.weight"
    t += [param("model.norm.weight", [hidden], dt, "LlamaRMSNorm"), lm_head]
    rules = [
        rule("*norm.weight", ones()),
    ]
    if rotary_buffers:
        # inv_freq[i] = 1 / base^(2i / head_dim), as LlamaRotaryEmbedding
        # computes it (non-persistent: not in the state_dict).
        rules.append(rule("*.rotary_emb.inv_freq",
                          {"ropeInvFreq": {"base": 10000.0}}))
    rules.append(rule("*.weight", normal(0.0, 0.02)))
    return request(t, rules, label, rng=rng)


def llama_small():
    return llama("llama-small (hidden 512, 8 layers, bf16)", vocab=32000,
                 hidden=512, intermediate=1376, layers=8, heads=8, kv_heads=8,
                 dt="bfloat16", rotary_buffers=True, tie_embeddings=True,
                 rng="RNG_MODE_TORCH")


TINYLLAMA_PARAMS = 1_100_048_384


def llama_1b():
    # TinyLlama-1.1B's shapes (grouped-query attention: 4 key/value heads).
    # float32, as the master weights of mixed-precision training (4.4 GB).
    req = llama("llama-1b (TinyLlama-1.1B shapes, fp32)", vocab=32000,
                hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=4,
                dt="float32", rotary_buffers=False, tie_embeddings=False)
    assert count_params(req) == TINYLLAMA_PARAMS, count_params(req)
    return req


EXAMPLES = {
    "mlp.json": mlp,
    "gpt2-small.json": gpt2_small,
    "llama-small.json": llama_small,
    "llama-1b.json": llama_1b,
}


def render(req):
    """Pretty JSON with one tensor / one rule per line (diff-friendly)."""
    def one(obj):
        return json.dumps(obj, separators=(", ", ": "))

    model = req["model"]
    lines = ["{", ' "model": {', '  "tensors": [']
    lines += ["   " + one(t) + ("," if i + 1 < len(model["tensors"]) else "")
              for i, t in enumerate(model["tensors"])]
    lines += ["  ],", '  "initRules": [']
    lines += ["   " + one(r) + ("," if i + 1 < len(model["initRules"]) else "")
              for i, r in enumerate(model["initRules"])]
    lines += ["  ],", '  "seed": ' + one(model["seed"])
              + ("," if "rng" in model else "")]
    if "rng" in model:
        lines += ['  "rng": ' + one(model["rng"])]
    lines += [" },"]
    rest = [k for k in req if k != "model"]
    for i, k in enumerate(rest):
        lines.append(" " + one(k) + ": " + one(req[k])
                     + ("," if i + 1 < len(rest) else ""))
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == req
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if any file differs")
    ap.add_argument("--out", default=HERE, help="output folder (default: here)")
    args = ap.parse_args(argv)
    stale = []
    for fname, build in EXAMPLES.items():
        text = render(build())
        path = os.path.join(args.out, fname)
        if args.check:
            try:
                with open(path, encoding="utf-8") as f:
                    if f.read() == text:
                        continue
            except FileNotFoundError:
                pass
            stale.append(fname)
        else:
            with open(path, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
            print(f"wrote {path}")
    if stale:
        print("stale: " + ", ".join(stale) + " (run examples/generate.py)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
