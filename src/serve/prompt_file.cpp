#include "serve/prompt_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "backend/ops.h"
#include "core/checked.h"
#include "core/error.h"
#include "model/model.h"

namespace osprey {
namespace fs = std::filesystem;
namespace {

using nlohmann::json;

constexpr char kPfMagic[8] = {'O', 'S', 'P', 'K', 'V', 'C', '\r', '\n'};
constexpr uint32_t kMaxHeaderBytes = 1u << 20;
constexpr size_t kPfSampleBytes = 64 << 10;
constexpr int kPfSamples = 16;
constexpr size_t kPfChunkBytes = size_t(64) << 20;    // per write() or read(), and between stop polls
constexpr size_t kCrcThreadBytes = size_t(16) << 20;  // a thread's share of a checksum, at least

struct PfFd {
  int fd = -1;
  ~PfFd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string pf_errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// One contiguous run of payload bytes.
struct PfPiece {
  const uint8_t* data;
  size_t n;
};

// crc32 of the pieces in order, the bytes split over threads at any boundary and combined.
uint32_t crc32_pieces(const std::vector<PfPiece>& pieces) {
  size_t total = 0;
  for (const PfPiece& p : pieces) total += p.n;
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t n_threads = std::max<size_t>(1, std::min(hw, total / kCrcThreadBytes));
  // Part t covers bytes [t * total / n, (t + 1) * total / n) of the concatenation.
  auto run = [&](size_t begin, size_t end) {
    uLong crc = crc32(0L, Z_NULL, 0);
    size_t at = 0;
    for (const PfPiece& p : pieces) {
      const size_t lo = std::max(begin, at), hi = std::min(end, at + p.n);
      for (size_t o = lo; o < hi;) {
        const size_t m = std::min<size_t>(hi - o, size_t(1) << 30);
        crc = crc32(crc, p.data + (o - at), uInt(m));
        o += m;
      }
      at += p.n;
      if (at >= end) break;
    }
    return uint32_t(crc);
  };
  if (n_threads == 1) return run(0, total);
  std::vector<uint32_t> parts(n_threads);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < n_threads; ++t)
    threads.emplace_back([&, t] { parts[t] = run(t * total / n_threads, (t + 1) * total / n_threads); });
  for (auto& th : threads) th.join();
  uLong crc = parts[0];
  for (size_t t = 1; t < n_threads; ++t) {
    const size_t len = (t + 1) * total / n_threads - t * total / n_threads;
    crc = crc32_combine(crc, parts[t], z_off_t(len));
  }
  return uint32_t(crc);
}

// Reads the pieces (their bytes, in order, from file offset `offset`) and returns their crc32.
// NOTE: chunks of kPfReadChunk go to up to kPfReadThreads threads at once, each reading (pread)
// and checksumming its own: several reads in flight keep a fast disk busy where one buffered
// read at a time does not, and the checksum runs beside the reads instead of after them.
constexpr size_t kPfReadChunk = size_t(8) << 20;
constexpr size_t kPfReadThreads = 8;

uint32_t pf_read_pieces(int fd, uint64_t offset, const std::vector<PfPiece>& pieces, const fs::path& path) {
  struct Chunk {
    uint8_t* data;
    size_t n;
    uint64_t at;
    uint32_t crc = 0;
  };
  std::vector<Chunk> chunks;
  for (const PfPiece& p : pieces)
    for (size_t o = 0; o < p.n; o += kPfReadChunk) {
      chunks.push_back({const_cast<uint8_t*>(p.data) + o, std::min(kPfReadChunk, p.n - o), offset});
      offset += chunks.back().n;
    }
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr failure;
  auto work = [&] {
    for (size_t i; (i = next++) < chunks.size();) {
      Chunk& c = chunks[i];
      try {
        for (size_t done = 0; done < c.n;) {
          const ssize_t r = ::pread(fd, c.data + done, c.n - done, off_t(c.at + done));
          if (r < 0 && errno == EINTR) continue;
          if (r < 0) throw IoError(pf_errno(path.string() + ": read failed"));
          if (r == 0) throw InvalidInput(path.string() + ": truncated (the file ended while being read)");
          done += size_t(r);
        }
        c.crc = uint32_t(crc32(crc32(0L, Z_NULL, 0), c.data, uInt(c.n)));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
        next = chunks.size();
      }
    }
  };
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t n_threads = std::min({kPfReadThreads, std::max<size_t>(2, hw), chunks.size()});
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(work);
  work();
  for (auto& th : threads) th.join();
  if (failure) std::rethrow_exception(failure);
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const Chunk& c : chunks) crc = crc32_combine(crc, c.crc, z_off_t(c.n));
  return uint32_t(crc);
}

// The payload of `data` as pieces: the tokens, then per layer each head's key rows, then each
// head's value rows. Throws InvalidInput when an array is not as prompt_file_rows says.
std::vector<PfPiece> pf_payload_pieces(const PromptFileData& data, const std::vector<KVCacheParams>& layers) {
  if (data.layers.size() != layers.size())
    throw InvalidInput("prompt-cache file: " + std::to_string(data.layers.size()) + " layers of rows for a model of " +
                       std::to_string(layers.size()));
  std::vector<PfPiece> pieces;
  pieces.push_back({reinterpret_cast<const uint8_t*>(data.tokens.data()), data.tokens.size() * sizeof(int32_t)});
  const int64_t n = int64_t(data.tokens.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const KVCacheParams& p = layers[l];
    const int64_t rows = prompt_file_rows(data.kind, p, n, data.first_row);
    for (const auto& [a, dt] : {std::pair{&data.layers[l].first, p.key_dtype()},
                                std::pair{&data.layers[l].second, p.value_dtype()}}) {
      const int64_t width = packed_row_width(dt, p.head_dim);
      if (!a->defined() || !a->device().is_cpu() || a->ndim() != 3 || a->dim(0) != p.n_kv_heads || a->dim(1) != rows ||
          a->dim(2) != width || a->dtype() != dt || a->strides()[2] != 1 || a->strides()[1] != width)
        throw InvalidInput("prompt-cache file: layer " + std::to_string(l) + "'s rows " +
                           (a->defined() ? describe(*a) : std::string("(none)")) + " are not [" +
                           std::to_string(p.n_kv_heads) + ", " + std::to_string(rows) + ", " +
                           std::to_string(width) + "] " + dtype_name(dt) + " on the CPU");
      const size_t head_bytes = size_t(rows * width) * a->itemsize();
      for (int64_t h = 0; h < p.n_kv_heads && head_bytes > 0; ++h)
        pieces.push_back(
            {static_cast<const uint8_t*>(a->raw()) + size_t(h * a->strides()[0]) * a->itemsize(), head_bytes});
    }
  }
  return pieces;
}

// The payload's size for n tokens of this layout; InvalidInput when it does not fit 64 bits.
uint64_t pf_payload_size(PromptFileKind kind, const std::vector<KVCacheParams>& layers, int64_t n, int64_t first_row) {
  const std::string what = "prompt-cache file payload";
  uint64_t bytes = checked_mul(uint64_t(n), sizeof(int32_t), what);
  for (const KVCacheParams& p : layers) {
    const uint64_t rows = uint64_t(prompt_file_rows(kind, p, n, first_row));
    for (DType dt : {p.key_dtype(), p.value_dtype()}) {
      const uint64_t one = checked_mul(
          checked_mul(checked_mul(uint64_t(p.n_kv_heads), rows, what), uint64_t(packed_row_width(dt, p.head_dim)), what),
          dtype_size(dt), what);
      bytes = checked_add(bytes, one, what);
    }
  }
  return bytes;
}

uint64_t pf_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// The running hash of prompt_prefix_id: seeded by the salt, one step per token; an id is the
// state after n tokens finished with n.
uint64_t prefix_seed(const std::string& salt) {
  uint64_t h = 0x6a09e667f3bcc908ull;
  for (unsigned char c : salt) h = pf_mix(h ^ (uint64_t(c) + 0x9e3779b97f4a7c15ull));
  return pf_mix(h ^ salt.size());
}
uint64_t prefix_step(uint64_t h, int32_t t) { return pf_mix(h ^ (uint64_t(uint32_t(t)) + 0x9e3779b97f4a7c15ull)); }
uint64_t prefix_finish(uint64_t h, size_t n) { return pf_mix(h ^ (uint64_t(n) * 0xd1b54a32d192ed03ull)); }

std::string pf_hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  return buf;
}

