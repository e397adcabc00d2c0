// Drives RendezvousState (common/core/rendezvous_state.h) with a sequence of protocol events
// decoded from bytes: joins (new streams, a few jobs, agents, hosts, node ranks, sizes, restarts
// and resumes), streams closing, failure reports, departures and the clock moving on. After each
// step it checks what must hold whatever the sequence:
//   - the ranks of a completed round are a permutation of 0..world-1: each member's block
//     [rank_offset, rank_offset + nproc) from its own join, disjoint, covering the world;
//   - world size is the sum of the members' nproc, and every member of a round is told the same
//     world, node count and agent count; group ranks are 0..nodes-1, local ranks fit the node;
//   - no agent is in a round twice, and a stream belongs to one job and gets at most one
//     assignment per round; nothing is sent on a stream after it was closed;
//   - every abort has a non-zero exit code.
// Used by the libFuzzer harness (rendezvous_events_fuzz.cc) and by the unit test that replays
// its findings (tests/rendezvous_events_test.cc). Pure; no state between calls.
#ifndef RDZV_TESTS_FUZZ_RENDEZVOUS_EVENTS_H_
#define RDZV_TESTS_FUZZ_RENDEZVOUS_EVENTS_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace rdzv {

// Runs the events `data` encodes; returns "" when every property held, else the first one
// violated, with the step it happened at.
std::string RunRendezvousEvents(const uint8_t* data, size_t size);

}  // namespace rdzv

#endif  // RDZV_TESTS_FUZZ_RENDEZVOUS_EVENTS_H_
