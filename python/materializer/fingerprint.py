"""The service's shard-composable fingerprints (docs/delivery.md), computed
on the trainer's side: check that a loaded tensor, or this rank's shard of
it, holds what the server made, and that ranks' shards add up to the full
model, by comparing 8-byte numbers.

    fp = fingerprint.of_tensor(shard, full_shape=[4096, 4096], offset=[1024, 0])
    total = fingerprint.combine(all_ranks_values)   # == full tensor's value
"""

import numpy as np

MASK = (1 << 64) - 1
_WIDTH = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# Elements hashed per step: bounds the temporary arrays (~40 bytes each).
_STEP = 1 << 20


def _splitmix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def _global_index(flat, shape, full_shape, offset):
    """Row-major index in the full tensor of the elements `flat` (indices
    into the stored box)."""
    g = np.zeros(flat.shape, dtype=np.uint64)
    rest = flat.astype(np.uint64)
    stride = 1
    for d in reversed(range(len(shape))):
        size = np.uint64(shape[d])
        g += (rest % size + np.uint64(offset[d])) * np.uint64(stride)
        rest //= size
        stride *= int(full_shape[d])
    return g


def of_bytes(data, itemsize: int, shape, full_shape=None, offset=None) -> int:
    """TensorInfo.fingerprint of row-major little-endian elements; `shape`
    is what `data` holds, `full_shape`/`offset` place it in the full tensor
    (defaults: the whole tensor)."""
    shape = [int(s) for s in shape]
    full_shape = [int(s) for s in (full_shape or shape)]
    offset = [int(o) for o in (offset or [0] * len(shape))]
    bits = np.frombuffer(data, dtype=_WIDTH[itemsize])
    total = 0
    with np.errstate(over="ignore"):
        for start in range(0, bits.size, _STEP):
            chunk = bits[start:start + _STEP].astype(np.uint64)
            flat = np.arange(start, start + chunk.size, dtype=np.uint64)
            g = (_global_index(flat, shape, full_shape, offset)
                 if shape else flat)
            terms = _splitmix64(g ^ _splitmix64(chunk))
            # Sum in two 32-bit halves so that no partial sum overflows.
            lo = int((terms & np.uint64(0xFFFFFFFF)).sum(dtype=np.uint64))
            hi = int((terms >> np.uint64(32)).sum(dtype=np.uint64))
            total = (total + lo + (hi << 32)) & MASK
    return total


def of_tensor(tensor, full_shape=None, offset=None) -> int:
    """TensorInfo.fingerprint of a torch tensor (copied to the CPU if
    needed), or of its place in the full tensor when it is a shard."""
    import torch
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
    return of_bytes(raw, t.element_size(), list(t.shape), full_shape, offset)


def combine(values) -> int:
    """Shards' fingerprints (or per-rank handle fingerprints) -> the whole's."""
    return sum(int(v) for v in values) & MASK


def of_handle(tensor_fingerprints) -> int:
    """HandleInfo.fingerprint from {name: fingerprint} of the tensors that
    are not ties."""
    return sum(int(fp) * (_fnv1a64(name.encode()) | 1)
               for name, fp in tensor_fingerprints.items()) & MASK
