"""Code generation from .proto files with the system protoc and gRPC plugins.

Bazel 4 offline has no rules_proto/grpc rules, so a genrule runs Debian's
protoc with grpc_cpp_plugin / grpc_python_plugin. Import paths are relative
to the calling package (e.g. //proto), so "materializer/v1/x.proto" is both
the file's registered name (what reflection clients see) and the include
path of its generated header.
"""

def _base(src):
    if not src.endswith(".proto"):
        fail("expected a .proto file, got " + src)
    return src[:-len(".proto")]

def cc_grpc_library(name, srcs, deps = [], visibility = None):
    """C++ messages and gRPC stubs for `srcs`, as one cc_library."""
    hdrs = []
    cc_srcs = []
    for src in srcs:
        base = _base(src)
        hdrs += [base + ".pb.h", base + ".grpc.pb.h"]
        cc_srcs += [base + ".pb.cc", base + ".grpc.pb.cc"]
    native.genrule(
        name = name + "_codegen",
        srcs = srcs,
        outs = hdrs + cc_srcs,
        cmd = ("protoc -I{pkg} " +
               "--cpp_out=$(RULEDIR) --grpc_out=$(RULEDIR) " +
               "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) " +
               "{files}").format(
            pkg = native.package_name() or ".",
            files = " ".join(["$(location %s)" % s for s in srcs]),
        ),
    )
    native.cc_library(
        name = name,
        srcs = cc_srcs,
        hdrs = hdrs,
        # -isystem: generated code is not held to our warning flags.
        includes = ["."],
        copts = ["-w"],
        linkstatic = True,  # no unused .so (see mat_cc_library)
        deps = deps + [
            "@system_grpc//:grpc++",
            "@system_protobuf//:protobuf",
        ],
        visibility = visibility,
    )

def py_grpc_sources(name, srcs, visibility = None):
    """Python messages (_pb2.py) and gRPC stubs (_pb2_grpc.py) for tests."""
    outs = []
    for src in srcs:
        base = _base(src)
        outs += [base + "_pb2.py", base + "_pb2_grpc.py"]
    native.genrule(
        name = name,
        srcs = srcs,
        outs = outs,
        cmd = ("protoc -I{pkg} " +
               "--python_out=$(RULEDIR) --grpc_out=$(RULEDIR) " +
               "--plugin=protoc-gen-grpc=$$(command -v grpc_python_plugin) " +
               "{files}").format(
            pkg = native.package_name() or ".",
            files = " ".join(["$(location %s)" % s for s in srcs]),
        ),
        visibility = visibility,
    )
