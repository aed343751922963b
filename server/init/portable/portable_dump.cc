// Writes the bytes of one portable fill to stdout, for the NumPy reference
// test (tests/python/test_portable_reference.py), which runs it once per
// case and compares with tests/python/portable_ref.py.
//
//   portable_dump --seed=7 --name=w --dtype=bfloat16 --dist=normal
//       --mean=0 --std=0.02 --shape=11,8 --box_offset=3,0 --box_length=3,8
//       [--shard=0:1:4,1:0:2] [--path=avx2] [--threads=3]
//   portable_dump --list_paths      # the CPU paths this machine can run

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "server/init/portable/portable.h"
#include "server/spec/dtype.h"

ABSL_FLAG(uint64_t, seed, 0, "request seed");
ABSL_FLAG(std::string, name, "", "tensor name (hashed with NameHash)");
ABSL_FLAG(uint32_t, stream, 0, "counter word 2");
ABSL_FLAG(std::string, dtype, "float32", "torch dtype name");
ABSL_FLAG(std::string, dist, "normal",
          "constant, uniform, normal or trunc_normal");
ABSL_FLAG(double, value, 0, "constant value");
ABSL_FLAG(double, a, 0, "uniform / trunc_normal lower bound");
ABSL_FLAG(double, b, 1, "uniform / trunc_normal upper bound");
ABSL_FLAG(double, mean, 0, "normal / trunc_normal mean");
ABSL_FLAG(double, std, 1, "normal / trunc_normal std");
ABSL_FLAG(std::string, shape, "", "full shape, comma-separated");
ABSL_FLAG(std::string, box_offset, "", "box offsets (with --box_length)");
ABSL_FLAG(std::string, box_length, "", "box lengths");
ABSL_FLAG(std::string, shard, "",
          "dim:index:count[,dim:index:count...] (instead of a box)");
ABSL_FLAG(std::string, path, "auto", "auto, scalar, avx2 or avx512");
ABSL_FLAG(int, threads, 1, "threads (0: all cores)");
ABSL_FLAG(bool, list_paths, false, "print the available CPU paths and exit");

namespace materializer::init::portable {
namespace {

absl::Status ParseInts(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  if (text.empty()) return absl::OkStatus();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t value;
    if (!absl::SimpleAtoi(part, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("not an integer: ", part));
    }
    out->push_back(value);
  }
  return absl::OkStatus();
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_list_paths)) {
    for (CpuPath path : AvailableCpuPaths()) {
      std::cout << CpuPathName(path) << "\n";
    }
    return absl::OkStatus();
  }
  PortableRequest r;
  r.seed = absl::GetFlag(FLAGS_seed);
  r.name_hash = NameHash(absl::GetFlag(FLAGS_name));
  r.stream = absl::GetFlag(FLAGS_stream);
  const std::optional<spec::DType> dtype =
      spec::ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype) return absl::InvalidArgumentError("unknown --dtype");
  r.dtype = *dtype;
  const std::string dist = absl::GetFlag(FLAGS_dist);
  const double a = absl::GetFlag(FLAGS_a), b = absl::GetFlag(FLAGS_b);
  const double mean = absl::GetFlag(FLAGS_mean), std = absl::GetFlag(FLAGS_std);
  if (dist == "constant") {
    r.dist = Distribution::Constant(absl::GetFlag(FLAGS_value));
  } else if (dist == "uniform") {
    r.dist = Distribution::Uniform(a, b);
  } else if (dist == "normal") {
    r.dist = Distribution::Normal(mean, std);
  } else if (dist == "trunc_normal") {
    r.dist = Distribution::TruncNormal(mean, std, a, b);
  } else {
    return absl::InvalidArgumentError("unknown --dist");
  }
  if (absl::Status s = ParseInts(absl::GetFlag(FLAGS_shape), &r.shape);
      !s.ok()) {
    return s;
  }
  if (!absl::GetFlag(FLAGS_shard).empty()) {
    std::vector<ShardSpec> shards;
    for (absl::string_view part :
         absl::StrSplit(absl::GetFlag(FLAGS_shard), ',')) {
      std::vector<int64_t> fields;
      if (absl::Status s =
              ParseInts(absl::StrReplaceAll(part, {{":", ","}}), &fields);
          !s.ok() || fields.size() != 3) {
        return absl::InvalidArgumentError("--shard wants dim:index:count");
      }
      shards.push_back(
          ShardSpec{static_cast<int>(fields[0]), fields[1], fields[2]});
    }
    absl::StatusOr<Box> box = ShardBox(r.shape, shards);
    if (!box.ok()) return box.status();
    r.box = *box;
  } else if (!absl::GetFlag(FLAGS_box_length).empty()) {
    Box box;
    if (absl::Status s =
            ParseInts(absl::GetFlag(FLAGS_box_offset), &box.offset);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            ParseInts(absl::GetFlag(FLAGS_box_length), &box.length);
        !s.ok()) {
      return s;
    }
    r.box = box;
  }
  FillOptions options;
  options.threads = absl::GetFlag(FLAGS_threads);
  const std::string path = absl::GetFlag(FLAGS_path);
  if (path == "auto") {
    options.path = CpuPath::kAuto;
  } else if (path == "scalar") {
    options.path = CpuPath::kScalar;
  } else if (path == "avx2") {
    options.path = CpuPath::kAvx2;
  } else if (path == "avx512") {
    options.path = CpuPath::kAvx512;
  } else {
    return absl::InvalidArgumentError("unknown --path");
  }
  absl::StatusOr<int64_t> bytes = PortableOutputBytes(r);
  if (!bytes.ok()) return bytes.status();
  std::string out(static_cast<size_t>(*bytes), '\0');
  if (absl::Status s = FillPortable(r, out.data(), options); !s.ok()) return s;
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) {
    return absl::UnavailableError("short write to stdout");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace materializer::init::portable

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = materializer::init::portable::Run();
  if (!status.ok()) {
    std::cerr << "portable_dump: " << status << "\n";
    return 1;
  }
  return 0;
}
