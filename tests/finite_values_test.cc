// Every scheme x dtype x extreme parameter, in both RNG modes and for whole
// tensors, shards and empty shards, through the engine: each request is
// either refused by validation (INVALID_ARGUMENT naming the tensor, the
// same message from Plan and from Materialize, nothing held afterwards) or
// materialized with every value finite. Nothing may fail later (INTERNAL at
// init) and no finite request may give inf or NaN.
//
// kBeforeValidation lists the cases that broke one of these promises before
// validation learnt the finite ranges of docs/init.md ("Ranges"), with what
// they did then (measured with this sweep on the earlier build).

#include <ATen/ops/isfinite.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "server/common/log.h"
#include "server/common/thread_pool.h"
#include "server/engine/engine.h"
#include "server/memory/arena.h"
#include "server/memory/arena_views.h"
#include "server/memory/pool.h"
#include "server/registry/registry.h"
#include "tests/testing/status_matchers.h"

namespace materializer {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct Scheme {
  std::string label;
  // InitScheme in text format.
  std::string text;
  // Shape the scheme needs (eye: 2-D, dirac: 3-D, rope: 1-D).
  std::string shape = "[4, 8]";
};

std::vector<Scheme> Schemes() {
  std::vector<Scheme> out;
  auto add = [&](std::string label, std::string text,
                 std::string shape = "[4, 8]") {
    out.push_back({std::move(label), std::move(text), std::move(shape)});
  };
  for (const char* v : {"1e308", "-1e308", "3.4e38", "65504", "65520", "448",
                        "57344", "100000", "0.5"}) {
    add(absl::StrCat("constant(", v, ")"),
        absl::StrCat("constant { val: ", v, " }"));
  }
  for (const auto& [a, b] :
       std::vector<std::pair<const char*, const char*>>{{"-1e308", "1e308"},
                                                        {"0", "1e308"},
                                                        {"-1.7e308", "0"},
                                                        {"-3e38", "3e38"},
                                                        {"-1e38", "1e38"},
                                                        {"0", "3.4e38"},
                                                        {"-65504", "65504"},
                                                        {"0", "65504"},
                                                        {"-448", "448"},
                                                        {"-200", "200"},
                                                        {"1e300", "1e300"},
                                                        {"-1", "1"}}) {
    add(absl::StrCat("uniform(", a, ",", b, ")"),
        absl::StrCat("uniform { a: ", a, " b: ", b, " }"));
  }
  for (const auto& [mean, std] :
       std::vector<std::pair<const char*, const char*>>{{"0", "1e308"},
                                                        {"0", "1e307"},
                                                        {"0", "1e38"},
                                                        {"0", "3e37"},
                                                        {"0", "65504"},
                                                        {"0", "7000"},
                                                        {"0", "100"},
                                                        {"1e308", "0"},
                                                        {"1.7e308", "1e300"},
                                                        {"65504", "1"},
                                                        {"448", "1"},
                                                        {"0", "1"}}) {
    add(absl::StrCat("normal(", mean, ",", std, ")"),
        absl::StrCat("normal { mean: ", mean, " std: ", std, " }"));
  }
  for (const auto& [mean, std, a, b] : std::vector<
           std::tuple<const char*, const char*, const char*, const char*>>{
           {"0", "1e308", "-2", "2"},
           {"0", "1e38", "-2", "2"},
           {"0", "1", "-1e39", "1e39"},
           {"0", "1", "-1e6", "1e6"},
           {"1e30", "1", "-2", "2"},
           {"0", "1000", "-500", "500"},
           {"1e308", "1", "-1e308", "1e308"},
           {"0", "1e300", "-1e300", "1e300"},
           {"0", "0.02", "-2", "2"}}) {
    add(absl::StrCat("trunc_normal(", mean, ",", std, ",", a, ",", b, ")"),
        absl::StrCat("trunc_normal { mean: ", mean, " std: ", std, " a: ", a,
                     " b: ", b, " }"));
  }
  for (const char* kind : {"xavier_uniform", "xavier_normal"}) {
    for (const char* gain :
         {"-1", "1e308", "1e38", "1e30", "10000", "1000", "1"}) {
      add(absl::StrCat(kind, "(gain=", gain, ")"),
          absl::StrCat(kind, " { gain { value: ", gain, " } }"));
    }
    add(absl::StrCat(kind, "(gain=leaky_relu(1e308))"),
        absl::StrCat(
            kind, " { gain { nonlinearity: \"leaky_relu\" param: 1e308 } }"));
  }
  for (const char* kind : {"kaiming_uniform", "kaiming_normal"}) {
    for (const char* a : {"1e308", "-1e308", "1e-308", "0"}) {
      add(absl::StrCat(kind, "(a=", a, ")"),
          absl::StrCat(kind, " { a: ", a, " }"));
    }
    add(absl::StrCat(kind, "(selu, fan_out)"),
        absl::StrCat(kind, " { mode: \"fan_out\" nonlinearity: \"selu\" }"));
  }
  for (const char* gain :
       {"1e308", "-1e308", "3.4e38", "1e38", "65504", "40000", "300", "-1"}) {
    add(absl::StrCat("orthogonal(gain=", gain, ")"),
        absl::StrCat("orthogonal { gain { value: ", gain, " } }"));
  }
  for (const char* std : {"1e308", "1e38", "10000", "0.01"}) {
    add(absl::StrCat("sparse(std=", std, ")"),
        absl::StrCat("sparse { sparsity: 0.5 std: ", std, " }"));
  }
  add("eye", "eye {}");
  add("dirac", "dirac {}", "[4, 4, 3]");
  add("zeros", "zeros {}");
  add("ones", "ones {}");
  add("empty", "empty {}");
  for (const auto& [start, step] :
       std::vector<std::pair<const char*, const char*>>{{"1e308", "1e308"},
                                                        {"0", "1e308"},
                                                        {"-1e308", "1e308"},
                                                        {"65000", "100"},
                                                        {"0", "1e307"},
                                                        {"0", "1e37"},
                                                        {"440", "1"},
                                                        {"0", "1"}}) {
    add(absl::StrCat("arange(", start, ",", step, ")"),
        absl::StrCat("arange { start: ", start, " step: ", step, " }"));
  }
  for (const char* base :
       {"1e-300", "1e-40", "1e-30", "1e-3", "0.5", "1e300", "1e39", "10000"}) {
    add(absl::StrCat("rope(base=", base, ")"),
        absl::StrCat("rope_inv_freq { base: ", base, " }"), "[4]");
  }
  for (const char* factor : {"1e-300", "1e-40", "1e-4", "4"}) {
    add(absl::StrCat("rope(linear ", factor, ")"),
        absl::StrCat("rope_inv_freq { scaling { type: \"linear\" factor: ",
                     factor, " } }"),
        "[4]");
    add(absl::StrCat("rope(llama3 ", factor, ")"),
        absl::StrCat("rope_inv_freq { scaling { type: \"llama3\" factor: ",
                     factor, " original_max_position_embeddings: 8 } }"),
        "[4]");
    add(absl::StrCat("rope(yarn ", factor, ")"),
        absl::StrCat("rope_inv_freq { scaling { type: \"yarn\" factor: ",
                     factor, " original_max_position_embeddings: 8 } }"),
        "[4]");
  }
  add("rope(llama3 high~low)",
      "rope_inv_freq { scaling { type: \"llama3\" factor: 8 low_freq_factor: 1 "
      "high_freq_factor: 1.0000000000000002 "
      "original_max_position_embeddings: 8192 } }",
      "[64]");
  add("rope(yarn beta_fast=1e-300)",
      "rope_inv_freq { scaling { type: \"yarn\" factor: 4 beta_fast: 1e-300 "
      "original_max_position_embeddings: 8 } }",
      "[4]");
  add("rope(yarn base~1)",
      "rope_inv_freq { base: 1.0000000000000002 scaling { type: \"yarn\" "
      "factor: 4 original_max_position_embeddings: 8 } }",
      "[4]");
  return out;
}

constexpr const char* kDtypes[] = {"float32",  "float64",       "float16",
                                   "bfloat16", "float8_e4m3fn", "float8_e5m2",
                                   "int8",     "int64",         "bool"};

enum class Shard { kWhole, kHalf, kEmpty };

const char* ShardName(Shard s) {
  switch (s) {
    case Shard::kWhole:
      return "whole";
    case Shard::kHalf:
      return "half";
    case Shard::kEmpty:
      return "empty-shard";
  }
  return "?";
}

struct Case {
  std::string name;
  std::string request;  // MaterializeRequest, text format
};

std::string TensorText(const std::string& shape, const std::string& dtype,
                       const std::string& init, Shard shard) {
  std::string text = absl::StrCat("name: \"w\" shape: ", shape, " dtype: \"",
                                  dtype, "\" init { ", init, " }");
  if (shard == Shard::kHalf) {
    absl::StrAppend(&text, " shard { split { dim: 0 index: 0 count: 2 } }");
  } else if (shard == Shard::kEmpty) {
    // More parts than rows: the last part is empty.
    absl::StrAppend(&text, " shard { split { dim: 0 index: 7 count: 8 } }");
  }
  return text;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const Scheme& scheme : Schemes()) {
    for (const char* dtype : kDtypes) {
      for (const char* rng : {"RNG_MODE_TORCH", "RNG_MODE_PORTABLE"}) {
        const bool portable = std::string(rng) == "RNG_MODE_PORTABLE";
        for (Shard shard : {Shard::kWhole, Shard::kHalf, Shard::kEmpty}) {
          if (shard != Shard::kWhole && !portable) continue;
          cases.push_back(
              {absl::StrCat(scheme.label, "/", dtype, "/",
                            portable ? "portable" : "torch", "/",
                            ShardName(shard)),
               absl::StrCat("model { tensors { ",
                            TensorText(scheme.shape, dtype, scheme.text, shard),
                            " } seed: 5 rng: ", rng, " }")});
        }
      }
    }
  }
  // Shapes whose strides overflow although they have no elements.
  for (const char* rng : {"RNG_MODE_TORCH", "RNG_MODE_PORTABLE"}) {
    cases.push_back(
        {absl::StrCat("zeros on [0, 2^32, 2^32]/", rng),
         absl::StrCat(
             "model { tensors { name: \"w\" shape: [0, 4294967296, "
             "4294967296] dtype: \"float32\" init { zeros {} } } rng: ",
             rng, " }")});
  }
  // A shard of a tensor past the portable counter space (2^62 elements).
  for (const char* init : {"normal {}", "zeros {}"}) {
    cases.push_back(
        {absl::StrCat(init, " on a shard of [2^62]"),
         absl::StrCat(
             "model { tensors { name: \"w\" shape: [4611686018427387904] "
             "dtype: \"float8_e4m3fn\" init { ",
             init,
             " } shard { box { offset: 0 length: 8 } } } "
             "rng: RNG_MODE_PORTABLE }")});
  }
  // A box that leaves more partially covered dimensions than the kernels
  // take.
  {
    std::string shape = "[";
    std::string box;
    for (int d = 0; d < 12; ++d) {
      absl::StrAppend(&shape, d ? ", " : "", 3);
      absl::StrAppend(&box, " box { offset: 1 length: 2 }");
    }
    shape += "]";
    cases.push_back(
        {"normal on a 12-D box",
         absl::StrCat("model { tensors { name: \"w\" shape: ", shape,
                      " dtype: \"float32\" init { normal {} } shard {", box,
                      " } } rng: RNG_MODE_PORTABLE }")});
  }
  return cases;
}

