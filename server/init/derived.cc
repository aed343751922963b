#include "server/init/derived.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/init/elementwise.h"
#include "server/init/schemes.h"
#include "server/spec/dtype.h"
#include "server/spec/field_path.h"

namespace materializer::init {
namespace {

using spec::DType;

constexpr double kInf = std::numeric_limits<double>::infinity();
// Norm reads allowed beyond twice the request's elements.
constexpr double kNormReadSlack = 1 << 20;

struct Graph {
  const v1::ModelSpec& model;
  const std::vector<spec::TensorDesc>& tensors;
  std::vector<DerivedTensor>& derived;
  // Per tensor: 0 unvisited, 1 on the current path, 2 done.
  std::vector<int> state;
  std::vector<int> depth;
  std::vector<Interval> bounds;
  // The current DFS path (tensor indices), for the cycle message.
  std::vector<int> path;
};

std::string StepPath(const Graph& g, int i, size_t k) {
  const std::string tensor = spec::TensorPath(i, g.tensors[i].name);
  if (g.model.tensors(i).init_steps_size() > 0) {
    return absl::StrCat(tensor, ".init_steps[", k, "]");
  }
  return tensor;
}

// The range of literal values: exact for float32, float64 and bfloat16;
// the dtype's finite range for the other floating dtypes, or unbounded
// when their bytes hold an infinity. (norm_of reads them.)
Interval ValuesBounds(const v1::Values& values, DType dtype) {
  const std::string& data = values.data();
  const size_t item = spec::ItemSize(dtype);
  if (data.empty() || item == 0) return {0.0, 0.0};
  double lo = kInf, hi = -kInf;
  auto see = [&](double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  };
  for (size_t at = 0; at + item <= data.size(); at += item) {
    const char* p = data.data() + at;
    switch (dtype) {
      case DType::kFloat32: {
        float v;
        std::memcpy(&v, p, 4);
        see(v);
        break;
      }
      case DType::kFloat64: {
        double v;
        std::memcpy(&v, p, 8);
        see(v);
        break;
      }
      case DType::kBFloat16: {
        uint16_t b;
        std::memcpy(&b, p, 2);
        const uint32_t u = static_cast<uint32_t>(b) << 16;
        float v;
        std::memcpy(&v, &u, 4);
        see(v);
        break;
      }
      case DType::kFloat16: {
        uint16_t b;
        std::memcpy(&b, p, 2);
        if ((b & 0x7fff) == 0x7c00) return {-kInf, kInf};
        break;
      }
      case DType::kFloat8E5M2: {
        const uint8_t b = static_cast<uint8_t>(*p);
        if ((b & 0x7f) == 0x7c) return {-kInf, kInf};
        break;
      }
      default:
        break;
    }
  }
  if (dtype == DType::kFloat32 || dtype == DType::kFloat64 ||
      dtype == DType::kBFloat16) {
    return {lo, hi};
  }
  const double m = spec::Info(dtype).is_floating_point ? MaxFinite(dtype)
                                                       : 9.3e18;  // int64
  return {-m, m};
}

absl::StatusOr<Interval> Visit(Graph& g, int i);

// The norm's range from its source's, or why it could overflow.
absl::StatusOr<Interval> NormBounds(Graph& g, int i, size_t k,
                                    const v1::NormOf& norm, int source) {
  absl::StatusOr<Interval> src = Visit(g, source);
  if (!src.ok()) return src.status();
  const spec::TensorDesc& s = g.tensors[source];
  const std::vector<int64_t>& shape = s.full_shape();
  double n = static_cast<double>(s.full_numel());
  if (norm.dim() >= 0 && shape[norm.dim()] > 0) n /= static_cast<double>(shape[norm.dim()]);
  const double a = std::max(std::fabs(src->lo), std::fabs(src->hi));
  const DType acc =
      s.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  const double squares = a * a * n;
  if (!std::isfinite(squares) || squares > MaxFinite(acc)) {
    return absl::InvalidArgumentError(absl::StrCat(
        StepPath(g, i, k), ".init.norm_of: \"", s.name, "\" holds values up to ",
        ShortNumber(a), " in magnitude; the sum of squares of ",
        ShortNumber(n), " of them can reach ", ShortNumber(squares),
        ", beyond ", spec::Name(acc), "'s largest finite value (inf)"));
  }
  return Interval{0.0, std::sqrt(squares)};
}

// The range of every value step k of tensor i can write.
absl::StatusOr<Interval> StepBounds(Graph& g, int i, size_t k) {
  const ResolvedStep& step = (*g.derived[i].steps)[k];
  const spec::TensorDesc& tensor = g.tensors[i];
  spec::TensorDesc target = StepTarget(tensor, step);
  if (step.map != nullptr) target.dtype = step.map->compute;
  absl::StatusOr<Interval> leaf;
  const v1::InitScheme& scheme = *step.scheme;
  if (scheme.has_norm_of()) {
    leaf = NormBounds(g, i, k, scheme.norm_of(), step.source);
  } else if (scheme.has_module_default() && g.derived[i].module_op != nullptr) {
    leaf = LeafBounds(*g.derived[i].module_op, target);
  } else if (scheme.has_values()) {
    leaf = ValuesBounds(scheme.values(), tensor.dtype);
  } else if (scheme.has_empty()) {
    leaf = Interval{0.0, 0.0};
  } else {
    leaf = LeafBounds(scheme, target);
  }
  if (!leaf.ok()) {
    if (step.map != nullptr || scheme.has_norm_of()) return leaf.status();
    // A scheme whose range is not computed here: the dtype's (sources only).
    const double m = MaxFinite(tensor.dtype);
    return Interval{-m, m};
  }
  if (step.map == nullptr) {
    if (scheme.has_norm_of() && leaf->hi > MaxFinite(tensor.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          StepPath(g, i, k), ".init.norm_of: the norm can reach ",
          ShortNumber(leaf->hi), ", beyond ", spec::Name(tensor.dtype),
          "'s largest finite value"));
    }
    return *leaf;
  }
  absl::StatusOr<Interval> out =
      CheckElementwiseBounds(*step.map, *leaf, tensor.dtype);
  if (!out.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(StepPath(g, i, k), ": ", out.status().message()));
  }
  return *out;
}

