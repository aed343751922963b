// The fetch paths of Engine: which bytes a client gets, in which layout,
// and their digests.

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "server/common/cancel.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/delivery/digest.h"
#include "server/delivery/fingerprint.h"
#include "server/delivery/weight_file.h"
#include "server/engine/engine.h"
#include "server/init/glob.h"
#include "server/init/seed.h"
#include "server/memory/arena.h"

namespace materializer::engine {
namespace {

// Bounds on what one fetch's filters may ask for (docs/api.md): patterns
// per field, and (bytes of the handle's tensor names) x glob words
// (glob.h) over both fields, i.e. steps of matching.
constexpr size_t kMaxFilterPatterns = 256;
constexpr uint64_t kMaxFilterMatchWork = uint64_t{1} << 30;

absl::Status MetaOnly(const registry::Handle& handle, v1::HandleState state) {
  if (state == v1::HANDLE_STATE_FAILED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "handle ", handle.id(), " has no data: its materialization failed (",
        handle.error(),
        "), so its tensors are still meta tensors (shapes and dtypes only) "
        "and there is nothing to copy out of them. Release it and "
        "materialize again."));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "handle ", handle.id(),
      " has no data yet: it is still materializing, so its tensors are meta "
      "tensors (shapes and dtypes only, no storage) and nothing can be "
      "copied out of them. Wait until Describe reports "
      "HANDLE_STATE_READY."));
}

// The arena of a READY handle.
absl::StatusOr<std::shared_ptr<const memory::Arena>> ReadyArena(
    const registry::Handle& handle) {
  const v1::HandleState state = handle.state();
  if (state != v1::HANDLE_STATE_READY) return MetaOnly(handle, state);
  std::shared_ptr<const memory::Arena> arena = handle.arena();
  if (arena == nullptr) {  // released between Get and here
    return absl::NotFoundError(
        absl::StrCat("handle \"", handle.id(), "\" was just released"));
  }
  return arena;
}

// Reads arena bytes [offset, offset + length) in pieces of at most 64 MiB
// and passes each to `use` (no copy for host arenas). Between pieces it
// stops with CANCELLED once the caller is gone.
template <typename Use>
absl::Status ScanArena(const memory::Arena& arena, uint64_t offset,
                       uint64_t length, const Cancelled& cancelled, Use use) {
  constexpr uint64_t kPiece = uint64_t{64} << 20;
  const char* host = reinterpret_cast<const char*>(arena.host_data());
  std::string buffer;
  if (host == nullptr) buffer.resize(std::min(length, kPiece));
  for (uint64_t done = 0; done < length;) {
    if (done > 0) RETURN_IF_ERROR(CheckCancelled(cancelled));
    const uint64_t n = std::min(kPiece, length - done);
    if (host != nullptr) {
      use(host + offset + done, n);
    } else {
      RETURN_IF_ERROR(arena.CopyToHost(offset + done, n, buffer.data()));
      use(buffer.data(), n);
    }
    done += n;
  }
  return absl::OkStatus();
}

// Runs work(i) for every i in `items` on up to `threads` threads (this
// one included), the largest `bytes[i]` first, so that one big tensor does
// not start last and leave the other threads idle. The first error stops
// the tasks not yet started and is returned.
absl::Status ForEachInParallel(
    std::vector<size_t> items, const std::vector<uint64_t>& bytes, int threads,
    const std::function<absl::Status(size_t)>& work) {
  std::stable_sort(items.begin(), items.end(),
                   [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first;
  auto run = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t k = next.fetch_add(1);
      if (k >= items.size()) return;
      absl::Status status = work(items[k]);
      if (!status.ok()) {
        absl::MutexLock lock(&mu);
        if (first.ok()) first = std::move(status);
        failed.store(true);
      }
    }
  };
  threads = std::max(1, std::min<int>(threads, static_cast<int>(items.size())));
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(run);
    } catch (const std::system_error&) {
      break;  // no thread to be had (a limit): fewer threads, same result
    }
  }
  run();
  for (std::thread& thread : pool) thread.join();
  absl::MutexLock lock(&mu);
  return first;
}

