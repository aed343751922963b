"""A second process opening a CUDA IPC export with torch (requires a GPU):
prints each tensor's digest as one JSON line."""

import ctypes
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
sys.path.insert(0, os.environ["MATERIALIZER_PY_PROTO"])

import torch  # noqa: E402
from materializer.v1 import materializer_pb2  # noqa: E402
from materializer import digest  # noqa: E402

def main():
    export = materializer_pb2.ExportResponse()
    with open(sys.argv[1], "rb") as f:
        export.ParseFromString(f.read())
    torch.cuda.init()  # loads the CUDA runtime
    cudart = None
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            cudart = ctypes.CDLL(name)
            break
        except OSError:
            continue
    assert cudart is not None, "no libcudart"

    class IpcHandle(ctypes.Structure):  # cudaIpcMemHandle_t, by value
        _fields_ = [("reserved", ctypes.c_char * 64)]

    handle = IpcHandle()
    ctypes.memmove(ctypes.addressof(handle), export.cuda.ipc_handle, 64)
    cudart.cudaIpcOpenMemHandle.argtypes = [
        ctypes.POINTER(ctypes.c_void_p), IpcHandle, ctypes.c_uint]
    pointer = ctypes.c_void_p()
    cudart.cudaSetDevice(export.cuda.device_ordinal)
    err = cudart.cudaIpcOpenMemHandle(ctypes.byref(pointer), handle, 1)
    assert err == 0, f"cudaIpcOpenMemHandle: {err}"
    base = pointer.value + export.cuda.base_offset
    out = {}
    for t in export.tensors:
        host = torch.empty(t.nbytes, dtype=torch.uint8)
        if t.nbytes:
            assert cudart.cudaMemcpy(ctypes.c_void_p(host.data_ptr()),
                                     ctypes.c_void_p(base + t.offset),
                                     ctypes.c_size_t(t.nbytes), 2) == 0
        out[t.name] = digest.of_bytes(host.numpy().tobytes())
    cudart.cudaIpcCloseMemHandle(pointer)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