// Depth-first: bounds and depth of tensor i after those of its sources.
absl::StatusOr<Interval> Visit(Graph& g, int i) {
  if (g.tensors[i].tie_root >= 0) i = g.tensors[i].tie_root;
  if (g.state[i] == 2) return g.bounds[i];
  if (g.state[i] == 1) {
    // A cycle: the path from i's first appearance back to i.
    std::vector<std::string> names;
    auto it = std::find(g.path.begin(), g.path.end(), i);
    for (; it != g.path.end(); ++it) {
      names.push_back(absl::StrCat("\"", g.tensors[*it].name, "\""));
    }
    names.push_back(absl::StrCat("\"", g.tensors[i].name, "\""));
    return absl::InvalidArgumentError(absl::StrCat(
        spec::TensorPath(i, g.tensors[i].name),
        ": its init reads itself through norm_of: ",
        absl::StrJoin(names, " reads "),
        "; a derived init reads tensors that are filled before it"));
  }
  g.state[i] = 1;
  g.path.push_back(i);
  Interval all{kInf, -kInf};
  int depth = 0;
  std::vector<ResolvedStep>& steps = *g.derived[i].steps;
  for (size_t k = 0; k < steps.size(); ++k) {
    if (steps[k].source >= 0) {
      absl::StatusOr<Interval> src = Visit(g, steps[k].source);
      if (!src.ok()) return src.status();
      depth = std::max(depth, g.depth[steps[k].source] + 1);
    }
    absl::StatusOr<Interval> b = StepBounds(g, i, k);
    if (!b.ok()) return b.status();
    all = {std::min(all.lo, b->lo), std::max(all.hi, b->hi)};
  }
  if (steps.empty()) {
    all = g.derived[i].loaded ? Interval{-kInf, kInf} : Interval{0.0, 0.0};
  }
  g.path.pop_back();
  g.state[i] = 2;
  g.depth[i] = depth;
  g.bounds[i] = all;
  return all;
}

}  // namespace

std::vector<int64_t> NormShape(const std::vector<int64_t>& source_shape,
                               int64_t dim) {
  if (dim < 0) return {};
  std::vector<int64_t> shape(source_shape.size(), 1);
  shape[dim] = source_shape[dim];
  return shape;
}

