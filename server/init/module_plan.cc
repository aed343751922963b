#include "server/init/module_plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "server/common/quote.h"
#include "server/init/init_math.h"
#include "server/init/schemes.h"
#include "server/spec/limits.h"

namespace materializer::init {
namespace {

using spec::DType;
using Shape = std::vector<int64_t>;

enum class Kind {
  kLinear,
  kBilinear,
  kConv,
  kEmbedding,
  kNorm,
  kMultiheadAttention,
  kRnn,
  kRnnCell,
};

// Which tensors a normalization layer has.
enum NormTensors : int {
  kWeightOnly = 1,
  kWeightAndBias = 2,
  kWithRunningStats = 3,
};

struct TypeInfo {
  const char* name;
  Kind kind;
  // kConv: spatial dimensions; kRnn / kRnnCell: gates per hidden unit;
  // kNorm: NormTensors.
  int param;
};

constexpr TypeInfo kTypes[] = {
    {"Linear", Kind::kLinear, 0},
    {"NonDynamicallyQuantizableLinear", Kind::kLinear, 0},
    {"Bilinear", Kind::kBilinear, 0},
    {"Conv1d", Kind::kConv, 1},
    {"Conv2d", Kind::kConv, 2},
    {"Conv3d", Kind::kConv, 3},
    {"ConvTranspose1d", Kind::kConv, 1},
    {"ConvTranspose2d", Kind::kConv, 2},
    {"ConvTranspose3d", Kind::kConv, 3},
    {"Embedding", Kind::kEmbedding, 0},
    {"EmbeddingBag", Kind::kEmbedding, 0},
    {"LayerNorm", Kind::kNorm, kWeightAndBias},
    {"RMSNorm", Kind::kNorm, kWeightOnly},
    {"GroupNorm", Kind::kNorm, kWeightAndBias},
    {"BatchNorm1d", Kind::kNorm, kWithRunningStats},
    {"BatchNorm2d", Kind::kNorm, kWithRunningStats},
    {"BatchNorm3d", Kind::kNorm, kWithRunningStats},
    {"SyncBatchNorm", Kind::kNorm, kWithRunningStats},
    {"InstanceNorm1d", Kind::kNorm, kWithRunningStats},
    {"InstanceNorm2d", Kind::kNorm, kWithRunningStats},
    {"InstanceNorm3d", Kind::kNorm, kWithRunningStats},
    {"MultiheadAttention", Kind::kMultiheadAttention, 0},
    {"RNN", Kind::kRnn, 1},
    {"GRU", Kind::kRnn, 3},
    {"LSTM", Kind::kRnn, 4},
    {"RNNCell", Kind::kRnnCell, 1},
    {"GRUCell", Kind::kRnnCell, 3},
    {"LSTMCell", Kind::kRnnCell, 4},
};

const TypeInfo* FindType(absl::string_view canonical) {
  for (const TypeInfo& t : kTypes) {
    if (canonical == t.name) return &t;
  }
  return nullptr;
}

DType GeneratingDType(DType dtype) {
  return dtype == DType::kFloat8E4M3FN || dtype == DType::kFloat8E5M2
             ? DType::kFloat32
             : dtype;
}

std::string ShapeText(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string TensorPath(int index, const spec::TensorDesc& tensor) {
  return absl::StrCat("model.tensors[", index, "] (",
                      Quote(tensor.name, spec::kMaxNameLength), ")");
}

std::string FullName(absl::string_view module, absl::string_view local) {
  return module.empty() ? std::string(local) : absl::StrCat(module, ".", local);
}

std::string ModuleText(absl::string_view type, absl::string_view module) {
  return module.empty() ? absl::StrCat(type, " (root module)")
                        : absl::StrCat(type, " ", Quote(module, spec::kMaxNameLength));
}

v1::InitScheme Zeros() {
  v1::InitScheme s;
  s.mutable_zeros();
  return s;
}
v1::InitScheme Ones() {
  v1::InitScheme s;
  s.mutable_ones();
  return s;
}
v1::InitScheme Normal01() {
  v1::InitScheme s;
  s.mutable_normal();
  return s;
}
// torch's init.uniform_(t, -bound, bound); bound 0 is Python's int 0.
v1::InitScheme Symmetric(double bound) {
  v1::InitScheme s;
  s.mutable_uniform()->set_a(bound == 0 ? 0.0 : -bound);
  s.mutable_uniform()->set_b(bound);
  return s;
}
// init.kaiming_uniform_(weight, a=math.sqrt(5)).
v1::InitScheme KaimingSqrt5() {
  v1::InitScheme s;
  s.mutable_kaiming_uniform()->set_a(std::sqrt(5.0));
  return s;
}
v1::InitScheme XavierUniform() {
  v1::InitScheme s;
  s.mutable_xavier_uniform();
  return s;
}
v1::InitScheme XavierNormal() {
  v1::InitScheme s;
  s.mutable_xavier_normal();
  return s;
}

// A slot while the plan is built: its shape may be unknown, and its op may
// be unknown when it depends on an absent tensor (`op_needs` says which).
struct Draft {
  std::string local;
  int tensor = -1;
  std::optional<Shape> shape;
  std::optional<v1::InitScheme> op;
  std::string op_needs;
};

// The tensors of one module, by local name.
class ModuleTensors {
 public:
  ModuleTensors(std::string name, const std::vector<spec::TensorDesc>& tensors,
                std::vector<int> members)
      : name_(std::move(name)), tensors_(tensors) {
    for (int i : members)
      by_local_[std::string(LocalName(tensors[i].name))] = i;
  }

  const std::string& name() const { return name_; }
  int Find(absl::string_view local) const {
    auto it = by_local_.find(std::string(local));
    return it == by_local_.end() ? -1 : it->second;
  }
  std::optional<Shape> ShapeOf(absl::string_view local) const {
    const int i = Find(local);
    if (i < 0) return std::nullopt;
    return tensors_[i].full_shape();
  }
  const std::map<std::string, int>& by_local() const { return by_local_; }
  const spec::TensorDesc& tensor(int i) const { return tensors_[i]; }

  // A draft for `local`: the present tensor's shape, else `derived`.
  Draft Make(const std::string& local, std::optional<Shape> derived,
             std::optional<v1::InitScheme> op,
             std::string op_needs = "") const {
    Draft d;
    d.local = local;
    d.tensor = Find(local);
    d.shape = d.tensor >= 0 ? std::optional<Shape>(tensors_[d.tensor].full_shape())
                            : std::move(derived);
    d.op = std::move(op);
    d.op_needs = std::move(op_needs);
    return d;
  }

 private:
  std::string name_;
  const std::vector<spec::TensorDesc>& tensors_;
  std::map<std::string, int> by_local_;
};

// What a type-specific planner produces.
struct Planned {
  std::vector<Draft> drafts;
  std::optional<int64_t> padding_idx;
};

class Planner {
 public:
  Planner(const ModuleTensors& m, const TypeInfo& type,
          const std::vector<bool>& is_module_default)
      : m_(m), type_(type), is_module_default_(is_module_default) {}

  // A reason about the tensor named `local`, as an INVALID_ARGUMENT that
  // names the tensor (or, if absent, the module).
  absl::Status Error(absl::string_view local, absl::string_view reason) const {
    const int i = m_.Find(local);
    const std::string where =
        i >= 0 ? TensorPath(i, m_.tensor(i))
               : absl::StrCat("\"", FullName(m_.name(), local), "\"");
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": module_default (",
                     ModuleText(type_.name, m_.name()), "): ", reason));
  }

