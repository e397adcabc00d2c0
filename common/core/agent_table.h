// AgentTable: the agents of one job's round as the rendezvous state keeps them, compact. At
// 100,000 agents a job's table is most of what rdzvd holds, so each agent is one record of
// fixed size (AgentRecord, 48 bytes), its agent id and host name sit back to back in one pool of
// bytes (each after a one- or two-byte length), and the index from agent id to record costs
// 4 bytes a slot. A round's agent with a 30-byte id and a 14-byte host name takes about 100 bytes
// here, where a map of strings to full records took over 400.
//
// What a record keeps is what the rules read once a round has formed: the agent's place (its
// Slot), its node (node index, global order, worker count) and identity (agent id and host, for
// status and for naming a lost node), the stream it is attached on, and how it went (left,
// finished, lost, spare, waiting for ranks in a rebuilt job). What only the forming of a round
// reads (addresses, ports, where it connected from) is kept elsewhere, and not for long.
//
// An index stays the agent's until Erase; a later Add may reuse it. Indices are dense: a table
// iterates in index order, which is the order agents were added in as long as none was erased.
//
// Not thread-safe. Movable: indices and records move with the table; a table moved from may
// only be assigned to or destroyed.
#ifndef RDZV_COMMON_CORE_AGENT_TABLE_H_
#define RDZV_COMMON_CORE_AGENT_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

// One agent of a round. Its node index and order are within 32 bits (ValidateJoinSpec bounds
// them by --nnodes).
struct AgentRecord {
  uint64_t stream = 0;  // the StreamId it is attached on; 0: none
  Slot slot;            // its place once its round formed (all zero for a spare)
  int32_t node_index = -1;
  int32_t order = -1;
  int32_t nproc = 1;
  bool left : 1 = false;      // it left (Leave), or a lost spare went
  bool finished : 1 = false;  // it left while the job ran, not a spare: its workers succeeded
  bool lost : 1 = false;      // its stream ended without a word after the job ended
  bool spare : 1 = false;     // a hot spare of the running round: no ranks
  // In a job rebuilt from resuming agents: it joined afresh and waits for its ranks.
  bool unranked : 1 = false;
  // It gave --master-addr, --master-port (the job's, which every agent that gives one shares).
  bool gave_master_addr : 1 = false;
  bool gave_master_port : 1 = false;

 private:
  friend class AgentTable;
  bool erased_ : 1 = false;
  uint64_t name_ = 0;  // where its agent id and host name start in the table's pool
};
static_assert(sizeof(AgentRecord) == 48, "the record's size is stated in the header");

// The encoding of the table's pool, for others that keep strings the same way: a length as a
// base-128 varint (one byte up to 127, two up to 16,383), then the bytes.
void AppendLengthPrefixed(std::string& pool, absl::string_view bytes);
// The string at `at` in `pool`, which one of the above wrote; moves `at` past it.
absl::string_view ReadLengthPrefixed(absl::string_view pool, size_t& at);

class AgentTable {
 public:
  using Index = uint32_t;
  static constexpr Index kNone = ~Index{0};

  AgentTable();
  ~AgentTable();
  AgentTable(AgentTable&& other) noexcept;
  AgentTable& operator=(AgentTable&& other) noexcept;
  AgentTable(const AgentTable&) = delete;
  AgentTable& operator=(const AgentTable&) = delete;

  // Adds `agent`, whose agent id the table does not hold, and returns its index. The record
  // takes the spec's node index, order and worker count; the rest of it starts at its defaults.
  Index Add(const AgentSpec& agent);
  // The index of the agent with id `agent_id`, or kNone.
  Index Find(absl::string_view agent_id) const;
  bool contains(absl::string_view agent_id) const { return Find(agent_id) != kNone; }
  // The agent at `i` joined again as `agent` (the same agent id, or another that the table does
  // not hold): its record takes the spec's numbers and its names; the rest of it stays.
  void Update(Index i, const AgentSpec& agent);
  // Forgets the agent at `i`, which must be in use.
  void Erase(Index i);
  void Clear();
  // Gives back what growing left unused (a round that formed takes no more agents), and the
  // names of erased records.
  void ShrinkToFit();

  AgentRecord& operator[](Index i) { return store_->records[i]; }
  const AgentRecord& operator[](Index i) const { return store_->records[i]; }
  // Valid until the table changes.
  absl::string_view agent_id(Index i) const;
  absl::string_view host(Index i) const;
  // The agent as it was added: its record's numbers and its names, an AgentSpec again.
  AgentSpec Spec(Index i) const;

  size_t size() const { return store_->records.size() - store_->free.size(); }
  bool empty() const { return size() == 0; }
  // The bytes the table holds: records, names and index, as allocated.
  size_t held_bytes() const;

  // The indices in use, ascending. Erasing the index an iterator is at leaves it valid.
  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = Index;
    using difference_type = std::ptrdiff_t;
    using pointer = const Index*;
    using reference = Index;

    const_iterator() = default;
    Index operator*() const { return i_; }
    const_iterator& operator++();
    const_iterator operator++(int) {
      const_iterator before = *this;
      ++*this;
      return before;
    }
    bool operator==(const const_iterator& other) const { return i_ == other.i_; }

   private:
    friend class AgentTable;
    const_iterator(const AgentTable* table, Index i) : table_(table), i_(i) {}
    void SkipErased();
    const AgentTable* table_ = nullptr;
    Index i_ = 0;
  };
  const_iterator begin() const;
  const_iterator end() const;

 private:
  // Behind a pointer, so that the index's functions, which read it, survive a move.
  struct Store {
    std::vector<AgentRecord> records;
    std::string names;
    std::vector<Index> free;  // erased records, for the next Add
    size_t dead_bytes = 0;    // of `names`, held by erased records
  };
  struct IdHash {
    using is_transparent = void;
    const Store* store;
    size_t operator()(Index i) const;
    size_t operator()(absl::string_view id) const;
  };
  struct IdEq {
    using is_transparent = void;
    const Store* store;
    bool operator()(Index a, Index b) const { return a == b; }
    bool operator()(Index a, absl::string_view b) const;
    bool operator()(absl::string_view a, Index b) const { return (*this)(b, a); }
  };
  using IdIndex = absl::flat_hash_set<Index, IdHash, IdEq>;

  // The names pool rewritten without the names of erased records, once they hold most of it.
  void MaybeCompact();
  void Compact();

  std::unique_ptr<Store> store_;
  IdIndex index_;
};

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_AGENT_TABLE_H_
