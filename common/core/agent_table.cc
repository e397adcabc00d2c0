#include "common/core/agent_table.h"

#include <utility>

#include "absl/hash/hash.h"

namespace rdzv {

void AppendLengthPrefixed(std::string& pool, absl::string_view bytes) {
  size_t n = bytes.size();
  while (n >= 0x80) {
    pool.push_back(static_cast<char>((n & 0x7f) | 0x80));
    n >>= 7;
  }
  pool.push_back(static_cast<char>(n));
  pool.append(bytes.data(), bytes.size());
}

absl::string_view ReadLengthPrefixed(absl::string_view pool, size_t& at) {
  size_t n = 0;
  for (int shift = 0;; shift += 7) {
    const auto byte = static_cast<unsigned char>(pool[at++]);
    n |= static_cast<size_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) break;
  }
  const absl::string_view bytes = pool.substr(at, n);
  at += n;
  return bytes;
}

namespace {

void PutName(std::string& pool, absl::string_view name) { AppendLengthPrefixed(pool, name); }
absl::string_view GetName(const std::string& pool, size_t& at) {
  return ReadLengthPrefixed(pool, at);
}

size_t NamesBytes(const std::string& pool, size_t at) {
  const size_t start = at;
  GetName(pool, at);
  GetName(pool, at);
  return at - start;
}

}  // namespace

size_t AgentTable::IdHash::operator()(Index i) const {
  size_t at = store->records[i].name_;
  return absl::Hash<absl::string_view>{}(GetName(store->names, at));
}

size_t AgentTable::IdHash::operator()(absl::string_view id) const {
  return absl::Hash<absl::string_view>{}(id);
}

bool AgentTable::IdEq::operator()(Index a, absl::string_view b) const {
  size_t at = store->records[a].name_;
  return GetName(store->names, at) == b;
}

AgentTable::AgentTable()
    : store_(std::make_unique<Store>()), index_(0, IdHash{store_.get()}, IdEq{store_.get()}) {}

AgentTable::~AgentTable() = default;

AgentTable::AgentTable(AgentTable&& other) noexcept
    : store_(std::exchange(other.store_, nullptr)), index_(std::move(other.index_)) {}

AgentTable& AgentTable::operator=(AgentTable&& other) noexcept {
  store_ = std::exchange(other.store_, nullptr);
  index_ = std::move(other.index_);
  return *this;
}

AgentTable::Index AgentTable::Add(const AgentSpec& agent) {
  Store& s = *store_;
  Index i;
  if (!s.free.empty()) {
    i = s.free.back();
    s.free.pop_back();
    s.records[i] = AgentRecord{};
  } else {
    i = static_cast<Index>(s.records.size());
    s.records.emplace_back();
  }
  AgentRecord& r = s.records[i];
  r.node_index = static_cast<int32_t>(agent.node_index);
  r.order = static_cast<int32_t>(agent.order);
  r.nproc = agent.nproc;
  r.name_ = s.names.size();
  PutName(s.names, agent.agent_id);
  PutName(s.names, agent.host);
  index_.insert(i);
  return i;
}

AgentTable::Index AgentTable::Find(absl::string_view agent_id) const {
  auto it = index_.find(agent_id);
  return it == index_.end() ? kNone : *it;
}

void AgentTable::Update(Index i, const AgentSpec& agent) {
  Store& s = *store_;
  AgentRecord& r = s.records[i];
  r.node_index = static_cast<int32_t>(agent.node_index);
  r.order = static_cast<int32_t>(agent.order);
  r.nproc = agent.nproc;
  if (agent_id(i) == agent.agent_id && host(i) == agent.host) return;
  index_.erase(i);  // by its old name
  s.dead_bytes += NamesBytes(s.names, r.name_);
  r.name_ = s.names.size();
  PutName(s.names, agent.agent_id);
  PutName(s.names, agent.host);
  index_.insert(i);
  MaybeCompact();
}

void AgentTable::Erase(Index i) {
  Store& s = *store_;
  index_.erase(i);  // by its name, which is still there
  AgentRecord& r = s.records[i];
  s.dead_bytes += NamesBytes(s.names, r.name_);
  r.erased_ = true;
  r.stream = 0;
  s.free.push_back(i);
  if (s.free.size() == s.records.size()) {
    Clear();
    return;
  }
  MaybeCompact();
}

void AgentTable::Clear() {
  Store& s = *store_;
  index_.clear();
  s.records.clear();
  s.names.clear();
  s.free.clear();
  s.dead_bytes = 0;
}

void AgentTable::MaybeCompact() {
  const Store& s = *store_;
  if (s.dead_bytes >= 4096 && s.dead_bytes >= s.names.size() / 2) Compact();
}

void AgentTable::ShrinkToFit() {
  Compact();
  store_->records.shrink_to_fit();
  store_->free.shrink_to_fit();
}

void AgentTable::Compact() {
  Store& s = *store_;
  std::string names;
  names.reserve(s.names.size() - s.dead_bytes);
  for (AgentRecord& r : s.records) {
    if (r.erased_) continue;
    size_t at = r.name_;
    const absl::string_view id = GetName(s.names, at);
    const absl::string_view host = GetName(s.names, at);
    r.name_ = names.size();
    PutName(names, id);
    PutName(names, host);
  }
  // The index holds record indices, not offsets: it stays as it is.
  s.names = std::move(names);
  s.dead_bytes = 0;
}

absl::string_view AgentTable::agent_id(Index i) const {
  size_t at = store_->records[i].name_;
  return GetName(store_->names, at);
}

absl::string_view AgentTable::host(Index i) const {
  size_t at = store_->records[i].name_;
  GetName(store_->names, at);
  return GetName(store_->names, at);
}

AgentSpec AgentTable::Spec(Index i) const {
  const AgentRecord& r = store_->records[i];
  AgentSpec spec;
  spec.agent_id = std::string(agent_id(i));
  spec.host = std::string(host(i));
  spec.node_index = r.node_index;
  spec.order = r.order;
  spec.nproc = r.nproc;
  return spec;
}

size_t AgentTable::held_bytes() const {
  const Store& s = *store_;
  return sizeof(Store) + s.records.capacity() * sizeof(AgentRecord) + s.names.capacity() +
         s.free.capacity() * sizeof(Index) +
         index_.capacity() * (sizeof(Index) + 1);  // a slot and its control byte
}

AgentTable::const_iterator& AgentTable::const_iterator::operator++() {
  ++i_;
  SkipErased();
  return *this;
}

void AgentTable::const_iterator::SkipErased() {
  const std::vector<AgentRecord>& records = table_->store_->records;
  while (i_ < records.size() && records[i_].erased_) ++i_;
}

AgentTable::const_iterator AgentTable::begin() const {
  const_iterator it(this, 0);
  it.SkipErased();
  return it;
}

AgentTable::const_iterator AgentTable::end() const {
  return const_iterator(this, static_cast<Index>(store_->records.size()));
}

}  // namespace rdzv