  // Only module_default tensors must be among the type's tensor names.
  absl::Status CheckNames(const std::set<std::string>& known,
                          absl::string_view hint = "") const {
    for (const auto& [local, i] : m_.by_local()) {
      if (!is_module_default_[i] || known.count(local) > 0) continue;
      return Error(local, absl::StrCat(type_.name, " has no tensor \"", local,
                                       "\" (its tensors: ",
                                       absl::StrJoin(known, ", "), ")", hint));
    }
    return absl::OkStatus();
  }

  absl::Status CheckDims(absl::string_view local, size_t dims) const {
    std::optional<Shape> shape = m_.ShapeOf(local);
    if (!shape.has_value() || shape->size() == dims) return absl::OkStatus();
    return Error(local,
                 absl::StrCat(type_.name, ".", local, " is ", dims,
                              "-D; the tensor has shape ", ShapeText(*shape)));
  }

  absl::StatusOr<Planned> Plan(bool zero_linear_bias) const {
    switch (type_.kind) {
      case Kind::kLinear:
      case Kind::kConv:
        return PlanLinearOrConv(zero_linear_bias);
      case Kind::kBilinear:
        return PlanBilinear();
      case Kind::kEmbedding:
        return PlanEmbedding();
      case Kind::kNorm:
        return PlanNorm();
      case Kind::kMultiheadAttention:
        return PlanMultiheadAttention();
      case Kind::kRnn:
        return PlanRnn();
      case Kind::kRnnCell:
        return PlanRnnCell();
    }
    return absl::InternalError("unknown module kind");
  }

