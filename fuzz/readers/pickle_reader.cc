#include "fuzz/readers/pickle_reader.h"

#include <map>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace materializer::fuzz {
namespace {

// A pickled object, as far as a state_dict needs.
struct Object;
using Ref = std::shared_ptr<Object>;

struct Object {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kString,
    kTuple,
    kGlobal,      // text = "module.name"
    kPersistent,  // items[0] = the id
    kCall,        // items[0] = callable, items[1] = args tuple
    kDict,        // pairs, in insertion order (an OrderedDict() call too)
    kMark,        // the stack marker, never an object
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  std::string text;
  std::vector<Ref> items;
  std::vector<std::pair<Ref, Ref>> pairs;
};

Ref Make(Object::Kind kind) {
  auto object = std::make_shared<Object>();
  object->kind = kind;
  return object;
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("data.pkl: ", what));
}

class Machine {
 public:
  explicit Machine(absl::string_view bytes) : bytes_(bytes) {}

  absl::StatusOr<Ref> Run() {
    while (true) {
      if (pos_ >= bytes_.size()) return Invalid("no STOP");
      const unsigned char op = static_cast<unsigned char>(bytes_[pos_++]);
      absl::Status status = absl::OkStatus();
      switch (op) {
        case 0x80:  // PROTO
          status = Need(1);
          if (status.ok() && static_cast<unsigned char>(bytes_[pos_]) > 5) {
            status = Invalid("unknown protocol");
          }
          ++pos_;
          break;
        case '.':  // STOP
          if (stack_.size() != 1 || stack_[0]->kind == Object::Kind::kMark) {
            return Invalid("STOP with a stack of other than one object");
          }
          if (pos_ != bytes_.size()) return Invalid("bytes after STOP");
          return stack_[0];
        case '(': stack_.push_back(Make(Object::Kind::kMark)); break;
        case ')': stack_.push_back(Make(Object::Kind::kTuple)); break;
        case 't': status = Tuple(); break;
        case 0x85: status = SmallTuple(1); break;  // TUPLE1
        case 0x86: status = SmallTuple(2); break;  // TUPLE2
        case 0x87: status = SmallTuple(3); break;  // TUPLE3
        case '}': stack_.push_back(Make(Object::Kind::kDict)); break;
        case 'N': stack_.push_back(Make(Object::Kind::kNone)); break;
        case 0x88:
        case 0x89: {  // NEWTRUE, NEWFALSE
          Ref b = Make(Object::Kind::kBool);
          b->boolean = op == 0x88;
          stack_.push_back(b);
          break;
        }
        case 'K': status = Int(1, false); break;  // BININT1
        case 'M': status = Int(2, false); break;  // BININT2
        case 'J': status = Int(4, true); break;   // BININT
        case 0x8a: status = Long1(); break;
        case 'X': status = BinUnicode(); break;
        case 'c': status = Global(); break;
        case 'Q': status = BinPersId(); break;
        case 'R': status = Reduce(); break;
        case 'u': status = SetItems(); break;
        case 's': status = SetItem(); break;
        case 'q': status = Put(1); break;  // BINPUT
        case 'r': status = Put(4); break;  // LONG_BINPUT
        case 'h': status = Get(1); break;  // BINGET
        case 'j': status = Get(4); break;  // LONG_BINGET
        default:
          return Invalid(absl::StrCat("unsupported opcode 0x",
                                      absl::Hex(op), " at ", pos_ - 1));
      }
      if (!status.ok()) return status;
    }
  }

 private:
  absl::Status Need(size_t n) const {
    if (bytes_.size() - pos_ < n) return Invalid("truncated");
    return absl::OkStatus();
  }

