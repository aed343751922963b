#include "server/init/apply.h"

#include <ATen/Parallel.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/kernel_threads.h"
#include "server/common/torch_guard.h"
#include "server/init/derived_fill.h"
#include "server/init/fill.h"
#include "server/init/portable_fill.h"
#include "server/init/schemes.h"
#include "server/init/seed.h"
#include "server/memory/arena_views.h"
#include "server/spec/torch_dtype.h"

namespace materializer::init {
namespace {

// One unit of work: a tensor with its own init, or a module_default module
// (its tensors share one generator and are drawn in order).
struct Task {
  int tensor = -1;
  const ModulePlan* module = nullptr;
  uint64_t bytes = 0;
  // ResolvedInit::depth: tasks run after every task of a smaller depth.
  int depth = 0;
};

std::vector<Task> MakeTasks(const std::vector<spec::TensorDesc>& tensors,
                            const std::vector<ResolvedInit>& inits) {
  std::vector<Task> tasks;
  std::map<const ModulePlan*, size_t> module_task;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].tie_root >= 0) continue;  // its root is written
    const ModulePlan* module = inits[i].module.get();
    if (module == nullptr) {
      tasks.push_back(
          {static_cast<int>(i), nullptr, tensors[i].nbytes, inits[i].depth});
      continue;
    }
    auto [it, inserted] = module_task.emplace(module, tasks.size());
    if (inserted) tasks.push_back({-1, module, 0});
    tasks[it->second].bytes += tensors[i].nbytes;
  }
  return tasks;
}

// Runs work(task) for every task on up to `threads` threads, largest first
// (longest-processing-time order keeps the threads evenly loaded when one
// tensor, such as an embedding, dominates). Rethrows the first exception
// after every thread has stopped.
template <typename Work>
void ForEachTaskInParallel(const std::vector<Task>& tasks, int threads,
                           const std::function<bool()>& cancelled,
                           std::atomic<bool>& stopped, Work work) {
  if (tasks.empty()) return;
  std::vector<size_t> order(tasks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tasks[a].bytes > tasks[b].bytes;
  });
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::atomic_flag error_set = ATOMIC_FLAG_INIT;
  auto run = [&] {
    UseOneKernelThreadHere();
    while (!failed.load(std::memory_order_relaxed)) {
      if (cancelled != nullptr && cancelled()) {
        stopped.store(true);
        return;
      }
      const size_t k = next.fetch_add(1);
      if (k >= order.size()) return;
      try {
        work(tasks[order[k]]);
      } catch (...) {
        if (!error_set.test_and_set()) error = std::current_exception();
        failed.store(true);
      }
    }
  };
  // Only fresh threads run tasks: the one-kernel-thread settings are
  // per-thread and must not stick to the caller (a server worker thread,
  // whose at::get_num_threads() sizes the next request's pool).
  threads = std::max(1, std::min<int>(threads, static_cast<int>(order.size())));
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int t = 0; t < threads; ++t) pool.emplace_back(run);
  for (std::thread& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
}

// Runs ForEachTaskInParallel depth by depth: every task of depth d after
// every task of smaller depth (derived values read their sources).
template <typename Work>
void ForEachTaskByDepth(const std::vector<Task>& tasks, int threads,
                        const std::function<bool()>& cancelled,
                        std::atomic<bool>& stopped, Work work) {
  int max_depth = 0;
  for (const Task& task : tasks) max_depth = std::max(max_depth, task.depth);
  if (max_depth == 0) {
    ForEachTaskInParallel(tasks, threads, cancelled, stopped, work);
    return;
  }
  for (int d = 0; d <= max_depth && !stopped.load(); ++d) {
    std::vector<Task> level;
    for (const Task& task : tasks) {
      if (task.depth == d) level.push_back(task);
    }
    ForEachTaskInParallel(level, threads, cancelled, stopped, work);
  }
}

// RNG_MODE_TORCH, a step with derived values (a map, or norm_of): the
// leaf in a tensor of the compute dtype (the scheme's draw from the
// tensor's generator, or the norm of the source's stored values), the
// program on it, and the result copied into the step's view (docs/init.md,
// "Derived values", has the Python).
void FillDerivedStepTorch(at::Tensor& target, const ResolvedStep& step,
                          const std::optional<at::Generator>& generator,
                          const std::optional<at::Generator>& permutations,
                          const std::vector<at::Tensor>& views) {
  at::Tensor leaf;
  if (step.scheme->has_norm_of()) {
    leaf = NormExceptDimTorch(views[step.source], step.scheme->norm_of().dim());
    if (step.map != nullptr) {
      leaf = leaf.to(spec::ToScalarType(step.map->compute));
    }
  } else {
    // Straight in the target where it is a contiguous tensor of the compute
    // dtype (the same draws either way), else in scratch memory.
    const c10::ScalarType compute = spec::ToScalarType(step.map->compute);
    leaf = target.is_contiguous() && target.scalar_type() == compute
               ? target
               : at::empty(target.sizes(), target.options().dtype(compute));
    Fill(leaf, *step.scheme, generator, permutations);
  }
  const at::Tensor result =
      step.map != nullptr ? RunElementwiseTorch(leaf, *step.map) : leaf;
  if (!result.is_same(target)) target.copy_(result);
}