  // Set by the caller for Embedding.
  std::optional<int64_t> padding_idx_in;

 private:
  // Linear, Conv*d, ConvTranspose*d:
  //   init.kaiming_uniform_(self.weight, a=math.sqrt(5))
  //   fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
  //   bias: init.uniform_(self.bias, -1/sqrt(fan_in), 1/sqrt(fan_in))
  // Linear uses bound 0 for fan_in 0; Conv leaves the bias alone (torch.empty,
  // here zeros) for fan_in 0.
  absl::StatusOr<Planned> PlanLinearOrConv(bool zero_bias) const {
    if (absl::Status s = CheckNames({"weight", "bias"}); !s.ok()) return s;
    const size_t weight_dims =
        type_.kind == Kind::kLinear ? 2 : static_cast<size_t>(type_.param) + 2;
    if (absl::Status s = CheckDims("weight", weight_dims); !s.ok()) return s;
    Planned p;
    p.drafts.push_back(m_.Make("weight", std::nullopt, KaimingSqrt5()));
    std::optional<v1::InitScheme> bias_op;
    std::optional<Shape> weight = m_.ShapeOf("weight");
    if (zero_bias) {
      bias_op = Zeros();
    } else if (weight.has_value()) {
      const int64_t fan_in = FanInAndFanOut(*weight).value().fan_in;
      if (fan_in > 0) {
        bias_op = Symmetric(1 / std::sqrt(static_cast<double>(fan_in)));
      } else {
        bias_op = type_.kind == Kind::kLinear ? Symmetric(0) : Zeros();
      }
    }
    p.drafts.push_back(
        m_.Make("bias", std::nullopt, bias_op,
                absl::StrCat("\"", FullName(m_.name(), "weight"),
                             "\" (its fan_in gives the bias bound)")));
    return p;
  }

  // Bilinear: bound = 1 / sqrt(weight.size(1)); uniform_(weight), then bias.
  absl::StatusOr<Planned> PlanBilinear() const {
    if (absl::Status s = CheckNames({"weight", "bias"}); !s.ok()) return s;
    if (absl::Status s = CheckDims("weight", 3); !s.ok()) return s;
    std::optional<v1::InitScheme> op;
    if (std::optional<Shape> weight = m_.ShapeOf("weight")) {
      if ((*weight)[1] <= 0) {
        return Error("weight",
                     "in1_features (weight.size(1)) is 0; torch's "
                     "reset_parameters() raises for it");
      }
      op = Symmetric(1 / std::sqrt(static_cast<double>((*weight)[1])));
    }
    const std::string needs = absl::StrCat("\"", FullName(m_.name(), "weight"),
                                           "\" (its size(1) gives the bound)");
    Planned p;
    p.drafts.push_back(m_.Make("weight", std::nullopt, op, needs));
    p.drafts.push_back(m_.Make("bias", std::nullopt, op, needs));
    return p;
  }

  // Embedding, EmbeddingBag: init.normal_(self.weight), then the padding_idx
  // row is filled with 0.
  absl::StatusOr<Planned> PlanEmbedding() const {
    if (absl::Status s = CheckNames({"weight"}); !s.ok()) return s;
    if (absl::Status s = CheckDims("weight", 2); !s.ok()) return s;
    Planned p;
    p.drafts.push_back(m_.Make("weight", std::nullopt, Normal01()));
    if (padding_idx_in.has_value()) {
      const int64_t rows = m_.ShapeOf("weight")->at(0);
      int64_t idx = *padding_idx_in;
      if (idx < -rows || idx >= rows) {
        return Error(
            "weight",
            absl::StrCat("padding_idx is ", idx, "; it must be within [", -rows,
                         ", ", rows, ") (num_embeddings is ", rows, ")"));
      }
      if (idx < 0) idx += rows;
      p.padding_idx = idx;
    }
    return p;
  }