// Per-tensor digests in spec order; tied tensors repeat their root's.
// Host arenas are hashed on `threads` threads, one tensor per task (XXH3
// is sequential within a tensor, not across tensors); device arenas on
// this thread, one bounded host copy at a time.
absl::StatusOr<std::shared_ptr<const registry::Handle::Digests>> TensorDigests(
    const registry::Handle& handle, const memory::Arena& arena,
    const Cancelled& cancelled, int threads) {
  return handle.TensorDigests(
      [&]() -> absl::StatusOr<registry::Handle::Digests> {
        const registry::HandleSpec& spec = handle.spec();
        registry::Handle::Digests digests(spec.tensors.size());
        std::vector<size_t> roots;
        std::vector<uint64_t> bytes(spec.tensors.size(), 0);
        for (size_t i = 0; i < spec.tensors.size(); ++i) {
          if (spec.tensors[i].tie_root >= 0) continue;
          roots.push_back(i);
          bytes[i] = spec.tensors[i].nbytes;
        }
        RETURN_IF_ERROR(ForEachInParallel(
            std::move(roots), bytes, arena.host_data() != nullptr ? threads : 1,
            [&](size_t i) -> absl::Status {
              RETURN_IF_ERROR(CheckCancelled(cancelled));
              delivery::Hasher hasher;
              RETURN_IF_ERROR(ScanArena(arena, spec.layout.offsets[i],
                                        spec.tensors[i].nbytes, cancelled,
                                        [&](const char* data, uint64_t n) {
                                          hasher.Update(data, n);
                                        }));
              digests[i] = delivery::FormatDigest(hasher.Finish());
              return absl::OkStatus();
            }));
        for (size_t i = 0; i < spec.tensors.size(); ++i) {
          const int root = spec.tensors[i].tie_root;
          if (root >= 0) digests[i] = digests[root];
        }
        return digests;
      });
}

// Per-tensor fingerprints in spec order; tied tensors repeat their root's.
absl::StatusOr<std::shared_ptr<const registry::Handle::Fingerprints>>
TensorFingerprints(const registry::Handle& handle, const memory::Arena& arena,
                   const Cancelled& cancelled) {
  return handle.TensorFingerprints(
      [&]() -> absl::StatusOr<registry::Handle::Fingerprints> {
        const registry::HandleSpec& spec = handle.spec();
        registry::Handle::Fingerprints values(spec.tensors.size());
        for (size_t i = 0; i < spec.tensors.size(); ++i) {
          const spec::TensorDesc& t = spec.tensors[i];
          if (t.tie_root >= 0) continue;
          RETURN_IF_ERROR(CheckCancelled(cancelled));
          const uint32_t itemsize = spec::ItemSize(t.dtype);
          delivery::Fingerprinter f(itemsize, t.shape, t.full_shape(),
                                    t.shard_offset);
          // Pieces of a device arena may end mid-element: carry the tail.
          std::string carry;
          RETURN_IF_ERROR(ScanArena(
              arena, spec.layout.offsets[i], t.nbytes, cancelled,
              [&](const char* data, uint64_t n) {
                if (!carry.empty()) {
                  const uint64_t need = itemsize - carry.size();
                  const uint64_t take = std::min(need, n);
                  carry.append(data, take);
                  data += take;
                  n -= take;
                  if (carry.size() < itemsize) return;
                  f.Add(carry.data(), 1);
                  carry.clear();
                }
                f.Add(data, n / itemsize);
                carry.assign(data + n / itemsize * itemsize, n % itemsize);
              }));
          values[i] = f.value();
        }
        for (size_t i = 0; i < spec.tensors.size(); ++i) {
          const int root = spec.tensors[i].tie_root;
          if (root >= 0) values[i] = values[root];
        }
        return values;
      });
}

// Weighting each tensor by an odd multiplier keeps the sum linear (so shard
// handles still add up) while telling apart equal tensors under other names.
uint64_t HandleFingerprint(const registry::HandleSpec& spec,
                           const registry::Handle::Fingerprints& values) {
  uint64_t sum = 0;
  for (size_t i = 0; i < spec.tensors.size() && i < values.size(); ++i) {
    if (spec.tensors[i].tie_root >= 0) continue;
    sum += values[i] * (init::Fnv1a64(spec.tensors[i].name) | 1);
  }
  return sum;
}

