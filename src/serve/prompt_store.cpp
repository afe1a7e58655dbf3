#include "serve/prompt_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "core/error.h"
#include "core/log.h"

namespace osprey {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStoreExtension = ".oskv";

// "<kind>-<16 hex digits>.oskv"
bool is_auto_name(const std::string& name, PromptFileKind kind) {
  const std::string prefix = std::string(prompt_file_kind_name(kind)) + "-";
  if (name.size() != prefix.size() + 16 + std::strlen(kStoreExtension) || name.rfind(prefix, 0) != 0) return false;
  if (name.substr(prefix.size() + 16) != kStoreExtension) return false;
  return std::all_of(name.begin() + long(prefix.size()), name.begin() + long(prefix.size() + 16),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

int64_t store_mtime_ns(const struct stat& st) { return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }

uint64_t store_data_bytes(const PromptFileData& d) {
  uint64_t n = d.tokens.size() * sizeof(int32_t);
  for (const auto& [k, v] : d.layers) n += k.nbytes() + v.nbytes();
  return n;
}

// A warning for the first drop and then at every power of two, so that a full queue under load
// does not flood the log.
bool store_worth_logging(uint64_t n) { return (n & (n - 1)) == 0; }

}  // namespace

struct PromptStore::Op {
  enum class Kind { write, remove, touch } kind = Kind::write;
  std::string name;
  uint64_t id = 0;
  uint64_t bytes = 0;
  PromptFileData data;
};

PromptStore::PromptStore(PromptStoreOptions options) : options_(std::move(options)) {
  if (options_.dir.empty()) return;
  const std::string where = "prompt cache folder " + options_.dir.string();
  std::error_code ec;
  fs::create_directories(auto_dir(), ec);
  if (ec || !fs::is_directory(auto_dir(), ec)) {
    log_warn(where + ": cannot use " + auto_dir().string() + " (" + (ec ? ec.message() : "not a directory") +
             "): cached prompts will not be kept on disk");
    return;
  }
  const fs::path lock = auto_dir() / ".lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) {
    log_warn(where + ": cannot open " + lock.string() + " (" + std::strerror(errno) +
             "): cached prompts will not be kept on disk");
    return;
  }
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    log_warn(where + ": another process holds " + lock.string() + ": cached prompts will not be kept on disk");
    ::close(lock_fd_);
    lock_fd_ = -1;
    return;
  }
  enabled_ = true;
  // The index: every file of either kind (both count towards the bound), paged ones linked.
  for (fs::directory_iterator it(auto_dir(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind('.', 0) == 0) {
      // A temporary file a killed writer left (the lock says none is writing now).
      if (name.find(".tmp.") != std::string::npos) fs::remove(it->path(), ec);
      ec.clear();
      continue;
    }
    if (!is_auto_name(name, PromptFileKind::dense) && !is_auto_name(name, PromptFileKind::paged)) continue;
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    FileEntry e;
    e.bytes = uint64_t(st.st_size);
    e.mtime_ns = store_mtime_ns(st);
    if (is_auto_name(name, PromptFileKind::paged)) {
      try {
        const PromptFileInfo info = read_prompt_file_info(it->path());
        e.linked = info.kind == PromptFileKind::paged;
        e.parent = info.parent_id;
        e.block_ends = info.block_end_ids;
      } catch (const Error&) {
        // usable_files() names it; it still counts towards the bound.
      }
    }
    add_entry(name, std::move(e));
  }
  if (ec) log_warn(where + ": cannot list " + auto_dir().string() + " (" + ec.message() + ")");
  writer_ = std::thread([this] { run(); });
}

PromptStore::~PromptStore() { close(std::chrono::seconds(30)); }

void PromptStore::add_entry(const std::string& name, FileEntry e) {
  drop_entry(name);
  stats_.bytes += e.bytes;
  ++stats_.n_files;
  if (e.linked)
    for (uint64_t id : e.block_ends) by_block_end_[id] = name;
  files_.emplace(name, std::move(e));
}

void PromptStore::drop_entry(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) return;
  stats_.bytes -= it->second.bytes;
  --stats_.n_files;
  for (uint64_t id : it->second.block_ends) {
    auto b = by_block_end_.find(id);
    if (b != by_block_end_.end() && b->second == name) by_block_end_.erase(b);
  }
  files_.erase(it);
}

