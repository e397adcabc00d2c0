#include "server/metrics_text.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace rdzv {
namespace {

// `name{label="value"} ` or `name `, ready for the value.
void AppendSampleStart(std::string& out, absl::string_view name, absl::string_view label,
                       absl::string_view label_value) {
  out.append(name.data(), name.size());
  if (!label.empty())
    absl::StrAppend(&out, "{", label, "=\"", EscapeLabelValue(label_value), "\"}");
  out += ' ';
}

}  // namespace

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (const char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void AppendDouble(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
  } else if (std::isinf(value)) {
    out += value > 0 ? "+Inf" : "-Inf";
  } else {
    char buffer[32];
    const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
    out.append(buffer, result.ptr);
  }
}

void AppendUint(std::string& out, uint64_t value) {
  char buffer[24];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out.append(buffer, result.ptr);
}

void AppendHeader(std::string& out, absl::string_view name, absl::string_view help,
                  absl::string_view type) {
  absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ", type, "\n");
}

void AppendSample(std::string& out, absl::string_view name, absl::string_view label,
                  absl::string_view label_value, double value) {
  AppendSampleStart(out, name, label, label_value);
  AppendDouble(out, value);
  out += '\n';
}

void AppendSample(std::string& out, absl::string_view name, absl::string_view label,
                  absl::string_view label_value, uint64_t value) {
  AppendSampleStart(out, name, label, label_value);
  AppendUint(out, value);
  out += '\n';
}

}  // namespace rdzv