// Per-tensor CRC-32s (the torch format's zip entries need them before
// their data) in spec order; tied tensors repeat their root's. Each tensor
// is cut into pieces of at most kCrcPieceBytes, checked in parallel on
// `threads` threads (host arenas) and combined in order, so that one big
// tensor uses every core.
constexpr uint64_t kCrcPieceBytes = uint64_t{64} << 20;

absl::StatusOr<std::shared_ptr<const registry::Handle::Crcs>> TensorCrcs(
    const registry::Handle& handle, const memory::Arena& arena,
    const Cancelled& cancelled, int threads) {
  return handle.TensorCrcs([&]() -> absl::StatusOr<registry::Handle::Crcs> {
    const registry::HandleSpec& spec = handle.spec();
    struct CrcPiece {
      size_t tensor;
      uint64_t offset;  // in the tensor
      uint64_t length;
      uint32_t crc = 0;
    };
    std::vector<CrcPiece> pieces;
    for (size_t i = 0; i < spec.tensors.size(); ++i) {
      if (spec.tensors[i].tie_root >= 0) continue;
      const uint64_t nbytes = spec.tensors[i].nbytes;
      for (uint64_t at = 0; at == 0 || at < nbytes; at += kCrcPieceBytes) {
        pieces.push_back({i, at, std::min(kCrcPieceBytes, nbytes - at)});
      }
    }
    std::vector<size_t> order(pieces.size());
    std::vector<uint64_t> bytes(pieces.size());
    for (size_t k = 0; k < pieces.size(); ++k) {
      order[k] = k;
      bytes[k] = pieces[k].length;
    }
    RETURN_IF_ERROR(ForEachInParallel(
        std::move(order), bytes, arena.host_data() != nullptr ? threads : 1,
        [&](size_t k) -> absl::Status {
          RETURN_IF_ERROR(CheckCancelled(cancelled));
          CrcPiece& piece = pieces[k];
          return ScanArena(
              arena, spec.layout.offsets[piece.tensor] + piece.offset,
              piece.length, cancelled, [&](const char* data, uint64_t n) {
                piece.crc = delivery::Crc32(data, n, piece.crc);
              });
        }));
    registry::Handle::Crcs crcs(spec.tensors.size());
    for (const CrcPiece& piece : pieces) {  // in order within each tensor
      crcs[piece.tensor] =
          piece.offset == 0 ? piece.crc
                            : delivery::Crc32Combine(crcs[piece.tensor],
                                                     piece.crc, piece.length);
    }
    for (size_t i = 0; i < spec.tensors.size(); ++i) {
      const int root = spec.tensors[i].tie_root;
      if (root >= 0) crcs[i] = crcs[root];
    }
    return crcs;
  });
}

// "xxh3-128:<32 hex>" -> its 16 canonical bytes, appended to *out.
void AppendDigestBytes(const std::string& digest, std::string* out) {
  const std::string hex = digest.substr(delivery::kDigestPrefix.size());
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out->push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
}

// Checks the include/exclude globs and says which tensors a request
// writes: the indices into spec.tensors, the safetensors metadata, and the
// key of the file in the handle's digest cache.
struct Selection {
  std::vector<size_t> indices;
  std::vector<std::pair<std::string, std::string>> metadata;
  registry::Handle::FileKey key;
};

// The filters of a request, each pattern compiled once.
struct Filters {
  std::vector<init::Glob> include;
  std::vector<init::Glob> exclude;
};

absl::StatusOr<Filters> CompileFilters(const v1::FetchRequest& request,
                                       uint64_t name_bytes) {
  Filters filters;
  uint64_t words = 0;
  auto compile = [&](const char* field, const auto& patterns,
                     std::vector<init::Glob>* out) -> absl::Status {
    if (static_cast<size_t>(patterns.size()) > kMaxFilterPatterns) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", patterns.size(), " patterns; the limit is ",
                       kMaxFilterPatterns));
    }
    for (int k = 0; k < patterns.size(); ++k) {
      absl::StatusOr<init::Glob> glob = init::Glob::Compile(patterns[k]);
      if (!glob.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, "[", k, "] (", Quote(patterns[k]),
                         "): ", glob.status().message()));
      }
      words += glob->words();
      out->push_back(std::move(*glob));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(compile("include", request.include(), &filters.include));
  RETURN_IF_ERROR(compile("exclude", request.exclude(), &filters.exclude));
  if (words * name_bytes > kMaxFilterMatchWork) {
    return absl::InvalidArgumentError(absl::StrCat(
        "include/exclude: matching ",
        request.include_size() + request.exclude_size(), " patterns against ",
        name_bytes, " bytes of tensor names is ", words * name_bytes,
        " steps (name bytes x patterns, a pattern with n >= 64 items other "
        "than '*' counting ceil((n + 1) / 64) times); the limit is ",
        kMaxFilterMatchWork, ". Use fewer patterns"));
  }
  return filters;
}

