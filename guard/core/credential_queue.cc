#include "guard/core/credential_queue.h"

#include <utility>

namespace rdzv {

CredentialQueue::CredentialQueue(Limits limits) : limits_(limits) {}

CredentialQueue::Pushed CredentialQueue::Push(absl::string_view share, Item item) {
  if (size_ >= limits_.total) return Pushed::kFull;
  const size_t bound = share == kUnproven ? limits_.unproven : limits_.per_user;
  auto [it, fresh] = shares_.try_emplace(share);
  Share& s = it->second;
  if (s.items.size() >= bound) return Pushed::kShareFull;
  s.items.push_back(std::move(item));
  ++size_;
  if (!s.in_turn) {
    s.in_turn = true;
    turns_.emplace_back(share);
  }
  return Pushed::kQueued;
}

std::optional<CredentialQueue::Item> CredentialQueue::Pop() {
  while (!turns_.empty()) {
    std::string key = std::move(turns_.front());
    turns_.pop_front();
    auto it = shares_.find(key);
    if (it == shares_.end() || it->second.items.empty()) continue;
    Share& s = it->second;
    Item item = std::move(s.items.front());
    s.items.pop_front();
    --size_;
    if (s.items.empty()) {
      shares_.erase(it);  // a user's share costs nothing once it has nothing waiting
    } else {
      turns_.push_back(std::move(key));  // its next one after every other share's
    }
    return item;
  }
  return std::nullopt;
}

size_t CredentialQueue::waiting(absl::string_view share) const {
  auto it = shares_.find(share);
  return it == shares_.end() ? 0 : it->second.items.size();
}

}  // namespace rdzv
