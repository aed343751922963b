"""Where a view lies in the tensor it views.

Init code writes through views: `weight[padding_idx].zero_()`,
`w.data[:, :k].normal_()`, `w.view(-1).copy_(x)`. Each is turned into a
*box* of the base tensor (one (offset, length) per dimension, or None for
the whole tensor) plus the view's geometry inside that box, so that values
written through a transposed or reshaped view land on the right elements.
A view that is not a box (a strided slice `w[::2]`, a diagonal) is refused
by the caller with the tensor's name.
"""

import math

import torch


class NotABox(Exception):
    """The view's elements do not form a box of the base."""


def contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


class Box:
    """A view `x` of a contiguous base tensor, as a box of the base.

    region: None (the whole base) or a tuple of (offset, length) per base
      dimension.
    shape: the box's shape.
    view(t): given a contiguous tensor `t` of the box's shape, the view of
      it that corresponds to `x` (same sizes, same element mapping).
    """

    __slots__ = ("region", "shape", "_sizes", "_strides", "_offset", "whole")

    def __init__(self, region, shape, sizes, strides, offset):
        self.region = region
        self.shape = tuple(shape)
        self._sizes = tuple(sizes)
        self._strides = tuple(strides)
        self._offset = offset
        self.whole = region is None

    def view(self, t):
        return t.as_strided(self._sizes, self._strides, t.storage_offset() + self._offset)

    @property
    def numel(self):
        return math.prod(self.shape)

    @property
    def natural(self):
        """Whether the view's elements, in row-major order, are the box's
        in row-major order (no transposition, no broadcast): then an
        elementwise program over the box is one over the view."""
        if self._offset != 0 or math.prod(self._sizes) != self.numel:
            return False
        want = contiguous_strides(self._sizes)
        return all(st == w for sz, st, w in zip(self._sizes, self._strides, want) if sz > 1)


def locate(x, base):
    """The Box of `x` (a tensor sharing `base`'s storage) in `base`
    (contiguous). Raises NotABox."""
    shape = tuple(base.shape)
    if (x.shape == base.shape and x.storage_offset() == base.storage_offset()
            and x.stride() == base.stride()):
        # The tensor itself (or .data, or an alias): the common case.
        return Box(None, shape, shape, contiguous_strides(shape), 0)
    shape = tuple(int(s) for s in shape)
    if base.numel() == 0:
        return Box(None, shape, x.shape, contiguous_strides(x.shape), 0)
    if x.dtype.itemsize != base.dtype.itemsize:
        raise NotABox("the view has another element size than the tensor")
    bstrides = contiguous_strides(shape)
    rel = x.storage_offset() - base.storage_offset()
    n = x.numel()
    if n == 0:
        return Box(tuple((0, 0) for _ in shape), [0] * len(shape), x.shape,
                   contiguous_strides(x.shape), 0)
    if rel < 0 or rel >= base.numel():
        raise NotABox("the view starts outside the tensor")
    # Dimensions of the view with more than one element, each on a base dim.
    used = {}
    dims_ok = True
    for k, (size, stride) in enumerate(zip(x.shape, x.stride())):
        if size == 1:
            continue
        matches = [d for d, bs in enumerate(bstrides) if bs == stride and shape[d] > 1]
        if len(matches) != 1 or matches[0] in used.values():
            dims_ok = False
            break
        used[k] = matches[0]
    origin = []
    rest = rel
    for bs in bstrides:
        origin.append(rest // bs)
        rest %= bs
    if dims_ok:
        lengths = [1] * len(shape)
        for k, d in used.items():
            lengths[d] = int(x.shape[k])
        if any(origin[d] + lengths[d] > shape[d] for d in range(len(shape))):
            dims_ok = False
    if dims_ok:
        box_shape = lengths
        box_strides = contiguous_strides(box_shape)
        sizes = tuple(int(s) for s in x.shape)
        strides = []
        for k in range(len(sizes)):
            strides.append(box_strides[used[k]] if k in used else 0)
        region = tuple(zip(origin, lengths))
        if all(o == 0 and l == s for (o, l), s in zip(region, shape)):
            region = None
        return Box(region, box_shape, sizes, strides, 0)
    # A contiguous view over a run of base elements (x.view(-1), merged dims).
    if not x.is_contiguous():
        raise NotABox("a strided view that is not a box of the tensor")
    for k in range(len(shape), -1, -1):
        inner = math.prod(shape[k:])
        if rel % inner or n % inner:
            continue
        if k == 0:
            region = None
            box_shape = list(shape)
        else:
            lo, hi = rel // inner, (rel + n) // inner
            d = k - 1
            if lo // shape[d] != (hi - 1) // shape[d]:
                continue
            region = tuple((origin[i], 1) for i in range(d)) + \
                ((lo % shape[d], hi - lo),) + tuple((0, shape[i]) for i in range(k, len(shape)))
            box_shape = [l for _, l in region]
            if all(o == 0 and l == s for (o, l), s in zip(region, shape)):
                region = None
        return Box(region, box_shape, x.shape, contiguous_strides(x.shape), 0)
    raise NotABox("a reshaped view that is not a box of the tensor")


def contains(outer, inner, shape):
    """Whether region `inner` lies inside region `outer` (None = whole)."""
    if outer is None:
        return True
    if inner is None:
        return all(o == 0 and l == s for (o, l), s in zip(outer, shape))
    return all(oo <= io and io + il <= oo + ol
               for (oo, ol), (io, il) in zip(outer, inner))


def intersect(a, b, shape):
    """The intersection of two regions (None = whole), or "empty"."""
    a = a if a is not None else tuple((0, s) for s in shape)
    b = b if b is not None else tuple((0, s) for s in shape)
    out = []
    for (ao, al), (bo, bl) in zip(a, b):
        lo, hi = max(ao, bo), min(ao + al, bo + bl)
        if hi <= lo:
            return "empty"
        out.append((lo, hi - lo))
    return tuple(out)


def slice_of(t, region):
    """t[o0:o0+l0, ...] for a region (None: t)."""
    if region is None:
        return t
    return t[tuple(slice(o, o + l) for o, l in region)]


def relative(region, within, shape):
    """`region` (in base coordinates) relative to the box `within`."""
    r = region if region is not None else tuple((0, s) for s in shape)
    w = within if within is not None else tuple((0, s) for s in shape)
    return tuple((o - wo, l) for (o, l), (wo, _) in zip(r, w))


def covers(boxes, shape, max_cells=1 << 20):
    """Whether the union of `boxes` (regions; None = whole) is the whole
    tensor. Exact, on the grid the boxes' edges make (False when that grid
    would have more than max_cells cells)."""
    if any(b is None for b in boxes):
        return True
    if math.prod(shape) == 0:
        return True
    edges = []
    for d, size in enumerate(shape):
        cuts = {0, size}
        for b in boxes:
            cuts.add(b[d][0])
            cuts.add(b[d][0] + b[d][1])
        edges.append(sorted(c for c in cuts if 0 <= c <= size))
    cells = math.prod(len(e) - 1 for e in edges)
    if cells > max_cells:
        return False
    covered = torch.zeros([len(e) - 1 for e in edges], dtype=torch.bool)
    for b in boxes:
        index = []
        for d, (o, l) in enumerate(b):
            lo, hi = edges[d].index(o), edges[d].index(o + l)
            index.append(slice(lo, hi))
        covered[tuple(index)] = True
    return bool(covered.all())
