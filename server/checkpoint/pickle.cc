#include "server/checkpoint/pickle.h"

#include <cstring>
#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/types/span.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"

namespace materializer::checkpoint {
namespace {

// Objects live in one vector and refer to each other by index, so shared
// and even cyclic references (a memoized dict put into itself) cost
// nothing and free nothing twice, and no destructor recurses.
using Id = uint32_t;
constexpr Id kMarkId = UINT32_MAX;

struct Object {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kBytes,
    kTuple,       // children_[first, first + count)
    kList,        // containers_[first]
    kDict,        // containers_[first]: key, value, key, value...
    kGlobal,      // text = "module\nname"
    kPersistent,  // children_[first]: the id
    kCall,        // children_[first]: callable, [first + 1]: args tuple
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  absl::string_view text;
  uint32_t first = 0;
  uint32_t count = 0;
};

constexpr Id kNoneId = 0;
constexpr Id kTrueId = 1;
constexpr Id kFalseId = 2;
constexpr Id kEmptyTupleId = 3;

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("data.pkl: ", what));
}

std::string GlobalName(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"\n", "."}});
}

class Machine {
 public:
  explicit Machine(absl::string_view bytes) : bytes_(bytes) {
    objects_.resize(4);
    objects_[kNoneId].kind = Object::Kind::kNone;
    objects_[kTrueId].kind = Object::Kind::kBool;
    objects_[kTrueId].boolean = true;
    objects_[kFalseId].kind = Object::Kind::kBool;
    objects_[kEmptyTupleId].kind = Object::Kind::kTuple;
  }

  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;

  const Object& object(Id id) const { return objects_[id]; }
  absl::Span<const Id> Children(const Object& o) const {
    if (o.kind == Object::Kind::kList || o.kind == Object::Kind::kDict) {
      return containers_[o.first];
    }
    return absl::MakeConstSpan(children_).subspan(o.first, o.count);
  }

  absl::StatusOr<Id> Run() {
    while (true) {
      if (pos_ >= bytes_.size()) return Invalid("no STOP");
      const size_t at = pos_;
      const unsigned char op = static_cast<unsigned char>(bytes_[pos_++]);
      absl::Status status;
      switch (op) {
        case 0x80:  // PROTO
          status = Need(1);
          if (status.ok() && static_cast<unsigned char>(bytes_[pos_++]) > 5) {
            status = Invalid("unknown protocol");
          }
          break;
        case 0x95:  // FRAME: a length hint only
          status = Need(8);
          pos_ += status.ok() ? 8 : 0;
          break;
        case '.':  // STOP
          if (stack_.size() != 1 || stack_[0] == kMarkId) {
            return Invalid("STOP with a stack of other than one object");
          }
          if (pos_ != bytes_.size()) return Invalid("bytes after STOP");
          return stack_[0];
        case '(': stack_.push_back(kMarkId); break;  // MARK
        case ')': stack_.push_back(kEmptyTupleId); break;
        case 't': status = TupleFromMark(); break;
        case 0x85: status = SmallTuple(1); break;
        case 0x86: status = SmallTuple(2); break;
        case 0x87: status = SmallTuple(3); break;
        case ']': status = NewContainer(Object::Kind::kList, {}); break;
        case 'l': status = ContainerFromMark(Object::Kind::kList); break;
        case 'a': status = Append(/*from_mark=*/false); break;
        case 'e': status = Append(/*from_mark=*/true); break;
        case '}': status = NewContainer(Object::Kind::kDict, {}); break;
        case 'd': status = ContainerFromMark(Object::Kind::kDict); break;
        case 's': status = SetItems(/*from_mark=*/false); break;
        case 'u': status = SetItems(/*from_mark=*/true); break;
        case 'N': stack_.push_back(kNoneId); break;
        case 0x88: stack_.push_back(kTrueId); break;
        case 0x89: stack_.push_back(kFalseId); break;
        case 'K': status = Int(1, false); break;  // BININT1
        case 'M': status = Int(2, false); break;  // BININT2
        case 'J': status = Int(4, true); break;   // BININT
        case 0x8a: status = Long(1); break;       // LONG1
        case 0x8b: status = Long(4); break;       // LONG4
        case 'G': status = Float(); break;        // BINFLOAT
        case 'X': status = Text(4, Object::Kind::kString); break;
        case 0x8c: status = Text(1, Object::Kind::kString); break;
        case 0x8d: status = Text(8, Object::Kind::kString); break;
        case 'B': status = Text(4, Object::Kind::kBytes); break;
        case 'C': status = Text(1, Object::Kind::kBytes); break;
        case 0x8e: status = Text(8, Object::Kind::kBytes); break;
        case 'c': status = Global(); break;
        case 0x93: status = StackGlobal(); break;
        case 'Q': status = Wrap(Object::Kind::kPersistent, 1); break;
        case 'R': status = Reduce(); break;
        case 'b': status = Build(); break;
        case 'q': status = Put(1); break;     // BINPUT
        case 'r': status = Put(4); break;     // LONG_BINPUT
        case 0x94: status = Memoize(); break; // MEMOIZE
        case 'h': status = Get(1); break;     // BINGET
        case 'j': status = Get(4); break;     // LONG_BINGET
        case '0': status = Pop().status(); break;
        case '1': status = PopToMark().status(); break;
        case '2': {  // DUP
          ASSIGN_OR_RETURN(const Id top, Top());
          stack_.push_back(top);
          break;
        }
        default:
          return Invalid(absl::StrCat("unsupported opcode 0x", absl::Hex(op),
                                      " at byte ", at));
      }
      if (!status.ok()) return status;
    }
  }

