#!/bin/bash
# Checks what nvcc built for the portable kernels (see BUILD.bazel):
#   $1  <name>.nvcc.txt   which nvcc, or "stub: ..." when there was none
#   $2  <name>.ptx        PTX of portable_kernel.cu
#   $3  the kernels' static library
set -euo pipefail
status_file="$1" ptx="$2" lib="$3"
status="$(cat "$status_file")"
echo "$status"
if [[ "$status" == stub:* ]]; then
  echo "SKIPPED: the CUDA kernels were not compiled: ${status#stub: }"
  exit 0
fi
fail() { echo "FAIL: $*"; exit 1; }

# One kernel per (distribution, format): 4 x 6.
entries="$(grep -c '^\.visible \.entry\|^\.entry\|\.entry ' "$ptx" || true)"
echo "kernels in PTX: $entries"
[ "$entries" -ge 24 ] || fail "expected 24 kernel entries in the PTX, found $entries"

# With --fmad=false, nvcc writes add/sub/mul with an explicit .rn, which
# ptxas never contracts into fma; a bare one could be fused and change bits.
bare="$(grep -E '^\s*(add|sub|mul)\.f(32|64)\s' "$ptx" || true)"
[ -z "$bare" ] || fail "unfused-rounding-unspecified float ops in PTX:
$(echo "$bare" | head -5)"
# No approximate or flush-to-zero arithmetic anywhere.
approx="$(grep -E '\.(approx|ftz)\b' "$ptx" || true)"
[ -z "$approx" ] || fail "approximate or ftz ops in PTX:
$(echo "$approx" | head -5)"
fmas="$(grep -cE '^\s*fma\.rn\.f(32|64)' "$ptx" || true)"
divs="$(grep -cE '^\s*div\.rn\.f(32|64)' "$ptx" || true)"
sqrts="$(grep -cE '^\s*sqrt\.rn\.f(32|64)' "$ptx" || true)"
echo "explicit fma.rn: $fmas, div.rn: $divs, sqrt.rn: $sqrts"
[ "$fmas" -gt 0 ] && [ "$divs" -gt 0 ] && [ "$sqrts" -gt 0 ] ||
  fail "expected fma.rn, div.rn and sqrt.rn in the PTX"

# The object carries device code (a fat binary) for the launcher.
sections="$(readelf -S -W "$lib")"
symbols="$(nm -C "$lib")"
grep -q '\.nv_fatbin' <<<"$sections" || fail "no .nv_fatbin in $lib"
grep -q 'LaunchPortableFill' <<<"$symbols" || fail "no LaunchPortableFill in $lib"
echo "PASS: CUDA kernels compiled by nvcc, PTX arithmetic exact (.rn)"