  // LayerNorm, GroupNorm, RMSNorm: init.ones_(weight), init.zeros_(bias).
  // BatchNorm*, InstanceNorm* (_NormBase.reset_parameters): running_mean
  // zeros, running_var ones, num_batches_tracked zeros, then weight ones and
  // bias zeros. Nothing random.
  absl::StatusOr<Planned> PlanNorm() const {
    std::set<std::string> names = {"weight"};
    if (type_.param >= kWeightAndBias) names.insert("bias");
    if (type_.param >= kWithRunningStats) {
      names.insert({"running_mean", "running_var", "num_batches_tracked"});
    }
    if (absl::Status s = CheckNames(names); !s.ok()) return s;
    Planned p;
    if (type_.param >= kWithRunningStats) {
      p.drafts.push_back(m_.Make("running_mean", std::nullopt, Zeros()));
      p.drafts.push_back(m_.Make("running_var", std::nullopt, Ones()));
      p.drafts.push_back(m_.Make("num_batches_tracked", std::nullopt, Zeros()));
    }
    p.drafts.push_back(m_.Make("weight", std::nullopt, Ones()));
    if (type_.param >= kWeightAndBias) {
      p.drafts.push_back(m_.Make("bias", std::nullopt, Zeros()));
    }
    return p;
  }

  // MultiheadAttention._reset_parameters:
  //   xavier_uniform_(in_proj_weight)   (or q_, k_, v_proj_weight in turn)
  //   constant_(in_proj_bias, 0); constant_(out_proj.bias, 0)
  //   xavier_normal_(bias_k); xavier_normal_(bias_v)
  // out_proj is a Linear submodule planned on its own (see below).
  absl::StatusOr<Planned> PlanMultiheadAttention() const {
    if (absl::Status s = CheckNames(
            {"in_proj_weight", "q_proj_weight", "k_proj_weight",
             "v_proj_weight", "in_proj_bias", "bias_k", "bias_v"},
            "; out_proj is a Linear submodule of its own: give the module "
            "\"<name>.out_proj\" the type Linear");
        !s.ok()) {
      return s;
    }
    for (const char* w : {"in_proj_weight", "q_proj_weight", "k_proj_weight",
                          "v_proj_weight"}) {
      if (absl::Status s = CheckDims(w, 2); !s.ok()) return s;
    }
    if (absl::Status s = CheckDims("in_proj_bias", 1); !s.ok()) return s;
    for (const char* b : {"bias_k", "bias_v"}) {
      if (absl::Status s = CheckDims(b, 3); !s.ok()) return s;
    }
    // embed_dim from whichever tensor shows it.
    std::optional<int64_t> e;
    if (auto s = m_.ShapeOf("in_proj_weight")) e = (*s)[1];
    if (auto s = m_.ShapeOf("q_proj_weight")) e = (*s)[0];
    if (auto s = m_.ShapeOf("k_proj_weight")) e = (*s)[0];
    if (auto s = m_.ShapeOf("v_proj_weight")) e = (*s)[0];
    if (auto s = m_.ShapeOf("in_proj_bias"); s && (*s)[0] % 3 == 0) {
      e = (*s)[0] / 3;
    }
    if (auto s = m_.ShapeOf("bias_k")) e = (*s)[2];
    if (auto s = m_.ShapeOf("bias_v")) e = (*s)[2];
    auto derived = [&](std::initializer_list<int64_t> factors) {
      if (!e.has_value()) return std::optional<Shape>();
      Shape shape;
      for (int64_t f : factors) shape.push_back(f == 0 ? 1 : f * *e);
      return std::optional<Shape>(shape);
    };
    Planned p;
    const bool separate = m_.Find("q_proj_weight") >= 0 ||
                          m_.Find("k_proj_weight") >= 0 ||
                          m_.Find("v_proj_weight") >= 0;
    if (separate) {
      p.drafts.push_back(
          m_.Make("q_proj_weight", derived({1, 1}), XavierUniform()));
      p.drafts.push_back(
          m_.Make("k_proj_weight", std::nullopt, XavierUniform()));
      p.drafts.push_back(
          m_.Make("v_proj_weight", std::nullopt, XavierUniform()));
    } else {
      p.drafts.push_back(
          m_.Make("in_proj_weight", derived({3, 1}), XavierUniform()));
    }
    p.drafts.push_back(m_.Make("in_proj_bias", derived({3}), Zeros()));
    p.drafts.push_back(m_.Make("bias_k", derived({0, 0, 1}), XavierNormal()));
    p.drafts.push_back(m_.Make("bias_v", derived({0, 0, 1}), XavierNormal()));
    return p;
  }

