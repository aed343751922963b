"""Structure-aware fuzzer over every RPC of a running materializerd.

Two clients (two identities) send generated requests from a fixed seed:
valid-looking models and requests for Plan, Materialize (small models
only), Describe, FetchWeights, DescribeFile, Release, ListHandles,
GetStats, Attach, Renew, ExportHandle and CloseExport, with mutated fields
(edge numbers, long and odd strings, other clients' handles), mutated and
random wire bytes sent through a generic channel, and calls cancelled
mid-flight. Each client works in episodes; at the end of each it releases
what it holds and ends its session, as a finishing client does. The first
client starts with the inputs of known bugs (Client.regressions), so every
run, whatever its seed, sends them.

Findings (each is a bug):
  crash     the server process died
  hang      a call that failed took over 5 s, or any call hit its deadline
  internal  a status of INTERNAL or UNKNOWN
  unclear   an error without a message, UNIMPLEMENTED for a method the
            server has, or a message too long to reach the client
  isolation a call naming another client's handle did not answer NOT_FOUND,
            or a client saw another client's handle or counters
  leak      a finished client still holds memory or handles (GetStats)
            after the session grace period
  rss       the server's memory grew past a bound over the run

    .venv/bin/python tests/python/rpc_fuzzer.py --requests 10000 --seed 1
    .venv/bin/python tests/python/rpc_fuzzer.py --tokens ...   # bearer tokens
        # over TLS, both identities on one connection

It starts its own server (MATERIALIZERD, as the Python tests do) unless
--address is given. Exit status 1 when there is a finding.
"""

import argparse
import collections
import contextlib
import math
import os
import random
import struct
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serverproc  # noqa: E402

SERVICE = "/materializer.v1.Materializer/"
# Method -> (request message, response message, kind).
METHODS = {
    "Plan": ("PlanRequest", "PlanResponse", "unary"),
    "Materialize": ("MaterializeRequest", "MaterializeResponse", "unary"),
    "Describe": ("DescribeRequest", "HandleInfo", "unary"),
    "FetchWeights": ("FetchRequest", "WeightChunk", "server_stream"),
    "Release": ("ReleaseRequest", "ReleaseResponse", "unary"),
    "ListHandles": ("ListHandlesRequest", "ListHandlesResponse", "unary"),
    "GetStats": ("GetStatsRequest", "GetStatsResponse", "unary"),
    "DescribeFile": ("FetchRequest", "FileLayout", "unary"),
    "Attach": ("AttachRequest", "AttachResponse", "bidi"),
    "Renew": ("RenewRequest", "RenewResponse", "unary"),
    "ExportHandle": ("ExportRequest", "ExportResponse", "unary"),
    "CloseExport": ("CloseExportRequest", "CloseExportResponse", "unary"),
}

BAD_CALL_S = 5.0       # a refused request must be refused within this
DEADLINE_S = 15.0      # every call's deadline
GRACE_S = 1.0          # the server's --session_grace for the fuzz server
# gRPC clients refuse trailers over 8 KiB by default; the status message
# travels in one.
MAX_MESSAGE_BYTES = 8192
RSS_GROWTH_BYTES = 256 << 20  # after everything is released
CPU_CAPACITY = "128MiB"

OK_CODES = {grpc.StatusCode.OK}

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int16",
          "int32", "int64", "uint8", "bool", "float8_e4m3fn", "float8_e5m2"]
BAD_DTYPES = ["", "float", "complex128", "float32 ", "FLOAT32", "torch.float32",
              "int4", "q" * 300]
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2,
            "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1,
            "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
NAMES = ["w", "b", "fc.weight", "fc.bias", "layers.0.attn.q_proj.weight",
         "layers.1.mlp.up.weight", "embed.weight", "lm_head.weight",
         "norm.weight", "rope.inv_freq", "h.0.ln_1.bias", "x.y.z"]
ODD_NAMES = ["", " ", "a b", 'q"uote', "back\\slash", "a..b", ".lead",
             "trail.", "é", "\x00", "tab\t", "n" * 513, "n" * 512, "*", "[",
             "\\\"", "a/b"]
PATTERNS = ["*", "*.weight", "*.bias", "layers.?.*", "*[0-9]*", "[!a]*",
            "*norm*", "fc.*", "nothing", "[", "[]", "[!]", "[a-", "", "**",
            "*.[wb]*", "\\", '"*']
NONLINEARITIES = ["linear", "relu", "leaky_relu", "tanh", "sigmoid", "selu",
                  "conv2d", "", "gelu", "RELU", "q" * 300]
FLOATS = [0.0, 1.0, -1.0, 0.02, 0.5, 2.0, 1e-308, 5e-324, 1e308, -1e308,
          3.4e38, 3.5e38, 65504.0, 65520.0, 1e30, float("inf"),
          float("-inf"), float("nan"), -0.0]
INTS = [0, 1, -1, 2, 3, 7, 8, 255, 256, 2**31 - 1, 2**31, 2**32, 2**62,
        2**63 - 1, -2**63]
SIZES = [0, 1, 2, 3, 4, 5, 8, 16, 31, 64]
HUGE_SIZES = [-1, 2**31, 2**32, 4294967296, 2**40, 2**62, 2**63 - 1, -2**63]


def i64(value):
    """`value` wrapped into int64, as a C++ client's arithmetic would."""
    return (value + 2**63) % 2**64 - 2**63


def long_text(rng, n=None):
    n = n if n is not None else rng.choice([300, 4096, 70000, 1 << 20])
    return rng.choice("qab*[") * n


class Findings:
    """Thread-safe collection of findings, grouped by kind."""

    KINDS = ("crash", "hang", "internal", "unclear", "isolation", "leak",
             "rss")

    def __init__(self):
        self._lock = threading.Lock()
        self.by_kind = collections.defaultdict(list)

    def add(self, kind, rpc, detail):
        assert kind in self.KINDS, kind
        with self._lock:
            self.by_kind[kind].append((rpc, detail[:600]))

    def counts(self):
        with self._lock:
            return {k: len(self.by_kind.get(k, [])) for k in self.KINDS}

    def total(self):
        return sum(self.counts().values())


