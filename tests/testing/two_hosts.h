// Two test hosts with addresses of their own on one machine: network namespaces joined by a veth
// pair, which the test makes and always deletes (the destructor). Traffic stays between them.
// Needs root; Create() says so otherwise.
#ifndef RDZV_TESTS_TESTING_TWO_HOSTS_H_
#define RDZV_TESTS_TESTING_TWO_HOSTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/testing/subprocess.h"

namespace rdzv::testing {

class TwoHosts {
 public:
  static constexpr char kAddrA[] = "10.231.77.1";
  static constexpr char kAddrB[] = "10.231.77.2";

  TwoHosts() = default;
  ~TwoHosts();
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  // Makes both namespaces, each with loopback and its end of the link up.
  absl::Status Create();

  // `argv` run on host A or B (the other options as given).
  SubprocessOptions OnA(std::vector<std::string> argv, SubprocessOptions options = {}) const;
  SubprocessOptions OnB(std::vector<std::string> argv, SubprocessOptions options = {}) const;

  // The link's name on each host (for GLOO_SOCKET_IFNAME).
  const std::string& link_a() const { return veth_a_; }
  const std::string& link_b() const { return veth_b_; }

  // Pulls B's cable: its end of the link goes down, and from then on packets between the hosts
  // are lost without a word to either side, as when a node loses power or its network.
  absl::Status CutB();

 private:
  std::string ns_a_, ns_b_, veth_a_, veth_b_;
};

}  // namespace rdzv::testing

#endif  // RDZV_TESTS_TESTING_TWO_HOSTS_H_
