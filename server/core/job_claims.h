// JobClaims: which server of a list (rdzvd --peers) takes up a job that its agents bring to more
// than one server at once, so that a job runs whole on one server or on none.
//
// A server takes a job up only when none of its peers serves it; a join of a job it does not
// know waits while it asks them. Two servers asking about one job at once settle it by their
// random instance numbers:
//   - asked while asking itself, a server says it holds the job to an asker of a higher number;
//   - to an asker of a lower number it says it does not, and then takes the job up for none of
//     its own joins for kConcedeFor (its own answers may come back empty before the asker has
//     taken the job).
// Only the higher-numbered server concedes, so the lowest-numbered asker never waits on another.
// A server that is not asking concedes nothing: if it asks later, the asker either serves the job
// by then or is still asking, and the numbers decide. A question of its own (its own address in
// its peer list, as when every server is given the same list) is answered no.
//
// Pure: the caller passes the time and what its own state knows. Not thread-safe.
#ifndef RDZV_SERVER_CORE_JOB_CLAIMS_H_
#define RDZV_SERVER_CORE_JOB_CLAIMS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

class JobClaims {
 public:
  // How long a server that yielded a job refuses it itself: longer than its own question may take
  // (the shell checks this against its question's timeout).
  static constexpr Micros kConcedeFor = 3'000'000;
  // How many yielded jobs are remembered at once; past it, the server says it holds the job (the
  // asker refuses its agents, which try again).
  static constexpr size_t kMaxConceded = 65536;

  explicit JobClaims(uint64_t instance, size_t max_conceded = kMaxConceded)
      : instance_(instance), max_conceded_(max_conceded) {}

  uint64_t instance() const { return instance_; }

  // A peer of instance number `asker` asks whether this server holds the job `key`. `serves`: this
  // server's state has it; `asking`: this server is asking its peers about it too. The answer.
  bool Answer(const std::string& key, bool serves, bool asking, uint64_t asker, Micros now);

  enum class Verdict {
    kTakeUp,           // no peer serves it: join it to the state
    kServedElsewhere,  // a peer said it holds it: refuse, naming that peer
    kYielded,          // this server yielded it to an asker lately: refuse for now
  };
  // This server's own question about `key` came back; `held_elsewhere` when a peer said it holds
  // it.
  Verdict Decide(const std::string& key, bool held_elsewhere, Micros now);

  // Forgets what has expired.
  void Sweep(Micros now);
  // The jobs yielded and not yet expired or swept.
  size_t yielded() const { return yielded_.size(); }

 private:
  const uint64_t instance_;
  const size_t max_conceded_;
  // Jobs yielded to a peer, until when.
  absl::flat_hash_map<std::string, Micros> yielded_;
};

}  // namespace rdzv

#endif  // RDZV_SERVER_CORE_JOB_CLAIMS_H_
