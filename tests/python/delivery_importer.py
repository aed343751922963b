"""A second process importing a CPU export (test_delivery_export.py).

    python delivery_importer.py EXPORT.pb

Maps the export with materializer.shm, prints one JSON line (each
tensor's digest, whether every tensor is a view into the mapping, the
process's anonymous and shared resident memory before and after reading
every byte), then waits for a line on stdin, reads the bytes again and
prints their digests once more, and exits when stdin closes.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
sys.path.insert(0, os.environ["MATERIALIZER_PY_PROTO"])

from materializer.v1 import materializer_pb2  # noqa: E402
from materializer import digest, shm  # noqa: E402


def rss():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    return out


def main():
    export = materializer_pb2.ExportResponse()
    with open(sys.argv[1], "rb") as f:
        export.ParseFromString(f.read())
    imported = shm.map_export(export)
    before = rss()
    base, size = imported.address(), imported.size
    views = all(
        t.numel() == 0 or base <= t.data_ptr() < base + size
        for t in imported.tensors.values())
    digests = {n: digest.of_tensor(t) for n, t in imported.tensors.items()}
    print(json.dumps({"digests": digests, "views": views, "before": before,
                      "after": rss(), "path": imported.path}), flush=True)
    sys.stdin.readline()  # the server released the handle meanwhile
    again = {n: digest.of_tensor(t) for n, t in imported.tensors.items()}
    print(json.dumps({"digests": again}), flush=True)
    sys.stdin.read()
    imported.close()


if __name__ == "__main__":
    main()