// RNG_MODE_TORCH, a tensor with its own init: its steps in order, on the
// view of each step's region, all drawing from the tensor's one generator
// (seeded with DeriveSeed(seed, name)); sparse's row permutations come from
// a second generator, seeded the same, that the steps share too. `views`
// are every tensor's, for steps that read other tensors (norm_of).
void FillSteps(const spec::TensorDesc& desc,
               const std::vector<ResolvedStep>& steps, uint64_t seed,
               at::Tensor& view, const std::vector<at::Tensor>& views) {
  if (desc.numel == 0) return;
  bool random = false;
  bool sparse = false;
  for (const ResolvedStep& step : steps) {
    random = random || IsRandom(*step.scheme);
    sparse = sparse || step.scheme->has_sparse();
  }
  std::optional<at::Generator> generator;
  std::optional<at::Generator> permutations;
  const uint64_t derived = DeriveSeed(seed, desc.name);
  if (random) generator = MakeGenerator(view.device(), derived);
  if (sparse) permutations = MakeGenerator(at::Device(at::kCPU), derived);
  for (const ResolvedStep& step : steps) {
    at::Tensor target = view;
    if (step.region.has_value()) {
      for (size_t d = 0; d < step.region->offset.size(); ++d) {
        target = target.narrow(static_cast<int64_t>(d), step.region->offset[d],
                               step.region->length[d]);
      }
    }
    if (step.map != nullptr || step.scheme->has_norm_of()) {
      FillDerivedStepTorch(target, step, generator, permutations, views);
    } else {
      Fill(target, *step.scheme, generator, permutations);
    }
  }
}

// Elements of a norm's source made at once (a piece of its slab).
constexpr int64_t kNormPieceElements = int64_t{1} << 22;

// RNG_MODE_PORTABLE: what every tensor's fill needs.
struct PortableContext {
  const std::vector<spec::TensorDesc>& tensors;
  const std::vector<ResolvedInit>& inits;
  uint64_t seed;
  int threads;
  // The arena's views. Tasks run by depth, so a tensor that a norm reads
  // is filled before its reader: where its view holds the part the norm
  // needs, that part is read rather than made again.
  const std::vector<at::Tensor>& views;
};

// `view` narrowed to `part` (full-tensor coordinates), given that view
// holds `stored`.
at::Tensor Narrowed(const at::Tensor& view, const portable::Box& stored,
                    const portable::Box& part) {
  at::Tensor out = view;
  for (size_t d = 0; d < part.offset.size(); ++d) {
    out = out.narrow(static_cast<int64_t>(d), part.offset[d] - stored.offset[d],
                     part.length[d]);
  }
  return out;
}

// `desc` as if it stored `box` of the full tensor (a shard's geometry),
// with elements of `dtype`.
spec::TensorDesc DescForBox(const spec::TensorDesc& desc,
                            const portable::Box& box, spec::DType dtype) {
  spec::TensorDesc out = desc;
  out.shard_full_shape = desc.full_shape();
  out.shard_offset = box.offset;
  out.shape = box.length;
  out.dtype = dtype;
  out.numel = static_cast<uint64_t>(portable::NumElements(box));
  out.nbytes = out.numel * spec::ItemSize(dtype);
  return out;
}

void FillTensorPortable(at::Tensor& view, const spec::TensorDesc& desc, int i,
                        const PortableContext& ctx);

// The values of tensor `i` over `box` of it, on the CPU, computed again
// from its init (its portable values depend only on the seed, its name and
// the index, so any part can be made on its own).
at::Tensor PortableValuesOf(int i, const portable::Box& box,
                            const PortableContext& ctx) {
  const spec::TensorDesc& desc = ctx.tensors[i];
  at::Tensor out = at::empty(box.length, at::TensorOptions().dtype(
                                             spec::ToScalarType(desc.dtype)));
  FillTensorPortable(out, DescForBox(desc, box, desc.dtype), i, ctx);
  return out;
}