// A 128-bit hash of what decides a file's bytes: the format, the flag that
// changes them, and which tensors the filters select. Filters that select
// the same tensors share one cache entry however they are written.
registry::Handle::FileKey KeyOf(v1::WeightFormat format, bool write_ties_once,
                                const std::vector<char>& selected) {
  delivery::Hasher hasher;
  const uint32_t header[2] = {static_cast<uint32_t>(format),
                              write_ties_once ? 1u : 0u};
  hasher.Update(header, sizeof(header));
  hasher.Update(selected.data(), selected.size());
  const delivery::Digest128 digest = hasher.Finish();
  return {digest.high, digest.low};
}

absl::StatusOr<Selection> Select(const registry::Handle& handle,
                                 const v1::FetchRequest& request,
                                 const Cancelled& cancelled) {
  const registry::HandleSpec& spec = handle.spec();
  uint64_t name_bytes = 0;
  for (const spec::TensorDesc& t : spec.tensors) name_bytes += t.name.size();
  ASSIGN_OR_RETURN(Filters filters, CompileFilters(request, name_bytes));
  const bool non_persistent = request.include_non_persistent();
  auto eligible = [&](size_t i) {
    return spec.tensors[i].persistent || non_persistent;
  };
  // Every pattern must match some tensor the file could hold: a pattern
  // that matches nothing is almost always a typo.
  auto check = [&](const char* field, const auto& patterns,
                   const std::vector<init::Glob>& globs) -> absl::Status {
    for (size_t k = 0; k < globs.size(); ++k) {
      bool matched = false;
      bool matched_non_persistent = false;
      for (size_t i = 0; i < spec.tensors.size() && !matched; ++i) {
        if (i % kCancelPollInterval == 0) {
          RETURN_IF_ERROR(CheckCancelled(cancelled));
        }
        if (!globs[k].Matches(spec.tensors[i].name)) continue;
        if (eligible(i)) {
          matched = true;
        } else {
          matched_non_persistent = true;
        }
      }
      if (!matched) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, "[", k, "] (", Quote(patterns[static_cast<int>(k)]),
            ") matches no tensor of handle ", handle.id(),
            matched_non_persistent
                ? " that the file would hold: it matches only non-persistent "
                  "buffers, which are written only with "
                  "include_non_persistent"
                : ""));
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check("include", request.include(), filters.include));
  RETURN_IF_ERROR(check("exclude", request.exclude(), filters.exclude));

  auto any_match = [](const std::vector<init::Glob>& globs,
                      const std::string& name) {
    for (const init::Glob& glob : globs) {
      if (glob.Matches(name)) return true;
    }
    return false;
  };
  Selection selection;
  const bool safetensors = request.format() == v1::WEIGHT_FORMAT_UNSPECIFIED ||
                           request.format() == v1::WEIGHT_FORMAT_SAFETENSORS;
  if (safetensors) selection.metadata.emplace_back("format", "pt");
  std::vector<char> selected(spec.tensors.size(), 0);
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    if (i % kCancelPollInterval == 0) {
      RETURN_IF_ERROR(CheckCancelled(cancelled));
    }
    const std::string& name = spec.tensors[i].name;
    selected[i] =
        eligible(i) &&
        (filters.include.empty() || any_match(filters.include, name)) &&
        !any_match(filters.exclude, name);
  }
  const bool write_ties_once = safetensors && request.write_ties_once();
  selection.key =
      KeyOf(safetensors ? v1::WEIGHT_FORMAT_SAFETENSORS : request.format(),
            write_ties_once, selected);
  // With write_ties_once (safetensors), each group of tied tensors is
  // written once, under its first selected name (the root when it is
  // selected); the others are recorded as ties.
  std::vector<int> carrier(spec.tensors.size(), -1);
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    if (!selected[i]) continue;
    const spec::TensorDesc& t = spec.tensors[i];
    const int root = t.tie_root >= 0 ? t.tie_root : static_cast<int>(i);
    if (write_ties_once) {
      int& written = carrier[root];
      if (written < 0) {
        written = selected[root] ? root : static_cast<int>(i);
      }
      if (written != static_cast<int>(i)) {
        selection.metadata.emplace_back(absl::StrCat("tie:", t.name),
                                        spec.tensors[written].name);
        continue;
      }
    }
    selection.indices.push_back(i);
  }
  if (selection.indices.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "include/exclude (", request.include_size(), " and ",
        request.exclude_size(), " patterns) leave no tensor of handle ",
        handle.id(), " to write"));
  }
  return selection;
}