  uint64_t ReadLE(int width) {
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i) {
      value = (value << 8) | static_cast<unsigned char>(bytes_[pos_ + i]);
    }
    pos_ += width;
    return value;
  }

  absl::StatusOr<Ref> Pop() {
    if (stack_.empty() || stack_.back()->kind == Object::Kind::kMark) {
      return Invalid("stack underflow");
    }
    Ref top = stack_.back();
    stack_.pop_back();
    return top;
  }

  // The objects above the topmost mark, and the mark removed.
  absl::StatusOr<std::vector<Ref>> PopToMark() {
    for (size_t i = stack_.size(); i-- > 0;) {
      if (stack_[i]->kind == Object::Kind::kMark) {
        std::vector<Ref> items(stack_.begin() + i + 1, stack_.end());
        stack_.resize(i);
        return items;
      }
    }
    return Invalid("no mark");
  }

  absl::Status Tuple() {
    absl::StatusOr<std::vector<Ref>> items = PopToMark();
    if (!items.ok()) return items.status();
    Ref tuple = Make(Object::Kind::kTuple);
    tuple->items = std::move(*items);
    stack_.push_back(tuple);
    return absl::OkStatus();
  }

  absl::Status SmallTuple(int n) {
    Ref tuple = Make(Object::Kind::kTuple);
    tuple->items.resize(n);
    for (int i = n; i-- > 0;) {
      absl::StatusOr<Ref> item = Pop();
      if (!item.ok()) return item.status();
      tuple->items[i] = *item;
    }
    stack_.push_back(tuple);
    return absl::OkStatus();
  }

  absl::Status Int(int width, bool is_signed) {
    if (absl::Status s = Need(width); !s.ok()) return s;
    uint64_t raw = ReadLE(width);
    Ref value = Make(Object::Kind::kInt);
    value->integer = is_signed ? static_cast<int32_t>(static_cast<uint32_t>(raw))
                               : static_cast<int64_t>(raw);
    stack_.push_back(value);
    return absl::OkStatus();
  }

  absl::Status Long1() {
    if (absl::Status s = Need(1); !s.ok()) return s;
    const size_t n = static_cast<unsigned char>(bytes_[pos_++]);
    if (n > 8) return Invalid("LONG1 wider than 64 bits");
    if (absl::Status s = Need(n); !s.ok()) return s;
    uint64_t raw = 0;
    for (size_t i = n; i-- > 0;) {
      raw = (raw << 8) | static_cast<unsigned char>(bytes_[pos_ + i]);
    }
    // Sign-extend from n bytes.
    if (n > 0 && n < 8 && (static_cast<unsigned char>(bytes_[pos_ + n - 1]) & 0x80)) {
      raw |= ~uint64_t{0} << (8 * n);
    }
    pos_ += n;
    Ref value = Make(Object::Kind::kInt);
    value->integer = static_cast<int64_t>(raw);
    stack_.push_back(value);
    return absl::OkStatus();
  }

  absl::Status BinUnicode() {
    if (absl::Status s = Need(4); !s.ok()) return s;
    const uint64_t n = ReadLE(4);
    if (absl::Status s = Need(n); !s.ok()) return s;
    Ref value = Make(Object::Kind::kString);
    value->text = std::string(bytes_.substr(pos_, n));
    pos_ += n;
    stack_.push_back(value);
    return absl::OkStatus();
  }

  absl::Status Global() {
    const size_t module_end = bytes_.find('\n', pos_);
    if (module_end == absl::string_view::npos) return Invalid("bad GLOBAL");
    const size_t name_end = bytes_.find('\n', module_end + 1);
    if (name_end == absl::string_view::npos) return Invalid("bad GLOBAL");
    Ref value = Make(Object::Kind::kGlobal);
    value->text = absl::StrCat(bytes_.substr(pos_, module_end - pos_), ".",
                               bytes_.substr(module_end + 1,
                                             name_end - module_end - 1));
    pos_ = name_end + 1;
    stack_.push_back(value);
    return absl::OkStatus();
  }

  absl::Status BinPersId() {
    absl::StatusOr<Ref> id = Pop();
    if (!id.ok()) return id.status();
    Ref value = Make(Object::Kind::kPersistent);
    value->items.push_back(*id);
    stack_.push_back(value);
    return absl::OkStatus();
  }

  absl::Status Reduce() {
    absl::StatusOr<Ref> args = Pop();
    if (!args.ok()) return args.status();
    absl::StatusOr<Ref> callable = Pop();
    if (!callable.ok()) return callable.status();
    if ((*args)->kind != Object::Kind::kTuple) {
      return Invalid("REDUCE arguments are not a tuple");
    }
    if ((*callable)->kind == Object::Kind::kGlobal &&
        (*callable)->text == "collections.OrderedDict") {
      if (!(*args)->items.empty()) return Invalid("OrderedDict(arguments)");
      stack_.push_back(Make(Object::Kind::kDict));
      return absl::OkStatus();
    }
    Ref call = Make(Object::Kind::kCall);
    call->items = {*callable, *args};
    stack_.push_back(call);
    return absl::OkStatus();
  }

  absl::Status AddPairs(std::vector<Ref> items) {
    if (items.size() % 2 != 0) return Invalid("SETITEMS with an odd count");
    if (stack_.empty() || stack_.back()->kind != Object::Kind::kDict) {
      return Invalid("SETITEMS on something other than a dict");
    }
    Object& dict = *stack_.back();
    for (size_t i = 0; i < items.size(); i += 2) {
      if (items[i]->kind != Object::Kind::kString) {
        return Invalid("a dict key that is not a string");
      }
      for (const auto& [key, unused] : dict.pairs) {
        if (key->text == items[i]->text) {
          return Invalid(absl::StrCat("duplicate key \"", key->text, "\""));
        }
      }
      dict.pairs.emplace_back(items[i], items[i + 1]);
    }
    return absl::OkStatus();
  }

  absl::Status SetItems() {
    absl::StatusOr<std::vector<Ref>> items = PopToMark();
    if (!items.ok()) return items.status();
    return AddPairs(std::move(*items));
  }

  absl::Status SetItem() {
    absl::StatusOr<Ref> value = Pop();
    if (!value.ok()) return value.status();
    absl::StatusOr<Ref> key = Pop();
    if (!key.ok()) return key.status();
    return AddPairs({*key, *value});
  }

  absl::Status Put(int width) {
    if (absl::Status s = Need(width); !s.ok()) return s;
    const uint64_t index = ReadLE(width);
    if (stack_.empty() || stack_.back()->kind == Object::Kind::kMark) {
      return Invalid("PUT of nothing");
    }
    memo_[index] = stack_.back();
    return absl::OkStatus();
  }

  absl::Status Get(int width) {
    if (absl::Status s = Need(width); !s.ok()) return s;
    auto it = memo_.find(ReadLE(width));
    if (it == memo_.end()) return Invalid("GET of an unset memo slot");
    stack_.push_back(it->second);
    return absl::OkStatus();
  }

  absl::string_view bytes_;
  size_t pos_ = 0;
  std::vector<Ref> stack_;
  std::map<uint64_t, Ref> memo_;
};

