"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/).

Two kinds of files, each named for what it is, so a failing replay names
its case:
  seed-*     from examples/: every request file as it is (Plan only: too
             big for the fuzz pool) and shrunk (every size at most 8) so
             Materialize, Describe and fetch run too, in both RNG modes
             and every fetch format;
  regress-*  the inputs of known bugs (issue 10): overflowing shapes,
             out-of-range init parameters, empty shard boxes, names with
             quotes and backslashes, long tie chains, large class
             patterns, long strings that errors echo, values and
             init_steps; for the checkpoint readers, the malformed
             headers, indexes and archives they must refuse.
The torch_archive_fuzzer seeds are written by torch.save (the venv's
torch).
Files a fuzzer finds later are added by hand as found-* (not touched here).

    bazel build //proto:materializer_py
    .venv/bin/python fuzz/seeds.py          # (re)write seed-* and regress-*
    .venv/bin/python fuzz/seeds.py --check  # exit 1 if any is stale
"""

import argparse
import base64
import copy
import json
import io
import os
import struct
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "fuzz", "corpus")
PY_PROTO = os.environ.get("MATERIALIZER_PY_PROTO",
                          os.path.join(REPO, "bazel-bin", "proto"))

KIB = 1 << 10
MIB = 1 << 20
# Longer than any error message may be (gRPC refuses larger trailers).
ECHO = 16 * KIB


def examples():
    folder = os.path.join(REPO, "examples")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                yield name[:-len(".json")], f.read()


def shrink(request, limit=8):
    """Every size at most `limit`; RoPE buffers keep their default dim."""
    small = copy.deepcopy(request)
    for t in small["model"]["tensors"]:
        t["shape"] = [min(int(s), limit) for s in t["shape"]]
    return small


def tensor(name, shape, init=None, dtype="float32", **extra):
    t = {"name": name, "shape": shape, "dtype": dtype}
    if init is not None:
        t["init"] = init
    t.update(extra)
    return t


def model(*tensors, rng=None, rules=None, **extra):
    m = {"tensors": list(tensors), "seed": "7"}
    if rng:
        m["rng"] = rng
    if rules:
        m["initRules"] = rules
    m.update(extra)
    return {"model": m}


TORCH = "RNG_MODE_TORCH"
PORTABLE = "RNG_MODE_PORTABLE"


def request_regressions():
    """(name, MaterializeRequest as JSON-able dict) of known bad inputs."""
    out = []
    add = lambda name, req: out.append((name, req))
    # INTERNAL "Stride calculation overflowed".
    add("zero-size-stride-overflow",
        model(tensor("w", [0, 4294967296, 4294967296], {"zeros": {}})))
    for rng in (TORCH, PORTABLE):
        mode = rng.split("_")[-1].lower()
        for scheme in ("xavierUniform", "xavierNormal"):
            add(f"{scheme}-gain-minus-1-{mode}",
                model(tensor("w", [4, 4], {scheme: {"gain": {"value": -1}}}),
                      rng=rng))
        add(f"normal-std-1e308-{mode}",
            model(tensor("w", [4, 4], {"normal": {"std": 1e308}}), rng=rng))
        add(f"trunc-normal-std-1e308-{mode}",
            model(tensor("w", [4, 4], {"truncNormal": {"std": 1e308}}),
                  rng=rng))
        add(f"uniform-huge-range-{mode}",
            model(tensor("w", [4, 4], {"uniform": {"a": -1e308, "b": 1e308}}),
                  rng=rng))
    add("sparse-std-1e308-torch",
        model(tensor("w", [4, 4], {"sparse": {"sparsity": 0.5, "std": 1e308}}),
              rng=TORCH))
    # Portable mode with 2^62 and more elements (1-byte dtypes keep the
    # bytes under 2^63), materialized as small shards.
    add("portable-2pow62-elements-shard",
        model(tensor("w", [2147483648, 2147483648], {"normal": {}},
                     dtype="float8_e4m3fn",
                     shard={"box": [{"offset": "0", "length": "1"},
                                    {"offset": "2147483632",
                                     "length": "16"}]}),
              rng=PORTABLE))
    add("portable-2pow62-plus-1d-shard-at-end",
        model(tensor("w", [4611686018427388000], {"uniform": {}},
                     dtype="uint8",
                     shard={"box": [{"offset": "4611686018427387990",
                                     "length": "10"}]}),
              rng=PORTABLE))
    # A shard with an empty box, and an invalid parameter that nothing
    # then checks.
    add("shard-empty-box-invalid-std",
        model(tensor("w", [8, 8], {"normal": {"std": -1}},
                     shard={"box": [{"offset": "0", "length": "0"},
                                    {"offset": "0", "length": "8"}]}),
              rng=PORTABLE))
    add("shard-empty-box-invalid-gain",
        model(tensor("w", [8, 8], {"xavierUniform": {"gain": {"value": -1}}},
                     shard={"box": [{"offset": "3", "length": "0"},
                                    {"offset": "0", "length": "8"}]}),
              rng=PORTABLE))
    add("zero-d-empty-box", model(tensor("s", [], {"ones": {}}, shard={}),
                                  rng=PORTABLE))
    add("zero-d-split",
        model(tensor("s", [], {"ones": {}},
                     shard={"split": {"dim": 0, "index": "0", "count": "1"}}),
              rng=PORTABLE))
    add("no-tensors", {"model": {}})
    add("empty-request", {})
    # Names a JSON header must escape.
    add("names-with-quote-and-backslash",
        model(tensor('a"b.weight', [2, 3]), tensor("c\\d.bias", [3]),
              tensor('e\\"f', [2]),
              rules=[{"pattern": '*"*', "init": {"normal": {"std": 0.5}}},
                     {"pattern": "*\\*", "init": {"ones": {}}}]))
    # Literal values and init steps.
    add("values-float32",
        model(tensor("v", [2, 2], {"values": {"data": base64.b64encode(
            b"\x00\x00\x80\x3f" * 4).decode()}})))
    add("values-wrong-size",
        model(tensor("v", [2, 2], {"values": {"data": "AAAA"}})))
    add("init-steps-row-zeroed",
        model(tensor("emb", [4, 3], initSteps=[
            {"init": {"normal": {"std": 0.02}}},
            {"init": {"zeros": {}}, "region": [
                {"offset": "1", "length": "1"},
                {"offset": "0", "length": "3"}]}])))
    # Errors that echo what they were sent.
    long = "q" * ECHO
    add("echo-dtype", model(tensor("w", [2], {"zeros": {}}, dtype=long)))
    add("echo-device",
        dict(model(tensor("w", [2], {"zeros": {}})),
             placement={"device": long}))
    add("echo-split-device",
        dict(model(tensor("w", [2], {"zeros": {}})),
             placement={"device": "split", "split": {"devices": [long]}}))
    add("echo-split-max-memory",
        dict(model(tensor("w", [2], {"zeros": {}})),
             placement={"device": "split",
                        "split": {"maxMemory": {"cpu:0": long}}}))
    add("echo-bad-pattern",
        model(tensor("w", [2]),
              rules=[{"pattern": "[" + long, "init": {"zeros": {}}}]))
    add("echo-unmatched-pattern",
        model(tensor("w", [2], {"zeros": {}}),
              rules=[{"pattern": long, "init": {"zeros": {}}}]))
    add("echo-tie-to",
        model(tensor("w", [2], {"zeros": {}}), tensor("v", [2], tieTo=long)))
    add("echo-nonlinearity",
        model(tensor("w", [2, 2], {"kaimingUniform": {"nonlinearity": long}})))
    add("echo-gain-nonlinearity",
        model(tensor("w", [2, 2], {"xavierUniform": {
            "gain": {"nonlinearity": long}}})))
    add("echo-kaiming-mode",
        model(tensor("w", [2, 2], {"kaimingNormal": {"mode": long}})))
    add("echo-rope-scaling",
        model(tensor("f", [4], {"ropeInvFreq": {"scaling": {"type": long}}})))
    add("echo-module-type",
        model(tensor("m.weight", [2, 2], {"moduleDefault": {}},
                     moduleType=long)))
    add("echo-label", dict(model(tensor("w", [2], {"zeros": {}})),
                           label=long))
    # An export of private memory, and of a handle named by the caller.
    add("open-export-private", dict(model(tensor("w", [2], {"zeros": {}})),
                                    openExport={}))
    add("open-export-handle", dict(model(tensor("w", [2], {"zeros": {}})),
                                   exportable=True, openExport={"handle": long}))
    # complex64: the deterministic inits it takes, random and computed ones
    # it refuses, values with a NaN imaginary part.
    for scheme in ({"constant": {"val": -2.5}}, {"ones": {}}, {"normal": {}},
                   {"arange": {}}, {"ropeInvFreq": {}}, {"eye": {}}):
        add(f"complex64-{next(iter(scheme))}",
            model(tensor("c", [4, 4], scheme, dtype="complex64")))
    nan_imag = struct.pack("<8f", 1, 0, 0.5, float("nan"), 0, 0, 1, 1)
    add("complex64-values-nan-imaginary",
        model(tensor("c", [4], {"values": {"data": base64.b64encode(nan_imag).decode()}},
                     dtype="complex64")))
    return out


def tie_chain(pb, n):
    """n tensors, each tied to the one before: quadratic to resolve."""
    req = pb.MaterializeRequest()
    req.model.seed = 7
    root = req.model.tensors.add(name="t0", shape=[4], dtype="float32")
    root.init.zeros.SetInParent()
    for i in range(1, n):
        req.model.tensors.add(name=f"t{i}", shape=[4], dtype="float32",
                              tie_to=f"t{i - 1}")
    return req


def class_pattern_plan(pb, pattern_bytes, tensors):
    """A rule whose class pattern is long, against long names of 'b'."""
    req = pb.MaterializeRequest()
    req.model.seed = 7
    for i in range(tensors):
        t = req.model.tensors.add(name="b" * 500 + f".{i:03d}", shape=[2],
                                  dtype="float32")
        t.init.zeros.SetInParent()
    rule = req.model.init_rules.add(pattern="*[" + "b" * pattern_bytes + "]c")
    rule.init.ones.SetInParent()
    return req


def derived_requests():
    """Requests with derived values: a dt bias program over a draw, and a
    weight norm (a norm of another tensor, sharded)."""
    dt_ops = [{"kind": "MUL", "x": 0, "c": 4.605170185988091},
              {"kind": "ADD", "x": 1, "c": -6.907755278982137},
              {"kind": "EXP", "x": 2}, {"kind": "CLAMP", "x": 3, "min": 0.0001},
              {"kind": "NEG", "x": 4}, {"kind": "EXPM1", "x": 5},
              {"kind": "NEG", "x": 6}, {"kind": "LOG", "x": 7},
              {"kind": "ADD", "x": 4, "y": 8}]
    yield "dt-bias", {"model": {"seed": "3", "tensors": [
        {"name": "dt.bias", "shape": [16], "dtype": "bfloat16",
         "initSteps": [{"init": {"uniform": {}},
                        "map": {"dtype": "float32", "ops": dt_ops}}]}]}}
    yield "weight-norm", {"model": {"seed": "3", "tensors": [
        {"name": "g", "shape": [4, 1, 1], "dtype": "float32",
         "init": {"normOf": {"tensor": "v", "dim": 0}},
         "shard": {"split": {"dim": 0, "index": 1, "count": 2}}},
        {"name": "v", "shape": [4, 3, 2], "dtype": "float32",
         "init": {"normal": {"std": 0.5}}}]}}


def request_corpus(pb, json_format):
    files = {}

    def add_json(name, text, flags=0):
        files[name] = bytes([flags | 1]) + text.encode("utf-8")

    def add_binary(name, message, flags=0):
        files[name] = bytes([flags & ~1]) + message.SerializeToString()

    def parse(obj):
        return json_format.ParseDict(obj, pb.MaterializeRequest())

    for name, text in examples():
        add_json(f"seed-{name}.json", text)
        add_binary(f"seed-{name}.bin", json_format.Parse(
            text, pb.MaterializeRequest()))
        small = shrink(json.loads(text))
        for fmt in range(4):
            for rng in (TORCH, PORTABLE):
                s = copy.deepcopy(small)
                s["model"]["rng"] = rng
                # Fetch format in bits 1-2; odd formats also write
                # non-persistent buffers and ties once.
                flags = (fmt << 1) | ((fmt & 1) << 3) | ((fmt & 1) << 4)
                add_json(f"seed-{name}-small-{rng.split('_')[-1].lower()}"
                         f"-format{fmt}.json", json.dumps(s), flags)
        # The caller goes away after 0, 1, 2 or 5 polls (flag bits 5-7).
        for k in range(4):
            s = copy.deepcopy(small)
            s["model"]["rng"] = TORCH if k % 2 else PORTABLE
            add_json(f"seed-{name}-small-caller-leaves-{k}.json", json.dumps(s),
                     0x20 | (k << 6))
        split = copy.deepcopy(small)
        split["placement"] = {"device": "split", "split": {
            "devices": ["cpu:1", "cpu:0"], "maxMemory": {"cpu:1": "4KiB"}}}
        add_json(f"seed-{name}-small-split.json", json.dumps(split))
        # Exported with the handle, closed by its release.
        exported = copy.deepcopy(small)
        exported.update(exportable=True, openExport={})
        add_json(f"seed-{name}-small-open-export.json", json.dumps(exported))
    for name, req in derived_requests():
        for rng in (TORCH, PORTABLE):
            r = copy.deepcopy(req)
            r["model"]["rng"] = rng
            add_json(f"seed-derived-{name}-{rng.split('_')[-1].lower()}.json",
                     json.dumps(r))
    for name, req in request_regressions():
        add_json(f"regress-{name}.json", json.dumps(req))
        add_binary(f"regress-{name}.bin", parse(req))
    add_binary("regress-tie-chain-20000.bin", tie_chain(pb, 20000))
    add_binary("regress-class-pattern-1mib-plan.bin",
               class_pattern_plan(pb, MIB, 64))
    return files


# -- glob_fuzzer: PATTERN \0 NAME, with 0xFF N C runs -------------------------

def run(char, count):
    """The glob fuzzer's run encoding: `char` repeated `count` times
    (rounded down to whole KiB, at most 256 KiB per run, runs chained)."""
    out = b""
    kib = count // KIB
    while kib > 0:
        n = min(kib, 256)
        out += bytes([0xFF, n - 1]) + char
        kib -= n
    return out


def glob_corpus():
    cases = {
        "seed-suffix": (b"*.bias", b"h.0.attn.bias"),
        "seed-layers": (b"h.*.ln_?.weight", b"h.11.ln_2.weight"),
        "seed-class": (b"layers.[0-3].mlp.*", b"layers.2.mlp.up_proj.weight"),
        "seed-negated": (b"*.[!b]ias", b"x.bias"),
        "seed-caret": (b"[^a-c]x", b"dx"),
        "seed-bracket-first": (b"[]]x", b"]x"),
        "seed-negated-bracket": (b"[!]]x", b"ax"),
        "seed-dash-edges": (b"[-a][a-]", b"-a"),
        "seed-reversed-range": (b"[z-a]", b"m"),
        "seed-high-bytes": (b"[a-\xc3]", b"b"),
        "seed-stars": (b"*a*a*a*a*a*a*b", b"a" * 60),
        "seed-question": (b"????", b"abcd"),
        "seed-literal-specials": (b"[*][?][[]", b"*?["),
        "seed-empty-name": (b"*", b""),
        "regress-class-2mib": (b"*[" + run(b"b", 2 * MIB) + b"]c",
                               run(b"b", KIB)),
        "regress-class-256kib-star": (b"*[" + run(b"b", 256 * KIB) + b"]*c",
                                      run(b"b", KIB)),
        "regress-literal-2mib": (run(b"a", 2 * MIB), b"a" * 512),
        "regress-many-stars": (b"*b" * 2000 + b"c", b"b" * 512),
    }
    return {name: p + b"\0" + n for name, (p, n) in cases.items()}


# -- weight_file_fuzzer: the handle description MakeHandle reads --------------

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int16",
          "int32", "int64", "uint8", "bool", "float8_e4m3fn", "float8_e5m2",
          "complex64"]


def encode_handle(tensors, metadata=(), tail=b""):
    """tensors: (name, dtype, shape, tie group 0|2|3); see MakeHandle."""
    def name_bytes(name):
        data = name.encode()
        assert 1 <= len(data) <= 24 and all(0x21 <= c < 0x7F for c in data)
        return bytes([len(data) - 1]) + bytes(c - 0x21 for c in data)
    out = bytes([len(tensors)])
    for name, dtype, shape, tie in tensors:
        out += name_bytes(name) + bytes([DTYPES.index(dtype), len(shape)])
        out += bytes(shape) + bytes([tie])
    out += bytes([len(metadata)])
    for key, value in metadata:
        out += name_bytes(key) + name_bytes(value)
    return out + tail


def weight_file_corpus():
    ranges = bytes(range(0, 256, 7))
    cases = {
        "seed-empty-handle": encode_handle([]),
        "seed-one-tensor": encode_handle([("w", "float32", [2, 3], 0)]),
        "seed-every-dtype": encode_handle(
            [(f"t.{d}", d, [3], 0) for d in DTYPES[:8]], tail=ranges),
        "seed-float8-and-bool": encode_handle(
            [("a", "float8_e4m3fn", [2, 2], 0), ("b", "float8_e5m2", [5], 0),
             ("c", "bool", [3], 0), ("d", "uint8", [6], 0)]),
        "seed-ties": encode_handle(
            [("wte.weight", "bfloat16", [4, 3], 2),
             ("lm_head.weight", "float32", [1], 2),
             ("x", "int64", [2], 3), ("y", "int64", [9], 3)]),
        "seed-zero-sizes-and-scalars": encode_handle(
            [("empty", "float32", [0], 0), ("scalar", "float64", [], 0),
             ("zero.mid", "int32", [3, 0, 2], 0)]),
        "seed-metadata": encode_handle(
            [("w", "float16", [2], 0)],
            metadata=[("format", "pt"), ("tie:x", "y")]),
        "regress-quote-backslash-names": encode_handle(
            [('a"b', "float32", [2], 0), ("c\\d", "float32", [2], 0),
             ('\\"', "int8", [3], 0), ("e}{", "int16", [1], 0)],
            metadata=[('k"', 'v\\')]),
    }
    return cases


# -- checkpoint_header_fuzzer: safetensors headers and shard indexes ----------
# First byte: 0 a header (then the data section's size, u16), 1 a whole
# safetensors file, 2 a shard index (see the target).

ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4,
               "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1,
               "F8_E5M2": 1}


def st_header(tensors, metadata=None):
    """tensors: (name, dtype, shape); laid back to back. -> (JSON, size)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    at = 0
    for name, dtype, shape in tensors:
        n = ST_ITEMSIZE.get(dtype, 1)
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [at, at + n]}
        at += n
    return json.dumps(header, separators=(",", ":")), at


