#include "common/core/host_port.h"

#include <arpa/inet.h>

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rdzv {

absl::StatusOr<std::vector<std::string>> SplitServerList(absl::string_view what,
                                                         absl::string_view text, size_t taken) {
  std::vector<std::string> servers;
  for (absl::string_view e : absl::StrSplit(text, ',')) {
    e = absl::StripAsciiWhitespace(e);
    if (e.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s \"%s\" has an empty entry; give HOST:PORT,HOST:PORT", what, text));
    }
    servers.emplace_back(e);
  }
  if (servers.size() + taken > kMaxServerList) {
    return absl::InvalidArgumentError(
        taken == 0
            ? absl::StrFormat("%s lists %d servers; give at most %d (a primary and its backups)",
                              what, servers.size(), kMaxServerList)
            : absl::StrFormat("%s lists %d servers; give at most %d, as a list has at most %d, "
                              "this one among them",
                              what, servers.size(), kMaxServerList - taken, kMaxServerList));
  }
  return servers;
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text, int default_port) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "endpoint \"%s\" is malformed (%s); expected HOST:PORT, e.g. node1:29400", text, why));
  };
  if (text.empty()) return bad("empty");
  HostPort hp;
  absl::string_view port_text;
  if (text.front() == '[') {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos) return bad("missing ']'");
    hp.host = std::string(text.substr(1, close - 1));
    absl::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return bad("junk after ']'");
      port_text = rest.substr(1);
      if (port_text.empty()) return bad("missing port");
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon != absl::string_view::npos && text.find(':') != colon) {
      return bad("IPv6 addresses need brackets");
    }
    hp.host = std::string(text.substr(0, colon));
    if (colon != absl::string_view::npos) {
      port_text = text.substr(colon + 1);
      if (port_text.empty()) return bad("missing port");
    }
  }
  if (hp.host.empty()) return bad("missing host");
  hp.port = default_port;
  if (!port_text.empty()) {
    if (!absl::SimpleAtoi(port_text, &hp.port) || hp.port < 1 || hp.port > 65535) {
      return bad("port is not a number in 1..65535");
    }
  }
  if (hp.port < 1 || hp.port > 65535) return bad("missing port");
  return hp;
}

std::string FormatHostPort(absl::string_view host, int port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

bool IsLoopbackAddress(absl::string_view address) {
  absl::ConsumePrefix(&address, "[");
  absl::ConsumeSuffix(&address, "]");
  if (address == "localhost" || address == "::1") return true;
  // Parsed, not matched by prefix: "127.example.org" is a name that may resolve anywhere.
  in_addr a4;
  const std::string text(address);
  return inet_pton(AF_INET, text.c_str(), &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127;
}

}  // namespace rdzv
