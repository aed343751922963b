#ifndef MATERIALIZER_CLIENT_FORMAT_H_
#define MATERIALIZER_CLIENT_FORMAT_H_

// Text formatting for matctl: aligned tables, and the progress and summary
// lines of a fetch. Pure functions of their arguments (the clock is passed
// in), so tests pin the exact output.
//
//   Table table({"NAME", "BYTES"});
//   table.SetAlign(1, Table::Align::kRight);
//   table.AddRow({"fc.weight", "8.00 KiB"});
//   std::cout << table.Render();

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace materializer::client {

// Rows of cells, rendered with each column padded to its widest cell and
// columns separated by two spaces. Lines carry no trailing spaces.
//
// Thread-compatible.
class Table {
 public:
  enum class Align { kLeft, kRight };

  // An empty header renders no header row (a key/value listing).
  explicit Table(std::vector<std::string> header = {});

  // Numbers read best right-aligned. Columns are left-aligned by default.
  void SetAlign(size_t column, Align align);

  // A row may have fewer cells than others; the missing ones are blank.
  void AddRow(std::vector<std::string> cells);

  size_t num_rows() const { return rows_.size(); }

  // Every line ends with '\n'; an empty table with no header renders "".
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<Align> align_;
};

// Columns a string occupies on a terminal: one per UTF-8 code point.
size_t DisplayWidth(absl::string_view text);

// "[64, 32]"; "[]" for a scalar.
std::string FormatShape(absl::Span<const int64_t> shape);

// Microseconds as milliseconds with three decimals: 1234 -> "1.234".
std::string FormatMillis(uint64_t micros);

// Decimal megabytes per second with one decimal, "87.3 MB/s"; "-- MB/s"
// when no time has passed.
std::string FormatRate(uint64_t bytes, absl::Duration elapsed);

// Whole seconds, rounded up: "0:07", "12:05", "1:02:03".
std::string FormatEta(absl::Duration remaining);

// One fetch progress line (no '\r', no newline), e.g.
//   [##########----------]  50.0%  1.00 MiB / 2.00 MiB  10.5 MB/s  ETA 0:01
// `done` of `total` bytes are in the file; `transferred` of them arrived in
// `elapsed` (the rest were there before a resume) and set the rate and ETA.
// The percentage is rounded down, so 100.0% means complete.
std::string FormatProgressLine(uint64_t done, uint64_t total,
                               uint64_t transferred, absl::Duration elapsed);

// The line printed when a fetch completes, e.g.
//   2097152 bytes (2.00 MiB) in 1.50 s, 1.4 MB/s
//   1048576 bytes (1.00 MiB) in 0.50 s, 2.1 MB/s; resumed at byte 1048576
//   of 2097152
std::string FormatFetchSummary(uint64_t file_bytes, uint64_t transferred,
                               absl::Duration elapsed);

// Decides when a fetch's progress line is redrawn: on the first update, at
// most once per kMinInterval after that, and always on completion.
//
// Thread-compatible.
class ProgressMeter {
 public:
  static constexpr absl::Duration kMinInterval = absl::Milliseconds(100);

  explicit ProgressMeter(absl::Time start) : start_(start) {}

  // The file now holds `done` of `total` bytes. The first call's `done` is
  // the baseline: bytes already there before this transfer (a resume).
  // Returns the line to draw, or nullopt when it is too early to redraw.
  std::optional<std::string> Update(uint64_t done, uint64_t total,
                                    absl::Time now);

  bool started() const { return started_; }
  uint64_t done() const { return done_; }
  uint64_t total() const { return total_; }
  // Bytes that arrived during this transfer.
  uint64_t transferred() const { return done_ - baseline_; }

 private:
  const absl::Time start_;
  absl::Time last_draw_ = absl::InfinitePast();
  bool started_ = false;
  uint64_t baseline_ = 0;
  uint64_t done_ = 0;
  uint64_t total_ = 0;
};

// A JSON string literal, quotes included, with ", \ and control characters
// escaped.
std::string JsonQuote(absl::string_view text);

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_FORMAT_H_
