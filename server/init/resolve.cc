#include "server/init/resolve.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/init/derived.h"
#include "server/init/glob.h"
#include "server/init/portable_request.h"
#include "server/init/rng_mode.h"
#include "server/init/schemes.h"
#include "server/init/value_range.h"
#include "server/spec/field_path.h"

namespace materializer::init {
namespace {

// Keeps the uncovered-tensor message within what the service sends whole
// (service/status.h): the status message travels in a trailer.
constexpr size_t kMaxListedChars = 3000;

std::string RulePath(int index, const v1::InitRule& rule) {
  return absl::StrCat("model.init_rules[", index, "] (", Quote(rule.pattern()),
                      ")");
}

std::string TensorPath(int index, const spec::TensorDesc& tensor) {
  return spec::TensorPath(index, tensor.name);
}

absl::Status Prefixed(const std::string& path, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(path, ": ", status.message()));
}

// What the resolution of each tensor needs beyond the tensor itself.
struct Context {
  Context(const v1::ModelSpec& model,
          const std::vector<spec::TensorDesc>& tensors, v1::RngMode rng)
      : model(model), tensors(tensors), rng(rng) {}

  const v1::ModelSpec& model;
  const std::vector<spec::TensorDesc>& tensors;
  v1::RngMode rng;
  // Each rule's pattern, compiled once for the whole request.
  std::vector<Glob> globs;
  // One shared scheme per rule (a rule's scheme fills many tensors).
  std::vector<std::shared_ptr<const v1::InitScheme>> rule_schemes;
  // Module types by module name, for the module-default fallback.
  absl::flat_hash_map<absl::string_view, absl::string_view> module_types;
  // Per rule: tensors it matches, and tensors it gives their init.
  std::vector<int> matched;
  std::vector<int> won;
};

// Patterns and parameters of every rule, before any tensor, and the bound
// on matching work; compiles each pattern into `globs`.
absl::Status CheckRules(const v1::ModelSpec& model,
                        const std::vector<spec::TensorDesc>& tensors,
                        std::vector<Glob>* globs) {
  if (model.init_rules_size() > kMaxInitRules) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.init_rules: ", model.init_rules_size(),
                     " rules; the limit is ", kMaxInitRules));
  }
  globs->reserve(model.init_rules_size());
  uint64_t words = 0;
  for (int r = 0; r < model.init_rules_size(); ++r) {
    const v1::InitRule& rule = model.init_rules(r);
    absl::StatusOr<Glob> glob = Glob::Compile(rule.pattern());
    if (!glob.ok()) return Prefixed(RulePath(r, rule), glob.status());
    words += glob->words();
    globs->push_back(std::move(*glob));
    if (rule.init().has_norm_of()) {
      return absl::InvalidArgumentError(absl::StrCat(
          RulePath(r, rule),
          ".init: norm_of names one source tensor; give it to the tensor "
          "(TensorSpec.init or init_steps), not to a rule"));
    }
    if (rule.init().has_values()) {
      return absl::InvalidArgumentError(absl::StrCat(
          RulePath(r, rule),
          ".init: values carry one tensor's bytes; give them to the tensor "
          "(TensorSpec.init or init_steps), not to a rule"));
    }
    if (absl::Status s = CheckSchemeParameters(rule.init()); !s.ok()) {
      return Prefixed(absl::StrCat(RulePath(r, rule), ".init"), s);
    }
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
  return absl::OkStatus();
}

