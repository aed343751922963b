#ifndef MATERIALIZER_FUZZ_CHECK_H_
#define MATERIALIZER_FUZZ_CHECK_H_

// FUZZ_CHECK(condition) << "what went wrong": the property checks of the
// fuzz targets. A failed check prints its message and aborts, which
// libFuzzer reports as a crash (and saves the input) and the corpus replay
// reports as a failed test. Unlike assert(), it is on in every build mode.

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace materializer::fuzz::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": property violated: " << condition
            << "\n  ";
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace materializer::fuzz::internal

#define FUZZ_CHECK(condition)                                              \
  if (condition) {                                                         \
  } else                                                                   \
    ::materializer::fuzz::internal::CheckFailure(__FILE__, __LINE__,       \
                                                 #condition)               \
        .stream()

#endif  // MATERIALIZER_FUZZ_CHECK_H_