absl::StatusOr<std::vector<int>> ResolveDerived(
    const v1::ModelSpec& model, const std::vector<spec::TensorDesc>& tensors,
    std::vector<DerivedTensor>& derived) {
  const int n = static_cast<int>(tensors.size());
  std::vector<int> depth(n, 0);
  bool any = false;
  for (const DerivedTensor& d : derived) {
    for (const ResolvedStep& step : *d.steps) {
      any = any || step.scheme->has_norm_of();
    }
  }
  if (!any) return depth;
  absl::flat_hash_map<absl::string_view, int> by_name;
  for (int i = 0; i < n; ++i) by_name.emplace(tensors[i].name, i);
  Graph g{model, tensors, derived, std::vector<int>(n, 0),
          std::vector<int>(n, 0), std::vector<Interval>(n), {}};
  for (int i = 0; i < n; ++i) {
    std::vector<ResolvedStep>& steps = *derived[i].steps;
    for (size_t k = 0; k < steps.size(); ++k) {
      if (!steps[k].scheme->has_norm_of()) continue;
      const v1::NormOf& norm = steps[k].scheme->norm_of();
      const std::string path = absl::StrCat(StepPath(g, i, k), ".init.norm_of");
      auto it = by_name.find(norm.tensor());
      if (it == by_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": \"", tensors[i].name, "\" is the norm of \"",
            norm.tensor(),
            "\", which is not a tensor of this request; a derived init reads "
            "tensors of the same request only, so add \"",
            norm.tensor(), "\" to it"));
      }
      const int source = tensors[it->second].tie_root >= 0
                             ? tensors[it->second].tie_root
                             : it->second;
      const spec::TensorDesc& s = tensors[source];
      const std::vector<int64_t>& shape = s.full_shape();
      if (norm.dim() >= static_cast<int64_t>(shape.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ".dim is ", norm.dim(), "; \"", s.name, "\" has ",
            shape.size(), " dimensions (-1 takes the norm of every element)"));
      }
      if (!spec::Info(s.dtype).is_floating_point) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": \"", s.name, "\" is ", spec::Name(s.dtype),
                         "; norm_of reads a floating tensor"));
      }
      const std::vector<int64_t> want = NormShape(shape, norm.dim());
      if (tensors[i].full_shape() != want) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": \"", tensors[i].name, "\" has shape [",
            absl::StrJoin(tensors[i].full_shape(), ", "),
            "]; torch.norm_except_dim(\"", s.name, "\" of shape [",
            absl::StrJoin(shape, ", "), "], 2, ", norm.dim(),
            ") has shape [", absl::StrJoin(want, ", "), "]"));
      }
      steps[k].source = source;
    }
  }
  // What norms read is bounded by what the request holds: each norm reads
  // its source's elements (portable mode makes them again, and a source
  // that is itself a norm reads its own source in turn).
  std::vector<double> reads(n, -1.0);
  std::function<double(int)> cost = [&](int i) -> double {
    if (reads[i] >= 0) return reads[i];
    reads[i] = 0;  // cycles are refused below; stop here meanwhile
    double total = 0;
    for (const ResolvedStep& step : *derived[i].steps) {
      if (step.source < 0) continue;
      total += static_cast<double>(tensors[step.source].full_numel()) +
               cost(step.source);
    }
    return reads[i] = total;
  };
  double held = 0, read = 0;
  for (int i = 0; i < n; ++i) {
    held += static_cast<double>(tensors[i].full_numel());
    read += cost(i);
  }
  if (read > 2 * held + kNormReadSlack) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: its norm_of steps read ", ShortNumber(read),
        " source elements in all, more than twice the ", ShortNumber(held),
        " elements the request holds (plus 2^20); fewer norms of large "
        "tensors, or their sources in separate requests"));
  }
  // The readers, and through them their sources.
  for (int i = 0; i < n; ++i) {
    bool reads = false;
    for (const ResolvedStep& step : *derived[i].steps) {
      reads = reads || step.source >= 0;
    }
    if (!reads) continue;
    absl::StatusOr<Interval> b = Visit(g, i);
    if (!b.ok()) return b.status();
  }
  for (int i = 0; i < n; ++i) {
    depth[i] = tensors[i].tie_root >= 0 ? g.depth[tensors[i].tie_root] : g.depth[i];
  }
  return depth;
}

}  // namespace materializer::init
