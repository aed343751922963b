#include "server/checkpoint/pickle.h"

#include <string>

#include "server/checkpoint/test_files.h"
#include "tests/testing/status_matchers.h"

namespace materializer::checkpoint {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TestPickle;
using testing::TestTensor;

// data.pkl as torch.save (torch 2.11) writes it for
// OrderedDict(w=torch.zeros(2, 3)): memo opcodes after every object, and
// SETITEM for the one entry.
std::string TorchStyle() {
  return std::string(
      "\200\002ccollections\nOrderedDict\nq\000)Rq\001X\001\000\000"
      "\000wq\002ctorch._utils\n_rebuild_tensor_v2\nq\003((X\007"
      "\000\000\000storageq\004ctorch\nFloatStorage\nq\005X\001\000"
      "\000\0000q\006X\003\000\000\000cpuq\007K\006tq\010QK\000K"
      "\002K\003\206q\011K\003K\001\206q\n\211h\000)Rq\013tq\014Rq"
      "\015s.",
      169);
}

TEST(PickleTest, ReadsATorchSavePickle) {
  ASSERT_OK_AND_ASSIGN(std::vector<PickledTensor> tensors,
                       ReadStateDictPickle(TorchStyle()));
  ASSERT_EQ(tensors.size(), 1u);
  const PickledTensor& t = tensors[0];
  EXPECT_EQ(t.name, "w");
  EXPECT_EQ(t.rebuild, "_rebuild_tensor_v2");
  EXPECT_EQ(t.storage_class, "torch.FloatStorage");
  EXPECT_EQ(t.storage_key, "0");
  EXPECT_EQ(t.location, "cpu");
  EXPECT_EQ(t.storage_size, 6);
  EXPECT_EQ(t.storage_offset, 0);
  EXPECT_THAT(t.shape, ElementsAre(2, 3));
  EXPECT_THAT(t.stride, ElementsAre(3, 1));
  EXPECT_FALSE(t.requires_grad);
  EXPECT_FALSE(t.parameter);
}

// Module.state_dict() pickles an OrderedDict, then BUILDs its `_metadata`
// (a dict of dicts) onto it.
TEST(PickleTest, AcceptsAndIgnoresStateDictMetadata) {
  TestTensor w;
  w.storage_numel = 2;
  w.shape = {2};
  w.stride = {1};
  TestPickle p;
  p.EmptyOrderedDict().Op('q').Raw(std::string(1, '\0'));
  p.Op('(').String("w").Tensor(w).Op('u');
  p.Op('}').String("_metadata").EmptyOrderedDict();
  p.Op('(').String("").Op('}').String("version").Int(1).Op('s');
  p.String("layer").Op('}').String("version").Int(1).Op('s').Op('u');
  p.Op('s').Op('b');
  ASSERT_OK_AND_ASSIGN(std::vector<PickledTensor> tensors,
                       ReadStateDictPickle(p.Finish()));
  ASSERT_EQ(tensors.size(), 1u);
  EXPECT_EQ(tensors[0].name, "w");
}

TEST(PickleTest, ReadsV3AndParameters) {
  TestTensor f8;
  f8.v3_dtype = "float8_e4m3fn";
  f8.storage_numel = 4;
  f8.shape = {4};
  f8.stride = {1};
  TestTensor h;
  h.storage_class = "HalfStorage";
  h.key = "1";
  h.storage_numel = 2;
  h.shape = {2};
  h.stride = {1};
  TestPickle p;
  p.Op('}').Op('(').String("f8").Tensor(f8).String("p");
  p.Global("torch._utils", "_rebuild_parameter").Op('(').Tensor(h);
  p.Op('\x88').EmptyOrderedDict().Op('t').Op('R').Op('u');
  ASSERT_OK_AND_ASSIGN(std::vector<PickledTensor> tensors,
                       ReadStateDictPickle(p.Finish()));
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].rebuild, "_rebuild_tensor_v3");
  EXPECT_EQ(tensors[0].dtype, "torch.float8_e4m3fn");
  EXPECT_EQ(tensors[0].storage_class, "torch.storage.UntypedStorage");
  EXPECT_EQ(tensors[1].name, "p");
  EXPECT_TRUE(tensors[1].parameter);
  EXPECT_TRUE(tensors[1].requires_grad);
  EXPECT_EQ(tensors[1].storage_class, "torch.HalfStorage");
}