uint64_t pf_parse_hex64(const json& j, const std::string& what) {
  if (!j.is_string() || j.get<std::string>().size() != 16) throw InvalidInput(what + " is not 16 hex digits");
  const std::string s = j.get<std::string>();
  uint64_t v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) throw InvalidInput(what + " is not 16 hex digits");
    v = v << 4 | uint64_t(d);
  }
  return v;
}

// crc32 of up to `n` bytes of an open file from `offset`.
uint32_t pf_crc_range(int fd, uint64_t offset, size_t n, const fs::path& path) {
  std::vector<uint8_t> buf(std::min<size_t>(n, size_t(1) << 20));
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const ssize_t r = ::pread(fd, buf.data(), std::min(n, buf.size()), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IoError(pf_errno(path.string() + ": read failed"));
    if (r == 0) break;
    crc = crc32(crc, buf.data(), uInt(r));
    offset += uint64_t(r);
    n -= size_t(r);
  }
  return uint32_t(crc);
}

// One weight file's identity: name, size, crc32 of its header (a safetensors file's JSON header,
// else its first MiB) and of kPfSamples samples spread evenly over it.
json weight_file_id(const fs::path& path) {
  PfFd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (f.fd < 0) throw IoError(pf_errno(path.string() + ": cannot open file"));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw IoError(pf_errno(path.string() + ": cannot examine file"));
  if (!S_ISREG(st.st_mode)) throw IoError(path.string() + ": expected a regular file");
  const uint64_t size = uint64_t(st.st_size);
  uint64_t head = std::min<uint64_t>(size, 1 << 20);
  if (path.extension() == ".safetensors" && size >= 8) {
    uint8_t len[8] = {};
    if (::pread(f.fd, len, 8, 0) == 8) {
      uint64_t h = 0;
      for (int i = 7; i >= 0; --i) h = h << 8 | len[i];
      head = std::min<uint64_t>(size, std::min<uint64_t>(h, uint64_t(100) << 20) + 8);
    }
  }
  uLong samples = crc32(0L, Z_NULL, 0);
  if (size > 0) {
    const uint64_t span = size > kPfSampleBytes ? size - kPfSampleBytes : 0;
    for (int i = 0; i < kPfSamples; ++i) {
      const uint64_t at = span * uint64_t(i) / uint64_t(kPfSamples - 1);
      samples = crc32_combine(samples, pf_crc_range(f.fd, at, std::min<uint64_t>(kPfSampleBytes, size - at), path),
                              z_off_t(std::min<uint64_t>(kPfSampleBytes, size - at)));
    }
  }
  return {{"file", path.filename().string()},
          {"bytes", size},
          {"header_crc32", pf_crc_range(f.fd, 0, size_t(head), path)},
          {"samples_crc32", uint32_t(samples)}};
}