// The file a request describes, over a READY handle's arena, and its key
// in the handle's digest cache. `threads`: for the torch format's CRCs.
struct BuiltFile {
  std::shared_ptr<const delivery::WeightFile> file;
  registry::Handle::FileKey key;
};

absl::StatusOr<BuiltFile> BuildFile(const registry::Handle& handle,
                                    const memory::Arena& arena,
                                    const v1::FetchRequest& request,
                                    const Cancelled& cancelled, int threads) {
  if (!v1::WeightFormat_IsValid(request.format())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format: unknown format ", request.format(),
        "; expected WEIGHT_FORMAT_SAFETENSORS, WEIGHT_FORMAT_TORCH or "
        "WEIGHT_FORMAT_RAW"));
  }
  if (!v1::FetchDigest_IsValid(request.digest())) {
    return absl::InvalidArgumentError(
        absl::StrCat("digest: unknown value ", request.digest(),
                     "; expected FETCH_DIGEST_FILE or FETCH_DIGEST_TENSORS"));
  }
  ASSIGN_OR_RETURN(Selection selection, Select(handle, request, cancelled));
  std::shared_ptr<const registry::Handle::Crcs> crcs;
  if (request.format() == v1::WEIGHT_FORMAT_TORCH) {
    ASSIGN_OR_RETURN(crcs, TensorCrcs(handle, arena, cancelled, threads));
  }
  const registry::HandleSpec& spec = handle.spec();
  std::vector<delivery::SourceTensor> tensors;
  tensors.reserve(selection.indices.size());
  for (size_t i : selection.indices) {
    const spec::TensorDesc& t = spec.tensors[i];
    delivery::SourceTensor entry;
    entry.name = t.name;
    entry.dtype = t.dtype;
    entry.shape = t.shape;
    entry.nbytes = t.nbytes;
    entry.source_offset = spec.layout.offsets[i];
    entry.group = t.tie_root >= 0 ? t.tie_root : static_cast<int64_t>(i);
    if (crcs != nullptr) entry.crc32 = (*crcs)[i];
    tensors.push_back(std::move(entry));
  }
  RETURN_IF_ERROR(CheckCancelled(cancelled));
  ASSIGN_OR_RETURN(
      delivery::WeightFile file,
      delivery::BuildWeightFile(request.format(), tensors, selection.metadata));
  return BuiltFile{
      std::make_shared<const delivery::WeightFile>(std::move(file)),
      selection.key};
}

// The whole file's digest: cached, or computed now and cached.
absl::StatusOr<std::string> FileDigestOf(const registry::Handle& handle,
                                         const memory::Arena& arena,
                                         const delivery::WeightFile& file,
                                         const registry::Handle::FileKey& key,
                                         const Cancelled& cancelled) {
  std::string digest = handle.FileDigest(key);
  if (!digest.empty()) return digest;
  delivery::Hasher hasher;
  absl::Status read = file.ForEachPiece(
      0, file.size(), [&](const delivery::Piece& piece) -> absl::Status {
        if (piece.kind != delivery::Piece::Kind::kSource) {
          hasher.Update(piece.data, piece.length);
          return absl::OkStatus();
        }
        RETURN_IF_ERROR(CheckCancelled(cancelled));
        return ScanArena(
            arena, piece.source_offset, piece.length, cancelled,
            [&](const char* data, uint64_t n) { hasher.Update(data, n); });
      });
  RETURN_IF_ERROR(read);
  digest = delivery::FormatDigest(hasher.Finish());
  handle.SetFileDigest(key, digest);
  return digest;
}

