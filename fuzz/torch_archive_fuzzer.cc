// Fuzz target: the torch.save archive reader (server/checkpoint), over a
// file in memory through the same positional-read interface the server
// uses over a file descriptor. The input is the whole file.
//
// Properties:
//   - an error is INVALID_ARGUMENT and names the file (never a crash, a
//     read past the end, which would be OUT_OF_RANGE, or another code);
//   - every tensor read lies inside the file, holds its element count
//     times its dtype's size, and has no negative size;
//   - where the whole-file zip reader (fuzz/readers: CRCs checked, entries
//     not overlapping) accepts the file, every tensor lies inside the data
//     of one storage entry ("<prefix>/data/<key>").

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "fuzz/check.h"
#include "fuzz/readers/zip_reader.h"
#include "server/checkpoint/checkpoint_tensor.h"
#include "server/checkpoint/random_access_file.h"
#include "server/checkpoint/torch_archive.h"
#include "server/spec/dtype.h"

namespace materializer::fuzz {
namespace {

using checkpoint::CheckpointTensor;

constexpr absl::string_view kLabel = "fuzz/pytorch_model.bin";

void CheckTensor(const CheckpointTensor& t, size_t size) {
  FUZZ_CHECK(t.offset <= size && t.nbytes <= size - t.offset)
      << t.name << " at [" << t.offset << ", +" << t.nbytes
      << ") passes the end of a " << size << "-byte file";
  FUZZ_CHECK(t.shape.size() <= checkpoint::kMaxCheckpointRank);
  unsigned __int128 nbytes = spec::ItemSize(t.dtype);
  for (int64_t s : t.shape) {
    FUZZ_CHECK(s >= 0) << t.name << " has a negative size";
    nbytes *= static_cast<uint64_t>(s);
    if (nbytes > (unsigned __int128){1} << 64) nbytes = 0;  // checked below
  }
  FUZZ_CHECK(nbytes == t.nbytes)
      << t.name << ": " << t.nbytes << " bytes for its shape and dtype";
}

}  // namespace
}  // namespace materializer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace materializer;
  using namespace materializer::fuzz;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<CheckpointTensor>> tensors =
      checkpoint::ReadTorchArchive(checkpoint::StringFile(bytes), kLabel);
  if (!tensors.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(tensors.status()))
        << "an error other than INVALID_ARGUMENT: " << tensors.status();
    FUZZ_CHECK(absl::StrContains(tensors.status().message(), kLabel))
        << "an error that does not name the file: " << tensors.status();
    return 0;
  }
  for (const CheckpointTensor& t : *tensors) CheckTensor(t, size);
  absl::StatusOr<std::vector<ZipEntryView>> entries = ReadZip(bytes);
  if (!entries.ok()) return 0;
  for (const CheckpointTensor& t : *tensors) {
    bool inside = false;
    for (const ZipEntryView& e : *entries) {
      inside = inside || (absl::StrContains(e.name, "/data/") &&
                          t.offset >= e.data_offset &&
                          t.offset + t.nbytes <= e.data_offset + e.size);
    }
    FUZZ_CHECK(inside) << t.name << " at [" << t.offset << ", +" << t.nbytes
                       << ") lies in no storage entry's data";
  }
  return 0;
}
