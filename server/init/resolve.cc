#include "server/init/resolve.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/quote.h"
#include "server/init/glob.h"
#include "server/init/rng_mode.h"
#include "server/init/schemes.h"

namespace materializer::init {
namespace {

// Keeps the uncovered-tensor message within what the service sends whole
// (service/status.h): the status message travels in a trailer.
constexpr size_t kMaxListedChars = 3000;

std::string RulePath(int index, const v1::InitRule& rule) {
  return absl::StrCat("model.init_rules[", index, "] (",
                      Quote(rule.pattern()), ")");
}

std::string TensorPath(int index, const spec::TensorDesc& tensor) {
  return absl::StrCat("model.tensors[", index, "] (\"", tensor.name, "\")");
}

absl::Status Prefixed(const std::string& path, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(path, ": ", status.message()));
}

}  // namespace

absl::StatusOr<Resolution> ResolveInits(
    const v1::ModelSpec& model, const std::vector<spec::TensorDesc>& tensors,
    const Cancelled& cancelled) {
  if (model.init_rules_size() > kMaxInitRules) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.init_rules: ", model.init_rules_size(),
                     " rules; the limit is ", kMaxInitRules));
  }
  // Each pattern is compiled once for the whole request.
  std::vector<Glob> globs;
  globs.reserve(model.init_rules_size());
  uint64_t words = 0;
  for (int r = 0; r < model.init_rules_size(); ++r) {
    const v1::InitRule& rule = model.init_rules(r);
    absl::StatusOr<Glob> glob = Glob::Compile(rule.pattern());
    if (!glob.ok()) return Prefixed(RulePath(r, rule), glob.status());
    if (absl::Status s = CheckSchemeParameters(rule.init()); !s.ok()) {
      return Prefixed(absl::StrCat(RulePath(r, rule), ".init"), s);
    }
    words += glob->words();
    globs.push_back(std::move(*glob));
  }
  uint64_t name_bytes = 0;
  for (const spec::TensorDesc& tensor : tensors) {
    name_bytes += tensor.name.size();
  }
  if (words * name_bytes > kMaxRuleMatchWork) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.init_rules: matching ", model.init_rules_size(),
        " rules against ", name_bytes, " bytes of tensor names is ",
        words * name_bytes,
        " steps (name bytes x rules, a pattern with n >= 64 items other "
        "than '*' counting ceil((n + 1) / 64) times); the limit is ",
        kMaxRuleMatchWork,
        ". Use fewer rules (one pattern can cover many tensors) or "
        "per-tensor inits"));
  }

  Resolution resolution;
  resolution.inits.resize(tensors.size());
  std::vector<int> matched(model.init_rules_size(), 0);
  std::vector<int> won(model.init_rules_size(), 0);
  std::vector<int> uncovered;

  // Module types by module name, for the module-default fallback.
  absl::flat_hash_map<absl::string_view, absl::string_view> module_types;
  for (const v1::ModuleSpec& module : model.modules()) {
    module_types.emplace(module.name(), module.type());
  }

  std::vector<std::string> sources(tensors.size());
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    if (i % kCancelPollInterval == 0) {
      if (absl::Status s = CheckCancelled(cancelled); !s.ok()) return s;
    }
    const spec::TensorDesc& tensor = tensors[i];
    const v1::TensorSpec& spec = model.tensors(i);
    ResolvedInit& out = resolution.inits[i];
    if (tensor.tie_root >= 0) {
      // Validation refuses an init on a tied tensor; rules skip it.
      out.description = absl::StrCat("tied to ", tensors[tensor.tie_root].name);
      continue;
    }
    bool covered = false;
    if (spec.has_init()) {
      if (absl::Status s = CheckSchemeParameters(spec.init()); !s.ok()) {
        return Prefixed(absl::StrCat(TensorPath(i, tensor), ".init"), s);
      }
      if (absl::Status s = CheckSchemeForTensor(spec.init(), tensor); !s.ok()) {
        return Prefixed(absl::StrCat(TensorPath(i, tensor), ".init"), s);
      }
      out.scheme = spec.init();
      sources[i] = " [tensor init]";
      covered = true;
    }
    for (int r = 0; r < model.init_rules_size(); ++r) {
      const v1::InitRule& rule = model.init_rules(r);
      if (!globs[r].Matches(tensor.name)) continue;
      ++matched[r];
      if (covered) continue;
      if (absl::Status s = CheckSchemeForTensor(rule.init(), tensor); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(TensorPath(i, tensor), ": ", RulePath(r, rule),
                         " applies: ", s.message()));
      }
      ++won[r];
      out.scheme = rule.init();
      // Every tensor's description holds this: keep it short.
      sources[i] = absl::StrCat(" [rule ", r, " ", Quote(rule.pattern(), 64),
                                "]");
      covered = true;
    }
    if (!covered) {
      // Last resort: what reset_parameters() of its module type does, when
      // the type is known (from model.modules, else the tensor's
      // module_type).
      auto it = module_types.find(ModuleOf(tensor.name));
      const absl::string_view type =
          it != module_types.end() && !it->second.empty()
              ? it->second
              : absl::string_view(tensor.module_type);
      if (!type.empty() && IsKnownModuleType(type)) {
        *out.scheme.mutable_module_default() = v1::ModuleDefault();
        sources[i] = " [module default]";
        covered = true;
      }
    }
    if (!covered) uncovered.push_back(i);
  }

  if (!uncovered.empty()) {
    std::string list;
    size_t listed = 0;
    for (int i : uncovered) {
      if (list.size() > kMaxListedChars) break;
      absl::StrAppend(&list, listed == 0 ? "" : ", ", "\"", tensors[i].name,
                      "\"");
      ++listed;
    }
    if (listed < uncovered.size()) {
      absl::StrAppend(&list, ", ... and ", uncovered.size() - listed, " more");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "model: ", uncovered.size(),
        uncovered.size() == 1 ? " tensor has" : " tensors have",
        " no init (no per-tensor init, no init_rules pattern matches, and no "
        "known module type gives a default), so it would be returned "
        "uninitialized: ",
        list,
        ". Add a rule such as {\"pattern\": \"*\", \"init\": {\"zeros\": "
        "{}}} or set the tensor's init."));
  }

  // Portable mode has no definition for schemes that need the whole matrix.
  if (EffectiveRngMode(model.rng()) == v1::RNG_MODE_PORTABLE) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const v1::InitScheme& scheme = resolution.inits[i].scheme;
      if (tensors[i].tie_root >= 0 || HasPortableDefinition(scheme)) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          TensorPath(static_cast<int>(i), tensors[i]), ":",
          sources[i].empty() ? "" : sources[i], " ", DescribeScheme(scheme),
          " has no portable definition: it needs the whole matrix at once, "
          "so no shard or device order can reproduce it. Use "
          "model.rng = RNG_MODE_TORCH for this model"));
    }
  }

  std::vector<bool> is_module_default(tensors.size(), false);
  for (size_t i = 0; i < tensors.size(); ++i) {
    is_module_default[i] = resolution.inits[i].scheme.has_module_default();
  }
  absl::StatusOr<ModulePlans> plans =
      PlanModuleDefaults(model, tensors, is_module_default);
  if (!plans.ok()) return plans.status();
  for (size_t i = 0; i < tensors.size(); ++i) {
    ResolvedInit& out = resolution.inits[i];
    if (tensors[i].tie_root >= 0) continue;
    out.module = plans->by_tensor[i];
    out.description = absl::StrCat(
        out.module != nullptr
            ? DescribeModuleDefault(*out.module, static_cast<int>(i))
            : DescribeScheme(out.scheme),
        sources[i]);
  }

  for (int r = 0; r < model.init_rules_size(); ++r) {
    const v1::InitRule& rule = model.init_rules(r);
    if (matched[r] == 0) {
      resolution.warnings.push_back(
          absl::StrCat(RulePath(r, rule), " matches no tensor"));
    } else if (won[r] == 0) {
      resolution.warnings.push_back(absl::StrCat(
          RulePath(r, rule), " matches ", matched[r],
          " tensor(s), all covered first by a per-tensor init or an earlier "
          "rule"));
    }
  }
  for (std::string& warning : plans->warnings) {
    resolution.warnings.push_back(std::move(warning));
  }
  return resolution;
}

}  // namespace materializer::init
