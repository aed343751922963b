// Runs a fuzz target's LLVMFuzzerTestOneInput over the files named on the
// command line (folders: every file below them, in name order), the way a
// libFuzzer binary replays a corpus, but without libFuzzer: the committed
// corpora run as ordinary tests in the g++ build and under --config=asan.
//
//   replay [-timeout=SECONDS] PATH...
//
// Fails (exit 1) when no input is found, so an empty or misplaced corpus
// cannot pass, and when one input runs longer than -timeout seconds (default
// 25, libFuzzer's flag name), so a regression input for a quadratic path
// fails as a test instead of only slowing the suite. A target that finds a
// property violated aborts; the input's name is printed before it runs.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc,
                                                          char*** argv);

namespace {

namespace fs = std::filesystem;

// Files under `path` (or `path` itself), sorted.
bool CollectInputs(const std::string& path, std::vector<std::string>* out) {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    std::vector<std::string> found;
    for (fs::recursive_directory_iterator it(path, error), end;
         !error && it != end; it.increment(error)) {
      if (it->is_regular_file(error)) found.push_back(it->path().string());
    }
    if (error) {
      std::fprintf(stderr, "replay: cannot list %s: %s\n", path.c_str(),
                   error.message().c_str());
      return false;
    }
    std::sort(found.begin(), found.end());
    out->insert(out->end(), found.begin(), found.end());
    return true;
  }
  if (fs::is_regular_file(path, error)) {
    out->push_back(path);
    return true;
  }
  std::fprintf(stderr, "replay: %s is neither a file nor a folder\n",
               path.c_str());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  double timeout_s = 25;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (std::strncmp(arg, "-timeout=", 9) == 0) {
      timeout_s = std::atof(arg + 9);
      continue;
    }
    if (arg[0] == '-') continue;  // other libFuzzer flags mean nothing here
    if (!CollectInputs(arg, &inputs)) return 1;
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "replay: no inputs (usage: %s [-timeout=S] PATH...)\n",
                 argv[0]);
    return 1;
  }
  int slow = 0;
  for (const std::string& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
      return 1;
    }
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(),
                 bytes.size());
    const auto start = std::chrono::steady_clock::now();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                           bytes.size());
    const double seconds = std::chrono::duration<double>(
                               std::chrono::steady_clock::now() - start)
                               .count();
    if (seconds > timeout_s) {
      std::fprintf(stderr, "replay: SLOW INPUT %s took %.1f s (limit %.0f s)\n",
                   path.c_str(), seconds, timeout_s);
      ++slow;
    }
  }
  std::fprintf(stderr, "replay: %zu inputs, %d over the time limit\n",
               inputs.size(), slow);
  return slow == 0 ? 0 : 1;
}