// What the sweep found before validation knew the finite ranges (see the
// file comment). Keyed by case name.
const std::map<std::string, std::string>& BeforeValidation() {
  static const auto* before = new std::map<std::string, std::string>{
#include "tests/finite_values_before.inc"
  };
  return *before;
}

class FiniteValuesTest : public ::testing::Test {
 protected:
  FiniteValuesTest() {
    log::SetMinLevel(log::Level::kWarning);  // thousands of handles come and go
    memory::DeviceConfig cpu;
    cpu.name = "cpu";
    cpu.capacity_bytes = uint64_t{1} << 30;
    pool_ = memory::DevicePool::Create({cpu}).value();
    workers_ = std::make_unique<ThreadPool>(1);
    engine_ = std::make_unique<engine::Engine>(pool_.get(), &registry_,
                                               workers_.get());
  }
  ~FiniteValuesTest() override { workers_.reset(); }

  // "" if every value of the handle's tensor is finite, else what is not.
  std::string NonFinite(const std::string& handle_id) {
    std::shared_ptr<registry::Handle> handle =
        registry_.Get(caller_.identity, handle_id).value();
    std::shared_ptr<const memory::Arena> arena = handle->arena();
    const at::Tensor& view = arena->tensors().views[0];
    if (!at::isFloatingType(view.scalar_type()) || view.numel() == 0) {
      return "";
    }
    const at::Tensor finite = at::isfinite(view.to(at::kDouble));
    const int64_t bad = view.numel() - finite.sum().item<int64_t>();
    if (bad == 0) return "";
    return absl::StrCat(bad, " of ", view.numel(), " values not finite");
  }

