#!/usr/bin/env python3
"""Assemblies at DeepSeek-V3's count, small sizes: 58 layers x 256 experts
x (w1, w3, w2) stored one tensor each (44,544 tensors), assembled into 58
gate_up [256, 2*I, H] and 58 down [256, H, I] tensors (44,544 parts):
the request's size, Materialize's round trip and the server's validate
(where the parts are checked) and checkpoint phases, 3 repetitions; the
values of two tensors checked once.

    bazel build //server:materializerd //proto:materializer_py
    .venv/bin/python bench/assembly_scale.py
"""
import json
import os
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
os.environ.setdefault("MATERIALIZERD", os.path.join(REPO, "bazel-bin", "server", "materializerd"))
os.environ.setdefault("MATERIALIZER_PY_PROTO", os.path.join(REPO, "bazel-bin", "proto"))
import serverproc  # noqa: E402
import matutil as m  # noqa: E402
L, E, I, H = 58, 256, 4, 8
root = os.path.join(tempfile.gettempdir(), "materializer-bench-assembly")
os.makedirs(root, exist_ok=True)
path = os.path.join(root, "moe.safetensors")
if not os.path.exists(path):
    sd = {}
    for l in range(L):
        for e in range(E):
            sd[f"l{l}.e{e}.w1"] = torch.full((I, H), float(e))
            sd[f"l{l}.e{e}.w3"] = torch.full((I, H), -float(e))
            sd[f"l{l}.e{e}.w2"] = torch.full((H, I), float(l))
    save_file(sd, path)
tensors, assemblies = [], []
for l in range(L):
    tensors.append({"name": f"l{l}.gate_up", "shape": [E, 2 * I, H], "dtype": "float32"})
    tensors.append({"name": f"l{l}.down", "shape": [E, H, I], "dtype": "float32"})
    assemblies.append({"tensor": f"l{l}.gate_up", "parts":
        [{"key": f"l{l}.e{e}.w1", "offset": [e, 0, 0]} for e in range(E)] +
        [{"key": f"l{l}.e{e}.w3", "offset": [e, I, 0]} for e in range(E)]})
    assemblies.append({"tensor": f"l{l}.down", "parts":
        [{"key": f"l{l}.e{e}.w2", "offset": [e, 0, 0]} for e in range(E)]})
req_json = {"model": {"tensors": tensors}, "checkpoint": {"path": "models/moe.safetensors",
                                                          "assemblies": assemblies}}
with serverproc.running_server(extra_args=(f"--checkpoint_roots=models={root}",)) as srv:
    req = srv.parse_request(json.dumps(req_json))
    print(f"request {req.ByteSize() / 1e6:.2f} MB, {sum(len(a['parts']) for a in assemblies)} parts")
    for rep in range(3):
        t0 = time.perf_counter()
        resp = srv.materialize(req, "scale")
        wall = time.perf_counter() - t0
        t = resp.timings
        print(f"rep {rep}: Materialize {wall * 1e3:.0f} ms (server: validate {t.validate_us / 1e3:.0f} ms, "
              f"checkpoint {t.checkpoint_us / 1e3:.0f} ms, total {t.total_us / 1e3:.0f} ms), "
              f"loaded {resp.checkpoint.tensors_loaded}")
        if rep == 0:
            got = m.load_safetensors(srv.fetch(resp.handle, "scale"))
            g = got["l7.gate_up"]
            assert torch.equal(g[:, :I], torch.arange(E, dtype=torch.float32).view(E, 1, 1).expand(E, I, H))
            assert torch.equal(g[:, I:], -torch.arange(E, dtype=torch.float32).view(E, 1, 1).expand(E, I, H))
            assert torch.all(got["l57.down"] == 57)
        srv.release(resp.handle, "scale")