class Stats:
    def __init__(self):
        self._lock = threading.Lock()
        self.calls = collections.Counter()
        self.codes = collections.Counter()
        self.slowest_bad = (0.0, "")

    def record(self, rpc, code, seconds):
        with self._lock:
            self.calls[rpc] += 1
            self.codes[code.name] += 1
            if code != grpc.StatusCode.OK and seconds > self.slowest_bad[0]:
                self.slowest_bad = (seconds, rpc)


class Target:
    """Where the clients send calls: one shared channel, and the metadata
    that names each identity on it."""

    def __init__(self, address, channel, identities, pid, pb, pb_grpc,
                 admin=None):
        self.address = address
        self.channel = channel
        self.identities = identities  # name -> metadata tuple
        self.pid = pid
        self.pb = pb
        self.stub = pb_grpc.MaterializerStub(channel)
        self.admin = admin


class Client(threading.Thread):
    """One identity's stream of requests."""

    def __init__(self, fuzzer, name, seed, requests):
        super().__init__(name=f"fuzz-{name}", daemon=True)
        self.f = fuzzer
        self.t = fuzzer.target
        self.pb = fuzzer.target.pb
        self.name = name
        self.rng = random.Random(seed)
        self.requests = requests
        self.md = tuple(self.t.identities[name])
        self.handles = []          # live handles (ids)
        self.exportable = set()    # handles materialized with exportable
        self.exports = []          # open export ids
        self.session = None        # serverproc-like Attachment
        self.error = None

    # -- bookkeeping shared with the other client ----------------------------
    def publish(self):
        with self.f.lock:
            self.f.live[self.name] = list(self.handles)

    def others_handles(self):
        with self.f.lock:
            out = []
            for who, hs in self.f.live.items():
                if who != self.name:
                    out += hs
            return out

    # -- calls ---------------------------------------------------------------
    def call(self, rpc, fn, request, bad_expected=False, session=True,
             timeout=DEADLINE_S):
        """Runs stub call `fn(request)`; returns (code, response or error)."""
        md = self.md
        if session and self.session is not None and self.rng.random() < 0.7:
            md = md + (("x-materializer-session", self.session.session_id),)
        start = time.monotonic()
        try:
            response = fn(request, metadata=md, timeout=timeout)
            code, result = grpc.StatusCode.OK, response
        except grpc.RpcError as error:
            code, result = error.code(), error
        seconds = time.monotonic() - start
        self.judge(rpc, code, result, seconds, request)
        return code, result

    def judge(self, rpc, code, result, seconds, request, known_method=True):
        self.f.stats.record(rpc, code, seconds)
        summary = describe_request(request)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            self.f.findings.add("hang", rpc, f"deadline of {DEADLINE_S:.0f} s "
                                f"exceeded: {summary}")
            return
        if code != grpc.StatusCode.OK and seconds > BAD_CALL_S:
            self.f.findings.add("hang", rpc, f"{code.name} after "
                                f"{seconds:.1f} s: {summary}")
        if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
            self.f.findings.add("internal", rpc, f"{code.name}: "
                                f"{result.details()!r} for {summary}")
        elif (code != grpc.StatusCode.OK and code != grpc.StatusCode.CANCELLED
              and known_method):
            details = result.details() or ""
            if not details.strip():
                self.f.findings.add("unclear", rpc, f"{code.name} with an "
                                    f"empty message for {summary}")
            elif code == grpc.StatusCode.UNIMPLEMENTED:
                self.f.findings.add("unclear", rpc, f"UNIMPLEMENTED "
                                    f"({details!r}) for {summary}")
            elif (code == grpc.StatusCode.RESOURCE_EXHAUSTED and
                  "metadata" in details.lower()):
                self.f.findings.add("unclear", rpc, f"the error did not fit "
                                    f"the trailers ({details!r}) for "
                                    f"{summary}")
            elif len(details.encode()) > MAX_MESSAGE_BYTES:
                self.f.findings.add("unclear", rpc, f"a {len(details)}-byte "
                                    f"message for {summary}")

    # -- request generators --------------------------------------------------
    def name_(self):
        r = self.rng.random()
        if r < 0.8:
            return self.rng.choice(NAMES) + (f".{self.rng.randrange(5)}"
                                             if self.rng.random() < 0.3 else "")
        if r < 0.95:
            return self.rng.choice(ODD_NAMES)
        return long_text(self.rng, self.rng.choice([600, 20000]))

    def number(self):
        return self.rng.choice(FLOATS) if self.rng.random() < 0.5 else \
            self.rng.uniform(-3, 3)

    def gain(self, g):
        if self.rng.random() < 0.5:
            g.value = self.number()
        else:
            g.nonlinearity = self.rng.choice(NONLINEARITIES)
            if self.rng.random() < 0.3:
                g.param = self.number()

    def scheme(self, s, numel_bytes=None):
        """Fills InitScheme `s` with a random scheme and parameters."""
        rng = self.rng
        kind = rng.choice([
            "zeros", "ones", "constant", "uniform", "normal", "trunc_normal",
            "xavier_uniform", "xavier_normal", "kaiming_uniform",
            "kaiming_normal", "orthogonal", "eye", "dirac", "sparse",
            "module_default", "empty", "arange", "rope_inv_freq", "values"])
        if kind in ("zeros", "ones", "eye", "module_default", "empty"):
            getattr(s, kind).SetInParent()
        elif kind == "constant":
            s.constant.val = self.number()
        elif kind == "uniform":
            s.uniform.SetInParent()
            if rng.random() < 0.6:
                s.uniform.a = self.number()
            if rng.random() < 0.6:
                s.uniform.b = self.number()
        elif kind in ("normal", "trunc_normal"):
            m = getattr(s, kind)
            m.SetInParent()
            for field in (("mean", "std", "a", "b") if kind == "trunc_normal"
                          else ("mean", "std")):
                if rng.random() < 0.5:
                    setattr(m, field, self.number())
        elif kind in ("xavier_uniform", "xavier_normal", "orthogonal"):
            m = getattr(s, kind)
            m.SetInParent()
            if rng.random() < 0.6:
                self.gain(m.gain)
        elif kind in ("kaiming_uniform", "kaiming_normal"):
            m = getattr(s, kind)
            m.SetInParent()
            if rng.random() < 0.5:
                m.a = self.number()
            if rng.random() < 0.4:
                m.mode = rng.choice(["fan_in", "fan_out", "", "fan", "q" * 300])
            if rng.random() < 0.4:
                m.nonlinearity = rng.choice(NONLINEARITIES)
        elif kind == "dirac":
            s.dirac.SetInParent()
            if rng.random() < 0.5:
                s.dirac.groups = rng.choice(INTS)
        elif kind == "sparse":
            s.sparse.sparsity = rng.choice([0.0, 0.1, 0.5, 1.0, -0.1, 1.5,
                                            float("nan")])
            if rng.random() < 0.5:
                s.sparse.std = self.number()
        elif kind == "arange":
            s.arange.SetInParent()
            if rng.random() < 0.5:
                s.arange.start = self.number()
            if rng.random() < 0.5:
                s.arange.step = self.number()
        elif kind == "rope_inv_freq":
            s.rope_inv_freq.SetInParent()
            if rng.random() < 0.5:
                s.rope_inv_freq.base = self.number()
            if rng.random() < 0.4:
                s.rope_inv_freq.dim = rng.choice(INTS)
            if rng.random() < 0.3:
                sc = s.rope_inv_freq.scaling
                sc.type = rng.choice(["", "default", "linear", "dynamic",
                                      "llama3", "yarn", "ntk", "q" * 300])
                sc.factor = self.number()
                sc.original_max_position_embeddings = rng.choice(INTS)
        elif kind == "values":
            n = numel_bytes if (numel_bytes is not None and
                                rng.random() < 0.7) else rng.randrange(0, 64)
            s.values.data = rng.randbytes(min(n, 1 << 20))

    def shape(self, small):
        rank = self.rng.choice([0, 1, 1, 2, 2, 2, 3, 4])
        shape = [self.rng.choice(SIZES) for _ in range(rank)]
        if not small and self.rng.random() < 0.15 and shape:
            shape[self.rng.randrange(len(shape))] = self.rng.choice(HUGE_SIZES)
        if small and self.rng.random() < 0.03 and shape:
            shape[self.rng.randrange(len(shape))] = self.rng.choice(HUGE_SIZES)
        return shape

    def model(self, m, small):
        rng = self.rng
        count = rng.choice([0, 1, 1, 2, 3, 4, 6]) if rng.random() < 0.97 \
            else rng.choice([200, 3000])
        names = []
        for i in range(count):
            t = m.tensors.add()
            t.name = self.name_() if count < 100 else f"t{i}"
            if rng.random() < 0.3 and names:
                t.name = rng.choice(names)  # duplicate
            names.append(t.name)
            t.shape.extend(self.shape(small))
            t.dtype = rng.choice(DTYPES) if rng.random() < 0.93 else \
                rng.choice(BAD_DTYPES)
            numel = 1
            for s in t.shape:
                numel *= max(s, 0)
            nbytes = numel * ITEMSIZE.get(t.dtype, 1)
            if rng.random() < 0.1:
                t.kind = rng.choice([1, 2, 7])
            if rng.random() < 0.1:
                t.persistent = rng.random() < 0.5
            if rng.random() < 0.2:
                t.module_type = rng.choice(["Linear", "Embedding", "LayerNorm",
                                            "Conv2d", "LlamaRMSNorm", "Nope",
                                            "torch.nn.Linear"])
            r = rng.random()
            if count >= 100:
                if i > 0 and rng.random() < 0.9:
                    t.tie_to = f"t{i - 1}"  # long chains
                else:
                    t.init.zeros.SetInParent()
            elif r < 0.55:
                self.scheme(t.init, nbytes)
            elif r < 0.65 and names[:-1]:
                t.tie_to = rng.choice(names[:-1] + [t.name, "missing"])
            elif r < 0.72:
                for k in range(rng.choice([1, 2, 3])):
                    step = t.init_steps.add()
                    self.scheme(step.init, nbytes)
                    if k > 0 or rng.random() < 0.2:
                        for s in t.shape:
                            d = step.region.add()
                            d.offset = i64(rng.choice([0, 1, s, s + 1, -1]))
                            d.length = rng.choice([0, 1, s, -1])
            if rng.random() < 0.12:
                if rng.random() < 0.6:
                    for s in t.shape:
                        d = t.shard.box.add()
                        d.offset = i64(rng.choice([0, 1, max(s - 1, 0), s,
                                                   s + 1, -1, 2**62]))
                        d.length = rng.choice([0, 1, s, max(s // 2, 0), -1])
                    if not t.shape:
                        t.shard.SetInParent()
                else:
                    t.shard.split.dim = rng.choice([0, 1, 2, -1, 9])
                    t.shard.split.index = rng.choice([0, 1, 2, -1, 2**40])
                    t.shard.split.count = rng.choice([1, 2, 3, 0, -1, 2**40])
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            rule = m.init_rules.add()
            rule.pattern = rng.choice(PATTERNS) if rng.random() < 0.9 else \
                "*[" + "b" * rng.choice([1000, 100000]) + "]*"
            self.scheme(rule.init)
        if rng.random() < 0.1:
            mod = m.modules.add()
            mod.name = rng.choice(["fc", "embed", "layers.0", "", "nope"])
            mod.type = rng.choice(["Linear", "Embedding", "LayerNorm", "x"])
            if rng.random() < 0.5:
                mod.padding_idx = rng.choice(INTS)
        m.seed = rng.choice([0, 1, 7, 2**64 - 1])
        m.rng = rng.choice([0, 1, 2, 2, 5])

    def placement(self, p):
        r = self.rng.random()
        if r < 0.6:
            return
        if r < 0.8:
            p.device = self.rng.choice(["auto", "cpu", "cpu:0", "cuda:0",
                                        "cuda", "gpu", "", "cpu:7"])
        elif r < 0.97:
            p.device = "split"
            for _ in range(self.rng.choice([0, 1, 2])):
                p.split.devices.append(self.rng.choice(["cpu", "cpu:0",
                                                        "cuda:0", "x"]))
            if self.rng.random() < 0.5:
                p.split.max_memory[self.rng.choice(["cpu", "x"])] = \
                    self.rng.choice(["1KiB", "10MiB", "0", "-1", "lots"])
            if self.rng.random() < 0.3:
                p.split.no_split.append(self.rng.choice(["layers.0", "", "*"]))
        else:
            p.device = long_text(self.rng, 20000)

    def handle_id(self):
        """Own, another client's, or made-up."""
        rng = self.rng
        r = rng.random()
        if r < 0.55 and self.handles:
            return rng.choice(self.handles), "own"
        others = self.others_handles()
        if r < 0.75 and others:
            return rng.choice(others), "other"
        return rng.choice([
            "", "h-" + "%032x" % rng.getrandbits(128), "h-", "h-zz",
            "h-" + "0" * 32 + "0", "\u00e9", long_text(rng, 300),
            long_text(rng, rng.choice([70000, 1 << 20])),
        ]), "made-up"

    def filters(self, req):
        for field in (req.include, req.exclude):
            for _ in range(self.rng.choice([0, 0, 1, 2])):
                r = self.rng.random()
                if r < 0.8:
                    field.append(self.rng.choice(PATTERNS))
                elif r < 0.9:
                    # Long and valid: matches everything, so it is cached.
                    field.append("*" * self.rng.choice([1000, 100000]))
                else:
                    field.append("*[" + "b" * self.rng.choice(
                        [10000, 1 << 20]) + "]c")

    # -- one request of each RPC ---------------------------------------------
    def do_plan(self):
        req = self.pb.PlanRequest()
        self.model(req.model, small=False)
        self.placement(req.placement)
        self.call("Plan", self.t.stub.Plan, req)

    def do_materialize(self):
        req = self.pb.MaterializeRequest()
        self.model(req.model, small=True)
        self.placement(req.placement)
        if self.rng.random() < 0.2:
            req.label = self.rng.choice(["x", "a" * 256, "a" * 257, "é"])
        if self.rng.random() < 0.15:
            setattr(req, "async", True)  # a keyword in Python
        if self.rng.random() < 0.15:
            req.ttl.seconds = self.rng.choice([0, 1, 3600, -5, 10**12])
        if self.rng.random() < 0.25:
            req.exportable = True
        if self.rng.random() < 0.15:
            req.open_export.SetInParent()
            if self.rng.random() < 0.2:
                req.open_export.handle = self.rng.choice(["h-1", self.handle_id()[0]])
            if self.rng.random() < 0.2:
                req.open_export.importer_device_uuid = self.rng.choice(["GPU-0", "x"])
        code, resp = self.call("Materialize", self.t.stub.Materialize, req)
        if code == grpc.StatusCode.OK:
            self.handles.append(resp.handle)
            if req.exportable:
                self.exportable.add(resp.handle)
            if resp.HasField("opened_export"):
                self.exports.append(resp.opened_export.export_id)
            self.publish()

    def check_isolated(self, rpc, code, whose, result, handle):
        # NOT_FOUND, as for an id never issued; a call that did not finish
        # (deadline, cancellation) reveals nothing either.
        # An error about the request itself (checked before the handle is
        # looked up) reveals nothing unless it speaks of the handle.
        if whose != "other" or code in (
                grpc.StatusCode.NOT_FOUND, grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED):
            return
        if code == grpc.StatusCode.OK:
            detail = "OK"
        else:
            detail = f"{code.name}: {result.details()!r}"
            if code == grpc.StatusCode.INVALID_ARGUMENT and \
                    handle not in (result.details() or ""):
                return
        self.f.findings.add("isolation", rpc, f"another client's handle "
                            f"answered {detail}")

    def do_describe(self):
        handle, whose = self.handle_id()
        code, result = self.call("Describe", self.t.stub.Describe,
                                 self.pb.DescribeRequest(handle=handle))
        self.check_isolated("Describe", code, whose, result, handle)
        if code == grpc.StatusCode.OK and result.owner != self.name:
            self.f.findings.add("isolation", "Describe",
                                f"{self.name} sees a handle of {result.owner}")

    def fetch_request(self):
        handle, whose = self.handle_id()
        req = self.pb.FetchRequest(handle=handle)
        req.format = self.rng.choice([0, 1, 2, 3, 3, 9])
        if self.rng.random() < 0.3:
            req.offset = self.rng.choice([0, 1, 8, 100, 2**40, 2**64 - 1])
        if self.rng.random() < 0.3:
            req.chunk_bytes = self.rng.choice([0, 1, 7, 4096, 2**32 - 1])
        req.include_non_persistent = self.rng.random() < 0.3
        req.write_ties_once = self.rng.random() < 0.3
        self.filters(req)
        return req, whose

    def do_fetch(self):
        req, whose = self.fetch_request()
        md = self.md
        start = time.monotonic()
        stop_after = self.rng.choice([None, None, 0, 1, 3])
        try:
            call = self.t.stub.FetchWeights(req, metadata=md,
                                            timeout=DEADLINE_S)
            received = 0
            for chunk in call:
                received += 1
                if stop_after is not None and received > stop_after:
                    call.cancel()
                    break
            code, result = grpc.StatusCode.OK, None
        except grpc.RpcError as error:
            code, result = error.code(), error
        if code == grpc.StatusCode.CANCELLED and stop_after is not None:
            code = grpc.StatusCode.OK  # we cancelled it
        self.judge("FetchWeights", code, result, time.monotonic() - start,
                   req)
        self.check_isolated("FetchWeights", code, whose, result, req.handle)

    def do_describe_file(self):
        req, whose = self.fetch_request()
        code, result = self.call("DescribeFile", self.t.stub.DescribeFile,
                                 req)
        self.check_isolated("DescribeFile", code, whose, result, req.handle)

    def do_release(self):
        handle, whose = self.handle_id()
        req = self.pb.ReleaseRequest(handle=handle,
                                     force=self.rng.random() < 0.4)
        if self.rng.random() < 0.3:
            # Its own exports (or any of this client's), junk, repeats.
            pool = [e for e in self.exports if e.endswith(handle)] or self.exports
            for _ in range(self.rng.choice([1, 1, 2, 65])):
                req.close_exports.append(
                    self.rng.choice(pool) if pool and self.rng.random() < 0.8
                    else self.rng.choice(["", "x-1", "x-" + handle, long_text(self.rng, 300)]))
        code, result = self.call("Release", self.t.stub.Release, req)
        self.check_isolated("Release", code, whose, result, handle)
        if code == grpc.StatusCode.OK and handle in self.handles:
            self.handles.remove(handle)
            self.publish()

    def do_list(self):
        code, result = self.call("ListHandles", self.t.stub.ListHandles,
                                 self.pb.ListHandlesRequest())
        if code == grpc.StatusCode.OK:
            others = set(self.others_handles())
            for h in result.handles:
                if h.handle in others:
                    self.f.findings.add("isolation", "ListHandles",
                                        f"{self.name} lists another "
                                        f"client's handle {h.handle}")

    def do_stats(self):
        code, result = self.call("GetStats", self.t.stub.GetStats,
                                 self.pb.GetStatsRequest())
        if code == grpc.StatusCode.OK:
            for c in result.clients:
                if c.client != self.name:
                    self.f.findings.add("isolation", "GetStats",
                                        f"{self.name} sees client {c.client}")

    def do_attach(self):
        rng = self.rng
        if self.session is not None and rng.random() < 0.5:
            end = rng.choice(["close", "crash"])
            getattr(self.session, end)()
            token = self.session.resume_token
            self.session = None
            if end == "crash" and rng.random() < 0.5:
                self.open_session(token)
            return
        if self.session is None:
            token = rng.choice(["", "", "", "bogus", long_text(rng, 300)])
            self.open_session(token)

    def open_session(self, token):
        start = time.monotonic()
        req = self.pb.AttachRequest(resume_token=token)
        try:
            self.session = Session(self.t, self.md, token)
            code, result = grpc.StatusCode.OK, None
        except grpc.RpcError as error:
            code, result = error.code(), error
        self.judge("Attach", code, result, time.monotonic() - start, req)

    def do_renew(self):
        handle, whose = self.handle_id()
        code, result = self.call("Renew", self.t.stub.Renew,
                                 self.pb.RenewRequest(handle=handle))
        self.check_isolated("Renew", code, whose, result, handle)

    def do_export(self):
        handle, whose = self.handle_id()
        if self.exportable and self.rng.random() < 0.5:
            handle, whose = self.rng.choice(sorted(self.exportable)), "own"
        req = self.pb.ExportRequest(handle=handle)
        if self.rng.random() < 0.3:
            req.importer_device_uuid = self.rng.choice(["GPU-0", "x", ""])
        code, result = self.call("ExportHandle", self.t.stub.ExportHandle, req)
        self.check_isolated("ExportHandle", code, whose, result, handle)
        if code == grpc.StatusCode.OK:
            self.exports.append(result.export_id)

    def do_close_export(self):
        if self.exports and self.rng.random() < 0.7:
            export_id = self.exports.pop(self.rng.randrange(len(self.exports)))
        else:
            export_id = self.rng.choice(["", "e-1", long_text(self.rng, 300)])
        self.call("CloseExport", self.t.stub.CloseExport,
                  self.pb.CloseExportRequest(export_id=export_id))

    def do_raw(self):
        """Wire bytes the stubs would never send, to any method."""
        rng = self.rng
        method = rng.choice(list(METHODS) + ["NoSuchMethod"])
        request_type = METHODS.get(method, ("PlanRequest",))[0]
        message = getattr(self.pb, request_type)()
        if request_type in ("PlanRequest", "MaterializeRequest"):
            self.model(message.model, small=True)
        elif request_type == "FetchRequest":
            message, _ = self.fetch_request()
        elif hasattr(message, "handle"):
            message.handle = self.handle_id()[0]
        payload = bytearray(message.SerializeToString())
        how = rng.choice(["random", "flip", "truncate", "insert",
                          "bad-utf8", "empty-field-soup"])
        if how == "random" or not payload:
            payload = bytearray(rng.randbytes(rng.choice([1, 5, 64, 4096])))
        elif how == "flip":
            for _ in range(rng.choice([1, 2, 8])):
                i = rng.randrange(len(payload))
                payload[i] ^= 1 << rng.randrange(8)
        elif how == "truncate":
            payload = payload[:rng.randrange(len(payload))]
        elif how == "insert":
            i = rng.randrange(len(payload) + 1)
            payload[i:i] = rng.randbytes(rng.choice([1, 3, 20]))
        elif how == "bad-utf8":
            # Field 1 (the handle, the model's first tensor name, ...) as a
            # string that is not UTF-8.
            payload = bytearray(b"\x0a\x02\xff\xfe") + payload
        else:
            payload = bytearray(b"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80"
                                ) + payload  # an over-long varint
        payload = bytes(payload)
        kind = METHODS.get(method, (None, None, "unary"))[2]
        path = SERVICE + method
        start = time.monotonic()
        try:
            if kind == "unary":
                answer = self.t.channel.unary_unary(path)(
                    payload, metadata=self.md, timeout=DEADLINE_S)
                # Mutated bytes can still be a valid request: keep track
                # of what it created, so finishing releases it.
                if method == "Materialize":
                    handle = self.pb.MaterializeResponse.FromString(
                        answer).handle
                    self.handles.append(handle)
                    self.exportable.add(handle)
                    self.publish()
                elif method == "ExportHandle":
                    self.exports.append(
                        self.pb.ExportResponse.FromString(answer).export_id)
            elif kind == "server_stream":
                for _ in self.t.channel.unary_stream(path)(
                        payload, metadata=self.md, timeout=DEADLINE_S):
                    pass
            else:
                call = self.t.channel.stream_stream(path)(
                    iter([payload]), metadata=self.md, timeout=3)
                with contextlib.suppress(StopIteration):
                    next(call)
                call.cancel()
            code, result = grpc.StatusCode.OK, None
        except grpc.RpcError as error:
            code, result = error.code(), error
        if kind == "bidi" and code in (grpc.StatusCode.CANCELLED,
                                       grpc.StatusCode.DEADLINE_EXCEEDED):
            code = grpc.StatusCode.OK  # we ended it
        self.judge(f"raw:{method}:{how}", code, result,
                   time.monotonic() - start, payload,
                   known_method=method in METHODS)

    def do_cancelled(self):
        """An expensive request, cancelled after a few milliseconds: the
        server must stop working on it (later calls must not wait)."""
        rng = self.rng
        req = self.pb.PlanRequest()
        if rng.random() < 0.5:
            for i in range(rng.choice([2000, 20000])):
                t = req.model.tensors.add(name=f"t{i}", shape=[4],
                                          dtype="float32")
                if i:
                    t.tie_to = f"t{i - 1}"
                else:
                    t.init.zeros.SetInParent()
        else:
            for i in range(64):
                t = req.model.tensors.add(name="b" * 500 + f".{i:03d}",
                                          shape=[2], dtype="float32")
            rule = req.model.init_rules.add(pattern="*[" + "b" * 200000 + "]c")
            rule.init.zeros.SetInParent()
        future = self.t.stub.Plan.future(req, metadata=self.md,
                                         timeout=DEADLINE_S)
        time.sleep(rng.choice([0.0, 0.005, 0.05]))
        future.cancel()
        self.f.stats.record("Plan(cancelled)", grpc.StatusCode.CANCELLED, 0)

    # -- the inputs of known bugs, sent once at the start ---------------------
    def regressions(self):
        """Fixed requests from the bug reports (issue 10): every run sends
        them, whatever the seed."""
        pb = self.pb
        from google.protobuf import json_format

        def model(*tensors, rng=None, rules=()):
            m = {"tensors": list(tensors), "seed": "7",
                 "initRules": list(rules)}
            if rng:
                m["rng"] = rng
            return {"model": m}

        def tensor(name, shape, init=None, dtype="float32", **extra):
            t = {"name": name, "shape": shape, "dtype": dtype, **extra}
            if init is not None:
                t["init"] = init
            return t

        requests = [
            model(tensor("w", [0, 4294967296, 4294967296], {"zeros": {}})),
            model(tensor("w", [4, 4], {"normal": {"std": 1e308}}),
                  rng="RNG_MODE_PORTABLE"),
            model(tensor("w", [4, 4], {"truncNormal": {"std": 1e308}}),
                  rng="RNG_MODE_PORTABLE"),
            model(tensor("w", [2147483648, 2147483648], {"normal": {}},
                         dtype="float8_e4m3fn", shard={"box": [
                             {"offset": "0", "length": "1"},
                             {"offset": "0", "length": "16"}]}),
                  rng="RNG_MODE_PORTABLE"),
            model(tensor("w", [8, 8], {"normal": {"std": -1}}, shard={
                "box": [{"offset": "0", "length": "0"},
                        {"offset": "0", "length": "8"}]}),
                  rng="RNG_MODE_PORTABLE"),
            model(tensor("s", [], {"ones": {}}, shard={}),
                  rng="RNG_MODE_PORTABLE"),
            {"model": {}},
        ]
        for rng in ("RNG_MODE_TORCH", "RNG_MODE_PORTABLE"):
            for scheme in ("xavierUniform", "xavierNormal"):
                requests.append(model(tensor(
                    "w", [4, 4], {scheme: {"gain": {"value": -1}}}), rng=rng))
        requests.append(model(tensor("w", [4, 4], {"sparse": {
            "sparsity": 0.5, "std": 1e308}}), rng="RNG_MODE_TORCH"))
        for body in requests:
            for rpc, cls in (("Plan", pb.PlanRequest),
                             ("Materialize", pb.MaterializeRequest)):
                req = json_format.ParseDict(body, cls())
                code, resp = self.call(rpc, getattr(self.t.stub, rpc), req,
                                       session=False)
                if rpc == "Materialize" and code == grpc.StatusCode.OK:
                    self.handles.append(resp.handle)
        # Names with '"' and '\', fetched as safetensors (JSON header).
        req = json_format.ParseDict(model(
            tensor('a"b.weight', [2, 3], {"ones": {}}),
            tensor("c\\d.bias", [3], {"zeros": {}})), pb.MaterializeRequest())
        code, resp = self.call("Materialize", self.t.stub.Materialize, req,
                               session=False)
        if code == grpc.StatusCode.OK:
            self.handles.append(resp.handle)
            data = b"".join(c.data for c in self.t.stub.FetchWeights(
                pb.FetchRequest(handle=resp.handle), metadata=self.md,
                timeout=DEADLINE_S))
            n = struct.unpack("<Q", data[:8])[0]
            import json
            header = json.loads(data[8:8 + n])
            if set(header) != {"__metadata__", 'a"b.weight', "c\\d.bias"}:
                self.f.findings.add("unclear", "FetchWeights",
                                    f"safetensors header names {set(header)}")
        # A handle with long names, then quadratic glob filters against it.
        long_names = pb.MaterializeRequest()
        for i in range(32):
            t = long_names.model.tensors.add(name="b" * 500 + f".{i:03d}",
                                             shape=[2], dtype="float32")
            t.init.zeros.SetInParent()
        code, resp = self.call("Materialize", self.t.stub.Materialize,
                               long_names, session=False)
        if code == grpc.StatusCode.OK:
            self.handles.append(resp.handle)
            for pattern in ("*[" + "b" * (2 << 20) + "]c",
                            "*[" + "b" * (64 << 10) + "]*"):
                fetch = pb.FetchRequest(handle=resp.handle, include=[pattern])
                self.call("DescribeFile", self.t.stub.DescribeFile, fetch)
            # Digest caches keyed by filter text: distinct, long, valid
            # filters must not grow the server without bound.
            for k in range(400):
                fetch = pb.FetchRequest(handle=resp.handle,
                                        include=["*" * ((1 << 20) - k)])
                self.call("DescribeFile", self.t.stub.DescribeFile, fetch)
        # Long chains and long class patterns in a Plan.
        chain = pb.PlanRequest()
        for i in range(20000):
            t = chain.model.tensors.add(name=f"t{i}", shape=[4],
                                        dtype="float32")
            if i:
                t.tie_to = f"t{i - 1}"
            else:
                t.init.zeros.SetInParent()
        self.call("Plan", self.t.stub.Plan, chain)
        pattern = pb.PlanRequest()
        pattern.CopyFrom(pb.PlanRequest(model=long_names.model))
        rule = pattern.model.init_rules.add(pattern="*[" + "b" * (1 << 20) +
                                            "]c")
        rule.init.ones.SetInParent()
        self.call("Plan", self.t.stub.Plan, pattern)
        # Ids and patterns of a megabyte, echoed into errors.
        big = "h-" + "f" * (1 << 20)
        self.call("Describe", self.t.stub.Describe,
                  pb.DescribeRequest(handle=big))
        self.call("Release", self.t.stub.Release, pb.ReleaseRequest(handle=big))
        bad = pb.PlanRequest()
        bad.model.tensors.add(name="w", shape=[2], dtype="float32")
        bad.model.init_rules.add(pattern="[" + "a" * (1 << 20)).init.zeros \
            .SetInParent()
        self.call("Plan", self.t.stub.Plan, bad)
        # Bytes that are no message at all.
        for method in ("Plan", "Materialize", "Describe", "Release"):
            start = time.monotonic()
            try:
                self.t.channel.unary_unary(SERVICE + method)(
                    b"\xff\xff\xff\xff", metadata=self.md,
                    timeout=DEADLINE_S)
                code, result = grpc.StatusCode.OK, None
            except grpc.RpcError as error:
                code, result = error.code(), error
            self.judge(f"raw:{method}:unparseable", code, result,
                       time.monotonic() - start, b"\xff\xff\xff\xff")
        self.finish()

    # -- episodes ------------------------------------------------------------
    def finish(self):
        """What a finishing client does: end its session, close exports,
        release its handles; then nothing of it may remain."""
        for export_id in self.exports:
            self.call("CloseExport", self.t.stub.CloseExport,
                      self.pb.CloseExportRequest(export_id=export_id),
                      session=False)
        self.exports = []
        for handle in list(self.handles):
            self.call("Release", self.t.stub.Release,
                      self.pb.ReleaseRequest(handle=handle, force=True),
                      session=False)
        self.handles = []
        self.exportable.clear()
        self.publish()
        if self.session is not None:
            getattr(self.session, self.rng.choice(["close", "crash"]))()
            self.session = None
        deadline = time.monotonic() + GRACE_S + 2.0
        while True:
            held = self.held()
            if held is None or held == (0, 0, 0):
                return
            if time.monotonic() > deadline:
                self.f.findings.add("leak", "GetStats", f"{self.name} still "
                                    f"holds (reserved, in use, handles) = "
                                    f"{held} {GRACE_S + 2:.0f} s after "
                                    "finishing")
                return
            time.sleep(0.05)

    def held(self):
        try:
            s = self.t.stub.GetStats(self.pb.GetStatsRequest(),
                                     metadata=self.md, timeout=DEADLINE_S)
        except grpc.RpcError:
            return None
        for c in s.clients:
            if c.client == self.name:
                return (c.reserved_bytes, c.in_use_bytes, c.handles)
        return (0, 0, 0)

    def run(self):
        weights = {
            self.do_plan: 16, self.do_materialize: 14, self.do_describe: 8,
            self.do_fetch: 10, self.do_describe_file: 6, self.do_release: 8,
            self.do_list: 3, self.do_stats: 3, self.do_attach: 3,
            self.do_renew: 4, self.do_export: 4, self.do_close_export: 3,
            self.do_raw: 16, self.do_cancelled: 0.4,
        }
        actions, w = zip(*weights.items())
        try:
            if self.f.regressions and self.name == min(self.t.identities):
                self.regressions()
            episode = 0
            for i in range(self.requests):
                if self.f.server_dead():
                    return
                self.rng.choices(actions, w)[0]()
                episode += 1
                if episode >= self.rng.choice([60, 120, 200]) or \
                        i == self.requests - 1:
                    self.finish()
                    episode = 0
                    self.f.sample_rss()
        except Exception as error:  # a fuzzer bug, not a finding
            self.error = error
            raise


class Session:
    """One Attach stream: close() ends it cleanly (half-close), crash()
    cancels it, as a dying client would."""

    def __init__(self, target, metadata, resume_token):
        self._done = threading.Event()
        pb = target.pb

        def requests():
            yield pb.AttachRequest(resume_token=resume_token)
            self._done.wait()

        self._call = target.stub.Attach(requests(), metadata=metadata,
                                        timeout=3600)
        try:
            first = next(self._call)
        except grpc.RpcError:
            self._done.set()
            raise
        self.session_id = first.session_id
        self.resume_token = first.resume_token

    def close(self):
        self._done.set()
        with contextlib.suppress(grpc.RpcError):
            for _ in self._call:
                pass

    def crash(self):
        self._call.cancel()
        self._done.set()


def describe_request(request):
    if isinstance(request, (bytes, bytearray)):
        head = bytes(request[:60])
        return f"{len(request)} wire bytes {head!r}"
    text = str(request).replace("\n", " ")
    if len(text) > 300:
        text = text[:300] + f"... ({len(text)} chars)"
    return f"{type(request).__name__} {{{text}}}"


class Fuzzer:
    def __init__(self, target, seed, requests, regressions=True):
        self.target = target
        self.regressions = regressions
        self.seed = seed
        self.requests = requests
        self.findings = Findings()
        self.stats = Stats()
        self.lock = threading.Lock()
        self.live = {}
        self.proc = psutil.Process(target.pid) if target.pid else None
        self.rss_start = self.rss_peak = self.rss_end = 0

    def server_dead(self):
        if self.proc is None:
            return False
        try:
            return self.proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def rss(self):
        try:
            return self.proc.memory_info().rss if self.proc else 0
        except psutil.NoSuchProcess:
            return 0

    def sample_rss(self):
        with self.lock:
            self.rss_peak = max(self.rss_peak, self.rss())

    def run(self):
        names = sorted(self.target.identities)
        self.rss_start = self.rss_peak = self.rss()
        start = time.monotonic()
        clients = [Client(self, name, self.seed * 1000 + k,
                          self.requests // len(names) +
                          (1 if k < self.requests % len(names) else 0))
                   for k, name in enumerate(names)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        self.seconds = time.monotonic() - start
        for c in clients:
            if c.error is not None:
                raise RuntimeError(f"fuzzer client {c.name} failed") \
                    from c.error
        if self.server_dead():
            self.findings.add("crash", "-", "the server died during the run")
            return
        time.sleep(0.5)
        self.rss_end = self.rss()
        if self.proc and self.rss_end - self.rss_start > RSS_GROWTH_BYTES:
            self.findings.add("rss", "-", f"server RSS grew from "
                              f"{self.rss_start >> 20} MiB to "
                              f"{self.rss_end >> 20} MiB with nothing held")

    def report(self):
        lines = [f"{sum(self.stats.calls.values())} requests in "
                 f"{self.seconds:.1f} s (seed {self.seed})"]
        lines.append("calls: " + ", ".join(
            f"{k} {v}" for k, v in sorted(self.stats.calls.items())
            if not k.startswith("raw:")) +
            f", raw {sum(v for k, v in self.stats.calls.items() if k.startswith('raw:'))}")
        lines.append("codes: " + ", ".join(
            f"{k} {v}" for k, v in self.stats.codes.most_common()))
        if self.proc:
            lines.append(f"server RSS: start {self.rss_start >> 20} MiB, peak "
                         f"{self.rss_peak >> 20} MiB, end "
                         f"{self.rss_end >> 20} MiB")
        lines.append(f"slowest refused call: {self.stats.slowest_bad[0]:.2f} s "
                     f"({self.stats.slowest_bad[1]})")
        counts = self.findings.counts()
        lines.append("findings: " + ", ".join(f"{k} {v}"
                                              for k, v in counts.items()))
        for kind in Findings.KINDS:
            items = self.findings.by_kind.get(kind, [])
            seen = collections.Counter()
            for rpc, detail in items:
                key = (rpc.split(":")[0], detail[:40])
                seen[key] += 1
                if seen[key] == 1 and sum(1 for v in seen.values()) <= 12:
                    lines.append(f"  {kind} {rpc}: {detail}")
        return "\n".join(lines)


# -- servers -------------------------------------------------------------------

def make_pki(folder):
    """A CA and a server certificate for 127.0.0.1/localhost."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=folder, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=ca", "-keyout", "ca.key", "-out", "ca.pem")
    with open(os.path.join(folder, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=server",
            "-keyout", "server.key", "-out", "server.csr")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey",
            "ca.key", "-CAcreateserial", "-days", "2", "-extfile",
            "server.ext", "-out", "server.pem")


@contextlib.contextmanager
def fuzz_target(tokens=False):
    """Starts a server for fuzzing and yields its Target."""
    pb, pb_grpc = serverproc.import_protos()
    args = [f"--session_grace={GRACE_S:g}s", "--default_ttl=600s",
            "--workers=2"]
    with contextlib.ExitStack() as stack:
        if not tokens:
            srv = stack.enter_context(serverproc.running_server(
                args, cpu_capacity=CPU_CAPACITY))
            identities = {n: ((serverproc.CLIENT_KEY, n),)
                          for n in ("alice", "bob")}
            yield Target(srv.address, srv.channel, identities, srv.proc.pid,
                         pb, pb_grpc)
            return
        folder = stack.enter_context(tempfile.TemporaryDirectory())
        make_pki(folder)
        secrets = {"alice": "token-a-" + os.urandom(8).hex(),
                   "bob": "token-b-" + os.urandom(8).hex()}
        with open(os.path.join(folder, "tokens"), "w") as f:
            for name, token in secrets.items():
                f.write(f"{token} {name}\n")
        srv = stack.enter_context(serverproc.running_server(
            args + [f"--tls_cert={folder}/server.pem",
                    f"--tls_key={folder}/server.key",
                    f"--token_file={folder}/tokens"],
            cpu_capacity=CPU_CAPACITY, connect=False))
        with open(os.path.join(folder, "ca.pem"), "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        port = srv.address.rsplit(":", 1)[1]
        # One connection for both identities: each call names its caller.
        channel = grpc.secure_channel(f"localhost:{port}", creds)
        stack.callback(channel.close)
        grpc.channel_ready_future(channel).result(timeout=30)
        identities = {n: (("authorization", f"Bearer {t}"),)
                      for n, t in secrets.items()}
        yield Target(srv.address, channel, identities, srv.proc.pid, pb,
                     pb_grpc)


def run(requests, seed, tokens=False, regressions=True):
    """Runs a fuzzer against a fresh server, then stops the server (a server
    that does not stop, or stops badly, is a finding); returns the Fuzzer."""
    import pytest
    fuzzer = None
    try:
        with fuzz_target(tokens) as target:
            fuzzer = Fuzzer(target, seed, requests, regressions)
            fuzzer.run()
    except pytest.fail.Exception as failure:  # serverproc, at shutdown
        if fuzzer is None:
            raise
        message = str(failure)
        kind = "hang" if "did not exit" in message else "crash"
        if not any(k == "crash" for k in fuzzer.findings.by_kind):
            fuzzer.findings.add(kind, "shutdown", message)
    return fuzzer


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tokens", action="store_true",
                        help="TLS server with bearer tokens; both identities "
                        "share one connection")
    parser.add_argument("--no-regressions", action="store_true",
                        help="skip the fixed inputs of known bugs")
    args = parser.parse_args()
    fuzzer = run(args.requests, args.seed, args.tokens,
                 not args.no_regressions)
    print(fuzzer.report())
    return 1 if fuzzer.findings.total() else 0


if __name__ == "__main__":
    sys.exit(main())