  const engine::Caller caller_{"sweep", "", false};
  std::unique_ptr<memory::DevicePool> pool_;
  registry::HandleRegistry registry_;
  std::unique_ptr<ThreadPool> workers_;
  std::unique_ptr<engine::Engine> engine_;
};

// What a case did: "refused: <message>", "finite", or what went wrong
// ("INTERNAL at Materialize: ...", "3 of 32 values not finite", ...).
struct Outcome {
  bool good = false;
  std::string text;
};

TEST_F(FiniteValuesTest, EveryCaseIsRefusedUpFrontOrFinite) {
  // MATERIALIZER_SWEEP_REPORT=1 prints the broken cases in the format of
  // finite_values_before.inc (how that file was made); =all prints every
  // case with its outcome.
  const char* report_env = std::getenv("MATERIALIZER_SWEEP_REPORT");
  const bool report = report_env != nullptr;
  const bool report_all = report && std::string(report_env) == "all";
  const std::vector<Case> cases = Cases();
  int refused = 0;
  int finite = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::MaterializeRequest request;
    ASSERT_TRUE(
        google::protobuf::TextFormat::ParseFromString(c.request, &request))
        << c.request;
    v1::PlanRequest plan_request;
    *plan_request.mutable_model() = request.model();
    const absl::StatusOr<v1::PlanResponse> plan =
        engine_->Plan(caller_, plan_request);
    const absl::StatusOr<v1::MaterializeResponse> made =
        engine_->Materialize(caller_, request);
    Outcome outcome;
    if (!plan.ok() || !made.ok()) {
      const bool invalid =
          plan.status().code() == absl::StatusCode::kInvalidArgument &&
          made.status().code() == absl::StatusCode::kInvalidArgument;
      const bool same = plan.status().message() == made.status().message();
      const bool names =
          absl::StartsWith(made.status().message(), "model.tensors[0] (\"w\")");
      outcome.good = invalid && same && names;
      if (outcome.good) {
        ++refused;
        outcome.text = absl::StrCat("refused: ", made.status().message());
      } else if (!plan.ok() && !made.ok()) {
        outcome.text = absl::StrCat("Plan ", plan.status().ToString(),
                                    "; Materialize ", made.status().ToString());
      } else {
        outcome.text = plan.ok() ? absl::StrCat("Plan OK; Materialize ",
                                                made.status().ToString())
                                 : absl::StrCat("Materialize OK; Plan ",
                                                plan.status().ToString());
      }
    } else {
      outcome.text = NonFinite(made->handle());
      outcome.good = outcome.text.empty();
      if (outcome.good) {
        ++finite;
        outcome.text = "finite";
      }
    }
    if (made.ok()) {
      v1::ReleaseRequest release;
      release.set_handle(made->handle());
      ASSERT_OK(engine_->Release(caller_, release).status());
    }
    const memory::PoolSnapshot held = pool_->Snapshot();
    ASSERT_EQ(held.total.reserved_bytes + held.total.in_use_bytes, 0u);
    if (report && (!outcome.good || report_all)) {
      std::cout << "    {\"" << c.name << "\",\n     \""
                << absl::CHexEscape(outcome.text.substr(0, 160)) << "\"},\n";
    }
    const auto before = BeforeValidation().find(c.name);
    EXPECT_TRUE(outcome.good)
        << outcome.text
        << (before == BeforeValidation().end()
                ? ""
                : absl::StrCat("\n  before validation knew the ranges: ",
                               before->second));
  }
  std::cout << cases.size() << " cases: " << refused
            << " refused by validation, " << finite
            << " materialized with finite values; " << BeforeValidation().size()
            << " of them failed later or gave inf/NaN before validation knew "
               "the ranges\n";
}

}  // namespace
}  // namespace materializer