 private:
  absl::Status Need(uint64_t n) const {
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

  absl::StatusOr<Id> Add(Object object) {
    if (objects_.size() >= kMaxPickleObjects) {
      return Invalid(absl::StrCat("builds more than ", kMaxPickleObjects,
                                  " objects"));
    }
    objects_.push_back(object);
    return static_cast<Id>(objects_.size() - 1);
  }

  absl::Status Push(Object object) {
    ASSIGN_OR_RETURN(const Id id, Add(object));
    stack_.push_back(id);
    return absl::OkStatus();
  }

  absl::StatusOr<Id> Top() const {
    if (stack_.empty() || stack_.back() == kMarkId) {
      return Invalid("stack underflow");
    }
    return stack_.back();
  }

  absl::StatusOr<Id> Pop() {
    ASSIGN_OR_RETURN(const Id top, Top());
    stack_.pop_back();
    return top;
  }

  // The objects above the topmost mark; the mark is removed.
  absl::StatusOr<std::vector<Id>> PopToMark() {
    for (size_t i = stack_.size(); i-- > 0;) {
      if (stack_[i] == kMarkId) {
        std::vector<Id> items(stack_.begin() + i + 1, stack_.end());
        stack_.resize(i);
        return items;
      }
    }
    return Invalid("no mark");
  }

  // A tuple-like object over `items` (kTuple, kPersistent, kCall).
  absl::Status PushWithChildren(Object::Kind kind,
                                const std::vector<Id>& items) {
    if (kind == Object::Kind::kTuple && items.empty()) {
      stack_.push_back(kEmptyTupleId);
      return absl::OkStatus();
    }
    Object object;
    object.kind = kind;
    object.first = static_cast<uint32_t>(children_.size());
    object.count = static_cast<uint32_t>(items.size());
    children_.insert(children_.end(), items.begin(), items.end());
    return Push(object);
  }

  absl::Status TupleFromMark() {
    ASSIGN_OR_RETURN(const std::vector<Id> items, PopToMark());
    return PushWithChildren(Object::Kind::kTuple, items);
  }

  // Pops `n` objects and pushes them wrapped in one of `kind`.
  absl::Status Wrap(Object::Kind kind, int n) {
    std::vector<Id> items(n);
    for (int i = n; i-- > 0;) {
      ASSIGN_OR_RETURN(items[i], Pop());
    }
    return PushWithChildren(kind, items);
  }

  absl::Status SmallTuple(int n) { return Wrap(Object::Kind::kTuple, n); }

  absl::Status NewContainer(Object::Kind kind, std::vector<Id> items) {
    if (kind == Object::Kind::kDict && items.size() % 2 != 0) {
      return Invalid("DICT with an odd number of objects");
    }
    Object object;
    object.kind = kind;
    object.first = static_cast<uint32_t>(containers_.size());
    ASSIGN_OR_RETURN(const Id id, Add(object));
    containers_.push_back(std::move(items));
    stack_.push_back(id);
    return absl::OkStatus();
  }

  absl::Status ContainerFromMark(Object::Kind kind) {
    ASSIGN_OR_RETURN(std::vector<Id> items, PopToMark());
    return NewContainer(kind, std::move(items));
  }

  absl::Status Append(bool from_mark) {
    std::vector<Id> items;
    if (from_mark) {
      ASSIGN_OR_RETURN(items, PopToMark());
    } else {
      ASSIGN_OR_RETURN(const Id item, Pop());
      items.push_back(item);
    }
    ASSIGN_OR_RETURN(const Id list, Top());
    if (objects_[list].kind != Object::Kind::kList) {
      return Invalid("APPEND to something other than a list");
    }
    std::vector<Id>& target = containers_[objects_[list].first];
    target.insert(target.end(), items.begin(), items.end());
    return absl::OkStatus();
  }

  absl::Status SetItems(bool from_mark) {
    std::vector<Id> items;
    if (from_mark) {
      ASSIGN_OR_RETURN(items, PopToMark());
      if (items.size() % 2 != 0) {
        return Invalid("SETITEMS with an odd number of objects");
      }
    } else {
      items.resize(2);
      ASSIGN_OR_RETURN(items[1], Pop());
      ASSIGN_OR_RETURN(items[0], Pop());
    }
    ASSIGN_OR_RETURN(const Id dict, Top());
    if (objects_[dict].kind != Object::Kind::kDict) {
      return Invalid("SETITEMS on something other than a dict");
    }
    std::vector<Id>& target = containers_[objects_[dict].first];
    target.insert(target.end(), items.begin(), items.end());
    return absl::OkStatus();
  }

  absl::Status Int(int width, bool is_signed) {
    RETURN_IF_ERROR(Need(width));
    const uint64_t raw = ReadLE(width);
    Object value;
    value.kind = Object::Kind::kInt;
    value.integer = is_signed
                        ? static_cast<int32_t>(static_cast<uint32_t>(raw))
                        : static_cast<int64_t>(raw);
    return Push(value);
  }

  // LONG1 / LONG4: a little-endian two's complement integer of n bytes.
  absl::Status Long(int length_width) {
    RETURN_IF_ERROR(Need(length_width));
    const uint64_t n = ReadLE(length_width);
    if (n > 8) return Invalid("an integer wider than 64 bits");
    RETURN_IF_ERROR(Need(n));
    uint64_t raw = 0;
    for (size_t i = n; i-- > 0;) {
      raw = (raw << 8) | static_cast<unsigned char>(bytes_[pos_ + i]);
    }
    if (n > 0 && n < 8 &&
        (static_cast<unsigned char>(bytes_[pos_ + n - 1]) & 0x80)) {
      raw |= ~uint64_t{0} << (8 * n);
    }
    pos_ += n;
    Object value;
    value.kind = Object::Kind::kInt;
    value.integer = static_cast<int64_t>(raw);
    return Push(value);
  }

  absl::Status Float() {
    RETURN_IF_ERROR(Need(8));
    pos_ += 8;
    Object value;
    value.kind = Object::Kind::kFloat;
    return Push(value);
  }

  absl::Status Text(int length_width, Object::Kind kind) {
    RETURN_IF_ERROR(Need(length_width));
    const uint64_t n = ReadLE(length_width);
    RETURN_IF_ERROR(Need(n));
    Object value;
    value.kind = kind;
    value.text = bytes_.substr(pos_, n);
    pos_ += n;
    return Push(value);
  }

  absl::Status Global() {
    const size_t module_end = bytes_.find('\n', pos_);
    if (module_end == absl::string_view::npos) return Invalid("bad GLOBAL");
    const size_t name_end = bytes_.find('\n', module_end + 1);
    if (name_end == absl::string_view::npos) return Invalid("bad GLOBAL");
    Object value;
    value.kind = Object::Kind::kGlobal;
    value.text = bytes_.substr(pos_, name_end - pos_);
    pos_ = name_end + 1;
    return Push(value);
  }

  absl::Status StackGlobal() {
    ASSIGN_OR_RETURN(const Id name, Pop());
    ASSIGN_OR_RETURN(const Id module, Pop());
    if (objects_[name].kind != Object::Kind::kString ||
        objects_[module].kind != Object::Kind::kString) {
      return Invalid("STACK_GLOBAL of something other than two strings");
    }
    owned_.push_back(
        absl::StrCat(objects_[module].text, "\n", objects_[name].text));
    Object value;
    value.kind = Object::Kind::kGlobal;
    value.text = owned_.back();
    return Push(value);
  }

  absl::Status Reduce() {
    ASSIGN_OR_RETURN(const Id args, Pop());
    ASSIGN_OR_RETURN(const Id callable, Pop());
    if (objects_[args].kind != Object::Kind::kTuple) {
      return Invalid("REDUCE arguments are not a tuple");
    }
    // OrderedDict() is an ordinary dict here; nothing else is called.
    if (objects_[callable].kind == Object::Kind::kGlobal &&
        objects_[callable].text == "collections\nOrderedDict") {
      if (objects_[args].count != 0) return Invalid("OrderedDict(arguments)");
      return NewContainer(Object::Kind::kDict, {});
    }
    return PushWithChildren(Object::Kind::kCall, {callable, args});
  }

  // BUILD sets an object's state (Module.state_dict()'s `_metadata` on its
  // OrderedDict); the state is checked as pickle data and ignored.
  absl::Status Build() {
    RETURN_IF_ERROR(Pop().status());
    return Top().status();
  }

  absl::Status Remember(uint64_t index) {
    ASSIGN_OR_RETURN(const Id top, Top());
    if (memo_.size() >= kMaxPickleObjects && !memo_.contains(index)) {
      return Invalid(absl::StrCat("memoizes more than ", kMaxPickleObjects,
                                  " objects"));
    }
    memo_[index] = top;
    return absl::OkStatus();
  }

  absl::Status Put(int width) {
    RETURN_IF_ERROR(Need(width));
    return Remember(ReadLE(width));
  }

  absl::Status Memoize() { return Remember(memo_.size()); }

  absl::Status Get(int width) {
    RETURN_IF_ERROR(Need(width));
    auto it = memo_.find(ReadLE(width));
    if (it == memo_.end()) return Invalid("GET of an unset memo slot");
    stack_.push_back(it->second);
    return absl::OkStatus();
  }

  absl::string_view bytes_;
  size_t pos_ = 0;
  std::vector<Object> objects_;
  std::vector<Id> children_;
  std::vector<std::vector<Id>> containers_;
  // STACK_GLOBAL names (stable addresses).
  std::deque<std::string> owned_;
  std::vector<Id> stack_;
  absl::flat_hash_map<uint64_t, Id> memo_;
};

// What a value is, for messages about values that are not tensors.
std::string Describe(const Machine& m, Id id) {
  const Object& o = m.object(id);
  switch (o.kind) {
    case Object::Kind::kNone: return "None";
    case Object::Kind::kBool: return "a bool";
    case Object::Kind::kInt: return "an int";
    case Object::Kind::kFloat: return "a float";
    case Object::Kind::kString: return "a string";
    case Object::Kind::kBytes: return "bytes";
    case Object::Kind::kTuple: return "a tuple";
    case Object::Kind::kList: return "a list";
    case Object::Kind::kDict: return "a dict";
    case Object::Kind::kGlobal: return "a global";
    case Object::Kind::kPersistent: return "a persistent id";
    case Object::Kind::kCall: {
      const Object& callable = m.object(m.Children(o)[0]);
      if (callable.kind == Object::Kind::kGlobal) {
        return absl::StrCat("made by ", GlobalName(callable.text));
      }
      return "made by a call";
    }
  }
  return "unknown";
}

class StateDictReader {
 public:
  explicit StateDictReader(const Machine& machine) : m_(machine) {}