// Sets out.steps and *source for tensor i from its own init or
// init_steps, the first matching rule, or its module type; leaves them
// empty when nothing covers it. Counts rule matches either way.
absl::Status ChooseInit(Context& context, int i, ResolvedInit& out,
                        std::string* source) {
  const spec::TensorDesc& tensor = context.tensors[i];
  const v1::TensorSpec& spec = context.model.tensors(i);
  if (tensor.tie_root >= 0) {
    // Validation refuses an init on a tied tensor; rules skip it.
    if (spec.init_steps_size() > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(TensorPath(i, tensor),
                       ": has both tie_to and init_steps; a tied tensor "
                       "takes its values from \"",
                       spec.tie_to(), "\", so remove its init_steps"));
    }
    out.description =
        absl::StrCat("tied to ", context.tensors[tensor.tie_root].name);
    return absl::OkStatus();
  }
  bool covered = false;
  if (spec.has_init() && spec.init_steps_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        TensorPath(i, tensor),
        ": has both init and init_steps; give one (a single init is the "
        "same as one step without a region)"));
  }
  if (spec.has_init()) {
    if (absl::Status s = CheckSchemeParameters(spec.init()); !s.ok()) {
      return Prefixed(absl::StrCat(TensorPath(i, tensor), ".init"), s);
    }
    if (absl::Status s = CheckSchemeFits(spec.init(), tensor); !s.ok()) {
      return Prefixed(absl::StrCat(TensorPath(i, tensor), ".init"), s);
    }
    out.steps.push_back(
        {std::make_shared<const v1::InitScheme>(spec.init()), std::nullopt});
    *source = " [tensor init]";
    covered = true;
  } else if (spec.init_steps_size() > 0) {
    ASSIGN_OR_RETURN(out.steps, ResolveInitSteps(i, spec, tensor, context.rng));
    *source = " [tensor init_steps]";
    covered = true;
  }
  for (int r = 0; r < context.model.init_rules_size(); ++r) {
    const v1::InitRule& rule = context.model.init_rules(r);
    if (!context.globs[r].Matches(tensor.name)) continue;
    ++context.matched[r];
    if (covered) continue;
    if (absl::Status s = CheckSchemeFits(rule.init(), tensor); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(TensorPath(i, tensor), ": ", RulePath(r, rule),
                       " applies: ", s.message()));
    }
    ++context.won[r];
    out.steps.push_back({context.rule_schemes[r], std::nullopt});
    // Every tensor's description holds this: keep it short.
    *source = absl::StrCat(" [rule ", r, " ", Quote(rule.pattern(), 64), "]");
    covered = true;
  }
  if (!covered) {
    // Last resort: what reset_parameters() of its module type does, when
    // the type is known (from model.modules, else the tensor's
    // module_type).
    auto it = context.module_types.find(ModuleOf(tensor.name));
    const absl::string_view type =
        it != context.module_types.end() && !it->second.empty()
            ? it->second
            : absl::string_view(tensor.module_type);
    if (!type.empty() && IsKnownModuleType(type)) {
      v1::InitScheme module_default;
      *module_default.mutable_module_default() = v1::ModuleDefault();
      out.steps.push_back(
          {std::make_shared<const v1::InitScheme>(std::move(module_default)),
           std::nullopt});
      *source = " [module default]";
    }
  }
  return absl::OkStatus();
}

absl::Status UncoveredError(const std::vector<spec::TensorDesc>& tensors,
                            const std::vector<int>& uncovered) {
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

// The scheme step k of tensor i draws with in portable mode: a module
// default runs its slot's call.
const v1::InitScheme& PortableScheme(const ResolvedInit& init, int i,
                                     size_t k) {
  if (init.module != nullptr) {
    for (const ModuleSlot& slot : init.module->slots) {
      if (slot.tensor == i) return slot.op;
    }
  }
  return *init.steps[k].scheme;
}

// RNG_MODE_PORTABLE: every step has a portable definition, and the
// requests the portable fill will make (portable_fill.cc: the step's
// region, its part in the shard, stream = step index) pass the kernels'
// own checks. So every failure the kernels could report is reported here,
// before anything is allocated, whatever the shard (an empty one too).
absl::Status CheckPortable(uint64_t seed,
                           const std::vector<spec::TensorDesc>& tensors,
                           const Resolution& resolution,
                           const std::vector<std::string>& sources) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const spec::TensorDesc& tensor = tensors[i];
    if (tensor.tie_root >= 0) continue;
    const ResolvedInit& init = resolution.inits[i];
    for (size_t k = 0; k < init.steps.size(); ++k) {
      const ResolvedStep& step = init.steps[k];
      const v1::InitScheme& scheme =
          PortableScheme(init, static_cast<int>(i), k);
      // Made only for a message: quoting every name of a large model cost
      // a tenth of its Plan.
      auto where = [&] {
        const std::string path = TensorPath(static_cast<int>(i), tensor);
        return init.steps.size() > 1
                   ? absl::StrCat(path, ".init_steps[", k, "]: ")
                   : absl::StrCat(path, ":", sources[i], " ");
      };
      if (!HasPortableDefinition(scheme)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), DescribeScheme(scheme),
            " has no portable definition: it needs the whole matrix at once, "
            "so no shard or device order can reproduce it. Use "
            "model.rng = RNG_MODE_TORCH for this model"));
      }
      if (!IsRandom(scheme)) continue;
      const std::vector<int64_t>& full = tensor.full_shape();
      const portable::Box region =
          step.region.has_value() ? *step.region : portable::FullBox(full);
      const portable::Box stored =
          tensor.is_shard() ? portable::Box{tensor.shard_offset, tensor.shape}
                            : portable::FullBox(full);
      PortableTarget target;
      target.name = tensor.name;
      target.dtype = tensor.dtype;
      if (step.map != nullptr) target.dtype = PortableLeafDtype(*step.map);
      target.shape = region.length;
      const portable::Box both = portable::Intersect(region, stored);
      // A shard that holds none of the region still has its parameters
      // checked, over an empty box.
      target.box = portable::NumElements(both) > 0
                       ? portable::Relative(both, region.offset)
                       : portable::Box{std::vector<int64_t>(full.size(), 0),
                                       std::vector<int64_t>(full.size(), 0)};
      target.stream = static_cast<uint32_t>(k);
      absl::StatusOr<portable::PortableRequest> request =
          PortableRequestFor(scheme, target, seed);
      absl::Status status =
          request.ok() ? CheckPortableRequest(*request) : request.status();
      if (!status.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), DescribeScheme(scheme),
                         " in RNG_MODE_PORTABLE: ", status.message()));
      }
    }
  }
  return absl::OkStatus();
}

