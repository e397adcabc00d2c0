#include "tests/fuzz/rendezvous_events.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/core/rendezvous_state.h"

namespace rdzv {
namespace {

// Hands out the input's bytes; zeros once it is used up.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return size_ == 0; }
  int Next(int bound) {
    if (size_ == 0) return 0;
    --size_;
    return *data_++ % bound;
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

constexpr int kJobs = 2;
constexpr int kAgents = 6;
constexpr int kMaxSteps = 400;

struct StreamInfo {
  std::string job_id;
  std::string agent_id;
  int32_t nproc = 0;
  bool closed = false;           // the state closed it
  bool closed_by_agent = false;  // StreamClosed was called for it
  std::set<int32_t> rounds;      // rounds it got an assignment for
};

class Checker {
 public:
  std::string Run(Bytes& in) {
    for (step_ = 0; step_ < kMaxSteps && !in.empty(); ++step_) {
      Decisions out;
      Step(in, out);
      if (std::string v = Check(out); !v.empty()) return absl::StrCat("step ", step_, ": ", v);
      // A job every agent left is forgotten; its id may start afresh at round 1.
      for (int j = 0; j < kJobs; ++j) {
        if (!state_.Status(JobId(j)).empty()) continue;
        std::erase_if(member_round_, [&](const auto& e) { return e.first.first == JobId(j); });
        std::erase_if(whole_rounds_,
                      [&](const auto& e) { return std::get<0>(e.first) == JobId(j); });
      }
    }
    return "";
  }

 private:
  static std::string JobId(int j) { return absl::StrCat("job", j); }
  static std::string AgentId(int a) { return absl::StrCat("agent", a); }

  void Step(Bytes& in, Decisions& out) {
    now_ += 1000;
    switch (in.Next(6)) {
      case 0:
      case 1:
        Join(in, out);
        break;
      case 2:
        if (next_stream_ > 1) {
          const StreamId stream =
              1 + static_cast<StreamId>(in.Next(static_cast<int>(next_stream_ - 1)));
          if (!streams_[stream].closed_by_agent) {
            streams_[stream].closed_by_agent = true;
            state_.StreamClosed(now_, stream, out);
          }
        }
        break;
      case 3: {
        const std::string job = JobId(in.Next(kJobs));
        const std::string agent = AgentId(in.Next(kAgents));
        FailureInfo failure;
        const int cause = in.Next(4);
        failure.cause = cause == 0   ? AbortCause::kAgentSignalled
                        : cause == 1 ? AbortCause::kAgentLost
                                     : AbortCause::kWorkerFailed;
        failure.exit_code = in.Next(3);  // 0 too: a report may claim success
        failure.rank = in.Next(8);
        absl::StatusOr<AbortEvent> abort = state_.ReportFailure(now_, job, agent, failure, out);
        if (abort.ok() && abort->exit_code == 0) violation_ = "ReportFailure returned exit code 0";
        break;
      }
      case 4:
        state_.Leave(now_, JobId(in.Next(kJobs)), AgentId(in.Next(kAgents)), out).IgnoreError();
        break;
      default:
        now_ += int64_t{in.Next(256)} * 100'000;
        state_.Tick(now_, out);
        break;
    }
  }

  void Join(Bytes& in, Decisions& out) {
    JoinSpec spec;
    const int job = in.Next(kJobs);
    const int agent = in.Next(kAgents);
    spec.job_id = JobId(job);
    spec.agent.agent_id = AgentId(agent);
    spec.agent.host = absl::StrCat("h", in.Next(4));
    spec.agent.node_index = in.Next(7) - 1;
    spec.agent.order = in.Next(7) - 1;
    spec.agent.nproc = 1 + in.Next(4);
    spec.min_agents = 1 + in.Next(3);
    spec.max_agents = spec.min_agents + in.Next(3);
    spec.last_call = int64_t{in.Next(4)} * 1'000'000;
    spec.restart_count = in.Next(3);
    // Hot spares, now and then: valid only with node ranks, one agent per node and fewer spares
    // than nodes; the others are refused.
    if (in.Next(4) == 0) spec.spare_nodes = in.Next(3);
    spec.master_port = 29500;
    spec.addresses = {spec.agent.host};
    // An agent id names one agent process, whose host, node rank and worker count never change
    // (rdzv-agent makes a new id per process): later joins of the same id repeat the first.
    auto [known, fresh] = agents_.try_emplace({spec.job_id, spec.agent.agent_id}, spec.agent);
    if (!fresh) spec.agent = known->second;
    if (const int restarts = in.Next(4); restarts > 0) spec.max_restarts = restarts - 1;
    if (in.Next(8) == 0) {
      auto it = last_assignment_.find({spec.job_id, spec.agent.agent_id});
      if (it != last_assignment_.end()) spec.resume = it->second;
    }
    const StreamId stream = next_stream_++;
    StreamInfo& info = streams_[stream];
    info.job_id = spec.job_id;
    info.agent_id = spec.agent.agent_id;
    info.nproc = spec.agent.nproc;
    state_.Join(now_, stream, spec, out);
  }

  std::string Check(const Decisions& out) {
    if (!violation_.empty()) return violation_;
    // (job, round) -> the assignments this step sent for it, by stream.
    std::map<std::pair<std::string, int32_t>, std::vector<std::pair<StreamId, AssignmentEvent>>>
        rounds;
    for (const Decisions::Send& send : out.sends) {
      auto it = streams_.find(send.stream);
      if (it == streams_.end()) return absl::StrCat("send on unknown stream ", send.stream);
      StreamInfo& s = it->second;
      if (s.closed) return absl::StrCat("send on stream ", send.stream, " after its close");
      if (send.event >= out.events.size()) return "a send of an event that is not there";
      const Event event = out.EventOf(send);
      if (const auto* abort = std::get_if<AbortEvent>(&event)) {
        if (abort->exit_code == 0) return "an abort with exit code 0";
      }
      const auto* a = std::get_if<AssignmentEvent>(&event);
      if (a == nullptr) continue;
      if (!s.rounds.insert(a->round).second) {
        return absl::StrCat("stream ", send.stream, " got two assignments for round ", a->round);
      }
      if (a->spare) {
        // A spare has no ranks: nothing of it is in the round's tiling.
        if (a->slot.rank_offset != 0 || a->slot.local_world_size != 0) {
          return absl::StrCat("stream ", send.stream, ": a spare with ranks");
        }
        last_assignment_[{s.job_id, s.agent_id}] = *a;
        continue;
      }
      rounds[{s.job_id, a->round}].emplace_back(send.stream, *a);
    }
    for (const Decisions::Close& close : out.closes) {
      auto it = streams_.find(close.stream);
      if (it == streams_.end()) return absl::StrCat("close of unknown stream ", close.stream);
      it->second.closed = true;
    }
    for (const auto& [key, assignments] : rounds) {
      if (std::string v = CheckRound(key.first, key.second, assignments); !v.empty()) return v;
    }
    return "";
  }

  std::string CheckRound(const std::string& job, int32_t round,
                         const std::vector<std::pair<StreamId, AssignmentEvent>>& assignments) {
    const AssignmentEvent& first = assignments.front().second;
    std::set<std::string> agents;
    for (const auto& [stream, a] : assignments) {
      const StreamInfo& s = streams_[stream];
      if (!agents.insert(s.agent_id).second) {
        return absl::StrCat(job, " round ", round, ": ", s.agent_id, " assigned twice");
      }
      if (a.world_size != first.world_size || a.group_world_size != first.group_world_size ||
          a.agents != first.agents || a.restart_count != first.restart_count) {
        return absl::StrCat(job, " round ", round, ": members told different sizes");
      }
      if (a.slot.group_rank < 0 || a.slot.group_rank >= a.group_world_size) {
        return absl::StrCat(job, " round ", round, ": group rank ", a.slot.group_rank,
                            " outside 0..", a.group_world_size - 1);
      }
      if (a.slot.local_rank_offset < 0 ||
          int64_t{a.slot.local_rank_offset} + s.nproc > a.slot.local_world_size) {
        return absl::StrCat(job, " round ", round, ": local ranks ", a.slot.local_rank_offset, "+",
                            s.nproc, " outside the node's ", a.slot.local_world_size);
      }
      // An agent in a round of one job is not in another round of it at the same time.
      auto [it, fresh] = member_round_.try_emplace({job, s.agent_id}, round);
      if (!fresh && it->second > round) {
        return absl::StrCat(job, ": ", s.agent_id, " assigned to round ", round, " after round ",
                            it->second);
      }
      it->second = round;
      last_assignment_[{job, s.agent_id}] = a;
    }
    // A whole round (not one member resuming into it): its blocks of ranks tile 0..world-1.
    if (static_cast<int32_t>(assignments.size()) != first.agents) {
      for (const auto& [stream, a] : assignments) {
        auto it = whole_rounds_.find({job, round, streams_[stream].agent_id});
        if (it != whole_rounds_.end() && (it->second.slot.rank_offset != a.slot.rank_offset ||
                                          it->second.world_size != a.world_size)) {
          return absl::StrCat(job, " round ", round, ": ", streams_[stream].agent_id,
                              " resumed into another place");
        }
      }
      return "";
    }
    std::vector<std::pair<int64_t, int64_t>> blocks;
    int64_t world = 0;
    std::set<int32_t> group_ranks;
    for (const auto& [stream, a] : assignments) {
      const int32_t nproc = streams_[stream].nproc;
      blocks.emplace_back(a.slot.rank_offset, a.slot.rank_offset + int64_t{nproc});
      world += nproc;
      group_ranks.insert(a.slot.group_rank);
      whole_rounds_[{job, round, streams_[stream].agent_id}] = a;
    }
    if (world != first.world_size) {
      return absl::StrCat(job, " round ", round, ": world size ", first.world_size,
                          " but the members run ", world, " workers");
    }
    if (static_cast<int32_t>(group_ranks.size()) != first.group_world_size) {
      return absl::StrCat(job, " round ", round, ": ", group_ranks.size(),
                          " group ranks for a group world of ", first.group_world_size);
    }
    std::sort(blocks.begin(), blocks.end());
    int64_t next = 0;
    for (const auto& [lo, hi] : blocks) {
      if (lo != next) {
        return absl::StrCat(job, " round ", round, ": ranks are not a permutation of 0..",
                            world - 1, " (a block starts at ", lo, ", expected ", next, ")");
      }
      next = hi;
    }
    return "";
  }

  RendezvousState state_;
  Micros now_ = 1'000'000'000;
  int step_ = 0;
  StreamId next_stream_ = 1;
  std::string violation_;
  std::map<StreamId, StreamInfo> streams_;
  std::map<std::pair<std::string, std::string>, AgentSpec> agents_;
  std::map<std::pair<std::string, std::string>, int32_t> member_round_;
  std::map<std::pair<std::string, std::string>, AssignmentEvent> last_assignment_;
  std::map<std::tuple<std::string, int32_t, std::string>, AssignmentEvent> whole_rounds_;
};

}  // namespace

std::string RunRendezvousEvents(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  Checker checker;
  return checker.Run(in);
}

}  // namespace rdzv