  absl::StatusOr<std::vector<PickledTensor>> Read(Id root) {
    const Object& dict = m_.object(root);
    if (dict.kind != Object::Kind::kDict) {
      return Invalid(absl::StrCat("the pickled object is ", Describe(m_, root),
                                  ", not a dict of tensors"));
    }
    absl::Span<const Id> items = m_.Children(dict);
    std::vector<PickledTensor> out;
    out.reserve(items.size() / 2);
    absl::flat_hash_set<absl::string_view> names;
    for (size_t i = 0; i + 1 < items.size(); i += 2) {
      const Object& key = m_.object(items[i]);
      if (key.kind != Object::Kind::kString) {
        return Invalid(absl::StrCat("a key that is ", Describe(m_, items[i]),
                                    ", not a string"));
      }
      if (!names.insert(key.text).second) {
        return Invalid(absl::StrCat("two entries named ", Quote(key.text)));
      }
    }
    for (size_t i = 0; i + 1 < items.size(); i += 2) {
      PickledTensor tensor;
      tensor.name = std::string(m_.object(items[i]).text);
      RETURN_IF_ERROR(ReadTensor(items[i + 1], /*parameter_ok=*/true, &tensor));
      out.push_back(std::move(tensor));
    }
    return out;
  }

 private:
  bool IsGlobal(Id id, absl::string_view text) const {
    const Object& o = m_.object(id);
    return o.kind == Object::Kind::kGlobal && o.text == text;
  }
  bool Is(Id id, Object::Kind kind) const {
    return m_.object(id).kind == kind;
  }

