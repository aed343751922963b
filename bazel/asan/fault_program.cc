// A program with one deliberate fault per mode, for asan_detection_test:
//   clean        no fault; uses the uninstrumented protobuf and abseil
//                libraries (allocations crossing them must not be reported)
//   overflow     reads one element past a heap array (ASan)
//   use-after-free
//   signed-overflow  int overflow (UBSan)
//   leak         loses a heap block (LeakSanitizer)
// The faults are hidden from the optimizer with volatile indices.

#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "materializer/v1/materializer.pb.h"

namespace {

volatile int one = 1;

int Clean() {
  materializer::v1::PlanRequest request;
  for (int i = 0; i < 100; ++i) {
    auto* t = request.mutable_model()->add_tensors();
    t->set_name(absl::StrCat("layers.", i, ".weight"));
    t->add_shape(i);
  }
  std::string wire;
  request.SerializeToString(&wire);
  materializer::v1::PlanRequest back;
  return back.ParseFromString(wire) && back.model().tensors_size() == 100 ? 0
                                                                          : 1;
}

int Overflow() {
  std::vector<int>* values = new std::vector<int>(4, 7);
  int* data = values->data();
  const int sum = data[4 * one];  // one past the end
  delete values;
  return sum == 12345 ? 2 : 0;
}

int UseAfterFree() {
  // Through a volatile pointer, so the compiler cannot see the fault.
  int* volatile value = new int(3);
  delete value;
  return *value * one == 12345 ? 2 : 0;
}

int SignedOverflow() {
  volatile int big = std::numeric_limits<int>::max();
  const int result = big + one;
  return result == 0 ? 2 : 0;
}

// volatile: the stores and with them the allocation stay (clang may
// otherwise drop a new whose pointer is overwritten unused).
char* volatile lost;

int Leak() {
  lost = new char[4096];
  std::memset(lost, 1, 4096);
  lost = nullptr;  // the only pointer is gone
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "clean") return Clean();
  if (mode == "overflow") return Overflow();
  if (mode == "use-after-free") return UseAfterFree();
  if (mode == "signed-overflow") return SignedOverflow();
  if (mode == "leak") return Leak();
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 64;
}