bool IsGlobal(const Ref& object, absl::string_view text) {
  return object->kind == Object::Kind::kGlobal && object->text == text;
}

absl::StatusOr<std::vector<int64_t>> IntTuple(const Ref& object,
                                              absl::string_view what) {
  if (object->kind != Object::Kind::kTuple) {
    return Invalid(absl::StrCat(what, " is not a tuple"));
  }
  std::vector<int64_t> out;
  for (const Ref& item : object->items) {
    if (item->kind != Object::Kind::kInt) {
      return Invalid(absl::StrCat(what, " holds a non-integer"));
    }
    out.push_back(item->integer);
  }
  return out;
}

absl::StatusOr<PickledTensor> ReadTensor(const std::string& name,
                                         const Ref& value) {
  const std::string where = absl::StrCat("\"", name, "\"");
  if (value->kind != Object::Kind::kCall) {
    return Invalid(absl::StrCat(where, " is not a rebuilt tensor"));
  }
  const Ref& callable = value->items[0];
  const std::vector<Ref>& args = value->items[1]->items;
  PickledTensor t;
  t.name = name;
  if (IsGlobal(callable, "torch._utils._rebuild_tensor_v2")) {
    t.rebuild = "_rebuild_tensor_v2";
    if (args.size() != 6) return Invalid(where + ": v2 takes 6 arguments");
  } else if (IsGlobal(callable, "torch._utils._rebuild_tensor_v3")) {
    t.rebuild = "_rebuild_tensor_v3";
    if (args.size() != 7) return Invalid(where + ": v3 takes 7 arguments");
    if (args[6]->kind != Object::Kind::kGlobal) {
      return Invalid(where + ": v3 dtype is not a global");
    }
    t.dtype = args[6]->text;
  } else {
    return Invalid(where + ": not rebuilt by _rebuild_tensor_v2/v3");
  }
  // Storage: a persistent id ('storage', class, key, location, size).
  if (args[0]->kind != Object::Kind::kPersistent ||
      args[0]->items[0]->kind != Object::Kind::kTuple) {
    return Invalid(where + ": storage is not a persistent id");
  }
  const std::vector<Ref>& id = args[0]->items[0]->items;
  if (id.size() != 5 || id[0]->kind != Object::Kind::kString ||
      id[0]->text != "storage" || id[1]->kind != Object::Kind::kGlobal ||
      id[2]->kind != Object::Kind::kString ||
      id[3]->kind != Object::Kind::kString ||
      id[4]->kind != Object::Kind::kInt) {
    return Invalid(where + ": malformed storage id");
  }
  t.storage_class = id[1]->text;
  t.storage_key = id[2]->text;
  t.location = id[3]->text;
  t.storage_size = id[4]->integer;
  if (args[1]->kind != Object::Kind::kInt) {
    return Invalid(where + ": storage offset is not an integer");
  }
  t.storage_offset = args[1]->integer;
  absl::StatusOr<std::vector<int64_t>> shape = IntTuple(args[2], where + " size");
  if (!shape.ok()) return shape.status();
  absl::StatusOr<std::vector<int64_t>> stride =
      IntTuple(args[3], where + " stride");
  if (!stride.ok()) return stride.status();
  t.shape = std::move(*shape);
  t.stride = std::move(*stride);
  if (args[4]->kind != Object::Kind::kBool) {
    return Invalid(where + ": requires_grad is not a bool");
  }
  t.requires_grad = args[4]->boolean;
  if (args[5]->kind != Object::Kind::kDict || !args[5]->pairs.empty()) {
    return Invalid(where + ": backward hooks are not an empty OrderedDict");
  }
  return t;
}

}  // namespace

absl::StatusOr<std::vector<PickledTensor>> ReadStateDictPickle(
    absl::string_view pickle) {
  absl::StatusOr<Ref> root = Machine(pickle).Run();
  if (!root.ok()) return root.status();
  if ((*root)->kind != Object::Kind::kDict) {
    return Invalid("the pickled object is not a dict");
  }
  std::vector<PickledTensor> out;
  for (const auto& [key, value] : (*root)->pairs) {
    absl::StatusOr<PickledTensor> tensor = ReadTensor(key->text, value);
    if (!tensor.ok()) return tensor.status();
    out.push_back(std::move(*tensor));
  }
  return out;
}

}  // namespace materializer::fuzz