  // RNNBase.reset_parameters: stdv = 1/sqrt(hidden_size) (0 if 0), then
  // init.uniform_(w, -stdv, stdv) for every parameter in registration order:
  // for each layer, for each direction: weight_ih, weight_hh, [bias_ih,
  // bias_hh], [weight_hr]. The constructor flags come from the tensors
  // present: bias from any bias_*, bidirectional from any *_reverse,
  // proj_size from weight_hr_*, num_layers from the highest layer.
  absl::StatusOr<Planned> PlanRnn() const {
    struct Parsed {
      std::string kind;  // weight_ih, weight_hh, bias_ih, bias_hh, weight_hr
      int64_t layer;
      bool reverse;
    };
    auto parse = [](absl::string_view local) -> std::optional<Parsed> {
      for (const char* kind :
           {"weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"}) {
        absl::string_view rest = local;
        if (!absl::ConsumePrefix(&rest, kind) ||
            !absl::ConsumePrefix(&rest, "_l")) {
          continue;
        }
        const bool reverse = absl::ConsumeSuffix(&rest, "_reverse");
        int64_t layer = 0;
        if (rest.empty() || !absl::SimpleAtoi(rest, &layer) || layer < 0 ||
            layer > 100000 || absl::StrCat(layer) != rest) {
          return std::nullopt;
        }
        return Parsed{kind, layer, reverse};
      }
      return std::nullopt;
    };
    const bool lstm = type_.param == 4;
    int64_t layers = 0;
    bool reverse = false;
    bool bias = false;
    bool proj = false;
    std::optional<int64_t> gate;
    std::optional<int64_t> hidden;
    std::optional<int64_t> proj_size;
    for (const auto& [local, i] : m_.by_local()) {
      std::optional<Parsed> parsed = parse(local);
      if (!parsed.has_value() || (parsed->kind == "weight_hr" && !lstm)) {
        if (!is_module_default_[i]) continue;
        return Error(local,
                     absl::StrCat(type_.name, " has no tensor \"", local,
                                  "\" (its tensors: weight_ih_l<k>, "
                                  "weight_hh_l<k>, bias_ih_l<k>, bias_hh_l<k>",
                                  lstm ? ", weight_hr_l<k>" : "",
                                  ", each optionally with _reverse)"));
      }
      const Shape& shape = m_.tensor(i).full_shape();
      const bool is_bias = absl::StartsWith(parsed->kind, "bias");
      if (shape.size() != (is_bias ? 1u : 2u)) {
        return Error(
            local, absl::StrCat(type_.name, ".", local, " is ", is_bias ? 1 : 2,
                                "-D; the tensor has shape ", ShapeText(shape)));
      }
      layers = std::max(layers, parsed->layer + 1);
      reverse = reverse || parsed->reverse;
      bias = bias || is_bias;
      if (parsed->kind == "weight_hr") {
        proj = true;
        proj_size = shape[0];
        hidden = shape[1];
      } else {
        if (gate.has_value() && *gate != shape[0]) {
          return Error(
              local, absl::StrCat("its dimension 0 is ", shape[0],
                                  " but another tensor of the module has "
                                  "gate size ",
                                  *gate, " (", type_.param, " x hidden_size)"));
        }
        gate = shape[0];
      }
    }
    if (gate.has_value()) {
      if (*gate % type_.param != 0) {
        return Error(m_.by_local().begin()->first,
                     absl::StrCat("gate size ", *gate, " is not a multiple of ",
                                  type_.param, " (", type_.name, " has ",
                                  type_.param, " gates)"));
      }
      hidden = *gate / type_.param;
    } else if (hidden.has_value()) {
      gate = *hidden * type_.param;
    }
    const std::optional<int64_t> real_hidden = proj ? proj_size : hidden;
    v1::InitScheme op = Symmetric(
        hidden.value_or(0) > 0 ? 1.0 / std::sqrt(static_cast<double>(*hidden))
                               : 0.0);
    auto shape2 = [](std::optional<int64_t> a, std::optional<int64_t> b) {
      if (!a.has_value() || !b.has_value()) return std::optional<Shape>();
      return std::optional<Shape>(Shape{*a, *b});
    };
    const int64_t dirs = reverse ? 2 : 1;
    Planned p;
    for (int64_t layer = 0; layer < layers; ++layer) {
      for (int64_t dir = 0; dir < dirs; ++dir) {
        const std::string suffix =
            absl::StrCat("_l", layer, dir == 1 ? "_reverse" : "");
        std::optional<int64_t> input;
        if (layer > 0 && real_hidden.has_value()) input = *real_hidden * dirs;
        p.drafts.push_back(
            m_.Make("weight_ih" + suffix, shape2(gate, input), op));
        p.drafts.push_back(
            m_.Make("weight_hh" + suffix, shape2(gate, real_hidden), op));
        if (bias) {
          std::optional<Shape> b;
          if (gate.has_value()) b = Shape{*gate};
          p.drafts.push_back(m_.Make("bias_ih" + suffix, b, op));
          p.drafts.push_back(m_.Make("bias_hh" + suffix, b, op));
        }
        if (proj) {
          p.drafts.push_back(
              m_.Make("weight_hr" + suffix, shape2(proj_size, hidden), op));
        }
      }
    }
    return p;
  }

