// rdzvctl's commands against a running rdzvd: status, watch, abort and health. The shell around
// ctl_options.h and status_format.h: it makes the calls through librdzv's Client (each with the
// --timeout deadline) and writes what they return.
#ifndef RDZV_CLIENT_CTL_CTL_COMMANDS_H_
#define RDZV_CLIENT_CTL_CTL_COMMANDS_H_

#include <ostream>

#include "client/ctl/ctl_options.h"

namespace rdzv {

// Runs `options.command`; writes results to `out` and one-line errors to `err`. Returns the
// process exit code: 0 on success (health: rdzvd is SERVING), 1 when rdzvd could not be asked
// or refused, 2 when the token file cannot be used (bad input, as a bad flag is), 3 when health
// says it is not serving. Blocks; watch runs until its --count.
int RunCtlCommand(const CtlOptions& options, std::ostream& out, std::ostream& err);

}  // namespace rdzv

#endif  // RDZV_CLIENT_CTL_CTL_COMMANDS_H_
