#include "server/memory/quota.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "server/common/status_macros.h"
#include "server/common/units.h"

namespace materializer::memory {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

absl::Status Bad(absl::string_view path, absl::string_view reason) {
  return absl::InvalidArgumentError(
      absl::StrCat("quota file: ", path, ": ", reason));
}

absl::StatusOr<uint64_t> Bytes(const Value& value, const std::string& path) {
  if (value.kind_case() == Value::kStringValue) {
    absl::StatusOr<uint64_t> bytes = ParseBytes(value.string_value());
    if (!bytes.ok()) return Bad(path, bytes.status().message());
    return *bytes;
  }
  if (value.kind_case() == Value::kNumberValue) {
    const double number = value.number_value();
    if (number >= 0 && number == std::floor(number) && number < 1.8e19) {
      return static_cast<uint64_t>(number);
    }
  }
  return Bad(path, "expected a size such as \"16GiB\" or a byte count");
}

absl::Status ParseQuota(const Struct& object, const std::string& path,
                        Quota* quota) {
  for (const auto& [key, value] : object.fields()) {
    const std::string at = absl::StrCat(path, ".", key);
    if (key == "totalBytes" || key == "total_bytes") {
      ASSIGN_OR_RETURN(quota->total_bytes, Bytes(value, at));
    } else if (key == "deviceBytes" || key == "device_bytes") {
      ASSIGN_OR_RETURN(quota->device_bytes, Bytes(value, at));
    } else if (key == "handles") {
      if (value.kind_case() != Value::kNumberValue ||
          value.number_value() < 0 ||
          value.number_value() != std::floor(value.number_value()) ||
          value.number_value() > kNoHandleLimit) {
        return Bad(at, "expected a whole number of handles");
      }
      quota->handles = static_cast<uint32_t>(value.number_value());
    } else if (key == "devices") {
      if (value.kind_case() != Value::kStructValue) {
        return Bad(at, "expected an object of device name -> size");
      }
      for (const auto& [device, size] : value.struct_value().fields()) {
        ASSIGN_OR_RETURN(quota->devices[device],
                         Bytes(size, absl::StrCat(at, ".", device)));
      }
    } else {
      return Bad(at, "unknown key (expected totalBytes, deviceBytes, "
                     "devices, handles)");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<QuotaBook> QuotaBook::FromJson(absl::string_view json,
                                              Quota base) {
  Struct root;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      std::string(json), &root);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("quota file is not JSON: ", parsed.ToString()));
  }
  QuotaBook book(std::move(base));
  for (const auto& [key, value] : root.fields()) {
    if (key == "default") {
      if (value.kind_case() != Value::kStructValue) {
        return Bad("default", "expected an object");
      }
      RETURN_IF_ERROR(ParseQuota(value.struct_value(), "default",
                                 &book.default_));
    } else if (key == "clients") {
      if (value.kind_case() != Value::kStructValue) {
        return Bad("clients", "expected an object of client name -> quota");
      }
    } else {
      return Bad(key, "unknown key (expected default, clients)");
    }
  }
  // Clients start from the default, then override what they name.
  if (auto it = root.fields().find("clients"); it != root.fields().end()) {
    for (const auto& [client, value] : it->second.struct_value().fields()) {
      const std::string path = absl::StrCat("clients.", client);
      if (value.kind_case() != Value::kStructValue) {
        return Bad(path, "expected an object");
      }
      Quota quota = book.default_;
      RETURN_IF_ERROR(ParseQuota(value.struct_value(), path, &quota));
      book.clients_.emplace(client, std::move(quota));
    }
  }
  return book;
}

const Quota& QuotaBook::For(absl::string_view client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? default_ : it->second;
}

}  // namespace materializer::memory
