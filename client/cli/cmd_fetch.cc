// fetch: a handle's weights into a file.

#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>

#include "absl/time/clock.h"
#include "client/cli/command.h"
#include "client/cli/render.h"
#include "client/format.h"
#include "server/common/status_macros.h"

namespace materializer::client::cli {
namespace {

v1::WeightFormat FormatNamed(const std::string& name) {
  if (name == "torch") return v1::WEIGHT_FORMAT_TORCH;
  if (name == "raw") return v1::WEIGHT_FORMAT_RAW;
  return v1::WEIGHT_FORMAT_SAFETENSORS;  // the flag table allows no other
}

}  // namespace

absl::Status RunFetch(Invocation& invocation) {
  const FlagValues& flags = invocation.flags();
  const std::string& handle = invocation.arg(0);
  const std::string path = flags.String("o");

  FetchFileOptions options;
  options.resume = flags.Bool("resume");
  options.format = FormatNamed(flags.String("format", "safetensors"));
  options.include = flags.List("include");
  options.exclude = flags.List("exclude");
  options.write_ties_once = flags.Bool("write_ties_once");
  options.include_non_persistent = flags.Bool("include_non_persistent");
  // The flag table caps it at 32 bits.
  options.chunk_bytes =
      static_cast<uint32_t>(flags.Bytes("chunk_bytes", kFetchChunkBytes));

  // Progress goes to a terminal only, never into a redirected stderr.
  const bool draw = isatty(STDERR_FILENO) != 0;
  bool drawn = false;
  const absl::Time start = absl::Now();
  ProgressMeter meter(start);
  options.progress = [&](uint64_t done, uint64_t total) {
    std::optional<std::string> line = meter.Update(done, total, absl::Now());
    if (draw && line.has_value()) {
      // \r returns to the line's start; ESC[K clears what a longer
      // previous line left behind.
      std::fprintf(stderr, "\r%s\x1b[K", line->c_str());
      std::fflush(stderr);
      drawn = true;
    }
  };
  const absl::StatusOr<FetchResult> result =
      FetchToFile(invocation.client(), handle, path, options);
  const absl::Duration elapsed = absl::Now() - start;
  if (drawn) std::fputs("\n", stderr);
  RETURN_IF_ERROR(result.status());

  if (invocation.json()) {
    JsonObject out;
    out.Str("handle", handle)
        .Str("path", path)
        .U64("totalBytes", result->total_bytes)
        .Str("digest", result->digest)
        .Bool("verified", result->verified);
    PrintJson(invocation.out(), out);
  } else {
    invocation.out() << "wrote " << path << ": "
                     << FormatFetchSummary(result->total_bytes,
                                           meter.transferred(), elapsed)
                     << "\ndigest " << result->digest << " (verified)\n";
  }
  return absl::OkStatus();
}

}  // namespace materializer::client::cli
