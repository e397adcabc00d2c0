#include "guard/core/connection_table.h"

#include <algorithm>
#include <utility>

namespace rdzv {

ConnectionTable::ConnectionTable(Limits limits) : limits_(limits) {}

void ConnectionTable::Prune(Ports& ports, const IsOpen& is_open) {
  for (auto it = ports.begin(); it != ports.end();) {
    if (is_open(it->second.handle)) {
      ++it;
    } else {
      ports.erase(it++);
      --size_;
    }
  }
}

bool ConnectionTable::Full(const Ports& ports) const {
  const size_t all = limits_.max_per_host > 0 ? static_cast<size_t>(limits_.max_per_host) : 0;
  if (all > 0 && ports.size() >= all) return true;
  const size_t unproven_bound =
      limits_.max_unproven_per_host > 0 ? static_cast<size_t>(limits_.max_unproven_per_host) : all;
  if (unproven_bound == 0 || ports.size() < unproven_bound) return false;
  size_t unproven = 0;
  for (const auto& [port, c] : ports) unproven += c.called ? 0 : 1;
  return unproven >= unproven_bound;
}

ConnectionTable::Admission ConnectionTable::Admit(absl::string_view host, uint16_t port,
                                                  Handle handle, Micros now, const IsOpen& is_open,
                                                  uint64_t random) {
  Admission admission;
  Ports& ports = hosts_[host];
  // A port seen before belongs to a connection that has closed: the host reuses it.
  if (auto reused = ports.find(port); reused != ports.end()) {
    ports.erase(reused);
    --size_;
  }
  if (Full(ports)) Prune(ports, is_open);
  while (Full(ports)) {
    // Room is made among the unproven: a random one past its grace, else the oldest.
    std::vector<std::pair<Micros, uint16_t>> unproven;
    for (const auto& [p, c] : ports) {
      if (!c.called) unproven.emplace_back(c.opened, p);
    }
    if (unproven.empty()) {
      ++refused_;
      return admission;
    }
    std::sort(unproven.begin(), unproven.end());
    size_t past_grace = 0;
    const Micros grace = absl::ToInt64Microseconds(limits_.grace);
    while (past_grace < unproven.size() && now - unproven[past_grace].first >= grace) {
      ++past_grace;
    }
    const uint16_t victim =
        past_grace > 0 ? unproven[random % past_grace].second : unproven.front().second;
    auto it = ports.find(victim);
    admission.dropped.push_back(it->second.handle);
    ports.erase(it);
    --size_;
    ++dropped_;
  }
  ports.emplace(port, Connection{handle, now, false});
  ++size_;
  if (limits_.first_call_within > absl::ZeroDuration()) {
    opened_.push_back(Opened{now, std::string(host), port, handle});
  }
  admission.admitted = true;
  return admission;
}

void ConnectionTable::CallAccepted(absl::string_view host, uint16_t port) {
  auto h = hosts_.find(host);
  if (h == hosts_.end()) return;
  auto c = h->second.find(port);
  if (c != h->second.end()) c->second.called = true;
}

std::optional<ConnectionTable::Handle> ConnectionTable::Find(absl::string_view host,
                                                             uint16_t port) const {
  auto h = hosts_.find(host);
  if (h == hosts_.end()) return std::nullopt;
  auto c = h->second.find(port);
  if (c == h->second.end()) return std::nullopt;
  return c->second.handle;
}

std::vector<ConnectionTable::Handle> ConnectionTable::TakeOverdue(Micros now) {
  std::vector<Handle> overdue;
  const Micros within = absl::ToInt64Microseconds(limits_.first_call_within);
  while (!opened_.empty() && now - opened_.front().at >= within) {
    const Opened& o = opened_.front();
    auto h = hosts_.find(o.host);
    if (h != hosts_.end()) {
      auto c = h->second.find(o.port);
      if (c != h->second.end() && c->second.handle == o.handle && !c->second.called) {
        overdue.push_back(o.handle);
        h->second.erase(c);
        --size_;
        if (h->second.empty()) hosts_.erase(h);
      }
    }
    opened_.pop_front();
  }
  return overdue;
}

void ConnectionTable::Sweep(const IsOpen& is_open) {
  for (auto h = hosts_.begin(); h != hosts_.end();) {
    Prune(h->second, is_open);
    if (h->second.empty()) {
      hosts_.erase(h++);
    } else {
      ++h;
    }
  }
}

}  // namespace rdzv
