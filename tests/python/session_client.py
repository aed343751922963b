"""A trainer-like client process for the fault tests: it attaches (opens a
session), does some work bound to the session, reports on stdout, and then
waits to be killed.

    session_client.py ADDRESS CLIENT hold N BYTES
        materializes N handles of BYTES bytes each in the session, prints
        "ready <handle> ...", then sleeps
    session_client.py ADDRESS CLIENT materialize BYTES
        prints "calling", then makes one (slow) Materialize of BYTES bytes in
        64 tensors in the session; it is meant to be killed before the call
        returns
    session_client.py ADDRESS CLIENT fetch BYTES
        materializes BYTES in the session, prints "fetching", then reads the
        fetch stream one chunk every 50 ms; meant to be killed mid-fetch
"""

import os
import sys
import time

sys.path.insert(0, os.environ["MATERIALIZER_PY_PROTO"])

import grpc  # noqa: E402
from materializer.v1 import materializer_pb2 as pb  # noqa: E402
from materializer.v1 import materializer_pb2_grpc as pb_grpc  # noqa: E402


def model(nbytes, name="w", pieces=1):
    """`pieces` float32 tensors of nbytes / pieces bytes each."""
    return pb.ModelSpec(
        tensors=[pb.TensorSpec(name=f"{name}.{i}",
                               shape=[nbytes // pieces // 4], dtype="float32")
                 for i in range(pieces)],
        init_rules=[pb.InitRule(pattern="*", init=pb.InitScheme(
            normal=pb.Normal(std=0.02)))],
        rng=pb.RNG_MODE_TORCH)


def main():
    address, client, mode = sys.argv[1:4]
    args = [int(a) for a in sys.argv[4:]]
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.MaterializerStub(channel)
    md = (("x-materializer-client", client),)

    def requests():
        yield pb.AttachRequest()
        while True:
            time.sleep(3600)

    attach = stub.Attach(requests(), metadata=md)
    session = next(attach).session_id
    smd = md + (("x-materializer-session", session),)

    if mode == "hold":
        count, nbytes = args
        handles = [stub.Materialize(pb.MaterializeRequest(model=model(nbytes)),
                                    metadata=smd).handle
                   for _ in range(count)]
        print("ready", *handles, flush=True)
    elif mode == "materialize":
        (nbytes,) = args
        print("calling", flush=True)
        # A model of many tensors, as real ones are: init stops at the next
        # tensor once the call is cancelled.
        stub.Materialize(pb.MaterializeRequest(model=model(nbytes, pieces=64)),
                         metadata=smd)
        print("returned", flush=True)
    elif mode == "fetch":
        (nbytes,) = args
        handle = stub.Materialize(pb.MaterializeRequest(model=model(nbytes)),
                                  metadata=smd).handle
        print("fetching", handle, flush=True)
        for _ in stub.FetchWeights(pb.FetchRequest(handle=handle,
                                                   chunk_bytes=65536),
                                   metadata=smd):
            time.sleep(0.05)
    time.sleep(3600)


if __name__ == "__main__":
    main()
