// Which address an agent-hosted rendezvous server listens on: the one the other nodes reach this
// host at, decided from what the server's host resolves to here, this host's addresses and, for a
// name that resolves to loopback, the address Slurm has for the node.
#include "client/agent/server_locator.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace rdzv {
namespace {

struct Case {
  const char* what;
  std::string server_host;
  std::vector<std::string> resolved;
  std::vector<std::string> local;
  std::string slurm;  // Slurm's NodeAddr; "" when it cannot tell
  std::string listen;
  bool noted;  // a line says why the server listens on every address
  bool asks_slurm;
};

TEST(EmbeddedListenAddressTest, ListensWhereTheOtherNodesReachThisHost) {
  const std::vector<std::string> local = {"10.0.0.5", "192.168.7.5", "fd00::5"};
  const std::vector<Case> cases = {
      {"an address of this host", "10.0.0.5", {"10.0.0.5"}, local, "", "10.0.0.5", false, false},
      {"a name of one of its addresses",
       "n5",
       {"192.168.7.5"},
       local,
       "",
       "192.168.7.5",
       false,
       false},
      {"the first of its addresses that is this host's",
       "n5",
       {"fd00::99", "10.0.0.5"},
       local,
       "",
       "10.0.0.5",
       false,
       false},
      {"an IPv6 address", "n5", {"fd00::5"}, local, "", "fd00::5", false, false},
      // The local test cluster: every node is 127.0.0.1 (Slurm's NodeAddr for the node name).
      {"a loopback address", "127.0.0.1", {"127.0.0.1"}, local, "", "127.0.0.1", false, false},
      {"a name of loopback only, Slurm knowing no better",
       "n1",
       {"::1", "127.0.0.1"},
       local,
       "",
       "127.0.0.1",
       false,
       true},
      {"a name of loopback, Slurm saying loopback too",
       "n1",
       {"127.0.1.1"},
       local,
       "127.0.0.1",
       "127.0.1.1",
       false,
       true},
      // A hosts file that maps the host's own name to 127.0.1.1, while the others resolve it to
      // the address Slurm has.
      {"a name of loopback here that Slurm puts on this host's address",
       "n5",
       {"127.0.1.1"},
       local,
       "10.0.0.5",
       "10.0.0.5",
       false,
       true},
      {"a name that does not resolve", "n5", {}, local, "", "0.0.0.0", true, false},
      {"a name of another host's address", "n5", {"10.9.9.9"}, local, "", "0.0.0.0", true, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    int asked = 0;
    ListenFacts facts;
    facts.server_host = c.server_host;
    facts.resolved = c.resolved;
    facts.local = c.local;
    facts.slurm_address = [&] {
      ++asked;
      return c.slurm;
    };
    const ListenChoice choice = EmbeddedListenAddress(facts);
    EXPECT_EQ(choice.address, c.listen);
    EXPECT_EQ(!choice.note.empty(), c.noted) << choice.note;
    EXPECT_EQ(asked, c.asks_slurm ? 1 : 0);
    if (c.noted) {
      EXPECT_NE(choice.note.find(c.server_host), std::string::npos) << choice.note;
      EXPECT_NE(choice.note.find("listens on every address"), std::string::npos) << choice.note;
    }
  }
}

// An address literal needs no resolver and no Slurm: LocateServer leaves slurm_address unset.
TEST(EmbeddedListenAddressTest, WorksWithoutSlurm) {
  ListenFacts facts;
  facts.server_host = "n1";
  facts.resolved = {"127.0.0.1"};
  EXPECT_EQ(EmbeddedListenAddress(facts).address, "127.0.0.1");
}

}  // namespace
}  // namespace rdzv
