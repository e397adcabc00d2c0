// Agent: what rdzv-agent does once its configuration is settled. Joins the rendezvous (hosting
// the server in-process when configured to), starts this node's workers with their
// environment, forwards their output, and supervises them: the first failure anywhere in the
// job stops every worker on every node, and the agent's exit code is that failure's.
//
// Signals, pipes and timers run on an Asio io_context on the calling thread, and so does every
// decision (AgentLifecycle); the rendezvous reports into that context from threads of its own
// (remote_rendezvous.cc joins on one, as rdzv::Client's join blocks). Run() blocks until the job
// has ended and is called once. Not thread-safe.
#ifndef RDZV_CLIENT_AGENT_AGENT_H_
#define RDZV_CLIENT_AGENT_AGENT_H_

#include <memory>

#include "client/agent/core/agent_options.h"
#include "client/agent/process_launcher.h"
#include "common/clock.h"
#include "common/core/env.h"

namespace rdzv {

// What the agent reads of the process it runs in: its clocks and its environment variables,
// given to it (rdzv-agent's main passes the real ones) so that nothing in it reads them itself.
struct AgentEnv {
  Clock steady_clock;  // monotonic microseconds: how long things take
  Clock wall_clock;    // microseconds since the Unix epoch: times that other hosts read
  // The process environment: the workers inherit it, and TMPDIR (common/core/file_names.h) and
  // TORCHELASTIC_TIMER_FILE are read from it.
  EnvList variables;
};

class Agent {
 public:
  Agent(AgentConfig config, std::unique_ptr<ProcessLauncher> launcher, AgentEnv env);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end and returns the exit code for the agent process: 0 when every
  // worker succeeded, else the first failure's code (128 + signal for a signal).
  int Run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_AGENT_H_