def header_case(text, data_size):
    return b"\x00" + struct.pack("<H", data_size) + text.encode("utf-8")


def file_case(text, data_size, pad=True):
    """A whole file, the header padded with spaces to 8 bytes as the
    safetensors library writes it."""
    header = text.encode("utf-8")
    if pad:
        header += b" " * (-len(header) % 8)
    data = bytes(i % 251 for i in range(data_size))
    return b"\x01" + struct.pack("<Q", len(header)) + header + data


def index_case(text):
    return b"\x02" + text.encode("utf-8")


def checkpoint_header_corpus():
    cases = {}
    two, two_size = st_header([("w", "F32", [2, 2]), ("b", "BF16", [3])])
    cases["seed-header-two-tensors"] = header_case(two, two_size)
    cases["seed-file-two-tensors"] = file_case(two, two_size)
    every, every_size = st_header(
        [(f"t.{d.lower()}", d, [3]) for d in ST_ITEMSIZE])
    cases["seed-header-every-dtype"] = header_case(every, every_size)
    meta, meta_size = st_header(
        [('a"b\\c', "I64", []), ("\u00e9\n", "F16", [0, 3]),
         ("x", "U8", [1, 1, 1])],
        metadata={"format": "pt", 'k"': "v\\", "\u2603": ""})
    cases["seed-header-metadata-escapes"] = header_case(meta, meta_size)
    cases["seed-file-metadata-escapes"] = file_case(meta, meta_size)
    cases["seed-header-empty"] = header_case("{}", 0)
    f32 = '{"dtype":"F32","shape":[2],"data_offsets":'
    regress = {
        "overlap": ('{"a":' + f32 + '[0,8]},"b":' + f32 + '[4,12]}}', 12),
        "gap": ('{"a":' + f32 + '[4,12]}}', 12),
        "past-end": ('{"a":' + f32 + '[0,8]}}', 4),
        "trailing-bytes": ('{"a":' + f32 + '[0,8]}}', 9),
        "size-mismatch": ('{"a":' + f32 + '[0,4]}}', 4),
        "unknown-dtype": ('{"a":{"dtype":"U16","shape":[2],'
                          '"data_offsets":[0,4]}}', 4),
        "duplicate-key": ('{"a":' + f32 + '[0,8]},"a":' + f32 + '[0,8]}}', 8),
        "overflow-shape": ('{"a":{"dtype":"F64","shape":[4294967296,'
                           '4294967296,2],"data_offsets":[0,0]}}', 0),
        "huge-offsets": ('{"a":{"dtype":"U8","shape":[0],"data_offsets":'
                         '[18446744073709551615,18446744073709551615]}}', 0),
        "negative-zero": ('{"a":{"dtype":"U8","shape":[-0],'
                          '"data_offsets":[0,0]}}', 0),
        "float-shape": ('{"a":{"dtype":"U8","shape":[1e0],'
                        '"data_offsets":[0,1]}}', 1),
        "lone-surrogate": ('{"\\ud800":{}}', 0),
        "deep-nesting": ('{"__metadata__":' + "[" * 100 + "]" * 100 + "}", 0),
        "metadata-not-string": ('{"__metadata__":{"k":1}}', 0),
        "extra-field": ('{"a":{"dtype":"U8","shape":[],"data_offsets":[0,1],'
                        '"x":null}}', 1),
    }
    for name, (text, size) in regress.items():
        cases[f"regress-header-{name}"] = header_case(text, size)
    cases["regress-file-length-past-end"] = (
        b"\x01" + struct.pack("<Q", 1 << 40) + b"{}")
    cases["regress-file-length-over-limit"] = (
        b"\x01" + struct.pack("<Q", 100000001) + b"{}")
    cases["regress-file-shorter-than-length"] = b"\x01\x08\x00\x00"
    weight_map = {f"transformer.h.{i}.{p}": f"model-0000{1 + i % 2}-of-00002"
                  ".safetensors" for i in range(3) for p in ("ln.weight",
                                                             "attn.bias")}
    cases["seed-index-save-pretrained"] = index_case(json.dumps(
        {"metadata": {"total_parameters": 108544, "total_size": 434176},
         "weight_map": weight_map}, indent=2, sort_keys=True) + "\n")
    index_regress = {
        "dotdot": '{"weight_map":{"w":"../model.safetensors"}}',
        "slash": '{"weight_map":{"w":"sub/model.safetensors"}}',
        "dot": '{"weight_map":{"w":"."}}',
        "empty-name": '{"weight_map":{"w":""}}',
        "nul": '{"weight_map":{"w":"a\\u0000b"}}',
        "not-string": '{"weight_map":{"w":7}}',
        "duplicate-tensor": '{"weight_map":{"w":"a","w":"b"}}',
        "no-weight-map": '{"metadata":{}}',
        "metadata-duplicate": '{"metadata":{"k":1,"k":2},"weight_map":{}}',
    }
    for name, text in index_regress.items():
        cases[f"regress-index-{name}"] = index_case(text)
    return cases