// The digests of the tensors `file` holds, in file order, by name.
std::vector<delivery::NamedDigest> FileTensorDigests(
    const registry::HandleSpec& spec, const delivery::WeightFile& file,
    const registry::Handle::Digests& digests) {
  absl::flat_hash_map<std::string, size_t> index;
  for (size_t i = 0; i < spec.tensors.size(); ++i)
    index[spec.tensors[i].name] = i;
  std::vector<delivery::NamedDigest> out;
  out.reserve(file.ranges().size());
  for (const delivery::FileRange& range : file.ranges()) {
    out.push_back({range.name, digests[index.at(range.name)]});
  }
  return out;
}

// A handle's tensor digests, computed on threads of their own while a
// stream sends the data (with threads to spare, the stream never waits for
// them; cached in the handle, so later fetches find them at once).
// Destroying it (the stream ended or the client went away) stops the
// computation between 64 MiB pieces and joins its thread; a computation
// stopped that way is not cached.
class BackgroundDigests final : public delivery::PendingTensorDigests {
 public:
  BackgroundDigests(std::shared_ptr<const registry::Handle> handle,
                    std::shared_ptr<const memory::Arena> arena,
                    std::shared_ptr<const delivery::WeightFile> file,
                    int threads)
      : thread_([this, handle = std::move(handle), arena = std::move(arena),
                 file = std::move(file), threads] {
          absl::StatusOr<std::shared_ptr<const registry::Handle::Digests>>
              digests = TensorDigests(
                  *handle, *arena, [this] { return stop_.load(); }, threads);
          absl::MutexLock lock(&mu_);
          if (digests.ok()) {
            result_ = FileTensorDigests(handle->spec(), *file, **digests);
          } else {
            result_ = digests.status();
          }
          done_ = true;
        }) {}

  ~BackgroundDigests() override {
    stop_.store(true);
    thread_.join();
  }

  absl::StatusOr<std::vector<delivery::NamedDigest>> Wait() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return result_;
  }

 private:
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<std::vector<delivery::NamedDigest>> result_
      ABSL_GUARDED_BY(mu_) = absl::UnknownError("not computed");
  // Last: it starts running once every member above exists.
  std::thread thread_;
};