uint32_t whole_file_crc(const fs::path& path) {
  PfFd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (f.fd < 0) throw IoError(pf_errno(path.string() + ": cannot open file"));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) throw IoError(path.string() + ": expected a regular file");
  return pf_crc_range(f.fd, 0, size_t(st.st_size), path);
}

// Writes n bytes through `write`, retrying short writes; throws IoError naming `path`.
void pf_write_all(int fd, const uint8_t* p, size_t n, const PromptFileWriteFn& write, const fs::path& path,
                  const std::function<bool()>& stop) {
  while (n > 0) {
    if (stop && stop()) throw IoError(path.string() + ": write abandoned (the server is stopping)");
    const size_t m = std::min(n, kPfChunkBytes);
    const ssize_t w = write ? write(fd, p, m) : ::write(fd, p, m);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw IoError(pf_errno(path.string() + ": write failed"));
    if (w == 0) throw IoError(path.string() + ": write failed: no progress");
    p += w;
    n -= size_t(w);
  }
}

void pf_read_all(int fd, uint8_t* p, size_t n, const fs::path& path) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, std::min(n, kPfChunkBytes));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IoError(pf_errno(path.string() + ": read failed"));
    if (r == 0) throw InvalidInput(path.string() + ": truncated (the file ended while being read)");
    p += r;
    n -= size_t(r);
  }
}

uint32_t pf_get_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
void pf_put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}

