#include "tests/testing/two_hosts.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace rdzv::testing {
namespace {

absl::Status Run(const std::vector<std::string>& argv) {
  Subprocess step(SubprocessOptions{.argv = argv});
  if (step.Wait(absl::Seconds(20)) != 0) {
    return absl::InternalError(absl::StrCat(step.CommandLine(), ": ", step.Stderr()));
  }
  return absl::OkStatus();
}

SubprocessOptions In(const std::string& ns, std::vector<std::string> argv,
                     SubprocessOptions options) {
  options.argv = {"ip", "netns", "exec", ns};
  options.argv.insert(options.argv.end(), argv.begin(), argv.end());
  return options;
}

}  // namespace

absl::Status TwoHosts::Create() {
  if (geteuid() != 0) return absl::FailedPreconditionError("network namespaces need root");
  const std::string id = absl::StrCat(getpid() % 100000);
  ns_a_ = "rdzvA" + id;
  ns_b_ = "rdzvB" + id;
  veth_a_ = "rva" + id;
  veth_b_ = "rvb" + id;
  const std::vector<std::vector<std::string>> setup = {
      {"ip", "netns", "add", ns_a_},
      {"ip", "netns", "add", ns_b_},
      {"ip", "link", "add", veth_a_, "type", "veth", "peer", "name", veth_b_},
      {"ip", "link", "set", veth_a_, "netns", ns_a_},
      {"ip", "link", "set", veth_b_, "netns", ns_b_},
      {"ip", "-n", ns_a_, "addr", "add", std::string(kAddrA) + "/24", "dev", veth_a_},
      {"ip", "-n", ns_b_, "addr", "add", std::string(kAddrB) + "/24", "dev", veth_b_},
      {"ip", "-n", ns_a_, "link", "set", veth_a_, "up"},
      {"ip", "-n", ns_b_, "link", "set", veth_b_, "up"},
      {"ip", "-n", ns_a_, "link", "set", "lo", "up"},
      {"ip", "-n", ns_b_, "link", "set", "lo", "up"},
  };
  for (const auto& argv : setup) {
    if (absl::Status s = Run(argv); !s.ok()) return s;
  }
  return absl::OkStatus();
}

TwoHosts::~TwoHosts() {
  // Deleting a namespace deletes its end of the link, and with it the other end.
  for (const std::string& ns : {ns_a_, ns_b_}) {
    if (!ns.empty()) (void)Run({"ip", "netns", "del", ns});
  }
}

SubprocessOptions TwoHosts::OnA(std::vector<std::string> argv, SubprocessOptions options) const {
  return In(ns_a_, std::move(argv), std::move(options));
}

SubprocessOptions TwoHosts::OnB(std::vector<std::string> argv, SubprocessOptions options) const {
  return In(ns_b_, std::move(argv), std::move(options));
}

absl::Status TwoHosts::CutB() { return Run({"ip", "-n", ns_b_, "link", "set", veth_b_, "down"}); }

}  // namespace rdzv::testing
