#include "client/format.h"

#include <algorithm>
#include <utility>

#include "absl/numeric/int128.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/common/units.h"

namespace materializer::client {
namespace {

constexpr int kBarWidth = 20;

}  // namespace

Table::Table(std::vector<std::string> header)
    : header_(std::move(header)), align_(header_.size(), Align::kLeft) {}

void Table::SetAlign(size_t column, Align align) {
  if (column >= align_.size()) align_.resize(column + 1, Align::kLeft);
  align_[column] = align;
}

void Table::AddRow(std::vector<std::string> cells) {
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  size_t columns = header_.size();
  for (const auto& row : rows_) columns = std::max(columns, row.size());
  std::vector<size_t> widths(columns, 0);
  const auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], DisplayWidth(row[i]));
    }
  };
  measure(header_);
  for (const auto& row : rows_) measure(row);

  std::string out;
  const auto render_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < columns; ++i) {
      const std::string empty;
      const std::string& cell = i < row.size() ? row[i] : empty;
      const std::string padding(widths[i] - DisplayWidth(cell), ' ');
      if (i > 0) line += "  ";
      const bool right = i < align_.size() && align_[i] == Align::kRight;
      absl::StrAppend(&line, right ? padding : "", cell, right ? "" : padding);
    }
    // Left-aligned last columns (and blank cells) would leave trailing
    // spaces that only get in the way of diff and grep.
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  };
  if (!header_.empty()) render_row(header_);
  for (const auto& row : rows_) render_row(row);
  return out;
}

size_t DisplayWidth(absl::string_view text) {
  size_t width = 0;
  for (const char c : text) {
    // Count every byte except UTF-8 continuation bytes (10xxxxxx).
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++width;
  }
  return width;
}

std::string FormatShape(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string FormatMillis(uint64_t micros) {
  return absl::StrFormat("%d.%03d", micros / 1000, micros % 1000);
}

std::string FormatRate(uint64_t bytes, absl::Duration elapsed) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  if (!(seconds > 0)) return "-- MB/s";
  return absl::StrFormat("%.1f MB/s",
                         static_cast<double>(bytes) / 1e6 / seconds);
}

std::string FormatEta(absl::Duration remaining) {
  const int64_t total = absl::ToInt64Seconds(
      absl::Ceil(std::max(remaining, absl::ZeroDuration()), absl::Seconds(1)));
  const int64_t hours = total / 3600;
  const int64_t minutes = total / 60 % 60;
  const int64_t seconds = total % 60;
  if (hours > 0) {
    return absl::StrFormat("%d:%02d:%02d", hours, minutes, seconds);
  }
  return absl::StrFormat("%d:%02d", minutes, seconds);
}

std::string FormatProgressLine(uint64_t done, uint64_t total,
                               uint64_t transferred, absl::Duration elapsed) {
  // Integer permille, rounded down, so the bar and the percentage reach
  // their end only when every byte is there.
  const uint64_t permille =
      total == 0 ? 1000
                 : absl::Uint128Low64(absl::uint128(std::min(done, total)) *
                                      1000 / total);
  const int filled = static_cast<int>(permille * kBarWidth / 1000);
  const std::string bar = absl::StrCat(std::string(filled, '#'),
                                       std::string(kBarWidth - filled, '-'));

  std::string eta = "--:--";
  const double seconds = absl::ToDoubleSeconds(elapsed);
  if (done >= total) {
    eta = FormatEta(absl::ZeroDuration());
  } else if (transferred > 0 && seconds > 0) {
    const double rate = static_cast<double>(transferred) / seconds;
    eta = FormatEta(absl::Seconds(static_cast<double>(total - done) / rate));
  }
  return absl::StrFormat("[%s] %3d.%d%%  %s / %s  %s  ETA %s", bar,
                         permille / 10, permille % 10, FormatBytes(done),
                         FormatBytes(total), FormatRate(transferred, elapsed),
                         eta);
}

std::string FormatFetchSummary(uint64_t file_bytes, uint64_t transferred,
                               absl::Duration elapsed) {
  std::string line = absl::StrFormat(
      "%d bytes (%s) in %.2f s, %s", transferred, FormatBytes(transferred),
      absl::ToDoubleSeconds(elapsed), FormatRate(transferred, elapsed));
  if (transferred != file_bytes) {
    absl::StrAppend(&line, "; resumed at byte ", file_bytes - transferred,
                    " of ", file_bytes);
  }
  return line;
}

std::optional<std::string> ProgressMeter::Update(uint64_t done, uint64_t total,
                                                 absl::Time now) {
  if (!started_) {
    started_ = true;
    baseline_ = done;
  }
  done_ = done;
  total_ = total;
  if (done < total && now - last_draw_ < kMinInterval) return std::nullopt;
  last_draw_ = now;
  return FormatProgressLine(done_, total_, transferred(), now - start_);
}

std::string JsonQuote(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  out += "\"";
  return out;
}

}  // namespace materializer::client