// The header, opened and checked; the descriptor is left at the payload's first byte.
PromptFileInfo pf_open_and_check(const fs::path& path, PfFd& f) {
  const std::string name = path.string();
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f.fd < 0) throw IoError(pf_errno(name + ": cannot open"));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw IoError(pf_errno(name + ": cannot examine"));
  if (S_ISDIR(st.st_mode)) throw IoError(name + ": is a directory, not a prompt-cache file");
  if (!S_ISREG(st.st_mode)) throw IoError(name + ": is not a regular file");
  const uint64_t size = uint64_t(st.st_size);
  uint8_t lead[16];
  if (size < sizeof lead)
    throw InvalidInput(name + ": truncated (" + std::to_string(size) + " bytes: not even a header)");
  pf_read_all(f.fd, lead, sizeof lead, path);
  if (std::memcmp(lead, kPfMagic, sizeof kPfMagic) != 0)
    throw InvalidInput(name + ": not a prompt-cache file (no OSPKVC magic)");
  const uint32_t version = pf_get_u32(lead + 8);
  if (version != kPromptFileVersion)
    throw InvalidInput(name + ": format version " + std::to_string(version) + ", this build reads version " +
                       std::to_string(kPromptFileVersion));
  const uint32_t h = pf_get_u32(lead + 12);
  if (h > kMaxHeaderBytes) throw InvalidInput(name + ": corrupted (a header of " + std::to_string(h) + " bytes)");
  if (size < 20 + uint64_t(h))
    throw InvalidInput(name + ": truncated (" + std::to_string(size) + " bytes, the header alone takes " +
                       std::to_string(20 + uint64_t(h)) + ")");
  std::vector<uint8_t> header(h + 4);
  pf_read_all(f.fd, header.data(), header.size(), path);
  uLong crc = crc32(0L, lead, sizeof lead);
  crc = crc32(crc, header.data(), h);
  if (uint32_t(crc) != pf_get_u32(header.data() + h))
    throw InvalidInput(name + ": corrupted (the header's checksum does not match)");

  PromptFileInfo info;
  info.path = path;
  info.file_bytes = size;
  try {
    const json j = json::parse(header.begin(), header.begin() + h);
    const std::string kind = j.at("kind").get<std::string>();
    if (kind == "dense")
      info.kind = PromptFileKind::dense;
    else if (kind == "paged")
      info.kind = PromptFileKind::paged;
    else
      throw InvalidInput("kind \"" + kind + "\"");
    const json& fp = j.at("fingerprint");
    info.fingerprint.weights = fp.at("weights").dump();
    info.fingerprint.tokenizer = fp.at("tokenizer").get<std::string>();
    info.fingerprint.device = fp.at("device").get<std::string>();
    info.fingerprint.kv = fp.at("kv").dump();
    info.salt = j.at("salt").get<std::string>();
    info.n_tokens = j.at("n_tokens").get<int64_t>();
    info.first_row = j.at("first_row").get<int64_t>();
    info.payload_bytes = j.at("payload_bytes").get<uint64_t>();
    info.payload_crc32 = j.at("payload_crc32").get<uint32_t>();
    if (info.kind == PromptFileKind::paged) {
      info.parent_id = pf_parse_hex64(j.at("parent"), "parent");
      for (const json& e : j.at("block_ends")) info.block_end_ids.push_back(pf_parse_hex64(e, "a block end"));
    }
  } catch (const json::exception& e) {
    throw InvalidInput(name + ": corrupted header (" + e.what() + ")");
  } catch (const InvalidInput& e) {
    throw InvalidInput(name + ": corrupted header (" + e.what() + ")");
  }
  if (info.n_tokens < 1 || info.n_tokens > (int64_t(1) << 31) || info.first_row < 0 ||
      info.first_row >= info.n_tokens || (info.kind == PromptFileKind::dense && info.first_row != 0))
    throw InvalidInput(name + ": corrupted header (" + std::to_string(info.n_tokens) + " tokens from row " +
                       std::to_string(info.first_row) + ")");
  const uint64_t want = 20 + uint64_t(h) + info.payload_bytes;
  if (info.payload_bytes > (uint64_t(1) << 50) || size < want)
    throw InvalidInput(name + ": truncated (" + std::to_string(size) + " of " + std::to_string(want) + " bytes)");
  if (size > want)
    throw InvalidInput(name + ": corrupted (" + std::to_string(size - want) + " bytes after the payload)");
  return info;
}

}  // namespace

const char* prompt_file_kind_name(PromptFileKind kind) { return kind == PromptFileKind::dense ? "dense" : "paged"; }

