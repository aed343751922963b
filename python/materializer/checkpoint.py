"""Checkpoints the server reads (MaterializeRequest.checkpoint;
docs/checkpoints.md): tensors found in the checkpoint come from it, the
others from the model's own init, which describe() records as usual.

    materializer.materialize(model, checkpoint="models/llama")
    materializer.materialize(model, checkpoint=materializer.Checkpoint(
        "models/gpt2", key_rules={"": "transformer."}, dtype_policy="exact"))
"""

from materializer._proto import pb

# The server's limits on CheckpointSource.key_rules and assemblies.
MAX_KEY_RULES = 1024
MAX_KEY_RULE_FROM_BYTES = 64 << 10
MAX_PARTS_PER_TENSOR = 4096
MAX_ASSEMBLY_PARTS = 131072

DTYPE_POLICIES = {"cast": pb.CHECKPOINT_DTYPE_POLICY_CAST,
                  "exact": pb.CHECKPOINT_DTYPE_POLICY_EXACT}


class Checkpoint:
    """path: "ROOT/relative/path" under one of the server's
    --checkpoint_roots (a safetensors file, a torch.save file, or a folder
    as save_pretrained writes it). key_rules: {from: to} (or (from, to)
    pairs), in order; the first rule whose `from` starts a tensor's name
    replaces that prefix with `to` to give its checkpoint key ("" adds a
    prefix). dtype_policy: "cast" (a stored float of another dtype is cast
    to the tensor's, as torch casts) or "exact". require_all: a tensor the
    checkpoint lacks is an error listing them, instead of taking its init.
    assemblies: {tensor name: [[key, key_offset, key_shape, offset, shape],
    ...]}, tensors the server builds from boxes of several checkpoint
    tensors (docs/checkpoints.md, "Assembled tensors"); for a Hugging Face
    model the SDK finds them from transformers' own conversions
    (materializer.hf.checkpoint_layout)."""

    def __init__(self, path, key_rules=None, dtype_policy="cast", require_all=False,
                 assemblies=None):
        if not isinstance(path, str) or not path:
            raise ValueError("checkpoint path must be a non-empty string "
                             f"(ROOT/relative/path), not {path!r}")
        if dtype_policy not in DTYPE_POLICIES:
            raise ValueError(f"dtype_policy must be one of {sorted(DTYPE_POLICIES)}, "
                             f"not {dtype_policy!r}")
        rules = key_rules.items() if isinstance(key_rules, dict) else (key_rules or ())
        self.path = path
        self.key_rules = [(str(a), str(b)) for a, b in rules]
        self.dtype_policy = dtype_policy
        self.require_all = bool(require_all)
        self.assemblies = {str(name): [list(p) for p in parts]
                           for name, parts in (assemblies or {}).items()}

    def to_proto(self):
        return pb.CheckpointSource(
            path=self.path,
            key_rules=[pb.KeyRule(**{"from": a, "to": b}) for a, b in self.key_rules],
            dtype_policy=DTYPE_POLICIES[self.dtype_policy],
            require_all=self.require_all,
            assemblies=[pb.TensorAssembly(tensor=name, parts=[
                pb.AssemblyPart(key=k, key_offset=ko, key_shape=ks, offset=o, shape=sh)
                for k, ko, ks, o, sh in parts]) for name, parts in self.assemblies.items()])

    def __repr__(self):
        return (f"Checkpoint({self.path!r}, key_rules={self.key_rules!r}, "
                f"dtype_policy={self.dtype_policy!r}, require_all={self.require_all}"
                + (f", assemblies=<{len(self.assemblies)} tensors>" if self.assemblies else "")
                + ")")


def for_tensors(source_pb, names):
    """CheckpointSource `source_pb` for a request holding only the tensors
    `names` (one part of a model split into several handles): the
    assemblies of the other parts' tensors left out."""
    if not source_pb.assemblies:
        return source_pb
    names = set(names)
    part = pb.CheckpointSource()
    part.CopyFrom(source_pb)
    del part.assemblies[:]
    part.assemblies.extend(a for a in source_pb.assemblies if a.tensor in names)
    return part


def check_assembled(source_pb, report):
    """Raises CheckpointLayoutError unless the server built every tensor
    `source_pb` (what one Materialize sent) asked it to assemble: a server
    older than assemblies ignores them, reports 0, and would have left
    those tensors to their inits (random experts, without an error)."""
    sent = len(source_pb.assemblies) if source_pb is not None else 0
    if sent and report.tensors_assembled != sent:
        from materializer.errors import CheckpointLayoutError
        names = ", ".join(a.tensor for a in source_pb.assemblies[:3])
        raise CheckpointLayoutError(
            f"the server assembled {report.tensors_assembled} of the {sent} tensors this "
            f"load needs built from several checkpoint tensors ({names}"
            f"{', ...' if sent > 3 else ''}); a server older than assemblies ignores them "
            "and those tensors would have kept their random init. Upgrade the server; "
            "the handle was released")
    return report


def as_checkpoint(value):
    """None, a path, or a Checkpoint -> a Checkpoint or None."""
    if value is None or isinstance(value, Checkpoint):
        return value
    if isinstance(value, str):
        return Checkpoint(value)
    raise TypeError(f"checkpoint must be a path string or a materializer.Checkpoint, "
                    f"not {type(value).__name__}")


class CheckpointReport:
    """What the server took from the checkpoint, over every part: tensors
    loaded and initialized, checkpoint keys no tensor mapped to, bytes read
    from files and found in the server's cache."""

    def __init__(self, reports):
        reports = list(reports)
        self.tensors_loaded = sum(r.tensors_loaded for r in reports)
        self.tensors_initialized = sum(r.tensors_initialized for r in reports)
        # Of tensors_loaded, those built from assemblies.
        self.tensors_assembled = sum(r.tensors_assembled for r in reports)
        self.bytes_read_from_files = sum(r.bytes_read_from_files for r in reports)
        self.bytes_from_cache = sum(r.bytes_from_cache for r in reports)
        # A key is unused only if no part used it.
        unused = None
        for r in reports:
            keys = set(r.unused_keys)
            unused = keys if unused is None else unused & keys
        self.unused_keys = sorted(unused or ())

    def __repr__(self):
        return (f"CheckpointReport(loaded={self.tensors_loaded}, "
                f"initialized={self.tensors_initialized}, "
                f"unused_keys={len(self.unused_keys)}, "
                f"read={self.bytes_read_from_files:,}, cached={self.bytes_from_cache:,})")
