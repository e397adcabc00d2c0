// Slurm's compact list syntaxes, parsed without scontrol so that they work inside containers
// that have no Slurm client installed.
//
// A hostlist such as "gpu[001-004,009],login1" names hosts by a prefix, a bracketed set of
// numeric ranges and an optional suffix; SLURM_TASKS_PER_NODE such as "2(x3),1" gives a task
// count per node with run-length repeats. These functions are pure (no I/O, no environment) and
// thread-safe.
//
// Error messages are one line that starts with the quoted input, so that a caller can prefix the
// variable it read, e.g. `SLURM_JOB_NODELIST="n[" is malformed (...); expected e.g. n[1-3,5]`.

#ifndef RDZV_COMMON_CORE_HOSTLIST_H_
#define RDZV_COMMON_CORE_HOSTLIST_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace rdzv {

// The most names one hostlist, or entries one tasks-per-node value, may expand to: twice the
// 100,000 nodes of the largest job rdzv is built for. Larger inputs are refused
// before anything is allocated: such a value is a typo (n[1-10000000]) or garbage, and a bound
// near what real jobs need keeps every parse of a few KiB of environment quick (a million names
// took seconds under ASan).
inline constexpr std::size_t kMaxHostlistExpansion = 200'000;

// The longest host name ExpandHostlist produces. Linux allows 64 characters and DNS 253, so a
// longer name is garbage; refusing it also bounds what an expansion allocates, which would
// otherwise grow with the product of the name's length and the number of names (a 4 KB value
// could ask for gigabytes).
inline constexpr std::size_t kMaxHostNameLength = 255;

// The most characters, all names together, one hostlist may expand to. kMaxHostlistExpansion
// names or names of 255 characters are each fine, but not both at once: 100,000 nodes with
// 64-character names need 6.4 MB, and 6.5 MiB keeps the slowest hostlist of a few KiB within a
// second under ASan (64 MiB took 8.6 s).
inline constexpr std::size_t kMaxHostlistCharacters = std::size_t{13} << 19;

// Expands a Slurm hostlist into host names, in the order Slurm lists them.
//
// Accepts plain names ("n1"), ranges ("n[1-3]"), several ranges ("a[1-2,5,7-9]"), zero padding
// whose width is kept ("gpu[001-016]"), suffixes ("rack1-n[1-4]-ib"), several comma-separated
// groups ("a[1-2],b3") and several brackets in one name ("r[1-2]n[1-2]": the cartesian product,
// the first bracket varying slowest). Returns InvalidArgumentError for empty or malformed input,
// whitespace, control characters, descending ranges, lists over kMaxHostlistExpansion names or
// kMaxHostlistCharacters characters, and names over kMaxHostNameLength characters.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view hostlist);

// Compresses host names into hostlist syntax, the inverse of ExpandHostlist.
//
// Adjacent names that differ only in their last number are merged into one bracket, with runs of
// consecutive numbers written as ranges: {n1,n2,n3,n5} -> "n[1-3,5]". Zero padding is kept, and
// padded numbers only share a bracket with numbers of the same width. Only adjacent names are
// merged so that the order is kept exactly: ExpandHostlist(CompressHostlist(x)) == x for any
// non-empty list of at most kMaxHostlistExpansion non-empty names of at most kMaxHostNameLength
// characters without ',', '[', ']', whitespace or control characters, sorted or not. Returns "" for
// an empty list.
std::string CompressHostlist(const std::vector<std::string>& hosts);

// Expands Slurm's SLURM_TASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE syntax into one task count per
// node: "2(x3),1" -> {2,2,2,1}, "4" -> {4}.
//
// Returns InvalidArgumentError for empty or malformed input, counts below 1, and values over
// kMaxHostlistExpansion entries.
absl::StatusOr<std::vector<int>> ExpandTasksPerNode(std::string_view value);

// Writes task counts in Slurm's SLURM_TASKS_PER_NODE syntax, the inverse of ExpandTasksPerNode:
// runs of equal adjacent counts become "count(xrepeat)", single ones stay plain, as Slurm writes
// them: {2,2,2,1} -> "2(x3),1", {4} -> "4". ExpandTasksPerNode(FormatTasksPerNode(x)) == x for
// any non-empty list of counts from 1 to kMaxHostlistExpansion. Returns "" for an empty list.
std::string FormatTasksPerNode(const std::vector<int>& counts);

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_HOSTLIST_H_
