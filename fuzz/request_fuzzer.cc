// Fuzz target: the request path without gRPC. Bytes become a
// MaterializeRequest (binary protobuf, or its proto3 JSON mapping, the
// format of matctl's request files) and go through the engine as the
// service would send them: Plan, then Materialize on a small pool of two
// virtual CPU devices, then Describe, DescribeFile, a whole fetch and
// Release.
//
// Input: one flag byte, then the message. Flag bit 0: 0 binary, 1 JSON;
// bits 1-2: the fetch format (0-3); bit 3: include_non_persistent; bit 4:
// write_ties_once; bit 5: also run Plan and Materialize with a caller that
// goes away after 0, 1, 2 or 5 polls (bits 6-7).
//
// Properties:
//   - no status outside OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
//     FAILED_PRECONDITION, OUT_OF_RANGE (never INTERNAL or UNKNOWN), and
//     every error message fits gRPC's metadata limits;
//   - Plan and Materialize agree: what Plan rejects, Materialize rejects
//     with the same status; what Plan accepts, Materialize materializes
//     unless the pool is too small (RESOURCE_EXHAUSTED), so every bad input
//     is found before memory is touched;
//   - validation does not depend on the shard box: a request whose
//     tensors are refused whole is refused for any shard of them;
//   - the handle matches the plan (sizes, offsets, tensors), its file
//     streams exactly the bytes DescribeFile announced, with the announced
//     digest;
//   - the values are what was asked for: a tensor filled by a random or
//     constant scheme holds no inf or NaN (finite parameters must give
//     finite values, or be refused), and a tensor given literal `values`
//     holds exactly those bytes;
//   - Plan allocates nothing, and after Release (or a failed Materialize)
//     the ledger and the registry are empty;
//   - a call whose caller goes away ends CANCELLED (only then), or as it
//     would have anyway, and keeps nothing.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "fuzz/check.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/json_util.h"
#include "materializer/v1/materializer.pb.h"
#include "server/common/cancel.h"
#include "server/common/log.h"
#include "server/common/thread_pool.h"
#include "server/engine/engine.h"
#include "server/memory/pool.h"
#include "server/registry/registry.h"