std::vector<PromptFileInfo> PromptStore::usable_files() {
  std::vector<std::pair<int64_t, PromptFileInfo>> found;
  if (!enabled_) return {};
  std::error_code ec;
  for (fs::directory_iterator it(auto_dir(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_auto_name(name, options_.kind)) continue;
    try {
      PromptFileInfo info = read_prompt_file_info(it->path());
      if (const std::string why = options_.fingerprint.mismatch(info.fingerprint); !why.empty())
        throw InvalidInput(it->path().string() + ": written for another model or cache layout: " + why);
      if (info.kind != options_.kind) throw InvalidInput(it->path().string() + ": holds another kind of rows");
      struct stat st {};
      found.emplace_back(::stat(it->path().c_str(), &st) == 0 ? store_mtime_ns(st) : 0, std::move(info));
    } catch (const Error& e) {
      log_warn(std::string("prompt cache: skipping ") + e.what());
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.n_skipped;
    }
  }
  if (ec) log_warn("prompt cache: cannot list " + auto_dir().string() + " (" + ec.message() + "): nothing restored");
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<PromptFileInfo> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::optional<PromptFileData> PromptStore::read(const fs::path& path) {
  try {
    return read_prompt_file(path, options_.fingerprint, options_.layers);
  } catch (const Error& e) {
    log_warn(std::string("prompt cache: skipping ") + e.what());
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.n_skipped;
    return std::nullopt;
  }
}

void PromptStore::note_restored(int64_t n_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.n_restored;
  stats_.n_restored_tokens += uint64_t(n_tokens);
}

std::string PromptStore::auto_name(uint64_t prefix_id) const {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s-%016llx%s", prompt_file_kind_name(options_.kind), (unsigned long long)prefix_id,
                kStoreExtension);
  return buf;
}

bool PromptStore::write(PromptFileData data) {
  if (!enabled_ || data.tokens.empty()) return false;
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::write;
  op->bytes = store_data_bytes(data);
  op->name = auto_name(prompt_prefix_id(data.salt, data.tokens));
  op->data = std::move(data);
  std::lock_guard<std::mutex> lock(mu_);
  const bool too_large = options_.max_bytes > 0 && op->bytes > options_.max_bytes;
  if (stopping_ || too_large || queued_bytes_ + op->bytes > options_.queue_bytes) {
    ++stats_.n_dropped;
    if (store_worth_logging(stats_.n_dropped))
      log_warn("prompt cache: " + std::to_string(stats_.n_dropped) + " write(s) to " + auto_dir().string() +
               " dropped so far; this one, " + op->name + " (" + std::to_string(op->bytes >> 10) +
               " KiB): " + (too_large ? "larger than --prompt-cache-max-gib" : "the writer is behind"));
    return false;
  }
  queued_bytes_ += op->bytes;
  queue_.push_back(std::move(op));
  cv_.notify_one();
  return true;
}

void PromptStore::remove(uint64_t prefix_id) {
  if (!enabled_) return;
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::remove;
  op->name = auto_name(prefix_id);
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  queue_.push_back(std::move(op));
  cv_.notify_one();
}

void PromptStore::touch(uint64_t prefix_id) {
  if (!enabled_) return;
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::touch;
  op->id = prefix_id;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  queue_.push_back(std::move(op));
  cv_.notify_one();
}

void PromptStore::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void PromptStore::close(std::chrono::milliseconds timeout) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
    if (!idle_cv_.wait_for(lock, timeout, [&] { return queue_.empty() && !busy_; })) {
      if (!queue_.empty() || busy_)
        log_warn("prompt cache: " + std::to_string(queue_.size() + (busy_ ? 1 : 0)) + " write(s) to " +
                 auto_dir().string() + " abandoned at shutdown");
      abandon_ = true;
      cv_.notify_all();
    }
  }
  if (writer_.joinable()) writer_.join();
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
}

void PromptStore::run() {
  for (;;) {
    std::unique_ptr<Op> op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (abandon_ || queue_.empty()) {
        stats_.n_dropped += queue_.size();
        queue_.clear();
        queued_bytes_ = 0;
        idle_cv_.notify_all();
        return;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    try {
      switch (op->kind) {
        case Op::Kind::write:
          do_write(*op);
          break;
        case Op::Kind::remove: {
          std::lock_guard<std::mutex> lock(mu_);
          uint64_t n = 0;
          if (files_.count(op->name)) erase_file(op->name, n);
          break;
        }
        case Op::Kind::touch:
          do_touch(op->id);
          break;
      }
    } catch (const std::exception& e) {
      log_warn(std::string("prompt cache: ") + e.what());
    }
    const uint64_t bytes = op->kind == Op::Kind::write ? op->bytes : 0;
    op.reset();  // the rows go before the next op takes its turn
    std::lock_guard<std::mutex> lock(mu_);
    queued_bytes_ -= bytes;
    busy_ = false;
    idle_cv_.notify_all();
  }
}

void PromptStore::do_write(Op& op) {
  const fs::path path = auto_dir() / op.name;
  uint64_t written = 0;
  try {
    written = write_prompt_file(path, op.data, options_.fingerprint, options_.layers, options_.block_size,
                                options_.write, [this] {
                                  std::lock_guard<std::mutex> lock(mu_);
                                  return abandon_;
                                });
  } catch (const Error& e) {
    log_warn(std::string("prompt cache: not kept on disk: ") + e.what());
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.n_write_failures;
    return;
  }
  FileEntry e;
  e.bytes = written;
  e.mtime_ns = mark_used(path);
  if (options_.kind == PromptFileKind::paged) {
    try {
      const PromptFileInfo info = read_prompt_file_info(path);
      e.linked = true;
      e.parent = info.parent_id;
      e.block_ends = info.block_end_ids;
    } catch (const Error& err) {
      log_warn(std::string("prompt cache: ") + err.what());
    }
  }
  const uint64_t parent = e.parent;
  const bool linked = e.linked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    add_entry(op.name, std::move(e));
    ++stats_.n_written;
    stats_.bytes_written += written;
  }
  // The run continues its parent's: that file and its ancestors were used just now.
  if (linked && op.data.first_row > 0) do_touch(parent);
  std::lock_guard<std::mutex> lock(mu_);
  evict_past_bound(op.name);
}

