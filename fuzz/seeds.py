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
             init_steps.
Files a fuzzer finds later are added by hand as found-* (not touched here).

    bazel build //proto:materializer_py
    .venv/bin/python fuzz/seeds.py          # (re)write seed-* and regress-*
    .venv/bin/python fuzz/seeds.py --check  # exit 1 if any is stale
"""

import argparse
import base64
import copy
import json
import os
import sys

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
          "int32", "int64", "uint8", "bool", "float8_e4m3fn", "float8_e5m2"]


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
