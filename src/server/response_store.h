#pragma once
// The finished responses of POST /v1/responses kept for previous_response_id, GET and DELETE:
// in memory, bounded by a count and a byte budget, the oldest evicted first. Thread-safe.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace osprey {

struct StoredResponse {
  nlohmann::ordered_json response;  // the response object as it was answered
  nlohmann::ordered_json input;     // every input item it answered: the previous response's
                                    // conversation, then its own input (instructions apart)
};

class ResponseStore {
 public:
  // At most max_entries responses and max_bytes of their JSON (a response larger than
  // max_bytes alone is not kept).
  ResponseStore(size_t max_entries, size_t max_bytes);

  // Keeps `r` under `id` (replacing one of that id), evicting the oldest past the bounds.
  void put(const std::string& id, StoredResponse r);
  // A copy of the response of that id; nullopt when absent (never stored, evicted, deleted).
  std::optional<StoredResponse> get(const std::string& id) const;
  // False when absent.
  bool erase(const std::string& id);

  size_t size() const;
  size_t bytes() const;

 private:
  struct Entry {
    StoredResponse value;
    size_t bytes = 0;
    uint64_t serial = 0;  // its place in order_
  };
  void evict_locked();

  size_t max_entries_, max_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::deque<std::pair<uint64_t, std::string>> order_;  // oldest first; stale pairs skipped
  uint64_t next_serial_ = 0;
  size_t bytes_ = 0;
};

}  // namespace osprey
