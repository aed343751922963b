#ifndef MATERIALIZER_SERVER_CHECKPOINT_TEST_FILES_H_
#define MATERIALIZER_SERVER_CHECKPOINT_TEST_FILES_H_

// Test-only writers of the files the checkpoint readers read, written from
// the formats' specifications (APPNOTE.TXT 4.3, pickle protocol 2), so
// tests can make the malformed and unusual files that real writers do not:
// a wrong CRC, a compressed or missing entry, zip64 end records, a
// state_dict pickle with chosen sizes, strides and storages.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/checkpoint/zip.h"

namespace materializer::checkpoint::testing {

inline void PutLE(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

struct TestZipEntry {
  std::string name;
  std::string data;
  uint16_t method = 0;     // as recorded; the data is never compressed
  bool bad_crc = false;
};

struct TestZipOptions {
  // Local headers with zero CRC and sizes and flag bit 3, as torch.save
  // writes them (the data descriptor after the data).
  bool data_descriptors = false;
  // A zip64 end record and locator before the end record (torch.save
  // writes them even for small archives).
  bool zip64_end = false;
  std::string comment;
};

inline std::string TestZip(const std::vector<TestZipEntry>& entries,
                           const TestZipOptions& options = {}) {
  std::string out;
  std::string central;
  for (const TestZipEntry& e : entries) {
    const uint32_t crc = ZipCrc32(e.data) ^ (e.bad_crc ? 1u : 0u);
    const uint64_t offset = out.size();
    const uint16_t flags = options.data_descriptors ? 0x808 : 0;
    PutLE(&out, 0x04034b50, 4);
    PutLE(&out, 20, 2);
    PutLE(&out, flags, 2);
    PutLE(&out, e.method, 2);
    PutLE(&out, 0, 4);  // time, date
    PutLE(&out, options.data_descriptors ? 0 : crc, 4);
    PutLE(&out, options.data_descriptors ? 0 : e.data.size(), 4);
    PutLE(&out, options.data_descriptors ? 0 : e.data.size(), 4);
    PutLE(&out, e.name.size(), 2);
    PutLE(&out, 0, 2);
    out += e.name + e.data;
    if (options.data_descriptors) {
      PutLE(&out, 0x08074b50, 4);
      PutLE(&out, crc, 4);
      PutLE(&out, e.data.size(), 4);
      PutLE(&out, e.data.size(), 4);
    }
    PutLE(&central, 0x02014b50, 4);
    PutLE(&central, 20, 2);
    PutLE(&central, 20, 2);
    PutLE(&central, flags, 2);
    PutLE(&central, e.method, 2);
    PutLE(&central, 0, 4);
    PutLE(&central, crc, 4);
    PutLE(&central, e.data.size(), 4);
    PutLE(&central, e.data.size(), 4);
    PutLE(&central, e.name.size(), 2);
    PutLE(&central, 0, 2);  // extra
    PutLE(&central, 0, 2);  // comment
    PutLE(&central, 0, 2);  // disk
    PutLE(&central, 0, 2);
    PutLE(&central, 0, 4);
    PutLE(&central, offset, 4);
    central += e.name;
  }
  const uint64_t cd_offset = out.size();
  out += central;
  if (options.zip64_end) {
    const uint64_t record = out.size();
    PutLE(&out, 0x06064b50, 4);
    PutLE(&out, 44, 8);
    PutLE(&out, 45, 2);
    PutLE(&out, 45, 2);
    PutLE(&out, 0, 4);
    PutLE(&out, 0, 4);
    PutLE(&out, entries.size(), 8);
    PutLE(&out, entries.size(), 8);
    PutLE(&out, central.size(), 8);
    PutLE(&out, cd_offset, 8);
    PutLE(&out, 0x07064b50, 4);
    PutLE(&out, 0, 4);
    PutLE(&out, record, 8);
    PutLE(&out, 1, 4);
  }
  PutLE(&out, 0x06054b50, 4);
  PutLE(&out, 0, 4);
  PutLE(&out, entries.size(), 2);
  PutLE(&out, entries.size(), 2);
  PutLE(&out, central.size(), 4);
  PutLE(&out, cd_offset, 4);
  PutLE(&out, options.comment.size(), 2);
  out += options.comment;
  return out;
}

// A tensor to pickle as torch.save does (protocol 2).
struct TestTensor {
  std::string storage_class = "FloatStorage";  // in module torch
  std::string key = "0";
  int64_t storage_numel = 0;
  int64_t storage_offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  // Non-empty: _rebuild_tensor_v3 with this torch dtype over an
  // UntypedStorage (storage_numel is then bytes).
  std::string v3_dtype;
};

// Pickle protocol 2, written op by op.
class TestPickle {
 public:
  TestPickle() : out_("\x80\x02") {}

  TestPickle& Op(char op) {
    out_.push_back(op);
    return *this;
  }
  TestPickle& Raw(absl::string_view bytes) {
    out_.append(bytes.data(), bytes.size());
    return *this;
  }
  TestPickle& String(absl::string_view s) {  // BINUNICODE
    out_.push_back('X');
    PutLE(&out_, s.size(), 4);
    out_.append(s.data(), s.size());
    return *this;
  }
  TestPickle& Int(int64_t v) {  // LONG1, 8 bytes
    out_.push_back('\x8a');
    out_.push_back(8);
    PutLE(&out_, static_cast<uint64_t>(v), 8);
    return *this;
  }
  TestPickle& Global(absl::string_view module, absl::string_view name) {
    absl::StrAppend(&out_, "c", module, "\n", name, "\n");
    return *this;
  }
  TestPickle& IntTuple(const std::vector<int64_t>& values) {
    Op('(');
    for (int64_t v : values) Int(v);
    return Op('t');
  }
  TestPickle& EmptyOrderedDict() {
    return Global("collections", "OrderedDict").Op(')').Op('R');
  }
  // Pushes the tensor.
  TestPickle& Tensor(const TestTensor& t) {
    const bool v3 = !t.v3_dtype.empty();
    Global("torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
    Op('(');  // the arguments
    Op('(').String("storage");
    if (v3) {
      Global("torch.storage", "UntypedStorage");
    } else {
      Global("torch", t.storage_class);
    }
    String(t.key).String("cpu").Int(t.storage_numel).Op('t').Op('Q');
    Int(t.storage_offset).IntTuple(t.shape).IntTuple(t.stride);
    Op('\x89');  // requires_grad False
    EmptyOrderedDict();
    if (v3) Global("torch", t.v3_dtype);
    return Op('t').Op('R');
  }

  std::string Finish() { return out_ + "."; }

 private:
  std::string out_;
};

// A dict of the tensors, as torch.save pickles it.
inline std::string StateDictPickle(
    const std::vector<std::pair<std::string, TestTensor>>& tensors) {
  TestPickle p;
  p.Op('}').Op('(');
  for (const auto& [name, tensor] : tensors) p.String(name).Tensor(tensor);
  return p.Op('u').Finish();
}

}  // namespace materializer::checkpoint::testing

#endif  // MATERIALIZER_SERVER_CHECKPOINT_TEST_FILES_H_
