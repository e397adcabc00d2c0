#include "server/core/connection_table.h"

#include <utility>

namespace rdzv {

ConnectionTable::ConnectionTable(int max_per_host, absl::Duration first_call_within)
    : max_per_host_(max_per_host), first_call_within_(first_call_within) {}

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

bool ConnectionTable::Admit(absl::string_view host, uint16_t port, Handle handle, absl::Time now,
                            const IsOpen& is_open) {
  Ports& ports = hosts_[host];
  if (max_per_host_ > 0 && ports.size() >= static_cast<size_t>(max_per_host_)) {
    Prune(ports, is_open);
    if (ports.size() >= static_cast<size_t>(max_per_host_)) {
      ++refused_;
      return false;
    }
  }
  // A port seen before belongs to a connection that has closed: the host reuses it.
  auto [it, added] = ports.insert_or_assign(port, Connection{handle, false});
  if (added) ++size_;
  if (first_call_within_ > absl::ZeroDuration()) {
    opened_.push_back(Opened{now, std::string(host), port, handle});
  }
  return true;
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

std::vector<ConnectionTable::Handle> ConnectionTable::TakeOverdue(absl::Time now) {
  std::vector<Handle> overdue;
  while (!opened_.empty() && now - opened_.front().at >= first_call_within_) {
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