// A step with derived values (a map, or norm_of) over the part of its
// region that `view` holds: the leaf on the CPU (the scheme's portable
// values in the leaf dtype, or the norm of the source's values for exactly
// the slab this part needs), the program, then a copy into the view
// (docs/portable-rng.md, section 14).
void FillDerivedStepPortable(at::Tensor& view, const spec::TensorDesc& desc,
                             const ResolvedStep& step, uint32_t k,
                             const PortableContext& ctx) {
  const portable::Box full = portable::FullBox(desc.full_shape());
  const portable::Box stored =
      desc.is_shard() ? portable::Box{desc.shard_offset, desc.shape} : full;
  const portable::Box part =
      portable::Intersect(step.region.has_value() ? *step.region : full, stored);
  if (portable::NumElements(part) == 0) return;
  at::Tensor dst = Narrowed(view, stored, part);
  at::Tensor leaf;
  if (step.scheme->has_norm_of()) {
    const int64_t dim = step.scheme->norm_of().dim();
    const spec::TensorDesc& source = ctx.tensors[step.source];
    portable::Box slab = portable::FullBox(source.full_shape());
    if (dim >= 0) {
      slab.offset[dim] = part.offset[dim];
      slab.length[dim] = part.length[dim];
    }
    // The slab is made and summed in pieces along its dimension 0, so the
    // scratch memory stays bounded whatever the source's size.
    std::vector<double> sums(
        std::max<int64_t>(1, dim >= 0 ? slab.length[dim] : 1), 0.0);
    if (portable::NumElements(slab) > 0) {
      int64_t row = 1;
      for (size_t d = 1; d < slab.length.size(); ++d) row *= slab.length[d];
      const int64_t rows_per_piece =
          slab.length.empty()
              ? 1
              : std::max<int64_t>(1, kNormPieceElements / std::max<int64_t>(row, 1));
      const int64_t rows = slab.length.empty() ? 1 : slab.length[0];
      for (int64_t r = 0; r < rows; r += rows_per_piece) {
        portable::Box piece = slab;
        if (!piece.length.empty()) {
          piece.offset[0] = slab.offset[0] + r;
          piece.length[0] = std::min(rows_per_piece, rows - r);
        }
        const spec::TensorDesc& src = ctx.tensors[step.source];
        const portable::Box held =
            src.is_shard() ? portable::Box{src.shard_offset, src.shape}
                           : portable::FullBox(src.full_shape());
        const bool stored =
            portable::Intersect(held, piece).length == piece.length;
        AccumulateSquares(stored ? Narrowed(ctx.views[step.source], held, piece)
                                 : PortableValuesOf(step.source, piece, ctx),
                          dim, r, sums);
      }
    }
    leaf = SqrtOfSums(sums, part.length);
    if (step.map != nullptr &&
        PortableLeafDtype(*step.map) != spec::DType::kFloat64) {
      leaf = leaf.to(at::kFloat);  // a program's float32 leaf
    }
  } else {
    // The leaf straight in the tensor where it has the leaf's dtype and
    // layout (the program then runs in place), else in scratch memory.
    const spec::DType leaf_dtype = PortableLeafDtype(*step.map);
    const bool direct = dst.device().is_cpu() && dst.is_contiguous() &&
                        dst.scalar_type() == spec::ToScalarType(leaf_dtype);
    leaf = direct ? dst
                  : at::empty(part.length, at::TensorOptions().dtype(
                                               spec::ToScalarType(leaf_dtype)));
    FillPortableStep(leaf, DescForBox(desc, part, leaf_dtype), *step.scheme,
                     step.region, k, ctx.seed, ctx.threads);
  }
  if (step.map != nullptr) {
    leaf = RunElementwisePortable(leaf, *step.map, ctx.threads);
  }
  if (desc.dtype != spec::DType::kFloat64 && leaf.scalar_type() == at::kDouble) {
    leaf = leaf.to(at::kFloat);  // every dtype but float64 narrows from f32
  }
  if (!leaf.is_same(dst)) dst.copy_(leaf);
}