# -- torch_archive_fuzzer: torch.save archives --------------------------------

def torch_save(obj, **kwargs):
    import torch
    out = io.BytesIO()
    torch.save(obj, out, **kwargs)
    return out.getvalue()


def rezip(archive, replace):
    """The archive's entries, stored, in order, with `replace` (name ->
    bytes) applied."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as src, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = replace.get(info.filename, src.read(info.filename))
            entry = zipfile.ZipInfo(info.filename, (1980, 1, 1, 0, 0, 0))
            dst.writestr(entry, data)
    return out.getvalue()


def torch_archive_corpus():
    """Files torch.save writes (needs the project venv's torch)."""
    import collections
    import torch
    sd = collections.OrderedDict()
    weight = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    sd["linear.weight"] = weight
    sd["embed.weight"] = torch.ones(4, 2, dtype=torch.bfloat16)
    sd["lm_head.weight"] = sd["embed.weight"]
    sd["row"] = weight[1]
    sd["steps"] = torch.tensor(7)
    sd["mask"] = torch.tensor([True, False])
    sd._metadata = collections.OrderedDict([("", {"version": 1})])
    plain = {"a": torch.tensor([1.0, 2.0]),
             "b": torch.tensor([[3, 4]], dtype=torch.int16)}
    cases = {
        "seed-state-dict": torch_save(sd),
        "seed-plain-dict-protocol4": torch_save(plain, pickle_protocol=4),
        "seed-float8-parameter": torch_save(
            {"s": torch.zeros(4, dtype=torch.float8_e4m3fn),
             "p": torch.nn.Parameter(torch.ones(2, dtype=torch.float16))}),
        "seed-empty": torch_save({}),
        "regress-noncontiguous": torch_save(
            {"t": torch.arange(12.0).reshape(3, 4).t()}),
        "regress-complex": torch_save({"c": torch.zeros(2, dtype=torch.cfloat)}),
        "regress-nested-dict": torch_save({"model": {"w": torch.ones(1)}}),
    }
    # The start of the legacy (pre-1.6) format: pickles, no zip. (Whole
    # legacy files name storages by memory address: not reproducible.)
    import pickle
    cases["regress-legacy-format-start"] = (
        pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) +
        pickle.dumps(1001, protocol=2) +
        pickle.dumps({"protocol_version": 1001, "little_endian": True,
                      "type_sizes": {"short": 2, "int": 4, "long": 4}},
                     protocol=2))
    cases["regress-big-endian"] = rezip(cases["seed-plain-dict-protocol4"],
                                        {"archive/byteorder": b"big"})
    cases["seed-rezipped"] = rezip(cases["seed-state-dict"], {})
    return cases