void PromptStore::do_touch(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string name = auto_name(id);
  for (int depth = 0; depth < (1 << 20); ++depth) {
    if (!files_.count(name)) {
      auto b = by_block_end_.find(id);
      if (b == by_block_end_.end()) return;
      name = b->second;
    }
    FileEntry& e = files_.at(name);
    const fs::path path = auto_dir() / name;
    if (const int64_t ns = mark_used(path); ns >= 0) e.mtime_ns = ns;
    if (!e.linked) return;
    // The file this run continues: the one holding the block that ends at its first row.
    auto p = by_block_end_.find(e.parent);
    if (p == by_block_end_.end() || p->second == name) return;
    id = e.parent;
    name = p->second;
  }
}

int64_t PromptStore::mark_used(const fs::path& path) {
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const int64_t ns = std::max(int64_t(now.tv_sec) * 1000000000 + now.tv_nsec, last_use_ns_ + 1);
  const struct timespec times[2] = {{0, UTIME_OMIT}, {time_t(ns / 1000000000), long(ns % 1000000000)}};
  if (::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0) {
    last_use_ns_ = ns;
    return ns;
  }
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? store_mtime_ns(st) : -1;
}

void PromptStore::erase_file(const std::string& name, uint64_t& n_removed) {
  std::vector<std::string> todo{name};
  while (!todo.empty()) {
    const std::string n = todo.back();
    todo.pop_back();
    auto it = files_.find(n);
    if (it == files_.end()) continue;
    const std::vector<uint64_t> ends = it->second.block_ends;
    std::error_code ec;
    fs::remove(auto_dir() / n, ec);
    if (ec) log_warn("prompt cache: cannot remove " + (auto_dir() / n).string() + ": " + ec.message());
    drop_entry(n);
    ++n_removed;
    // The runs that continue this one's blocks are of no use without them.
    for (const auto& [child, e] : files_)
      if (e.linked && std::find(ends.begin(), ends.end(), e.parent) != ends.end()) todo.push_back(child);
  }
}

void PromptStore::evict_past_bound(const std::string& keep) {
  while (options_.max_bytes > 0 && stats_.bytes > options_.max_bytes) {
    auto victim = files_.end();
    for (auto it = files_.begin(); it != files_.end(); ++it)
      if (it->first != keep && (victim == files_.end() || it->second.mtime_ns < victim->second.mtime_ns)) victim = it;
    if (victim == files_.end()) return;
    uint64_t n = 0;
    erase_file(victim->first, n);
    stats_.n_evicted += n;
  }
}

fs::path PromptStore::user_path(const std::string& filename) const {
  const bool bad = filename.empty() || filename.size() > 255 || filename == "." || filename == ".." ||
                   filename[0] == '.' || std::any_of(filename.begin(), filename.end(), [](char c) {
                     return c == '/' || c == '\\' || (unsigned char)c < 0x20 || c == 0x7f;
                   });
  if (bad)
    throw InvalidInput("invalid filename \"" + filename +
                       "\": a plain file name is expected (no '/', no leading '.', no control characters)");
  return options_.dir / filename;
}

uint64_t PromptStore::save(const std::string& filename, const PromptFileData& data) {
  if (!enabled_) throw Unsupported("the prompt cache folder is not in use (see the log at start)");
  return write_prompt_file(user_path(filename), data, options_.fingerprint, options_.layers, options_.block_size,
                           options_.write);
}

PromptFileData PromptStore::load(const std::string& filename) {
  if (!enabled_) throw Unsupported("the prompt cache folder is not in use (see the log at start)");
  return read_prompt_file(user_path(filename), options_.fingerprint, options_.layers);
}

PromptStoreStats PromptStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace osprey
