// CredentialQueue: the credentials waiting for munged, in shares, so that one user's flood
// delays only that user's calls. A credential's share is the user its connection proved with its
// first decoded call (the uid is known only once munged has decoded one), or the one share of
// the connections not yet proven. Each share holds at most so many credentials (past that its
// next one is refused, UNAVAILABLE, which clients retry), all together at most so many, and the
// shares take turns at the decoders: the next credential decoded is the oldest of the share
// after the one served last. A user flooding credentials while munged is slow fills its own
// share, and every other share waits at most one of its credentials per turn.
//
// Pure: no threads, no clock; the items are the caller's (what to run for each credential).
// Not thread-safe: the caller serialises calls.
#ifndef RDZV_GUARD_CORE_CREDENTIAL_QUEUE_H_
#define RDZV_GUARD_CORE_CREDENTIAL_QUEUE_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace rdzv {

class CredentialQueue {
 public:
  using Item = std::function<void()>;

  struct Limits {
    size_t total = 20'000;    // every share together
    size_t per_user = 8'192;  // one proven user's share
    size_t unproven = 4'096;  // the share of connections not yet proven
  };
  // The share of connections that have not yet proven a user.
  static constexpr absl::string_view kUnproven = "";

  explicit CredentialQueue(Limits limits);

  enum class Pushed { kQueued, kShareFull, kFull };
  // Queues `item` in `share` (a user's key, or kUnproven); kShareFull or kFull when it is
  // refused, and then `item` is dropped.
  Pushed Push(absl::string_view share, Item item);

  // The next item to run, taking the shares in turn; nullopt when nothing waits.
  std::optional<Item> Pop();

  size_t size() const { return size_; }
  size_t waiting(absl::string_view share) const;

 private:
  struct Share {
    std::deque<Item> items;
    bool in_turn = false;  // listed in turns_
  };

  const Limits limits_;
  absl::flat_hash_map<std::string, Share> shares_;
  // The shares with items, in the order they are served next.
  std::deque<std::string> turns_;
  size_t size_ = 0;
};

}  // namespace rdzv

#endif  // RDZV_GUARD_CORE_CREDENTIAL_QUEUE_H_
