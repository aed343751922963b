// The C++ client's side of an export, for tools/gpu-run: opens a saved
// ExportResponse with client::ExportImport (cudaIpcOpenMemHandle for a CUDA
// export, a mapping for shared memory), views its tensors as at::Tensors
// without a copy (client::ViewAsTensors), copies each to the host and
// prints one JSON line: where the tensors live and each one's XXH3-128
// digest, comparable with Describe's. tests/python/delivery_cuda_importer.py
// does the same from Python with torch.
//
//   gpu_export_read EXPORT.pb
//
// Exit status 0 with the JSON line; 1 with a message on stderr.

#include <ATen/ATen.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/export_import.h"
#include "client/export_torch.h"
#include "materializer/v1/materializer.pb.h"
#include "server/delivery/digest.h"

namespace {

int Fail(const std::string& message) {
  std::cerr << "gpu_export_read: " << message << "\n";
  return 1;
}

int Run(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) return Fail(absl::StrCat("cannot open ", path));
  const std::string bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  materializer::v1::ExportResponse exported;
  if (!exported.ParseFromString(bytes) || exported.export_id().empty()) {
    return Fail(absl::StrCat(path, " is not an ExportResponse"));
  }
  absl::StatusOr<std::shared_ptr<const materializer::client::ExportImport>>
      import = materializer::client::ExportImport::Open(exported);
  if (!import.ok()) return Fail(import.status().ToString());
  const bool on_cuda = (*import)->on_cuda();
  std::vector<std::string> digests;
  {
    absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> tensors =
        materializer::client::ViewAsTensors(*import);
    if (!tensors.ok()) return Fail(tensors.status().ToString());
    for (const auto& [name, view] : *tensors) {
      if (view.is_cuda() != on_cuda) {
        return Fail(absl::StrCat(name, " is not on the export's device"));
      }
      const at::Tensor host = view.contiguous().to(at::kCPU);
      const size_t nbytes = host.numel() * host.element_size();
      const std::string digest = materializer::delivery::FormatDigest(
          materializer::delivery::HashBytes(
              nbytes == 0 ? nullptr : host.data_ptr(), nbytes));
      digests.push_back(absl::StrCat("\"", name, "\": \"", digest, "\""));
    }
  }  // the views go before the import, which closes the mapping
  import->reset();
  std::printf("{\"on_cuda\": %s, \"digests\": {%s}}\n",
              on_cuda ? "true" : "false", absl::StrJoin(digests, ", ").c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: gpu_export_read EXPORT.pb\n";
    return 1;
  }
  try {
    return Run(argv[1]);
  } catch (const std::exception& error) {  // LibTorch reports by exception
    return Fail(error.what());
  }
}
