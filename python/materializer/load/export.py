"""Zero-copy delivery from a server on the same host.

- Shared memory (CPU arenas): the export's /dev/shm file is mapped and the
  module's tensors become views of the mapping: nothing is copied, and the
  mapping outlives the handle's release. When the handle is released
  right after loading (the default), the pages themselves are mapped
  writable (MAP_SHARED, populated): once the server lets go of them they
  are the trainer's, and its first write to each page (the first
  optimizer step) costs no copy-on-write fault and no 4 KiB copy. With
  keep_handle, or where the file cannot be opened for writing, the mapping
  is copy-on-write (MAP_PRIVATE): pages the trainer writes become its own
  and the server's arena is never changed.
- CUDA IPC (CUDA arenas): the arena is opened in this process and each
  tensor is copied device to device into the module's own tensors, then
  the mapping is closed, so the trainer holds no memory of the server's
  (a CUDA export keeps the server's allocation until it is closed).
"""

import ctypes

import torch

from materializer import shm
from materializer.errors import LoadError


def shm_views(export, spec, shared=False):
    """{root name: tensor viewing the mapped export}, shaped as the spec's
    local shapes. shared: map the pages themselves (the caller releases the
    handle before anything writes them), else copy-on-write."""
    imported = shm.map_export(export, writable="shared" if shared else True)
    views = {}
    for desc in spec.roots:
        t = imported.tensors.get(desc.name)
        if t is None:
            raise LoadError(f"the export has no tensor {desc.name}")
        if tuple(t.shape) != desc.local_shape or t.dtype != desc.dtype:
            raise LoadError(f"{desc.name}: the export holds {list(t.shape)} {t.dtype}, "
                            f"the spec {list(desc.local_shape)} {desc.dtype}")
        views[desc.name] = t
    imported.close()  # the views keep the mapping
    return views


_cudart = None


def _runtime():
    global _cudart
    if _cudart is None:
        torch.cuda.init()
        for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"):
            try:
                _cudart = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if _cudart is None:
            raise LoadError("CUDA IPC needs the CUDA runtime (libcudart) next to torch")

        class Handle(ctypes.Structure):
            _fields_ = [("reserved", ctypes.c_char * 64)]

        _cudart.Handle = Handle
        _cudart.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), Handle, ctypes.c_uint]
        _cudart.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        _cudart.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                            ctypes.c_int, ctypes.c_void_p]
    return _cudart


def device_uuid(device):
    """"GPU-..." of a torch CUDA device, as ExportRequest.importer_device_uuid wants."""
    props = torch.cuda.get_device_properties(torch.device(device))
    return "GPU-" + str(props.uuid)


def copy_cuda_ipc(export, spec, dests, device):
    """Copies every tensor of a CUDA export into `dests` (tensors on
    `device`, the export's GPU), device to device."""
    rt = _runtime()
    device = torch.device(device)
    handle = rt.Handle()
    ctypes.memmove(ctypes.addressof(handle), export.cuda.ipc_handle, 64)
    pointer = ctypes.c_void_p()
    with torch.cuda.device(device):
        err = rt.cudaIpcOpenMemHandle(ctypes.byref(pointer), handle, 1)
        if err != 0:
            raise LoadError(f"cudaIpcOpenMemHandle failed with CUDA error {err}")
        try:
            base = pointer.value + export.cuda.base_offset
            offsets = {t.name: (t.offset, t.nbytes) for t in export.tensors}
            stream = torch.cuda.current_stream(device)
            for desc in spec.roots:
                off, nbytes = offsets[desc.name]
                dst = dests[desc.name]
                if dst.numel() * dst.element_size() != nbytes:
                    raise LoadError(f"{desc.name}: {nbytes} bytes in the export, "
                                    f"{dst.numel() * dst.element_size()} in the module")
                if nbytes:
                    err = rt.cudaMemcpyAsync(ctypes.c_void_p(dst.data_ptr()),
                                             ctypes.c_void_p(base + off), nbytes, 3,
                                             ctypes.c_void_p(stream.cuda_stream))
                    if err != 0:
                        raise LoadError(f"cudaMemcpyAsync failed with CUDA error {err}")
            stream.synchronize()
        finally:
            rt.cudaIpcCloseMemHandle(pointer)
