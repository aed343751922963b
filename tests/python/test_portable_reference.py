"""The portable RNG's C++ library against its pure-NumPy reference.

Every distribution x float dtype x several shapes and boxes must agree bit
for bit between //server/init/portable:portable_dump (the library) and
tests/python/portable_ref.py (an independent implementation of
docs/portable-rng.md), on every CPU path this machine has.

Needs the dump binary: MATERIALIZER_PORTABLE_DUMP, else
<repo>/bazel-bin/server/init/portable/portable_dump (./dev test builds it).
Starts no server.
"""

import os
import random
import subprocess
from fractions import Fraction

import numpy as np
import pytest

import portable_ref as ref

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DUMP = os.environ.get(
    "MATERIALIZER_PORTABLE_DUMP",
    os.path.join(REPO, "bazel-bin", "server", "init", "portable", "portable_dump"))

FLOAT_DTYPES = ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]
DISTS = {
    "uniform": dict(a=-0.25, b=0.75),
    "normal": dict(mean=0.5, std=2.0),
    "trunc_normal": dict(mean=0.1, std=1.0, a=-2.0, b=1.5),
    "constant": dict(value=0.3),
}


def _dump_binary():
    if not os.path.exists(DUMP):
        pytest.fail(f"portable_dump not found at {DUMP} (set "
                    "MATERIALIZER_PORTABLE_DUMP, or run `./dev test`, which "
                    "builds //server/init/portable:portable_dump)",
                    pytrace=False)
    return DUMP