  // RNNCellBase.reset_parameters: the same uniform over weight_ih,
  // weight_hh, [bias_ih, bias_hh].
  absl::StatusOr<Planned> PlanRnnCell() const {
    if (absl::Status s =
            CheckNames({"weight_ih", "weight_hh", "bias_ih", "bias_hh"});
        !s.ok()) {
      return s;
    }
    for (const char* w : {"weight_ih", "weight_hh"}) {
      if (absl::Status s = CheckDims(w, 2); !s.ok()) return s;
    }
    for (const char* b : {"bias_ih", "bias_hh"}) {
      if (absl::Status s = CheckDims(b, 1); !s.ok()) return s;
    }
    std::optional<int64_t> gate;
    std::optional<int64_t> hidden;
    for (const char* local : {"weight_ih", "weight_hh", "bias_ih", "bias_hh"}) {
      if (auto s = m_.ShapeOf(local)) gate = (*s)[0];
    }
    if (auto s = m_.ShapeOf("weight_hh")) hidden = (*s)[1];
    if (!hidden.has_value() && gate.has_value()) {
      if (*gate % type_.param != 0) {
        return Error(m_.by_local().begin()->first,
                     absl::StrCat("gate size ", *gate, " is not a multiple of ",
                                  type_.param));
      }
      hidden = *gate / type_.param;
    }
    if (!gate.has_value() && hidden.has_value()) gate = *hidden * type_.param;
    const v1::InitScheme op = Symmetric(
        hidden.value_or(0) > 0 ? 1.0 / std::sqrt(static_cast<double>(*hidden))
                               : 0.0);
    const bool bias = m_.Find("bias_ih") >= 0 || m_.Find("bias_hh") >= 0;
    Planned p;
    p.drafts.push_back(m_.Make("weight_ih", std::nullopt, op));
    std::optional<Shape> hh;
    std::optional<Shape> b;
    if (gate.has_value() && hidden.has_value()) hh = Shape{*gate, *hidden};
    if (gate.has_value()) b = Shape{*gate};
    p.drafts.push_back(m_.Make("weight_hh", hh, op));
    if (bias) {
      p.drafts.push_back(m_.Make("bias_ih", b, op));
      p.drafts.push_back(m_.Make("bias_hh", b, op));
    }
    return p;
  }

