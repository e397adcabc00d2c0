#include "client/agent/core/watchdog_request.h"

#include <cmath>
#include <map>
#include <utility>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rdzv {
namespace {

struct Null {};
using Value = std::variant<Null, bool, double, std::string>;

// A reader for the one JSON shape the protocol uses: a flat object.
class FlatJson {
 public:
  explicit FlatJson(absl::string_view text) : s_(text) {}

  absl::StatusOr<std::map<std::string, Value>> Object() {
    std::map<std::string, Value> fields;
    Skip();
    if (!Eat('{')) return Error("expected a JSON object");
    Skip();
    if (Eat('}')) return End(std::move(fields));
    for (;;) {
      Skip();
      absl::StatusOr<std::string> key = String();
      if (!key.ok()) return key.status();
      Skip();
      if (!Eat(':')) return Error("expected ':'");
      Skip();
      absl::StatusOr<Value> value = Scalar();
      if (!value.ok()) return value.status();
      fields[*key] = *std::move(value);
      Skip();
      if (Eat(',')) continue;
      if (Eat('}')) return End(std::move(fields));
      return Error("expected ',' or '}'");
    }
  }

 private:
  absl::StatusOr<std::map<std::string, Value>> End(std::map<std::string, Value> fields) {
    Skip();
    if (i_ != s_.size()) return Error("text after the object");
    return fields;
  }

  absl::StatusOr<Value> Scalar() {
    if (i_ >= s_.size()) return Error("value missing");
    const char c = s_[i_];
    if (c == '"') {
      absl::StatusOr<std::string> str = String();
      if (!str.ok()) return str.status();
      return Value(*std::move(str));
    }
    if (Word("true")) return Value(true);
    if (Word("false")) return Value(false);
    if (Word("null")) return Value(Null{});
    const size_t start = i_;
    while (i_ < s_.size() &&
           (absl::ascii_isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' ||
            s_[i_] == '+' || s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
    }
    double number = 0;
    if (start == i_ || !absl::SimpleAtod(s_.substr(start, i_ - start), &number) ||
        !std::isfinite(number)) {
      i_ = start;
      return Error("expected a string, number, true, false or null");
    }
    return Value(number);
  }

  absl::StatusOr<std::string> String() {
    if (!Eat('"')) return Error("expected a string");
    std::string out;
    while (i_ < s_.size()) {
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= s_.size()) break;
      const char e = s_[i_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          absl::StatusOr<uint32_t> cp = CodePoint();
          if (!cp.ok()) return cp.status();
          AppendUtf8(*cp, out);
          break;
        }
        default:
          return Error("unknown escape in a string");
      }
    }
    return Error("unterminated string");
  }

  // After "\u": four hex digits, or a surrogate pair written as two escapes.
  absl::StatusOr<uint32_t> CodePoint() {
    absl::StatusOr<uint32_t> first = Hex4();
    if (!first.ok()) return first;
    if (*first < 0xD800 || *first > 0xDFFF) return first;
    if (*first > 0xDBFF || s_.substr(i_, 2) != "\\u") return Error("unpaired surrogate");
    i_ += 2;
    absl::StatusOr<uint32_t> second = Hex4();
    if (!second.ok()) return second;
    if (*second < 0xDC00 || *second > 0xDFFF) return Error("unpaired surrogate");
    return 0x10000 + ((*first - 0xD800) << 10) + (*second - 0xDC00);
  }

  absl::StatusOr<uint32_t> Hex4() {
    uint32_t v = 0;
    if (s_.size() - i_ < 4) return Error("short \\u escape");
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        return Error("bad \\u escape");
      }
    }
    return v;
  }

  static void AppendUtf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  bool Word(absl::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool Eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void Skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrFormat("%s at offset %d", what, i_));
  }

  absl::string_view s_;
  size_t i_ = 0;
};

const double* Number(const std::map<std::string, Value>& f, const std::string& key) {
  auto it = f.find(key);
  return it == f.end() ? nullptr : std::get_if<double>(&it->second);
}

bool IsWhole(double v) { return std::floor(v) == v && std::fabs(v) < 9e15; }

}  // namespace

absl::StatusOr<WatchdogRequest> ParseWatchdogLine(absl::string_view line) {
  if (line.size() > kMaxWatchdogLine) {
    return absl::InvalidArgumentError(
        absl::StrFormat("line of %d bytes (at most %d)", line.size(), kMaxWatchdogLine));
  }
  absl::StatusOr<std::map<std::string, Value>> parsed = FlatJson(line).Object();
  if (!parsed.ok()) return parsed.status();
  const std::map<std::string, Value>& f = *parsed;

  const double* version = Number(f, "version");
  if (version == nullptr || *version != 1) {
    return absl::InvalidArgumentError("\"version\" must be 1");
  }
  const double* pid = Number(f, "pid");
  if (pid == nullptr || !IsWhole(*pid) || *pid <= 0) {
    return absl::InvalidArgumentError("\"pid\" must be a positive whole number");
  }
  WatchdogRequest r;
  r.pid = static_cast<int64_t>(*pid);

  if (auto hb = f.find("heartbeat"); hb != f.end()) {
    const bool* on = std::get_if<bool>(&hb->second);
    if (on == nullptr || !*on) return absl::InvalidArgumentError("\"heartbeat\" must be true");
    r.kind = WatchdogRequest::Kind::kHeartbeat;
    return r;
  }

  for (const auto& [key, request] : {std::pair{"exclude_node", RankRequest::kExcludeNode},
                                     std::pair{"no_restart", RankRequest::kNoRestart}}) {
    auto it = f.find(key);
    if (it == f.end()) continue;
    const std::string* words = std::get_if<std::string>(&it->second);
    if (words == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("\"%s\" must be a string", key));
    }
    r.kind = WatchdogRequest::Kind::kRankRequest;
    r.request = request;
    // Shown on every node's terminal: one printable line.
    for (const char c : *words) {
      if (r.reason.size() > kMaxRankRequestReasonBytes) break;
      const auto u = static_cast<unsigned char>(c);
      r.reason.push_back(u < 0x20 || u == 0x7f ? ' ' : c);
    }
    r.reason.resize(Utf8Cut(r.reason, kMaxRankRequestReasonBytes));
    return r;
  }

  auto scope = f.find("scope_id");
  const std::string* scope_id =
      scope == f.end() ? nullptr : std::get_if<std::string>(&scope->second);
  if (scope_id == nullptr) {
    return absl::InvalidArgumentError("neither \"heartbeat\" nor a string \"scope_id\"");
  }
  r.scope = *scope_id;
  const double* expiration = Number(f, "expiration_time");
  if (expiration == nullptr) {
    return absl::InvalidArgumentError("\"expiration_time\" must be a number");
  }
  if (const double* sig = Number(f, "signal"); sig != nullptr && IsWhole(*sig)) {
    r.signal = static_cast<int32_t>(*sig);
  }
  if (*expiration < 0) {
    r.kind = WatchdogRequest::Kind::kRelease;
    return r;
  }
  // Seconds since the epoch; years past 2200 are no deadline anyone means.
  if (*expiration > 7.3e9) {
    return absl::InvalidArgumentError("\"expiration_time\" is not a time in seconds");
  }
  r.kind = WatchdogRequest::Kind::kAcquire;
  r.expiration_us = static_cast<Micros>(std::llround(*expiration * 1e6));
  return r;
}

}  // namespace rdzv
