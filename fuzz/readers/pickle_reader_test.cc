#include "fuzz/readers/pickle_reader.h"

#include <string>

#include "tests/testing/status_matchers.h"

namespace materializer::fuzz {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

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

TEST(PickleReaderTest, ReadsAStateDictWithMemo) {
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
  EXPECT_THAT(t.shape, ElementsAre(2, 3));
  EXPECT_THAT(t.stride, ElementsAre(3, 1));
  EXPECT_FALSE(t.requires_grad);
}

TEST(PickleReaderTest, RefusesTruncatedAndForeignPickles) {
  const std::string p = TorchStyle();
  EXPECT_THAT(ReadStateDictPickle(p.substr(0, p.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no STOP")));
  EXPECT_THAT(ReadStateDictPickle(p.substr(0, 20)),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  // A list instead of a dict.
  EXPECT_THAT(ReadStateDictPickle(std::string("\200\002]q\000.", 6)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is a list, not a dict of tensors")));
  // INST, an opcode that would construct an object.
  EXPECT_THAT(ReadStateDictPickle(std::string("\200\002i", 3)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unsupported opcode 0x69")));
  ASSERT_OK_AND_ASSIGN(std::vector<PickledTensor> none,
                       ReadStateDictPickle(std::string("\200\002}q\000.", 6)));
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace materializer::fuzz
