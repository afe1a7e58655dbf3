#include "server/response_store.h"

namespace osprey {

ResponseStore::ResponseStore(size_t max_entries, size_t max_bytes) : max_entries_(max_entries), max_bytes_(max_bytes) {}

void ResponseStore::put(const std::string& id, StoredResponse r) {
  const size_t n = r.response.dump().size() + r.input.dump().size() + id.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    bytes_ -= it->second.bytes;
    entries_.erase(it);
  }
  if (n > max_bytes_ || max_entries_ == 0) return;
  const uint64_t serial = next_serial_++;
  entries_[id] = Entry{std::move(r), n, serial};
  order_.emplace_back(serial, id);
  bytes_ += n;
  evict_locked();
}

void ResponseStore::evict_locked() {
  while ((entries_.size() > max_entries_ || bytes_ > max_bytes_) && !order_.empty()) {
    auto [serial, id] = order_.front();
    order_.pop_front();
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.serial != serial) continue;  // deleted or replaced
    bytes_ -= it->second.bytes;
    entries_.erase(it);
  }
  // The pairs of deleted or replaced entries are dropped once they outnumber the live ones,
  // so that order_ stays bounded.
  if (order_.size() <= 2 * entries_.size() + 64) return;
  std::deque<std::pair<uint64_t, std::string>> live;
  for (auto& p : order_) {
    auto it = entries_.find(p.second);
    if (it != entries_.end() && it->second.serial == p.first) live.push_back(std::move(p));
  }
  order_ = std::move(live);
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.value;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  bytes_ -= it->second.bytes;
  entries_.erase(it);
  evict_locked();
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace osprey