std::string CacheFingerprint::mismatch(const CacheFingerprint& o) const {
  if (weights != o.weights) return "the weights differ";
  if (tokenizer != o.tokenizer) return "the tokenizer differs";
  if (device != o.device) return "its rows were computed on " + o.device + ", this process runs on " + device;
  if (kv != o.kv) return "the KV cache layout differs (" + o.kv + " against " + kv + ")";
  return "";
}

CacheFingerprint model_fingerprint(const fs::path& model_path, Device device) {
  std::vector<fs::path> weights;
  fs::path config, tokenizer;
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) {
    for (const auto& e : fs::directory_iterator(model_path, ec)) {
      const std::string ext = e.path().extension().string();
      if ((ext == ".safetensors" || ext == ".gguf") && e.is_regular_file(ec)) weights.push_back(e.path());
    }
    if (ec) throw IoError(model_path.string() + ": cannot list the model folder: " + ec.message());
    config = model_path / "config.json";
    tokenizer = model_path / "tokenizer.json";
  } else {
    weights.push_back(model_path);
  }
  std::sort(weights.begin(), weights.end());
  json w = json::array();
  for (const fs::path& p : weights) w.push_back(weight_file_id(p));
  json j = {{"files", w}};
  if (!config.empty() && fs::is_regular_file(config, ec)) j["config_crc32"] = whole_file_crc(config);
  CacheFingerprint fp;
  fp.weights = j.dump();
  fp.tokenizer =
      !tokenizer.empty() && fs::is_regular_file(tokenizer, ec) ? pf_hex64(whole_file_crc(tokenizer)) : "none";
  fp.device = device.is_cpu() ? "cpu" : "cuda";
  return fp;
}

std::string kv_layout_fingerprint(PromptFileKind kind, const std::vector<KVCacheParams>& layers, int64_t block_size) {
  json l = json::array();
  // The rows' type: one name when keys and values share it (as files before the cache types
  // were written), else "keys/values".
  for (const KVCacheParams& p : layers) {
    const DType k = p.key_dtype(), v = p.value_dtype();
    const std::string type = k == v ? dtype_name(k) : std::string(dtype_name(k)) + "/" + dtype_name(v);
    l.push_back({p.n_kv_heads, p.head_dim, type, kind == PromptFileKind::paged ? 0 : p.window});
  }
  return json{{"kind", prompt_file_kind_name(kind)},
              {"block_size", kind == PromptFileKind::paged ? block_size : 0},
              {"layers", l}}
      .dump();
}

int64_t prompt_file_rows(PromptFileKind kind, const KVCacheParams& layer, int64_t n_tokens, int64_t first_row) {
  if (kind == PromptFileKind::paged) return n_tokens - first_row;
  return layer.window > 0 ? std::min(n_tokens, layer.window) : n_tokens;
}

uint64_t prompt_prefix_id(const std::string& salt, std::span<const int32_t> tokens) {
  uint64_t h = prefix_seed(salt);
  for (int32_t t : tokens) h = prefix_step(h, t);
  return prefix_finish(h, tokens.size());
}

uint32_t prompt_crc32(uint32_t crc, const void* data, size_t n) {
  const uint32_t part = crc32_pieces({{static_cast<const uint8_t*>(data), n}});
  return uint32_t(crc32_combine(crc, part, z_off_t(n)));
}