namespace materializer::fuzz {
namespace {

// Per virtual CPU device: small enough that init stays fast, large enough
// for the small examples.
constexpr uint64_t kDeviceBytes = uint64_t{2} << 20;
// gRPC carries the message in a trailer; clients refuse trailers over
// 8 KiB by default.
constexpr size_t kMaxMessageBytes = 8192;
constexpr size_t kMaxLabelBytes = 256;

struct World {
  std::unique_ptr<memory::DevicePool> pool;
  registry::HandleRegistry registry;
  std::unique_ptr<ThreadPool> workers;
  std::unique_ptr<engine::Engine> engine;
};

World& TheWorld() {
  // Never destroyed: the process ends without tearing LibTorch down.
  static World* world = [] {
    log::SetMinLevel(log::Level::kError);
    // Mutated strings are often not UTF-8, and protobuf logs every such
    // parse to stderr (thousands of lines a minute); the parse result is
    // what the target checks.
    google::protobuf::SetLogHandler(nullptr);
    auto* w = new World;
    std::vector<memory::DeviceConfig> devices(2);
    for (int i = 0; i < 2; ++i) {
      devices[i].name = absl::StrCat("cpu:", i);
      devices[i].ordinal = i;
      devices[i].capacity_bytes = kDeviceBytes;
    }
    w->pool = memory::DevicePool::Create(devices).value();
    w->workers = std::make_unique<ThreadPool>(1);
    w->engine = std::make_unique<engine::Engine>(w->pool.get(), &w->registry,
                                                 w->workers.get());
    return w;
  }();
  return *world;
}

std::string Show(const absl::Status& status) {
  std::string text = status.ToString();
  if (text.size() > 600) {
    text = absl::StrCat(text.substr(0, 600), "... (", text.size(),
                        " bytes)");
  }
  return text;
}

void CheckStatus(const absl::Status& status, absl::string_view call,
                 bool may_cancel = false) {
  FUZZ_CHECK(may_cancel || status.code() != absl::StatusCode::kCancelled)
      << call << " answered " << Show(status) << " though nobody cancelled";
  switch (status.code()) {
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      break;
    default:
      FUZZ_CHECK(false) << call << " answered " << Show(status);
  }
  FUZZ_CHECK(status.message().size() <= kMaxMessageBytes)
      << call << " answered a " << status.message().size()
      << "-byte message: " << Show(status);
  FUZZ_CHECK(status.ok() || !status.message().empty())
      << call << " answered " << status.code() << " without a message";
}

void CheckNothingHeld(const World& world, absl::string_view after) {
  const memory::PoolSnapshot s = world.pool->Snapshot();
  FUZZ_CHECK(s.total.reserved_bytes == 0 && s.total.in_use_bytes == 0 &&
             s.total.handles == 0)
      << "after " << after << " the ledger holds " << s.total.reserved_bytes
      << " reserved, " << s.total.in_use_bytes << " in use, "
      << s.total.handles << " handles";
  FUZZ_CHECK(world.registry.size() == 0)
      << "after " << after << " the registry holds " << world.registry.size()
      << " handles";
  const size_t exports = world.registry.Census().exports;
  FUZZ_CHECK(exports == 0)
      << "after " << after << " " << exports << " exports are open";
}

// Why Materialize must refuse `request` though Plan may accept it (fields
// Plan does not have), or "".
std::string MaterializeOnlyProblem(const v1::MaterializeRequest& request) {
  if (request.label().size() > kMaxLabelBytes) return "label";
  if (request.has_ttl()) return "ttl";  // its bounds are the engine's
  if (request.exportable() && request.placement().device() == "split") {
    return "exportable";
  }
  // Every device of this world is a CPU: an export needs shared memory.
  if (request.has_open_export() &&
      (!request.open_export().handle().empty() || !request.exportable() ||
       request.placement().device() == "split")) {
    return "open_export";
  }
  // This world's engine reads no checkpoints, and Plan sees none: a
  // request naming one is refused for that (FAILED_PRECONDITION, or
  // INVALID_ARGUMENT for checkpoint fields without a path), whatever Plan
  // says of its model. (With roots, a loaded tensor needs no init, so
  // Plan's verdict on the model is not Materialize's either.)
  if (request.checkpoint().ByteSizeLong() != 0) return "checkpoint";
  return "";
}

// Reads the whole file of `fetch` and checks it against DescribeFile.
// Returns the layout and the bytes, or nothing if the request is refused.
std::optional<std::pair<v1::FileLayout, std::string>> CheckFetch(
    World& world, const engine::Caller& caller,
    const v1::FetchRequest& fetch) {
  absl::StatusOr<v1::FileLayout> layout =
      world.engine->DescribeFile(caller, fetch);
  CheckStatus(layout.status(), "DescribeFile");
  absl::StatusOr<std::unique_ptr<delivery::WeightStream>> stream =
      world.engine->OpenFetch(caller, fetch);
  CheckStatus(stream.status(), "OpenFetch");
  FUZZ_CHECK(layout.ok() == stream.ok())
      << "DescribeFile: " << Show(layout.status())
      << "; OpenFetch: " << Show(stream.status());
  if (!layout.ok()) {
    FUZZ_CHECK(layout.status() == stream.status())
        << "DescribeFile: " << Show(layout.status())
        << "; OpenFetch: " << Show(stream.status());
    return std::nullopt;
  }
  std::string file;
  uint64_t received = 0;
  std::string digest;
  v1::WeightChunk chunk;
  while (!(*stream)->done()) {
    const absl::Status status = (*stream)->Next(&chunk);
    CheckStatus(status, "WeightStream::Next");
    FUZZ_CHECK(status.ok()) << Show(status);
    FUZZ_CHECK(chunk.offset() == received)
        << "chunk at " << chunk.offset() << ", expected " << received;
    FUZZ_CHECK(chunk.total_bytes() == layout->total_bytes())
        << "chunk says " << chunk.total_bytes() << " bytes, DescribeFile "
        << layout->total_bytes();
    received += chunk.data().size();
    file += chunk.data();
    if (!chunk.digest().empty()) digest = chunk.digest();
  }
  FUZZ_CHECK(received == layout->total_bytes())
      << "streamed " << received << " bytes, DescribeFile said "
      << layout->total_bytes();
  FUZZ_CHECK(digest == layout->digest())
      << "stream digest " << digest << ", DescribeFile " << layout->digest();
  // In file order, apart; tied tensors may share one range (torch format).
  uint64_t start = 0;
  uint64_t end = 0;
  for (const v1::FileEntry& entry : layout->entries()) {
    const bool shared = entry.offset() == start &&
                        entry.offset() + entry.nbytes() == end;
    FUZZ_CHECK((shared || entry.offset() >= end) &&
               entry.offset() + entry.nbytes() <= layout->total_bytes())
        << "entry " << entry.name() << " at " << entry.offset() << "+"
        << entry.nbytes() << " overlaps another or passes the end";
    start = entry.offset();
    end = entry.offset() + entry.nbytes();
  }
  return std::make_pair(*std::move(layout), std::move(file));
}

// Whether element bits are inf or NaN, per floating dtype.
bool AnyNonFinite(absl::string_view dtype, absl::string_view bytes) {
  auto scan = [&](size_t width, auto non_finite) {
    for (size_t i = 0; i + width <= bytes.size(); i += width) {
      uint64_t bits = 0;
      for (size_t b = 0; b < width; ++b) {
        bits |= uint64_t{static_cast<unsigned char>(bytes[i + b])} << (8 * b);
      }
      if (non_finite(bits)) return true;
    }
    return false;
  };
  if (dtype == "float32") {
    return scan(4, [](uint64_t b) { return ((b >> 23) & 0xff) == 0xff; });
  }
  if (dtype == "float64") {
    return scan(8, [](uint64_t b) { return ((b >> 52) & 0x7ff) == 0x7ff; });
  }
  if (dtype == "float16") {
    return scan(2, [](uint64_t b) { return ((b >> 10) & 0x1f) == 0x1f; });
  }
  if (dtype == "bfloat16") {
    return scan(2, [](uint64_t b) { return ((b >> 7) & 0xff) == 0xff; });
  }
  if (dtype == "float8_e5m2") {
    return scan(1, [](uint64_t b) { return ((b >> 2) & 0x1f) == 0x1f; });
  }
  if (dtype == "complex64") {  // two float32 per element
    return scan(4, [](uint64_t b) { return ((b >> 23) & 0xff) == 0xff; });
  }
  if (dtype == "float8_e4m3fn") {  // no inf; NaN is S.1111.111
    return scan(1, [](uint64_t b) { return (b & 0x7f) == 0x7f; });
  }
  return false;
}

// Schemes that, given finite parameters, must produce finite values.
bool FiniteScheme(absl::string_view init_description) {
  for (absl::string_view scheme :
       {"zeros", "ones", "constant", "uniform", "normal", "trunc_normal",
        "xavier_uniform", "xavier_normal", "kaiming_uniform",
        "kaiming_normal", "orthogonal", "eye", "dirac", "sparse"}) {
    if (absl::StartsWith(init_description, scheme) &&
        (init_description.size() == scheme.size() ||
         init_description[scheme.size()] == '(' ||
         init_description[scheme.size()] == ' ')) {
      return true;
    }
  }
  return false;
}

// Checks the values in a fetched file against what was asked for.
void CheckValues(const v1::MaterializeRequest& request,
                 const v1::PlanResponse& plan, const v1::FileLayout& layout,
                 const std::string& file) {
  std::map<std::string, const v1::TensorPlan*> planned;
  for (const v1::TensorPlan& t : plan.tensors()) planned[t.name()] = &t;
  std::map<std::string, const v1::TensorSpec*> asked;
  for (const v1::TensorSpec& t : request.model().tensors()) asked[t.name()] = &t;
  for (const v1::FileEntry& entry : layout.entries()) {
    const absl::string_view bytes =
        absl::string_view(file).substr(entry.offset(), entry.nbytes());
    auto p = planned.find(entry.name());
    FUZZ_CHECK(p != planned.end()) << "file holds an unplanned " << entry.name();
    auto a = asked.find(entry.name());
    const v1::TensorSpec* spec = a == asked.end() ? nullptr : a->second;
    if (spec != nullptr && spec->tie_to().empty() &&
        spec->init().has_values() && !spec->has_shard()) {
      FUZZ_CHECK(bytes == spec->init().values().data())
          << entry.name() << " holds " << bytes.size()
          << " bytes other than the " << spec->init().values().data().size()
          << " literal bytes it was given";
    }
    if (FiniteScheme(p->second->init())) {
      FUZZ_CHECK(!AnyNonFinite(entry.dtype(), bytes))
          << entry.name() << " (" << entry.dtype() << ", init "
          << p->second->init() << ") holds inf or NaN";
    }
  }
}

void CheckHandle(World& world, const engine::Caller& caller,
                 const v1::MaterializeRequest& request,
                 const v1::PlanResponse& plan,
                 const v1::MaterializeResponse& made, uint8_t flags) {
  FUZZ_CHECK(made.state() == v1::HANDLE_STATE_READY) << made.state();
  FUZZ_CHECK(made.num_tensors() ==
             static_cast<uint32_t>(plan.tensors_size()))
      << made.num_tensors() << " tensors made, " << plan.tensors_size()
      << " planned";
  FUZZ_CHECK(made.tensor_bytes() == plan.tensor_bytes())
      << made.tensor_bytes() << " tensor bytes made, " << plan.tensor_bytes()
      << " planned";
  const bool split = request.placement().device() == "split";
  if (!split) {
    FUZZ_CHECK(made.arena_bytes() == plan.arena_bytes())
        << made.arena_bytes() << " arena bytes made, " << plan.arena_bytes()
        << " planned";
  }
  v1::DescribeRequest describe;
  describe.set_handle(made.handle());
  absl::StatusOr<v1::HandleInfo> info =
      world.engine->Describe(caller, describe);
  CheckStatus(info.status(), "Describe");
  FUZZ_CHECK(info.ok()) << Show(info.status());
  FUZZ_CHECK(info->tensors_size() == plan.tensors_size());
  for (int i = 0; i < plan.tensors_size(); ++i) {
    const v1::TensorPlan& p = plan.tensors(i);
    const v1::TensorInfo& t = info->tensors(i);
    FUZZ_CHECK(t.name() == p.name() && t.dtype() == p.dtype() &&
               t.nbytes() == p.nbytes() &&
               std::equal(t.shape().begin(), t.shape().end(),
                          p.shape().begin(), p.shape().end()) &&
               t.tied_to() == p.tied_to() && t.init() == p.init())
        << "tensor " << i << " described as " << t.ShortDebugString()
        << ", planned as " << p.ShortDebugString();
    if (!split) {
      FUZZ_CHECK(t.arena_offset() == p.arena_offset())
          << "tensor " << p.name() << " at " << t.arena_offset()
          << ", planned at " << p.arena_offset();
    }
  }

  v1::FetchRequest fetch;
  fetch.set_handle(made.handle());
  fetch.set_format(static_cast<v1::WeightFormat>((flags >> 1) & 3));
  fetch.set_include_non_persistent((flags >> 3) & 1);
  fetch.set_write_ties_once((flags >> 4) & 1);
  if (auto fetched = CheckFetch(world, caller, fetch)) {
    CheckValues(request, plan, fetched->first, fetched->second);
  }

  // An export opened with the handle is closed by the release.
  FUZZ_CHECK(made.has_opened_export() == request.has_open_export())
      << "open_export " << request.has_open_export() << ", answered with "
      << (made.has_opened_export() ? "an" : "no") << " export";
  v1::ReleaseRequest release;
  release.set_handle(made.handle());
  release.set_force(true);
  if (made.has_opened_export()) {
    release.add_close_exports(made.opened_export().export_id());
  }
  absl::StatusOr<v1::ReleaseResponse> released =
      world.engine->Release(caller, release);
  CheckStatus(released.status(), "Release");
  FUZZ_CHECK(released.ok() && released->released()) << Show(released.status());
  FUZZ_CHECK(released->exports_closed() == (made.has_opened_export() ? 1 : 0))
      << "the release closed " << released->exports_closed() << " exports";
}

}  // namespace
}  // namespace materializer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace materializer;
  using namespace materializer::fuzz;
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 1),
                                size - 1);
  v1::MaterializeRequest request;
  if ((flags & 1) == 0) {
    if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return 0;
    }
  } else {
    google::protobuf::util::JsonParseOptions options;
    if (!google::protobuf::util::JsonStringToMessage(
             std::string(bytes), &request, options)
             .ok()) {
      return 0;
    }
  }
  // Synchronous only: an async build would outlive this input.
  request.set_async(false);

  World& world = TheWorld();
  const engine::Caller caller{"fuzz", "", false};

  v1::PlanRequest plan_request;
  *plan_request.mutable_model() = request.model();
  *plan_request.mutable_placement() = request.placement();
  const absl::StatusOr<v1::PlanResponse> plan =
      world.engine->Plan(caller, plan_request);
  CheckStatus(plan.status(), "Plan");
  CheckNothingHeld(world, "Plan");
  if (plan.ok()) {
    v1::PlanRequest whole = plan_request;
    bool sharded = false;
    for (v1::TensorSpec& t : *whole.mutable_model()->mutable_tensors()) {
      sharded = sharded || t.has_shard();
      t.clear_shard();
    }
    if (sharded) {
      const absl::StatusOr<v1::PlanResponse> unsharded =
          world.engine->Plan(caller, whole);
      CheckStatus(unsharded.status(), "Plan (shards removed)");
      FUZZ_CHECK(unsharded.status().code() !=
                 absl::StatusCode::kInvalidArgument)
          << "Plan accepts shards of tensors it refuses whole: "
          << Show(unsharded.status());
    }
  }

  const absl::StatusOr<v1::MaterializeResponse> made =
      world.engine->Materialize(caller, request);
  CheckStatus(made.status(), "Materialize");
  const std::string materialize_only = MaterializeOnlyProblem(request);
  if (materialize_only.empty()) {
    if (!plan.ok()) {
      FUZZ_CHECK(made.status() == plan.status())
          << "Plan answered " << Show(plan.status()) << " but Materialize "
          << Show(made.status());
    } else {
      FUZZ_CHECK(made.ok() || made.status().code() ==
                                  absl::StatusCode::kResourceExhausted)
          << "Plan accepted the request but Materialize answered "
          << Show(made.status());
    }
  } else if (materialize_only == "checkpoint") {
    FUZZ_CHECK(made.status().code() == (request.checkpoint().path().empty()
                                            ? absl::StatusCode::kInvalidArgument
                                            : absl::StatusCode::kFailedPrecondition) &&
               absl::StrContains(made.status().message(), "checkpoint"))
        << "Materialize answered " << Show(made.status())
        << " to a checkpoint on a server that reads none";
  } else if (materialize_only != "ttl") {
    FUZZ_CHECK(!made.ok()) << "Materialize accepted a bad " << materialize_only;
  }
  if (made.ok()) {
    FUZZ_CHECK(plan.ok()) << "Materialize accepted what Plan refused: "
                          << Show(plan.status());
    CheckHandle(world, caller, request, *plan, *made, flags);
  }
  CheckNothingHeld(world, made.ok() ? "Release" : "a failed Materialize");

  if (flags & 0x20) {
    static constexpr int kPollsBeforeLeaving[] = {0, 1, 2, 5};
    const int limit = kPollsBeforeLeaving[(flags >> 6) & 3];
    // Init threads may poll too.
    std::atomic<int> polls{0};
    const Cancelled gone = [&polls, limit] { return polls++ >= limit; };
    const absl::StatusOr<v1::PlanResponse> cancelled_plan =
        world.engine->Plan(caller, plan_request, gone);
    CheckStatus(cancelled_plan.status(), "Plan (caller gone)", true);
    FUZZ_CHECK(cancelled_plan.status().code() == plan.status().code() ||
               (cancelled_plan.status().code() ==
                    absl::StatusCode::kCancelled &&
                polls > limit))
        << "Plan answered " << Show(plan.status()) << ", and "
        << Show(cancelled_plan.status()) << " when its caller left after "
        << limit << " polls";
    CheckNothingHeld(world, "a Plan whose caller left");
    polls = 0;
    const absl::StatusOr<v1::MaterializeResponse> cancelled_made =
        world.engine->Materialize(caller, request, gone);
    CheckStatus(cancelled_made.status(), "Materialize (caller gone)", true);
    FUZZ_CHECK(cancelled_made.status().code() == made.status().code() ||
               (cancelled_made.status().code() ==
                    absl::StatusCode::kCancelled &&
                polls > limit))
        << "Materialize answered " << Show(made.status()) << ", and "
        << Show(cancelled_made.status()) << " when its caller left after "
        << limit << " polls";
    if (cancelled_made.ok()) {
      v1::ReleaseRequest release;
      release.set_handle(cancelled_made->handle());
      release.set_force(true);
      if (cancelled_made->has_opened_export()) {
        release.add_close_exports(cancelled_made->opened_export().export_id());
      }
      FUZZ_CHECK(world.engine->Release(caller, release).ok());
    }
    CheckNothingHeld(world, "a Materialize whose caller left");
  }
  return 0;
}