void AddRuleWarnings(const Context& context, Resolution& resolution) {
  for (int r = 0; r < context.model.init_rules_size(); ++r) {
    const v1::InitRule& rule = context.model.init_rules(r);
    if (context.matched[r] == 0) {
      resolution.warnings.push_back(
          absl::StrCat(RulePath(r, rule), " matches no tensor"));
    } else if (context.won[r] == 0) {
      resolution.warnings.push_back(absl::StrCat(
          RulePath(r, rule), " matches ", context.matched[r],
          " tensor(s), all covered first by a per-tensor init or an earlier "
          "rule"));
    }
  }
}

}  // namespace

absl::StatusOr<Resolution> ResolveInits(
    const v1::ModelSpec& model, const std::vector<spec::TensorDesc>& tensors,
    const Cancelled& cancelled, const std::vector<std::string>* loaded) {
  auto is_loaded = [loaded](size_t i) {
    return loaded != nullptr && !(*loaded)[i].empty();
  };
  RETURN_IF_ERROR(CheckInitLimits(model));
  Context context(model, tensors, EffectiveRngMode(model.rng()));
  RETURN_IF_ERROR(CheckRules(model, tensors, &context.globs));
  for (const v1::InitRule& rule : model.init_rules()) {
    context.rule_schemes.push_back(
        std::make_shared<const v1::InitScheme>(rule.init()));
  }
  for (const v1::ModuleSpec& module : model.modules()) {
    context.module_types.emplace(module.name(), module.type());
  }
  context.matched.assign(model.init_rules_size(), 0);
  context.won.assign(model.init_rules_size(), 0);

  Resolution resolution;
  resolution.inits.resize(tensors.size());
  std::vector<std::string> sources(tensors.size());
  std::vector<int> uncovered;
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    if (i % kCancelPollInterval == 0) RETURN_IF_ERROR(CheckCancelled(cancelled));
    if (is_loaded(i)) {
      resolution.inits[i].description = (*loaded)[i];
      continue;
    }
    RETURN_IF_ERROR(ChooseInit(context, i, resolution.inits[i], &sources[i]));
    if (tensors[i].tie_root < 0 && resolution.inits[i].steps.empty()) {
      uncovered.push_back(i);
    }
  }
  if (!uncovered.empty()) return UncoveredError(tensors, uncovered);

  std::vector<bool> is_module_default(tensors.size(), false);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::vector<ResolvedStep>& steps = resolution.inits[i].steps;
    is_module_default[i] =
        steps.size() == 1 && steps[0].scheme->has_module_default();
  }
  ASSIGN_OR_RETURN(ModulePlans plans,
                   PlanModuleDefaults(model, tensors, is_module_default));
  // The tensors a rule covers share its scheme object, so a plain one-step
  // init (no region, no program) is described once per scheme: formatting
  // the same numbers for each of 45,000 tensors was a sixth of a Plan.
  struct Described {
    std::vector<v1::InitStepInfo> infos;
    std::string text;
  };
  absl::flat_hash_map<const v1::InitScheme*, Described> plain;
  for (size_t i = 0; i < tensors.size(); ++i) {
    ResolvedInit& out = resolution.inits[i];
    if (tensors[i].tie_root >= 0 || is_loaded(i)) continue;
    out.module = plans.by_tensor[i];
    if (out.module == nullptr && out.steps.size() == 1 &&
        !out.steps[0].region.has_value() && out.steps[0].map == nullptr) {
      auto [it, fresh] = plain.try_emplace(out.steps[0].scheme.get());
      if (fresh) {
        it->second.infos = StepInfos(out.steps);
        it->second.text = DescribeSteps(out.steps);
      }
      out.step_infos = it->second.infos;
      out.description = it->second.text + sources[i];
      continue;
    }
    out.step_infos = StepInfos(out.steps);
    if (out.module != nullptr) {
      out.step_infos[0].set_init(
          DescribeModuleDefault(*out.module, static_cast<int>(i)));
      out.description = out.step_infos[0].init();
    } else {
      out.description = DescribeSteps(out.steps);
    }
    out.description += sources[i];
  }

  std::vector<DerivedTensor> derived(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    ResolvedInit& init = resolution.inits[i];
    derived[i].steps = &init.steps;
    derived[i].loaded = is_loaded(i);
    if (init.module != nullptr) {
      derived[i].module_op = &PortableScheme(init, static_cast<int>(i), 0);
    }
  }
  ASSIGN_OR_RETURN(std::vector<int> depth,
                   ResolveDerived(model, tensors, derived));
  for (size_t i = 0; i < tensors.size(); ++i) {
    resolution.inits[i].depth = depth[i];
  }

  if (context.rng == v1::RNG_MODE_PORTABLE) {
    RETURN_IF_ERROR(CheckPortable(model.seed(), tensors, resolution, sources));
  }
  AddRuleWarnings(context, resolution);
  for (std::string& warning : plans.warnings) {
    resolution.warnings.push_back(std::move(warning));
  }
  return resolution;
}

}  // namespace materializer::init