// Fills `view` (desc's stored box of tensor i) with tensor i's init.
void FillTensorPortable(at::Tensor& view, const spec::TensorDesc& desc, int i,
                        const PortableContext& ctx) {
  const ModulePlan* module = ctx.inits[i].module.get();
  const ModuleSlot* slot = nullptr;
  if (module != nullptr) {
    for (const ModuleSlot& s : module->slots) {
      if (s.tensor == i) slot = &s;
    }
    TORCH_CHECK(slot != nullptr, "module plan lacks tensor ", desc.name);
  }
  if (slot != nullptr) {
    FillPortableStep(view, desc, slot->op, std::nullopt, 0, ctx.seed,
                     ctx.threads);
  }
  const std::vector<ResolvedStep>& steps = ctx.inits[i].steps;
  for (size_t k = 0; slot == nullptr && k < steps.size(); ++k) {
    const ResolvedStep& step = steps[k];
    if (step.map != nullptr || step.scheme->has_norm_of()) {
      FillDerivedStepPortable(view, desc, step, static_cast<uint32_t>(k), ctx);
      continue;
    }
    FillPortableStep(view, desc, *step.scheme, step.region,
                     static_cast<uint32_t>(k), ctx.seed, ctx.threads);
  }
  // Embedding: the padding row is zero (if this box holds it).
  if (module != nullptr && module->padding_idx.has_value() &&
      slot->local_name == "weight") {
    const int64_t row = *module->padding_idx;
    const int64_t first = desc.is_shard() ? desc.shard_offset[0] : 0;
    if (row >= first && row < first + desc.shape[0]) {
      view.select(0, row - first).fill_(0);
    }
  }
}

// RNG_MODE_PORTABLE: one task per tensor (a module default is its tensor's
// slot of the plan), run one at a time, each kernel using every thread, by
// depth. A tensor that reads another (norm_of) reads the part of the source
// it needs from the arena where this request holds it, and computes it
// again where it does not (a shard's rows of v that another rank holds), so
// a shard needs no other rank's bytes.
absl::Status ApplyPortable(const std::vector<spec::TensorDesc>& tensors,
                           const std::vector<ResolvedInit>& inits,
                           uint64_t seed, memory::Arena& arena,
                           const std::function<bool()>& cancelled) {
  std::vector<Task> tasks;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].tie_root >= 0) continue;
    tasks.push_back(
        {static_cast<int>(i), nullptr, tensors[i].nbytes, inits[i].depth});
  }
  std::vector<at::Tensor>& views = arena.tensors().views;
  const PortableContext ctx{tensors, inits, seed, at::get_num_threads(), views};
  std::atomic<bool> stopped{false};
  absl::Status status = GuardTorch("initializing tensors", [&] {
    ForEachTaskByDepth(tasks, /*threads=*/1, cancelled, stopped,
                       [&](const Task& task) {
      FillTensorPortable(views[task.tensor], tensors[task.tensor], task.tensor,
                         ctx);
    });
  });
  if (status.ok() && stopped.load()) {
    return absl::CancelledError(
        "materialization cancelled: the caller went away before every "
        "tensor was initialized");
  }
  return status;
}

}  // namespace

absl::Status ApplyInits(const std::vector<spec::TensorDesc>& tensors,
                        const std::vector<ResolvedInit>& inits, uint64_t seed,
                        v1::RngMode rng, memory::Arena& arena,
                        const std::function<bool()>& cancelled) {
  if (inits.size() != tensors.size() || arena.num_tensors() != tensors.size()) {
    return absl::InternalError("init: tensor, init and arena counts differ");
  }
  rng = EffectiveRngMode(rng);
  if (rng == v1::RNG_MODE_PORTABLE) {
    return ApplyPortable(tensors, inits, seed, arena, cancelled);
  }
  if (rng != v1::RNG_MODE_TORCH) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.rng: unknown mode ", static_cast<int>(rng)));
  }
  std::vector<at::Tensor>& views = arena.tensors().views;
  const std::vector<Task> tasks = MakeTasks(tensors, inits);

  // Each task has its own generator(s), so the result does not depend on
  // which thread runs it or in which order.
  std::atomic<bool> stopped{false};
  absl::Status status = GuardTorch("initializing tensors", [&] {
    ForEachTaskByDepth(tasks, at::get_num_threads(), cancelled, stopped,
                       [&](const Task& task) {
      if (task.module != nullptr) {
        // The module's device (a split handle keeps a module on one).
        at::Device device(at::kCPU);
        for (const ModuleSlot& slot : task.module->slots) {
          if (slot.tensor >= 0) {
            device = views[slot.tensor].device();
            break;
          }
        }
        FillModule(*task.module, views, device,
                   MakeGenerator(device, DeriveSeed(seed, task.module->name)));
        return;
      }
      FillSteps(tensors[task.tensor], inits[task.tensor].steps, seed,
                views[task.tensor], views);
    });
  });
  if (status.ok() && stopped.load()) {
    return absl::CancelledError(
        "materialization cancelled: the caller went away before every "
        "tensor was initialized");
  }
  return status;
}

}  // namespace materializer::init
