"""Legacy tensor constructors on the meta device, for meta_device().

`torch.Tensor(d, n)`, `torch.FloatTensor(4, 4)` and the other typed
constructors ignore `with torch.device("meta")`: they make CPU tensors of
uninitialized memory, whose values the model's init code then writes
where nobody records it. While `patched()` is active in a thread, these
constructors called from that thread make meta tensors instead (sizes: an
uninitialized meta tensor, which the init code must write; data such as
`torch.Tensor([1.0, 2.0])`: `torch.tensor(data, dtype=...)` on the meta
device, whose values the recorder keeps). Other threads see torch's own
constructors.

`torch.Tensor` gets a `__new__` for the duration; the typed classes
(`torch.FloatTensor`, ...) are immutable, so the `torch` module's names
point at stand-ins that construct as above and answer `isinstance` and
`issubclass` (and any attribute) as the originals do. Code that bound a
typed class before the context (`from torch import FloatTensor`) keeps
torch's; describe() still catches the CPU tensors that makes.

Thread-safe: the patch is installed while any thread is inside and
removed, even on exceptions, when the last one leaves (guarded by _lock).
"""

import contextlib
import threading

import torch

_TYPED = {"FloatTensor": torch.float32, "DoubleTensor": torch.float64,
          "HalfTensor": torch.float16, "BFloat16Tensor": torch.bfloat16,
          "LongTensor": torch.int64, "IntTensor": torch.int32,
          "ShortTensor": torch.int16, "CharTensor": torch.int8,
          "ByteTensor": torch.uint8, "BoolTensor": torch.bool}

_lock = threading.Lock()
_depth = {}        # thread id -> nesting depth; guarded by _lock
_saved = {}        # name -> torch's original, while installed; guarded by _lock
_base_new = torch._C.TensorBase.__new__


def _active():
    return threading.get_ident() in _depth


def _sizes(args):
    if len(args) == 1 and isinstance(args[0], torch.Size):
        return tuple(args[0])
    if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return tuple(args)
    return None


def _make(original, dtype, args, kwargs):
    """What a legacy constructor makes under meta_device(), or torch's own
    result where that is not an uninitialized CPU tensor (an explicit
    device, a tensor or storage to alias)."""
    device = kwargs.get("device")
    if (device is not None and torch.device(device).type != "meta") or \
            set(kwargs) - {"device"} or \
            (len(args) == 1 and isinstance(args[0], (torch.Tensor, torch.UntypedStorage,
                                                      torch.TypedStorage))):
        return original(*args, **kwargs)
    dtype = dtype or torch.get_default_dtype()
    sizes = _sizes(args)
    if sizes is not None:
        return torch.empty(sizes, dtype=dtype, device="meta")
    if len(args) != 1:
        return original(*args, **kwargs)
    return torch.tensor(args[0], dtype=dtype, device="meta")


def _tensor_new(cls, *args, **kwargs):
    if cls is torch.Tensor and _active():
        return _make(lambda *a, **k: _base_new(cls, *a, **k), None, args, kwargs)
    return _base_new(cls, *args, **kwargs)


class _StandIn(type):
    """The metaclass of a typed constructor's stand-in."""

    def __call__(cls, *args, **kwargs):
        if _active():
            return _make(cls._original, cls._dtype, args, kwargs)
        return cls._original(*args, **kwargs)

    def __instancecheck__(cls, obj):
        return isinstance(obj, cls._original)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, cls._original)

    def __getattr__(cls, name):
        return getattr(cls._original, name)

    def __repr__(cls):
        return repr(cls._original)


def _stand_in(name, original):
    return _StandIn(name, (), {"_original": original, "_dtype": _TYPED[name],
                               "__module__": "torch"})


def _install():
    torch.Tensor.__new__ = staticmethod(_tensor_new)
    for name in _TYPED:
        original = getattr(torch, name)
        _saved[name] = original
        setattr(torch, name, _stand_in(name, original))


def _uninstall():
    for name, original in _saved.items():
        setattr(torch, name, original)
    _saved.clear()
    if "__new__" in torch.Tensor.__dict__:
        del torch.Tensor.__new__


@contextlib.contextmanager
def patched():
    """Legacy constructors called from this thread make meta tensors."""
    me = threading.get_ident()
    with _lock:
        if not _depth:
            _install()
        _depth[me] = _depth.get(me, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _depth[me] -= 1
            if not _depth[me]:
                del _depth[me]
            if not _depth:
                _uninstall()