  absl::Status Error(const PickledTensor& t, absl::string_view what) const {
    return Invalid(absl::StrCat("tensor ", Quote(t.name), ": ", what));
  }

  absl::StatusOr<std::vector<int64_t>> IntTuple(const PickledTensor& t,
                                                Id id,
                                                absl::string_view what) const {
    if (!Is(id, Object::Kind::kTuple)) {
      return Error(t, absl::StrCat(what, " is not a tuple"));
    }
    std::vector<int64_t> out;
    for (Id item : m_.Children(m_.object(id))) {
      if (!Is(item, Object::Kind::kInt)) {
        return Error(t, absl::StrCat(what, " holds ", Describe(m_, item)));
      }
      out.push_back(m_.object(item).integer);
    }
    return out;
  }

  absl::Status ReadTensor(Id id, bool parameter_ok, PickledTensor* t) const {
    const Object& value = m_.object(id);
    if (value.kind != Object::Kind::kCall) {
      return Error(*t, absl::StrCat("is ", Describe(m_, id),
                                    ", not a tensor"));
    }
    absl::Span<const Id> call = m_.Children(value);
    const Id callable = call[0];
    absl::Span<const Id> args = m_.Children(m_.object(call[1]));
    if (parameter_ok &&
        (IsGlobal(callable, "torch._utils\n_rebuild_parameter") ||
         IsGlobal(callable, "torch._utils\n_rebuild_parameter_with_state"))) {
      // (data, requires_grad, backward_hooks[, state])
      if (args.size() != 3 && args.size() != 4) {
        return Error(*t, "_rebuild_parameter takes 3 or 4 arguments");
      }
      if (!Is(args[1], Object::Kind::kBool)) {
        return Error(*t, "requires_grad is not a bool");
      }
      t->parameter = true;
      RETURN_IF_ERROR(ReadTensor(args[0], /*parameter_ok=*/false, t));
      t->requires_grad = m_.object(args[1]).boolean;
      return absl::OkStatus();
    }
    if (IsGlobal(callable, "torch._utils\n_rebuild_tensor_v2")) {
      t->rebuild = "_rebuild_tensor_v2";
      if (args.size() != 6) {
        return Error(*t, absl::StrCat("_rebuild_tensor_v2 with ", args.size(),
                                      " arguments (6 expected; tensor "
                                      "metadata such as a negation bit is "
                                      "not read)"));
      }
    } else if (IsGlobal(callable, "torch._utils\n_rebuild_tensor_v3")) {
      t->rebuild = "_rebuild_tensor_v3";
      if (args.size() != 7) {
        return Error(*t, absl::StrCat("_rebuild_tensor_v3 with ", args.size(),
                                      " arguments (7 expected)"));
      }
      if (!Is(args[6], Object::Kind::kGlobal)) {
        return Error(*t, "the v3 dtype is not a global");
      }
      t->dtype = GlobalName(m_.object(args[6]).text);
    } else {
      return Error(*t, absl::StrCat("is ", Describe(m_, id),
                                    ", not by _rebuild_tensor_v2/v3"));
    }
    // ('storage', storage class, key, location, size)
    if (!Is(args[0], Object::Kind::kPersistent) ||
        !Is(m_.Children(m_.object(args[0]))[0], Object::Kind::kTuple)) {
      return Error(*t, "its storage is not a persistent id");
    }
    absl::Span<const Id> pid =
        m_.Children(m_.object(m_.Children(m_.object(args[0]))[0]));
    if (pid.size() != 5 || !Is(pid[0], Object::Kind::kString) ||
        m_.object(pid[0]).text != "storage" ||
        !Is(pid[1], Object::Kind::kGlobal) ||
        !Is(pid[2], Object::Kind::kString) ||
        !Is(pid[3], Object::Kind::kString) || !Is(pid[4], Object::Kind::kInt)) {
      return Error(*t, "malformed storage id");
    }
    t->storage_class = GlobalName(m_.object(pid[1]).text);
    t->storage_key = std::string(m_.object(pid[2]).text);
    t->location = std::string(m_.object(pid[3]).text);
    t->storage_size = m_.object(pid[4]).integer;
    if (!Is(args[1], Object::Kind::kInt)) {
      return Error(*t, "its storage offset is not an int");
    }
    t->storage_offset = m_.object(args[1]).integer;
    ASSIGN_OR_RETURN(t->shape, IntTuple(*t, args[2], "size"));
    ASSIGN_OR_RETURN(t->stride, IntTuple(*t, args[3], "stride"));
    if (!Is(args[4], Object::Kind::kBool)) {
      return Error(*t, "requires_grad is not a bool");
    }
    t->requires_grad = m_.object(args[4]).boolean;
    if (!Is(args[5], Object::Kind::kDict) ||
        !m_.Children(m_.object(args[5])).empty()) {
      return Error(*t, "backward hooks are not an empty OrderedDict");
    }
    return absl::OkStatus();
  }

  const Machine& m_;
};

}  // namespace

absl::StatusOr<std::vector<PickledTensor>> ReadStateDictPickle(
    absl::string_view pickle) {
  Machine machine(pickle);
  ASSIGN_OR_RETURN(const Id root, machine.Run());
  return StateDictReader(machine).Read(root);
}

}  // namespace materializer::checkpoint