int DigestThreads(const EngineOptions& options) {
  if (options.digest_threads > 0) return options.digest_threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

absl::StatusOr<std::unique_ptr<delivery::WeightStream>> Engine::OpenFetch(
    const Caller& caller, const v1::FetchRequest& request,
    const Cancelled& cancelled) const {
  ASSIGN_OR_RETURN(std::shared_ptr<registry::Handle> handle,
                   registry_->Get(caller.identity, request.handle()));
  ASSIGN_OR_RETURN(std::shared_ptr<const memory::Arena> arena,
                   ReadyArena(*handle));
  ASSIGN_OR_RETURN(BuiltFile built,
                   BuildFile(*handle, *arena, request, cancelled,
                             DigestThreads(options_)));
  std::shared_ptr<const delivery::WeightFile> file = std::move(built.file);
  const registry::Handle::FileKey key = built.key;
  delivery::FileDigest digest;
  if (request.digest() == v1::FETCH_DIGEST_TENSORS) {
    // Computed (once per handle) on threads of their own while the data
    // goes out, and sent after it: the stream itself only moves bytes.
    digest.per_tensor = true;
    try {
      digest.pending = std::make_unique<BackgroundDigests>(
          handle, arena, file, DigestThreads(options_));
    } catch (const std::system_error&) {
      // No thread to be had: compute them here, before the first chunk.
      ASSIGN_OR_RETURN(
          std::shared_ptr<const registry::Handle::Digests> digests,
          TensorDigests(*handle, *arena, cancelled, DigestThreads(options_)));
      digest.tensors = FileTensorDigests(handle->spec(), *file, *digests);
    }
  } else {
    digest.known = handle->FileDigest(key);
  }
  if (!digest.per_tensor && digest.known.empty()) {
    // The stream hashes the file as it goes and caches the result. It
    // holds the handle weakly: a released handle needs no cache.
    std::weak_ptr<const registry::Handle> weak = handle;
    digest.on_computed = [weak, key](const std::string& value) {
      if (auto held = weak.lock()) held->SetFileDigest(key, value);
    };
  }
  return delivery::WeightStream::Open(std::move(arena), std::move(file),
                                      request.offset(), request.chunk_bytes(),
                                      std::move(digest));
}

absl::StatusOr<v1::FileLayout> Engine::DescribeFile(
    const Caller& caller, const v1::FetchRequest& request,
    const Cancelled& cancelled) const {
  ASSIGN_OR_RETURN(std::shared_ptr<registry::Handle> handle,
                   registry_->Get(caller.identity, request.handle()));
  ASSIGN_OR_RETURN(std::shared_ptr<const memory::Arena> arena,
                   ReadyArena(*handle));
  ASSIGN_OR_RETURN(BuiltFile built,
                   BuildFile(*handle, *arena, request, cancelled,
                             DigestThreads(options_)));
  const std::shared_ptr<const delivery::WeightFile>& file = built.file;
  if (request.offset() > file->size()) {
    return absl::OutOfRangeError(absl::StrCat("offset: ", request.offset(),
                                              " is past the end of the ",
                                              file->size(), "-byte file"));
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<const registry::Handle::Digests> digests,
      TensorDigests(*handle, *arena, cancelled, DigestThreads(options_)));
  // FETCH_DIGEST_TENSORS: the caller checks tensors, not the file; no pass
  // over the file for a digest it does not use.
  std::string digest;
  if (request.digest() != v1::FETCH_DIGEST_TENSORS) {
    ASSIGN_OR_RETURN(
        digest, FileDigestOf(*handle, *arena, *file, built.key, cancelled));
  }

  // Ranges index the selection; map them back to spec indices by name.
  const registry::HandleSpec& spec = handle->spec();
  absl::flat_hash_map<std::string, size_t> index;
  for (size_t i = 0; i < spec.tensors.size(); ++i)
    index[spec.tensors[i].name] = i;
  v1::FileLayout layout;
  layout.set_total_bytes(file->size());
  layout.set_digest(digest);
  layout.set_format(file->format());
  for (const delivery::FileRange& range : file->ranges()) {
    v1::FileEntry* entry = layout.add_entries();
    entry->set_name(range.name);
    entry->set_dtype(spec::Name(range.dtype));
    entry->mutable_shape()->Add(range.shape.begin(), range.shape.end());
    entry->set_offset(range.offset);
    entry->set_nbytes(range.nbytes);
    entry->set_digest((*digests)[index.at(range.name)]);
  }
  return layout;
}

absl::Status Engine::AddDeliveryInfo(const registry::Handle& handle,
                                     v1::HandleInfo* info,
                                     const Cancelled& cancelled) const {
  info->set_exports(handle.num_exports());
  if (handle.state() != v1::HANDLE_STATE_READY) return absl::OkStatus();
  std::shared_ptr<const memory::Arena> arena = handle.arena();
  if (arena == nullptr) return absl::OkStatus();  // released meanwhile
  ASSIGN_OR_RETURN(
      std::shared_ptr<const registry::Handle::Digests> digests,
      TensorDigests(handle, *arena, cancelled, DigestThreads(options_)));
  std::string concatenated;
  concatenated.reserve(digests->size() * 16);
  for (int i = 0;
       i < info->tensors_size() && i < static_cast<int>(digests->size()); ++i) {
    info->mutable_tensors(i)->set_digest((*digests)[i]);
  }
  for (const std::string& digest : *digests) {
    AppendDigestBytes(digest, &concatenated);
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<const registry::Handle::Fingerprints> fingerprints,
      TensorFingerprints(handle, *arena, cancelled));
  for (int i = 0;
       i < info->tensors_size() && i < static_cast<int>(fingerprints->size());
       ++i) {
    info->mutable_tensors(i)->set_fingerprint((*fingerprints)[i]);
  }
  info->set_fingerprint(HandleFingerprint(handle.spec(), *fingerprints));
  info->set_digest(delivery::FormatDigest(
      delivery::HashBytes(concatenated.data(), concatenated.size())));
  return absl::OkStatus();
}

}  // namespace materializer::engine