TEST(PickleTest, RefusesWhatIsNotAStateDictWithoutRunningIt) {
  const std::string p = TorchStyle();
  const std::pair<std::string, std::string> cases[] = {
      {p.substr(0, p.size() - 1), "no STOP"},
      {p.substr(0, 40), "truncated"},
      {p + "N", "bytes after STOP"},
      {std::string("\x80\x02]q\x00.", 6), "is a list, not a dict of tensors"},
      {std::string("\x80\x02i", 3), "unsupported opcode 0x69"},  // INST
      {std::string("\x80\x02h\x05.", 5), "GET of an unset memo slot"},
      {std::string("\x80\x02}(K\x01K\x02u.", 10), "a key that is an int"},
      {TestPickle().Op('}').Op('(').String("x").Int(3).Op('u').Finish(),
       "tensor \"x\": is an int, not a tensor"},
      // A call is a record, never made: os.system is not run.
      {TestPickle().Op('}').Op('(').String("x").Global("os", "system")
           .Op('(').String("touch /tmp/pwned").Op('t').Op('R').Op('u')
           .Finish(),
       "tensor \"x\": is made by os.system, not by _rebuild_tensor_v2/v3"},
      {TestPickle().Op('}').Op('(').String("x").Int(1).String("x").Int(2)
           .Op('u').Finish(),
       "two entries named \"x\""},
      {TestPickle().Op('u').Finish(), "no mark"},
      {TestPickle().Op('}').Op('(').String("x").Op('u').Finish(),
       "odd number"},
  };
  for (const auto& [pickle, reason] : cases) {
    EXPECT_THAT(ReadStateDictPickle(pickle),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(reason)))
        << reason;
  }
}

TEST(PickleTest, RefusesTensorArgumentsItDoesNotRead) {
  TestTensor t;
  t.storage_numel = 2;
  t.shape = {2};
  t.stride = {1};
  // A seventh argument (tensor metadata such as the negation bit).
  TestPickle p;
  p.Op('}').Op('(').String("t");
  p.Global("torch._utils", "_rebuild_tensor_v2").Op('(');
  p.Op('(').String("storage").Global("torch", "FloatStorage").String("0");
  p.String("cpu").Int(2).Op('t').Op('Q').Int(0).IntTuple({2}).IntTuple({1});
  p.Op('\x89').EmptyOrderedDict().Op('}').Op('t').Op('R').Op('u');
  EXPECT_THAT(ReadStateDictPickle(p.Finish()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("_rebuild_tensor_v2 with 7 arguments")));
}

// Cycles and deep nesting are plain data to the machine: no recursion, no
// leak (the sanitizer builds check both).
TEST(PickleTest, SurvivesCyclesAndDeepNesting) {
  // d = {}; d["d"] = d
  EXPECT_THAT(ReadStateDictPickle(std::string("\x80\x02}q\x00X\x01\x00\x00"
                                              "\x00" "dh\x00s.",
                                              15)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor \"d\": is a dict")));
  TestPickle deep;
  deep.Op('}').Op('(').String("t").Op(')');
  for (int i = 0; i < 1000000; ++i) deep.Op('\x85');  // ((((),),),)...
  deep.Op('u');
  EXPECT_THAT(ReadStateDictPickle(deep.Finish()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor \"t\": is a tuple")));
}

TEST(PickleTest, RefusesMoreObjectsThanTheLimit) {
  std::string many("\x80\x02)");
  many.append(kMaxPickleObjects, '\x85');
  many += ".";
  EXPECT_THAT(ReadStateDictPickle(many),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("builds more than 4194304 objects")));
}

}  // namespace
}  // namespace materializer::checkpoint