uint64_t write_prompt_file(const fs::path& path, const PromptFileData& data, const CacheFingerprint& fingerprint,
                           const std::vector<KVCacheParams>& layers, int64_t block_size, const PromptFileWriteFn& write,
                           const std::function<bool()>& stop) {
  const std::string name = path.string();
  const int64_t n = int64_t(data.tokens.size());
  if (n < 1) throw InvalidInput(name + ": no tokens to write");
  if (data.first_row < 0 || data.first_row >= n || (data.kind == PromptFileKind::dense && data.first_row != 0))
    throw InvalidInput(name + ": first row " + std::to_string(data.first_row) + " of " + std::to_string(n) + " tokens");
  const std::vector<PfPiece> pieces = pf_payload_pieces(data, layers);
  uint64_t payload = 0;
  for (const PfPiece& p : pieces) payload += p.n;

  json fp = {{"weights", json::parse(fingerprint.weights)},
             {"tokenizer", fingerprint.tokenizer},
             {"device", fingerprint.device},
             {"kv", json::parse(fingerprint.kv)}};
  json header = {{"kind", prompt_file_kind_name(data.kind)},
                 {"fingerprint", fp},
                 {"salt", data.salt},
                 {"n_tokens", n},
                 {"first_row", data.first_row},
                 {"payload_bytes", payload},
                 {"payload_crc32", crc32_pieces(pieces)}};
  if (data.kind == PromptFileKind::paged) {
    if (block_size < 1 || data.first_row % block_size != 0 || n % block_size != 0)
      throw InvalidInput(name + ": a paged run of rows [" + std::to_string(data.first_row) + ", " + std::to_string(n) +
                         ") is not whole blocks of " + std::to_string(block_size));
    uint64_t h = prefix_seed(data.salt);
    json ends = json::array();
    for (int64_t i = 0; i < n; ++i) {
      if (i == data.first_row) header["parent"] = pf_hex64(prefix_finish(h, size_t(i)));
      h = prefix_step(h, data.tokens[size_t(i)]);
      if (i + 1 > data.first_row && (i + 1) % block_size == 0)
        ends.push_back(pf_hex64(prefix_finish(h, size_t(i + 1))));
    }
    header["block_ends"] = ends;
  }
  const std::string text = header.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kMaxHeaderBytes)
    throw InvalidInput(name + ": a header of " + std::to_string(text.size()) + " bytes");
  std::vector<uint8_t> lead(16 + text.size() + 4);
  std::memcpy(lead.data(), kPfMagic, sizeof kPfMagic);
  pf_put_u32(lead.data() + 8, kPromptFileVersion);
  pf_put_u32(lead.data() + 12, uint32_t(text.size()));
  std::memcpy(lead.data() + 16, text.data(), text.size());
  pf_put_u32(lead.data() + 16 + text.size(), uint32_t(crc32(0L, lead.data(), uInt(16 + text.size()))));

  static std::atomic<uint64_t> counter{0};
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const fs::path tmp =
      dir / ("." + path.filename().string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++));
  PfFd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)};
  if (f.fd < 0) throw IoError(pf_errno(name + ": cannot create its temporary file " + tmp.string()));
  try {
    pf_write_all(f.fd, lead.data(), lead.size(), write, path, stop);
    for (const PfPiece& p : pieces) pf_write_all(f.fd, p.data, p.n, write, path, stop);
    if (::fsync(f.fd) != 0) throw IoError(pf_errno(name + ": fsync failed"));
    if (::close(f.fd) != 0) {
      f.fd = -1;
      throw IoError(pf_errno(name + ": close failed"));
    }
    f.fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw IoError(pf_errno(name + ": rename from " + tmp.string() + " failed"));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename is durable once the folder is: a failure here loses at most this file on a crash.
  PfFd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd >= 0) ::fsync(d.fd);
  return lead.size() + payload;
}

PromptFileInfo read_prompt_file_info(const fs::path& path) {
  PfFd f;
  return pf_open_and_check(path, f);
}

PromptFileData read_prompt_file(const fs::path& path, const CacheFingerprint& expected,
                                const std::vector<KVCacheParams>& layers) {
  const std::string name = path.string();
  PfFd f;
  const PromptFileInfo info = pf_open_and_check(path, f);
  if (const std::string why = expected.mismatch(info.fingerprint); !why.empty())
    throw InvalidInput(name + ": written for another model or cache layout: " + why);
  const uint64_t want = pf_payload_size(info.kind, layers, info.n_tokens, info.first_row);
  if (want != info.payload_bytes)
    throw InvalidInput(name + ": corrupted (a payload of " + std::to_string(info.payload_bytes) + " bytes, " +
                       std::to_string(info.n_tokens) + " tokens of this layout take " + std::to_string(want) + ")");
  ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);

  PromptFileData data;
  data.kind = info.kind;
  data.salt = info.salt;
  data.first_row = info.first_row;
  data.tokens.resize(size_t(info.n_tokens));
  std::vector<PfPiece> pieces;
  pieces.push_back({reinterpret_cast<const uint8_t*>(data.tokens.data()), data.tokens.size() * sizeof(int32_t)});
  for (const KVCacheParams& p : layers) {
    const int64_t rows = prompt_file_rows(info.kind, p, info.n_tokens, info.first_row);
    Array k = Array::empty({p.n_kv_heads, rows, packed_row_width(p.key_dtype(), p.head_dim)}, p.key_dtype());
    Array v = Array::empty({p.n_kv_heads, rows, packed_row_width(p.value_dtype(), p.head_dim)}, p.value_dtype());
    for (const Array* a : {&k, &v}) pieces.push_back({static_cast<const uint8_t*>(a->raw()), a->nbytes()});
    data.layers.emplace_back(std::move(k), std::move(v));
  }
  if (pf_read_pieces(f.fd, info.file_bytes - info.payload_bytes, pieces, path) != info.payload_crc32)
    throw InvalidInput(name + ": corrupted (the payload's checksum does not match)");
  return data;
}