  const ModuleTensors& m_;
  const TypeInfo& type_;
  const std::vector<bool>& is_module_default_;
};

// Turns drafts into slots: which tensors are written, which draws must be
// consumed, and whether everything needed is known.
absl::Status Finalize(const Planner& planner, const ModuleTensors& m,
                      const std::vector<bool>& is_module_default,
                      std::vector<Draft>& drafts, ModulePlan& plan) {
  std::optional<DType> module_dtype;
  for (const Draft& d : drafts) {
    if (d.tensor >= 0) {
      module_dtype = GeneratingDType(m.tensor(d.tensor).dtype);
      break;
    }
  }
  // Backwards: a draft's draws are needed if a later random draft is written.
  const std::string* needed_by = nullptr;
  std::vector<const std::string*> consumer(drafts.size(), nullptr);
  std::vector<bool> write(drafts.size(), false);
  for (size_t k = drafts.size(); k-- > 0;) {
    const Draft& d = drafts[k];
    write[k] = d.tensor >= 0 && is_module_default[d.tensor];
    const bool random = !d.op.has_value() || IsRandom(*d.op);
    if (!random) continue;
    if (!write[k]) consumer[k] = needed_by;
    if (write[k]) needed_by = &d.local;
  }
  for (size_t k = 0; k < drafts.size(); ++k) {
    Draft& d = drafts[k];
    const bool consume = consumer[k] != nullptr;
    if (!write[k] && !consume) continue;
    if (!d.op.has_value()) {
      return planner.Error(
          write[k] ? d.local : *consumer[k],
          absl::StrCat("needs ", d.op_needs,
                       ", which the request does not have; add it (with any "
                       "init)"));
    }
    if (consume && !d.shape.has_value()) {
      return planner.Error(
          *consumer[k],
          absl::StrCat(
              "reset_parameters() draws \"", FullName(m.name(), d.local),
              "\" first, so its draws must be consumed, but the request has "
              "no such tensor and its shape cannot be derived from the "
              "module's other tensors; add \"",
              FullName(m.name(), d.local), "\" (with any init)"));
    }
    ModuleSlot slot;
    slot.local_name = d.local;
    slot.tensor = d.tensor;
    slot.shape = *d.shape;
    slot.op = *d.op;
    slot.write = write[k];
    slot.consume = consume;
    slot.dtype = d.tensor >= 0 ? GeneratingDType(m.tensor(d.tensor).dtype)
                               : module_dtype.value_or(DType::kFloat32);
    if (slot.write && IsRandom(slot.op) &&
        !spec::Info(m.tensor(d.tensor).dtype).is_floating_point) {
      return planner.Error(
          d.local, absl::StrCat("reset_parameters() fills it with ",
                                DescribeScheme(slot.op),
                                ", which needs a floating-point dtype; the "
                                "tensor is ",
                                spec::Name(m.tensor(d.tensor).dtype)));
    }
    plan.slots.push_back(std::move(slot));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CanonicalModuleType(absl::string_view type) {
  if (absl::StartsWith(type, "torch.nn.") || absl::StartsWith(type, "nn.")) {
    const size_t dot = type.rfind('.');
    return std::string(type.substr(dot + 1));
  }
  return std::string(type);
}

std::string KnownModuleTypes() {
  std::vector<std::string> names;
  for (const TypeInfo& t : kTypes) names.push_back(t.name);
  return absl::StrJoin(names, ", ");
}

bool IsKnownModuleType(absl::string_view type) {
  return FindType(CanonicalModuleType(type)) != nullptr;
}

absl::string_view ModuleOf(absl::string_view tensor_name) {
  const size_t dot = tensor_name.rfind('.');
  return dot == absl::string_view::npos ? absl::string_view()
                                        : tensor_name.substr(0, dot);
}

absl::string_view LocalName(absl::string_view tensor_name) {
  const size_t dot = tensor_name.rfind('.');
  return dot == absl::string_view::npos ? tensor_name
                                        : tensor_name.substr(dot + 1);
}

absl::StatusOr<ModulePlans> PlanModuleDefaults(
    const v1::ModelSpec& model, const std::vector<spec::TensorDesc>& tensors,
    const std::vector<bool>& is_module_default) {
  ModulePlans plans;
  plans.by_tensor.resize(tensors.size());
  if (model.modules_size() == 0 &&
      std::find(is_module_default.begin(), is_module_default.end(), true) ==
          is_module_default.end()) {
    return plans;  // the common case: nothing to plan or check
  }

  std::map<std::string, std::vector<int>> members;
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    members[std::string(ModuleOf(tensors[i].name))].push_back(i);
  }

  // model.modules: unique names, types that agree with the tensors.
  std::map<std::string, int> specs;
  for (int j = 0; j < model.modules_size(); ++j) {
    const v1::ModuleSpec& module = model.modules(j);
    const std::string path =
        absl::StrCat("model.modules[", j, "] (", Quote(module.name()), ")");
    auto [it, inserted] = specs.emplace(module.name(), j);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": the name repeats model.modules[", it->second,
                       "]; module names must be unique"));
    }
    const std::string type = CanonicalModuleType(module.type());
    auto owned = members.find(module.name());
    if (owned == members.end()) {
      plans.warnings.push_back(
          absl::StrCat(path, " owns no tensor (no tensor is named \"",
                       FullName(module.name(), "<name>"), "\")"));
    } else if (!type.empty()) {
      for (int i : owned->second) {
        if (tensors[i].module_type.empty() ||
            CanonicalModuleType(tensors[i].module_type) == type) {
          continue;
        }
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": type ", Quote(module.type()), " disagrees with ",
            TensorPath(i, tensors[i]), ".module_type ",
            Quote(tensors[i].module_type), "; they must name the same class"));
      }
    }
    if (module.has_padding_idx()) {
      const TypeInfo* info = FindType(type);
      if (info != nullptr && info->kind != Kind::kEmbedding) {
        return absl::InvalidArgumentError(absl::StrCat(
            path,
            ": padding_idx applies to Embedding and EmbeddingBag; the "
            "module is a ",
            type));
      }
    }
  }

  // The type of a module: its ModuleSpec's, else its tensors' module_type.
  // Empty if none; an error if the tensors disagree.
  auto type_of = [&](const std::string& module,
                     int for_tensor) -> absl::StatusOr<std::string> {
    if (auto s = specs.find(module); s != specs.end()) {
      const std::string type =
          CanonicalModuleType(model.modules(s->second).type());
      if (!type.empty()) return type;
    }
    std::string found;
    int found_at = -1;
    auto owned = members.find(module);
    if (owned == members.end()) return found;
    for (int i : owned->second) {
      if (tensors[i].module_type.empty()) continue;
      const std::string type = CanonicalModuleType(tensors[i].module_type);
      if (found_at >= 0 && type != found) {
        return absl::InvalidArgumentError(absl::StrCat(
            TensorPath(for_tensor, tensors[for_tensor]),
            ": module_default cannot tell the type of module ", Quote(module),
            ": ", TensorPath(found_at, tensors[found_at]), " says module_type ",
            Quote(tensors[found_at].module_type), " and ",
            TensorPath(i, tensors[i]), " says ", Quote(tensors[i].module_type),
            "; add a model.modules entry for it"));
      }
      found = type;
      found_at = i;
    }
    return found;
  };

  for (const auto& [module, indices] : members) {
    int first = -1;
    for (int i : indices) {
      if (is_module_default[i]) {
        first = i;
        break;
      }
    }
    if (first < 0) continue;
    absl::StatusOr<std::string> type = type_of(module, first);
    if (!type.ok()) return type.status();
    if (type->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          TensorPath(first, tensors[first]),
          ": module_default needs the type of module ", Quote(module),
          ": set the tensor's module_type or add a model.modules entry "
          "{name: ",
          Quote(module), ", type: ...}; known types: ", KnownModuleTypes()));
    }
    const TypeInfo* info = FindType(*type);
    if (info == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          TensorPath(first, tensors[first]),
          ": module_default does not know "
          "the module type ",
          Quote(*type), " (module ", Quote(module), "); known types: ",
          KnownModuleTypes(), ". Give its tensors explicit inits instead"));
    }

    ModuleTensors m(module, tensors, indices);
    Planner planner(m, *info, is_module_default);
    if (auto s = specs.find(module);
        s != specs.end() && model.modules(s->second).has_padding_idx()) {
      planner.padding_idx_in = model.modules(s->second).padding_idx();
    }
    // MultiheadAttention._reset_parameters zeroes out_proj.bias (when it has
    // in_proj_bias, i.e. bias=True, which is also when out_proj has a bias).
    bool zero_bias = false;
    if (info->kind == Kind::kLinear && LocalName(module) == "out_proj") {
      const std::string parent(ModuleOf(module));
      absl::StatusOr<std::string> parent_type = type_of(parent, first);
      zero_bias = parent_type.ok() && *parent_type == "MultiheadAttention";
    }
    absl::StatusOr<Planned> planned = planner.Plan(zero_bias);
    if (!planned.ok()) return planned.status();

    auto plan = std::make_shared<ModulePlan>();
    plan->name = module;
    plan->type = info->name;
    plan->padding_idx = planned->padding_idx;
    if (absl::Status s =
            Finalize(planner, m, is_module_default, planned->drafts, *plan);
        !s.ok()) {
      return s;
    }
    for (const ModuleSlot& slot : plan->slots) {
      if (slot.write) plans.by_tensor[slot.tensor] = plan;
    }
    for (int i : indices) {
      if (is_module_default[i] && plans.by_tensor[i] == nullptr) {
        return absl::InternalError(absl::StrCat(
            TensorPath(i, tensors[i]), ": module_default planned no write"));
      }
    }
  }
  return plans;
}

std::string DescribeModuleDefault(const ModulePlan& plan, int tensor) {
  for (const ModuleSlot& slot : plan.slots) {
    if (slot.tensor != tensor) continue;
    std::string text =
        absl::StrCat("module_default(", ModuleText(plan.type, plan.name), ": ",
                     DescribeScheme(slot.op));
    if (plan.padding_idx.has_value() && slot.local_name == "weight") {
      absl::StrAppend(&text, ", row ", *plan.padding_idx, " zeroed");
    }
    return absl::StrCat(text, ")");
  }
  return "module_default";
}

}  // namespace materializer::init
