// Writing Prometheus's text exposition format (version 0.0.4): escaping, numbers, the HELP and
// TYPE lines and samples. Pure functions that append to a string; thread-safe.
#ifndef RDZV_SERVER_METRICS_TEXT_H_
#define RDZV_SERVER_METRICS_TEXT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace rdzv {

// The label value as it appears between the quotes of a sample (backslash, double quote and
// line feed escaped), and the HELP text (backslash and line feed).
std::string EscapeLabelValue(absl::string_view value);
std::string EscapeHelp(absl::string_view help);

// The shortest text that reads back as the same double; NaN, +Inf and -Inf as Prometheus
// spells them.
void AppendDouble(std::string& out, double value);
void AppendUint(std::string& out, uint64_t value);

// "# HELP name help\n# TYPE name type\n".
void AppendHeader(std::string& out, absl::string_view name, absl::string_view help,
                  absl::string_view type);

// `name{label="value"} 12\n`, or `name 12\n` when `label` is empty.
void AppendSample(std::string& out, absl::string_view name, absl::string_view label,
                  absl::string_view label_value, double value);
void AppendSample(std::string& out, absl::string_view name, absl::string_view label,
                  absl::string_view label_value, uint64_t value);

}  // namespace rdzv

#endif  // RDZV_SERVER_METRICS_TEXT_H_
