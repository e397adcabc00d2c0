// Fuzzes the rendezvous state machine with sequences of protocol events; the events and the
// properties checked after each are described in rendezvous_events.h.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/rendezvous_events.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string violation = rdzv::RunRendezvousEvents(data, size);
  rdzv::FuzzCheck(violation.empty(), "rendezvous invariant", violation);
  return 0;
}
