#include "server/delivery/safetensors.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace materializer::delivery {

std::string JsonQuote(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", u);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

SafetensorsFile SafetensorsFile::Build(
    std::vector<FileTensor> tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::sort(tensors.begin(), tensors.end(),
            [](const FileTensor& a, const FileTensor& b) {
              const uint32_t sa = spec::ItemSize(a.dtype);
              const uint32_t sb = spec::ItemSize(b.dtype);
              if (sa != sb) return sa > sb;
              return a.name < b.name;
            });
  SafetensorsFile file;
  std::string json = "{";
  if (!metadata.empty()) {
    auto sorted = metadata;
    std::sort(sorted.begin(), sorted.end());
    json += "\"__metadata__\":{";
    json += absl::StrJoin(sorted, ",", [](std::string* out, const auto& kv) {
      absl::StrAppend(out, JsonQuote(kv.first), ":", JsonQuote(kv.second));
    });
    json += "}";
  }
  uint64_t cursor = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const FileTensor& t = tensors[i];
    if (i > 0 || !metadata.empty()) json += ",";
    absl::StrAppend(&json, JsonQuote(t.name), ":{\"dtype\":\"",
                    spec::Info(t.dtype).safetensors_name, "\",\"shape\":[",
                    absl::StrJoin(t.shape, ","), "],\"data_offsets\":[",
                    cursor, ",", cursor + t.nbytes, "]}");
    file.data_offsets_.push_back(cursor);
    cursor += t.nbytes;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');

  const uint64_t n = json.size();
  file.header_.resize(8);
  for (int i = 0; i < 8; ++i) {
    file.header_[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  }
  file.header_ += json;
  file.tensors_ = std::move(tensors);
  file.data_bytes_ = cursor;
  return file;
}

absl::Status SafetensorsFile::Read(uint64_t offset, uint64_t length,
                                   const SourceReader& reader,
                                   std::string* out) const {
  if (offset > size() || length > size() - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "bytes [", offset, ", ", offset + length, ") pass the end of the ",
        size(), "-byte file"));
  }
  const uint64_t end = offset + length;
  out->reserve(out->size() + length);
  if (offset < header_.size()) {
    const uint64_t stop = std::min<uint64_t>(end, header_.size());
    out->append(header_, offset, stop - offset);
    offset = stop;
  }
  if (offset >= end) return absl::OkStatus();

  // Data section: find the first tensor that overlaps, then walk forward.
  uint64_t data_pos = offset - header_.size();
  const uint64_t data_end = end - header_.size();
  size_t i = std::upper_bound(data_offsets_.begin(), data_offsets_.end(),
                              data_pos) -
             data_offsets_.begin();
  i = i == 0 ? 0 : i - 1;
  for (; data_pos < data_end && i < tensors_.size(); ++i) {
    const uint64_t t_begin = data_offsets_[i];
    const uint64_t t_end = t_begin + tensors_[i].nbytes;
    if (t_end <= data_pos) continue;
    const uint64_t from = std::max(data_pos, t_begin);
    const uint64_t to = std::min(data_end, t_end);
    const size_t at = out->size();
    out->resize(at + (to - from));
    absl::Status status = reader(tensors_[i].source_offset + (from - t_begin),
                                 to - from, out->data() + at);
    if (!status.ok()) return status;
    data_pos = to;
  }
  return absl::OkStatus();
}

}  // namespace materializer::delivery
