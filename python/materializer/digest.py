"""The service's content digests: XXH3-128, written "xxh3-128:<32 hex>"
(high 64 bits first, as xxhash's hexdigest prints them). They detect
corruption, not tampering."""

import xxhash

PREFIX = "xxh3-128:"


def of_bytes(data) -> str:
    """Digest of a bytes-like object (bytes, memoryview, mmap)."""
    return PREFIX + xxhash.xxh3_128(data).hexdigest()


def of_tensor(tensor) -> str:
    """Digest of a tensor's bytes (as TensorInfo.digest), for a CPU tensor;
    contiguous tensors are hashed in place."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return of_bytes(b"")
    return of_bytes(memoryview(t.view(__import__("torch").uint8).numpy()))


def of_handle(tensor_digests) -> str:
    """HandleInfo.digest from the tensors' digests in Describe's order."""
    h = xxhash.xxh3_128()
    for d in tensor_digests:
        h.update(bytes.fromhex(d[len(PREFIX):]))
    return PREFIX + h.hexdigest()