std::vector<KVCacheParams> model_kv_layers(const Model& model, const KVCacheParams& options) {
  std::vector<KVCacheParams> layers;
  for (int64_t l = 0; l < model.info().n_layers; ++l) layers.push_back(model.kv_params(l, options));
  return layers;
}

PromptFileData dense_file_data(std::vector<int32_t> tokens, const std::vector<KVState>& states, std::string salt,
                               const std::vector<KVCacheParams>& layers) {
  if (states.size() != layers.size())
    throw InvalidInput("prompt-cache file: a snapshot of " + std::to_string(states.size()) + " layers for a model of " +
                       std::to_string(layers.size()));
  PromptFileData d;
  d.kind = PromptFileKind::dense;
  d.salt = std::move(salt);
  const int64_t n = int64_t(tokens.size());
  for (size_t l = 0; l < states.size(); ++l) {
    const KVState& s = states[l];
    if (s.offset != n || !s.keys.defined())
      throw InvalidInput("prompt-cache file: layer " + std::to_string(l) + "'s snapshot at offset " +
                         std::to_string(s.offset) + " for " + std::to_string(n) + " tokens");
    const int64_t rows = prompt_file_rows(PromptFileKind::dense, layers[l], n, 0);
    Array k = kv_rows_view(s.keys, 0, rows), v = kv_rows_view(s.values, 0, rows);
    d.layers.emplace_back(ops::to_device(k, Device::cpu()), ops::to_device(v, Device::cpu()));
  }
  d.tokens = std::move(tokens);
  return d;
}

std::vector<KVState> dense_file_states(const PromptFileData& data, const std::vector<KVCacheParams>& layers,
                                       Device device) {
  if (data.kind != PromptFileKind::dense || data.layers.size() != layers.size())
    throw InvalidInput("prompt-cache file: not a dense snapshot of this model's " + std::to_string(layers.size()) +
                       " layers");
  const int64_t n = int64_t(data.tokens.size());
  std::vector<KVState> states;
  for (size_t l = 0; l < layers.size(); ++l) {
    const KVCacheParams& p = layers[l];
    Array k = data.layers[l].first, v = data.layers[l].second;
    if (p.window > 0 && k.dim(1) < p.window) {
      // A ring not yet wrapped: its rows [0, n) hold positions [0, n); the rest is never read.
      Array rk = Array::zeros({p.n_kv_heads, p.window, k.dim(2)}, k.dtype());
      Array rv = Array::zeros({p.n_kv_heads, p.window, v.dim(2)}, v.dtype());
      ops::copy_into(kv_rows_view(rk, 0, k.dim(1)), k);
      ops::copy_into(kv_rows_view(rv, 0, v.dim(1)), v);
      k = rk;
      v = rv;
    }
    if (p.window == 0 && p.step > 0 && n % p.step != 0) {
      // Buffers of the size the cache grows to (as a stored snapshot's are), so that the copying
      // write a restore costs is also the only one until the sequence passes them.
      const int64_t cap = (n + p.step - 1) / p.step * p.step;
      Array pk = Array::empty({p.n_kv_heads, cap, k.dim(2)}, k.dtype(), device);
      Array pv = Array::empty({p.n_kv_heads, cap, v.dim(2)}, v.dtype(), device);
      ops::copy_into(kv_rows_view(pk, 0, n), ops::to_device(k, device));
      ops::copy_into(kv_rows_view(pv, 0, n), ops::to_device(v, device));
      states.push_back({pk, pv, n});
      continue;
    }
    states.push_back({ops::to_device(k, device), ops::to_device(v, device), n});
  }
  return states;
}

}  // namespace osprey