# -- request_file_fuzzer: matctl's request files -------------------------------

def request_file_corpus():
    files = {}
    for name, text in examples():
        files[f"seed-{name}.json"] = text.encode("utf-8")
    cases = {
        "seed-plan-request": '{"model": {"tensors": [{"name": "w", '
                             '"shape": [2], "dtype": "float32"}]}}',
        "seed-proto-field-names": '{"model": {"init_rules": [{"pattern": "*",'
                                  ' "init": {"zeros": {}}}]}}',
        "seed-int64-as-numbers": '{"model": {"seed": 18446744073709551615,'
                                 ' "tensors": [{"name": "w", "shape": '
                                 '[9007199254740993]}]}}',
        "seed-nan-and-infinity": '{"model": {"initRules": [{"pattern": "*", '
                                 '"init": {"normal": {"mean": "NaN", '
                                 '"std": "Infinity"}}}]}}',
        "seed-duration": '{"ttl": "30.5s", "async": true, "label": "x"}',
        "seed-map": '{"placement": {"device": "split", "split": {'
                    '"maxMemory": {"cpu:0": "1GiB", "cpu:1": "2"}}}}',
        "seed-bytes": '{"model": {"tensors": [{"name": "v", "init": '
                      '{"values": {"data": "AAECAw=="}}}]}}',
        "regress-unknown-field": '{"model": {"tensorz": []}}',
        "regress-duplicate-field": '{"label": "a", "label": "b"}',
        "regress-trailing-garbage": '{"label": "a"} x',
        "regress-deep-nesting": '{"model": ' * 200 + "{}" + "}" * 200,
        "regress-escapes": '{"label": "\\ud83d\\ude00 \\u0000 \\" \\\\"}',
        "regress-lone-surrogate": '{"label": "\\ud800"}',
        "regress-enum-number": '{"model": {"rng": 99}}',
        "regress-negative-uint": '{"model": {"seed": "-1"}}',
        "regress-empty": "",
    }
    for name, text in cases.items():
        files[name] = text.encode("utf-8")
    files["regress-invalid-utf8-label"] = b'{"label": "\xff\xfe"}'
    files["regress-invalid-utf8-key"] = b'{"\xc3": 1}'
    files["regress-nul-in-string"] = b'{"label": "a\x00b"}'
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a file is missing or differs")
    args = parser.parse_args()
    sys.path.insert(0, PY_PROTO)
    try:
        from google.protobuf import json_format
        from materializer.v1 import materializer_pb2 as pb
    except ImportError as error:
        sys.exit(f"{error}: run `bazel build //proto:materializer_py` first "
                 "(or set MATERIALIZER_PY_PROTO)")
    corpora = {
        "request_fuzzer": request_corpus(pb, json_format),
        "glob_fuzzer": glob_corpus(),
        "weight_file_fuzzer": weight_file_corpus(),
        "request_file_fuzzer": request_file_corpus(),
        "checkpoint_header_fuzzer": checkpoint_header_corpus(),
        "torch_archive_fuzzer": torch_archive_corpus(),
    }
    stale = []
    for target, files in corpora.items():
        folder = os.path.join(CORPUS, target)
        os.makedirs(folder, exist_ok=True)
        for old in os.listdir(folder):
            if old.startswith(("seed-", "regress-")) and old not in files:
                stale.append(os.path.join(folder, old))
                if not args.check:
                    os.unlink(os.path.join(folder, old))
        for name, data in files.items():
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    same = f.read() == data
            except FileNotFoundError:
                same = False
            if same:
                continue
            stale.append(path)
            if not args.check:
                with open(path, "wb") as f:
                    f.write(data)
    for path in stale:
        print(("stale: " if args.check else "wrote: ") +
              os.path.relpath(path, REPO))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
