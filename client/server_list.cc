#include "client/server_list.h"

#include <grpcpp/create_channel.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/client_channel.h"
#include "common/core/host_port.h"
#include "common/net.h"

namespace rdzv {

absl::StatusOr<std::unique_ptr<ServerList>> ServerList::Make(const ClientOptions& options) {
  absl::StatusOr<ClientChannelSetup> setup = MakeClientChannelSetup(options);
  if (!setup.ok()) return setup.status();
  std::vector<std::string> names;
  if (absl::StartsWith(options.endpoint, "unix:")) {
    names.push_back(options.endpoint);
  } else {
    // A server list: the primary first, its backups after it.
    absl::StatusOr<std::vector<std::string>> list =
        SplitServerList("the endpoint", options.endpoint);
    if (!list.ok()) return list.status();
    names = *std::move(list);
  }
  names.insert(names.end(), options.alternate_endpoints.begin(), options.alternate_endpoints.end());
  std::vector<Server> servers;
  for (const std::string& name : names) {
    Server s;
    if (absl::StartsWith(name, "unix:")) {
      // A node's relay (client/agent/node_relay.h): a socket in a directory of this user's own.
      s.name = name;
    } else {
      absl::StatusOr<HostPort> hp = ParseHostPort(name, 29400);
      if (!hp.ok()) return hp.status();
      s.name = FormatHostPort(hp->host, hp->port);
      // Without a credential only a server on this host's loopback can take the calls: any
      // other would refuse each one, and a wait for it could only end at the join timeout.
      if (!options.auth.none_because.empty() && !ReachesOnlyThisHost(hp->host)) {
        return absl::FailedPreconditionError(
            absl::StrFormat("cannot prove who this process is to the rendezvous server at %s: %s",
                            s.name, options.auth.none_because));
      }
    }
    s.channel = grpc::CreateCustomChannel(s.name, setup->credentials, setup->args);
    s.stub = v1::Rendezvous::NewStub(s.channel);
    servers.push_back(std::move(s));
  }
  return std::unique_ptr<ServerList>(new ServerList(std::move(servers)));
}

size_t ServerList::MoveOn(size_t from) {
  size_t expected = from;
  current_.compare_exchange_strong(expected, (from + 1) % servers_.size());
  return current_;
}

bool ServerList::JoinProofRequired(size_t i) const {
  return several() || ProofRequiredAt(servers_[i].name);
}

std::string ServerList::Names() const {
  std::vector<std::string> names;
  for (const Server& s : servers_) names.push_back(s.name);
  // An agent's candidates, one host's consecutive ports, read better as a range.
  std::vector<HostPort> parsed;
  for (const std::string& name : names) {
    absl::StatusOr<HostPort> hp = ParseHostPort(name, 0);
    if (hp.ok()) parsed.push_back(*hp);
  }
  bool range = parsed.size() > 2 && parsed.size() == names.size();
  for (size_t i = 1; range && i < parsed.size(); ++i) {
    range = parsed[i].host == parsed[0].host && parsed[i].port == parsed[i - 1].port + 1;
  }
  if (range) {
    return absl::StrFormat("%s ports %d-%d", names.front().substr(0, names.front().rfind(':')),
                           parsed.front().port, parsed.back().port);
  }
  return absl::StrJoin(names, " or ");
}

bool MovesOn(absl::StatusCode code, bool several) {
  return code == absl::StatusCode::kUnavailable || (code == absl::StatusCode::kNotFound && several);
}

absl::StatusOr<JoinOpening> OpenJoin(JoinStream& stream, const ServerList& servers, size_t i,
                                     const ClientAuth& auth, const v1::JoinRequest& request,
                                     absl::Time wait_until) {
  const std::string nonce = NewNonce();
  const std::string& job = request.job_id();
  if (absl::Status s = AttachCredential(stream.context(), auth, "Join", job, nonce); !s.ok()) {
    return s;
  }
  stream.Start(servers.at(i).stub.get(), request);
  const bool required = servers.JoinProofRequired(i);
  // Nothing the stream carries counts before this: no assignment, no abort.
  JoinOpening opening;
  opening.headers = stream.AwaitHeaders(wait_until);
  switch (opening.headers) {
    case JoinStream::Headers::kWaiting:
      stream.Abandon();
      opening.proof = absl::FailedPreconditionError("it sent nothing in answer");
      return opening;
    case JoinStream::Headers::kNone:
      // Ended at once: a refusal, whose proof (if any) came with its status.
      stream.LetEnd();
      stream.AwaitDone();
      opening.proof = CheckServerProof(stream.context(), auth, "Join", job, nonce, required);
      return opening;
    case JoinStream::Headers::kArrived:
      break;
  }
  opening.proof = CheckServerProof(stream.context(), auth, "Join", job, nonce, required);
  if (!opening.proof.ok()) stream.Abandon();
  return opening;
}

}  // namespace rdzv
