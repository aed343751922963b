#!/usr/bin/env python3
"""Plan at scale: the round trip of a Plan of a DeepSeek-V3-shaped model from
Python, split into client encode, the call, and client decode, with and
without the per-tensor listing (PlanRequest.summary_only).

The spec is generated here from DeepSeek-V3's published shapes (61 layers,
hidden 7168; the first 3 dense (intermediate 18432), 58 mixture-of-experts
layers of 256 routed experts (intermediate 2048) and one shared expert;
multi-head latent attention; vocabulary 129280): 45,395 tensors, 671 B
parameters, bfloat16, every tensor named and shaped, inits by pattern
rules (normal std 0.006 for weights, ones for norms, zeros for the
router's bias). Nothing is allocated: Plan only.

Interleaved repetitions of the two modes (after a warm-up), medians:

    .venv/bin/python bench/plan_scale.py            # print the table
    .venv/bin/python bench/plan_scale.py --write    # ... and update bench/RESULTS.md
"""

import argparse
import datetime
import os
import re
import shlex
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import run as bench_run  # noqa: E402


def deepseek_v3_tensors():
    """[(name, shape)] in the order the checkpoint lists them."""
    hidden, vocab, layers, dense_layers = 7168, 129280, 61, 3
    heads, q_lora, kv_lora, nope, rope, v_dim = 128, 1536, 512, 128, 64, 128
    dense_ffn, expert_ffn, experts = 18432, 2048, 256
    out = [("model.embed_tokens.weight", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_a_proj.weight", [q_lora, hidden]),
            (p + "self_attn.q_a_layernorm.weight", [q_lora]),
            (p + "self_attn.q_b_proj.weight", [heads * (nope + rope), q_lora]),
            (p + "self_attn.kv_a_proj_with_mqa.weight", [kv_lora + rope, hidden]),
            (p + "self_attn.kv_a_layernorm.weight", [kv_lora]),
            (p + "self_attn.kv_b_proj.weight", [heads * (nope + v_dim), kv_lora]),
            (p + "self_attn.o_proj.weight", [hidden, heads * v_dim]),
        ]
        if i < dense_layers:
            out += [(p + f"mlp.{n}.weight", s) for n, s in (
                ("gate_proj", [dense_ffn, hidden]), ("up_proj", [dense_ffn, hidden]),
                ("down_proj", [hidden, dense_ffn]))]
        else:
            out += [(p + "mlp.gate.weight", [experts, hidden]),
                    (p + "mlp.gate.e_score_correction_bias", [experts])]
            for e in range(experts):
                q = p + f"mlp.experts.{e}."
                out += [(q + "gate_proj.weight", [expert_ffn, hidden]),
                        (q + "up_proj.weight", [expert_ffn, hidden]),
                        (q + "down_proj.weight", [hidden, expert_ffn])]
            out += [(p + f"mlp.shared_experts.{n}.weight", s) for n, s in (
                ("gate_proj", [expert_ffn, hidden]), ("up_proj", [expert_ffn, hidden]),
                ("down_proj", [hidden, expert_ffn]))]
        out += [(p + "input_layernorm.weight", [hidden]),
                (p + "post_attention_layernorm.weight", [hidden])]
    out += [("model.norm.weight", [hidden]), ("lm_head.weight", [vocab, hidden])]
    return out


def request(pb, summary_only):
    tensors = deepseek_v3_tensors()
    model = pb.ModelSpec(rng=pb.RNG_MODE_PORTABLE)
    for name, shape in tensors:
        model.tensors.add(name=name, shape=shape, dtype="bfloat16")
    model.init_rules.add(pattern="*norm.weight", init=pb.InitScheme(ones=pb.Ones()))
    model.init_rules.add(pattern="*e_score_correction_bias",
                         init=pb.InitScheme(zeros=pb.Zeros()))
    model.init_rules.add(pattern="*", init=pb.InitScheme(normal=pb.Normal(mean=0, std=0.006)))
    return pb.PlanRequest(model=model, summary_only=summary_only), len(tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--server", default=os.environ.get(
        "MATERIALIZERD", os.path.join(REPO, "bazel-bin", "server", "materializerd")))
    ap.add_argument("--proto", default=os.environ.get(
        "MATERIALIZER_PY_PROTO", os.path.join(REPO, "bazel-bin", "proto")))
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    command = " ".join([".venv/bin/python", "bench/plan_scale.py"]
                       + [shlex.quote(a) for a in sys.argv[1:]])
    svc = bench_run.Service(args.server, args.proto, os.cpu_count())
    pb = svc.pb
    import grpc
    channel = grpc.insecure_channel(svc.address, options=[
        ("grpc.max_receive_message_length", 256 << 20),
        ("grpc.max_send_message_length", 256 << 20)])
    plan_call = channel.unary_unary(
        "/materializer.v1.Materializer/Plan",
        request_serializer=lambda b: b, response_deserializer=lambda b: b)
    modes = {"full listing": False, "summary_only": True}
    results = {m: {"build": [], "encode": [], "call": [], "decode": [], "total": [],
                   "req": 0, "resp": 0} for m in modes}
    params = 0
    try:
        for i in range(args.reps + 1):
            for mode, summary in (list(modes.items()) if i % 2 == 0
                                  else list(modes.items())[::-1]):
                tb = time.perf_counter()
                req, n = request(pb, summary)
                t0 = time.perf_counter()
                data = req.SerializeToString()
                t1 = time.perf_counter()
                raw = plan_call(data, timeout=600)
                t2 = time.perf_counter()
                resp = pb.PlanResponse.FromString(raw)
                t3 = time.perf_counter()
                assert len(resp.tensors) == (0 if summary else n), len(resp.tensors)
                params = resp.num_elements
                r = results[mode]
                r["req"], r["resp"], r["n"] = len(data), len(raw), n
                if i > 0:
                    r["build"].append(t0 - tb)
                    r["encode"].append(t1 - t0)
                    r["call"].append(t2 - t1)
                    r["decode"].append(t3 - t2)
                    r["total"].append(t3 - t0)
                print(f"{'rep' if i else 'warm-up'} {i}: {mode} {t3 - t0:.3f} s "
                      f"(encode {t1 - t0:.3f}, call {t2 - t1:.3f}, decode {t3 - t2:.3f})",
                      file=sys.stderr)
    finally:
        channel.close()
        svc.stop()
    med = statistics.median
    base = med(results["full listing"]["total"])
    from google.protobuf.internal import api_implementation
    lines = [f"Plan of a DeepSeek-V3-shaped spec: {results['full listing']['n']:,} tensors, "
             f"{params / 1e9:,.0f} B parameters (bfloat16), from Python (grpcio, protobuf "
             f"{api_implementation.Type()}). Median of {args.reps} interleaved "
             "repetitions (min–max), milliseconds. Round trip = encode (serializing the "
             "request) + call (the bytes there and back: the server's validation, init "
             "resolution and layout, the response's encoding) + decode (parsing the "
             "response); build = making the request message from the tensor list, which "
             "a client does once per model, shown apart.", "",
             "| mode | request | response | build | encode | call | decode | round trip | ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, r in results.items():
        lines.append(
            f"| {mode} | {r['req'] / 1e6:.1f} MB | {r['resp'] / 1e6:.2f} MB | "
            f"{bench_run.ms(med(r['build']))} | "
            f"{bench_run.ms(med(r['encode']))} | {bench_run.ms(med(r['call']))} | "
            f"{bench_run.ms(med(r['decode']))} | {bench_run.ms(med(r['total']))} "
            f"({bench_run.ms(min(r['total']))}–{bench_run.ms(max(r['total']))}) | "
            f"**{med(r['total']) / base:.2f}** |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        mach = bench_run.machine()
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        key = re.sub(r"[^a-z0-9]+", "-", f"plan {mach['cpu']} {mach['cores']}c".lower())
        body = "\n".join([f"## Plan at scale: {mach['cpu']}, {mach['cores']} cores, {mach['ram']}",
                          "", f"- command: `{command}`", f"- date: {date}",
                          f"- commit {bench_run.git_commit()}", "", table])
        bench_run.write_results(key.strip("-"), body, mark="bench/plan_scale.py")


if __name__ == "__main__":
    main()