def dump(dtype, dist, params, shape, box=None, shard=None, seed=1234,
         name="layers.0.weight", path="auto", threads=1, stream=0):
    args = [_dump_binary(), f"--seed={seed}", f"--name={name}",
            f"--dtype={dtype}", f"--dist={dist}", f"--stream={stream}",
            "--shape=" + ",".join(str(s) for s in shape),
            f"--path={path}", f"--threads={threads}"]
    for key, value in params.items():
        args.append(f"--{key}={value!r}")
    if box is not None:
        args.append("--box_offset=" + ",".join(str(o) for o in box[0]))
        args.append("--box_length=" + ",".join(str(n) for n in box[1]))
    if shard is not None:
        args.append("--shard=" + ",".join(f"{d}:{i}:{c}" for d, i, c in shard))
    result = subprocess.run(args, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


def reference_bytes(dtype, dist, params, shape, box=None, seed=1234,
                    name="layers.0.weight", stream=0):
    values = ref.fill(seed, name, dtype, dist, params, shape, box, stream)
    return np.ascontiguousarray(values).tobytes()


def first_difference(got, want, itemsize):
    for k in range(0, min(len(got), len(want)), itemsize):
        if got[k:k + itemsize] != want[k:k + itemsize]:
            return k // itemsize
    return None


def assert_same(got, want, itemsize, what):
    assert len(got) == len(want), f"{what}: {len(got)} bytes, want {len(want)}"
    if got != want:
        k = first_difference(got, want, itemsize)
        pytest.fail(f"{what}: element {k} differs: got "
                    f"{got[k * itemsize:(k + 1) * itemsize].hex()}, want "
                    f"{want[k * itemsize:(k + 1) * itemsize].hex()}")


def cpu_paths():
    out = subprocess.run([_dump_binary(), "--list_paths"], capture_output=True,
                         check=True).stdout.decode().split()
    return out


# ------------------------------------------------- the reference itself ---

def test_reference_philox_matches_random123_known_answers():
    # Random123 kat_vectors (see server/init/portable/philox_test.cc).
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2,
         (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for counter, key, expected in cases:
        words = ref.philox4x32(*[np.array([c], dtype=np.uint32) for c in counter], *key)
        assert [int(w[0]) for w in words] == list(expected)


def _exact_fma32(a, b, c):
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    # Correct rounding to float32 via a float64 that cannot double-round:
    # compare the two float32 neighbours of float32(float64(exact)).
    approx = np.float32(float(exact))
    best = None
    for cand in (np.nextafter(approx, np.float32(-np.inf)), approx,
                 np.nextafter(approx, np.float32(np.inf))):
        err = abs(Fraction(float(cand)) - exact)
        if best is None or err < best[0] or (
                err == best[0] and (int(np.float32(cand).view(np.uint32)) & 1) == 0):
            best = (err, cand)
    return np.float32(best[1])


def test_fma32_emulation_is_correctly_rounded():
    rng = random.Random(5)
    a, b, c = [], [], []
    for _ in range(4000):
        x = np.float32(rng.uniform(-4, 4))
        y = np.float32(rng.uniform(-4, 4))
        # c close to -x*y makes the cancellation (and the rounding) hard.
        z = np.float32(-float(x) * float(y) * (1 + rng.choice([0, 1e-7, -3e-8, 2 ** -24])))
        a.append(x), b.append(y), c.append(z)
    # Products that are float32 midpoints (short significands), nudged by a
    # c far below float64's precision: rounding p + c to float64 first lands
    # on the midpoint and a naive emulation then rounds the wrong way.
    for _ in range(2000):
        x = np.float32((1 + rng.randrange(1 << 12) * 2 ** -12) * rng.choice([1, -1]))
        y = np.float32(1 + rng.randrange(1 << 12) * 2 ** -12)
        z = np.float32(rng.choice([1, -1]) * 2.0 ** -rng.randrange(60, 100))
        a.append(x), b.append(y), c.append(z)
    a, b, c = (np.array(v, dtype=np.float32) for v in (a, b, c))
    got = ref.fma32(a, b, c)
    want = np.array([_exact_fma32(x, y, z) for x, y, z in zip(a, b, c)],
                    dtype=np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_narrow_rounding_matches_torch_conversions():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    bits = np.concatenate([
        rng.integers(0, 2 ** 32, size=200_000, dtype=np.uint64).astype(np.uint32),
        # Near every power of two and the formats' edges: all low bits.
        (np.arange(-4096, 4096, dtype=np.int64)[:, None] +
         (np.arange(0, 256, dtype=np.int64) << 23)[None, :]).reshape(-1)
        .astype(np.uint32),
    ])
    values = bits.view(np.float32)
    values = values[~np.isnan(values)]
    for dtype in ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"):
        ours = ref.round_to_narrow(values, dtype)
        theirs = torch.from_numpy(values).to(getattr(torch, dtype))
        view = torch.int16 if theirs.element_size() == 2 else torch.uint8
        theirs = theirs.view(view).numpy().view(ours.dtype)
        mismatch = np.nonzero(ours != theirs)[0]
        assert mismatch.size == 0, (
            f"{dtype}: {mismatch.size} differ, e.g. {values[mismatch[0]]!r}: "
            f"ours {ours[mismatch[0]]:#x} torch {theirs[mismatch[0]]:#x}")


def test_host_erf_is_accurate():
    import math
    for x in np.linspace(-7, 7, 2801):
        assert abs(ref.portable_erf(float(x)) - math.erf(float(x))) < 4e-15


def test_reference_reproduces_the_pinned_hashes():
    # The table pinned in server/init/portable/portable_test.cc
    # (PinnedKnownAnswers): FNV-1a 64 of the bytes of every (distribution,
    # dtype) fill of a (7, 45) tensor, seed 1234, "layers.0.weight".
    dtypes = ["float32", "float64", "bfloat16", "float16", "float8_e4m3fn",
              "float8_e5m2"]
    dists = [("constant", DISTS["constant"]), ("uniform", DISTS["uniform"]),
             ("normal", DISTS["normal"]), ("trunc_normal", DISTS["trunc_normal"])]
    pinned = [
        [0xe7f46f34c1bfe74f, 0x8b982b0f0221d829, 0xcecb7ef4c90df999,
         0xd3cae27dbc2f9a9c, 0xa95e2166f6c5ef0d, 0x999c1f5be903efa6],
        [0xda1355a4fbf6409a, 0xfe57bbc56c76ea78, 0xa04c57d50f060d1c,
         0x89a7e366d9f604f2, 0x726ced07cb3623d2, 0xe391ac6d676b90e5],
        [0x9a5774d3adb99977, 0xbe559318a189ad50, 0x3c710dda4d467a11,
         0x0acbf9884fed8306, 0x80b190b9d99c66e2, 0x2111b74502a0814d],
        [0x7991792667698f1b, 0x3eb5d585abb36649, 0x1110104765a3df35,
         0xf73a841a1db1af9c, 0x6dd32668deaa2e74, 0xcf51e382cf2994ac],
    ]
    for (dist, params), row in zip(dists, pinned):
        for dtype, want in zip(dtypes, row):
            data = reference_bytes(dtype, dist, params, (7, 45))
            assert ref.fnv1a64(data) == want, (dist, dtype)
    first = ref.fill(1, "w", "float32", "normal", dict(mean=0.0, std=1.0), (8,))
    assert [int(v) for v in first.view(np.uint32)] == [
        0xbecd0428, 0xbdfdb512, 0xbe8f61f1, 0x3f3174b0,
        0xbe9d82e8, 0x3fd382f3, 0xbe3400da, 0x3f8ede6f]


# ------------------------------------------------ library vs reference ----

SHAPES_AND_BOXES = [
    ((1000,), None),
    ((7, 45), None),                       # rows shorter than a group
    ((5, 130), ((1, 3), (3, 101))),        # interior box: partial groups
    ((3, 4, 70), ((0, 1, 0), (3, 2, 70))),  # merged inner dims
    ((), None),                            # a scalar
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dist", sorted(DISTS))
def test_library_matches_reference(dtype, dist):
    for shape, box in SHAPES_AND_BOXES:
        want = reference_bytes(dtype, dist, DISTS[dist], shape, box)
        for path in cpu_paths():
            got = dump(dtype, dist, DISTS[dist], shape, box, path=path)
            assert_same(got, want, ref.ITEMSIZE[dtype],
                        f"{dtype} {dist} shape {shape} box {box} path {path}")


@pytest.mark.parametrize("dist", sorted(DISTS))
def test_library_matches_reference_float64(dist):
    # fma64 is exact rational arithmetic: keep these small.
    for shape, box in [((70,), None), ((3, 40), ((1, 5), (2, 30))), ((), None)]:
        want = reference_bytes("float64", dist, DISTS[dist], shape, box)
        for path in cpu_paths():
            got = dump("float64", dist, DISTS[dist], shape, box, path=path)
            assert_same(got, want, 8, f"float64 {dist} {shape} {box} {path}")


@pytest.mark.parametrize("dist,params", [
    ("normal", dict(mean=0.0, std=0.02)),            # GPT-2 style
    ("trunc_normal", dict(mean=0.0, std=0.02, a=-2.0, b=2.0)),  # timm ViT
    ("trunc_normal", dict(mean=0.0, std=1.0, a=2.5, b=9.0)),    # one tail
    ("trunc_normal", dict(mean=1.0, std=3.0, a=0.9, b=1.1)),    # narrow
    ("uniform", dict(a=-0.0625, b=0.0625)),          # kaiming_uniform-like
    ("uniform", dict(a=3.0, b=3.0)),                 # empty range
    ("normal", dict(mean=0.0, std=0.0)),
    ("normal", dict(mean=-1e30, std=1e29)),          # large float32 values
    ("normal", dict(mean=0.0, std=1e-40)),           # subnormal float32
])
def test_library_matches_reference_edge_parameters(dist, params):
    for dtype in ["float32", "bfloat16", "float16", "float8_e4m3fn",
                  "float8_e5m2"]:
        want = reference_bytes(dtype, dist, params, (4, 300), seed=99, name="e")
        got = dump(dtype, dist, params, (4, 300), seed=99, name="e")
        assert_same(got, want, ref.ITEMSIZE[dtype], f"{dtype} {dist} {params}")


def test_library_matches_reference_many_normals():
    # 2^18 float32 normals: covers the angle quadrants and the log's range.
    want = reference_bytes("float32", "normal", dict(mean=0.0, std=1.0),
                           (1 << 18,), seed=5, name="big")
    got = dump("float32", "normal", dict(mean=0.0, std=1.0), (1 << 18,),
               seed=5, name="big", threads=3)
    assert_same(got, want, 4, "2^18 normals")


def test_library_matches_reference_at_huge_indices():
    # The counter's high word: a box deep inside a tensor of 2^40 elements.
    shape = (1 << 20, 1 << 20)
    box = (((1 << 20) - 2, (1 << 20) - 100), (2, 100))
    for dtype, dist in [("float32", "normal"), ("bfloat16", "uniform"),
                        ("float64", "normal")]:
        want = reference_bytes(dtype, dist, DISTS[dist], shape, box)
        got = dump(dtype, dist, DISTS[dist], shape, box)
        assert_same(got, want, ref.ITEMSIZE[dtype], f"{dtype} {dist} huge")


def test_stream_and_seed_change_the_values():
    a = dump("float32", "normal", DISTS["normal"], (64,))
    assert a == reference_bytes("float32", "normal", DISTS["normal"], (64,))
    assert dump("float32", "normal", DISTS["normal"], (64,), stream=1) != a
    assert dump("float32", "normal", DISTS["normal"], (64,), seed=1235) != a
    assert dump("float32", "normal", DISTS["normal"], (64,), name="other") != a
    assert dump("float32", "normal", DISTS["normal"], (64,), stream=1) == \
        reference_bytes("float32", "normal", DISTS["normal"], (64,), stream=1)


# ---------------------------------------------------- shard invariance ----

def _assemble(shape, pieces):
    """pieces: list of (box, bytes-as-array) -> full array."""
    full = None
    for (offset, length), arr in pieces:
        if full is None:
            full = np.zeros(shape, dtype=arr.dtype)
        full[tuple(slice(o, o + n) for o, n in zip(offset, length))] = \
            arr.reshape(length)
    return full


@pytest.mark.parametrize("layout", [
    ("1-D, uneven", (1001,), [[(0, i, 4)] for i in range(4)]),
    ("rows", (37, 64), [[(0, i, 8)] for i in range(8)]),
    ("columns", (16, 99), [[(1, i, 5)] for i in range(5)]),
    ("2-D blocks", (30, 50), [[(0, r, 3), (1, c, 4)] for r in range(3) for c in range(4)]),
    ("more shards than rows", (3, 70), [[(0, i, 5)] for i in range(5)]),
])
def test_shards_reassemble_to_the_full_tensor(layout):
    _, shape, shard_lists = layout
    np_dtype = {"float32": np.float32, "bfloat16": np.uint16,
                "float8_e4m3fn": np.uint8}
    for dtype in np_dtype:
        full = np.frombuffer(dump(dtype, "normal", DISTS["normal"], shape),
                             dtype=np_dtype[dtype]).reshape(shape)
        pieces = []
        for shards in shard_lists:
            box = ref.chunk_box(shape, shards)
            got = dump(dtype, "normal", DISTS["normal"], shape, shard=shards)
            pieces.append((box, np.frombuffer(got, dtype=np_dtype[dtype])))
            # The library's shard box is torch.chunk's.
            assert len(got) == int(np.prod(box[1])) * ref.ITEMSIZE[dtype]
        np.testing.assert_array_equal(_assemble(shape, pieces), full)
        torch = pytest.importorskip("torch")
        for (box, arr), shards in zip(pieces, shard_lists):
            t = torch.from_numpy(full.copy())
            for dim, index, count in shards:
                chunks = torch.chunk(t, count, dim=dim)
                t = chunks[index] if index < len(chunks) else t.narrow(dim, 0, 0)
            np.testing.assert_array_equal(t.numpy().reshape(-1), arr)
