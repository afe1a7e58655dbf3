#include "core/env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"

namespace osprey {

bool parse_switch(const char* value, bool fallback) {
  if (!value || !*value) return fallback;
  std::string v(value);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return !(v == "0" || v == "false" || v == "off" || v == "no");
}

namespace {

int parse_int(const char* name, int fallback, int min_value, int max_value) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || errno == ERANGE || x < min_value || x > max_value)
    throw InvalidInput(std::string(name) + "=" + v + ": expected an integer in [" + std::to_string(min_value) + ", " +
                       std::to_string(max_value) + "]");
  return int(x);
}

std::string read_string(const char* name, std::string fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// huggingface_hub's reading of a boolean: 1/true/on/yes (any case) or 0/false/off/no; another
// value is an error naming the variable.
std::optional<bool> parse_strict_switch(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  throw InvalidInput(std::string(name) + "=" + v + ": expected 1/true/on/yes or 0/false/off/no");
}

// OSPREY_CUDA_FAULT: unset or empty is -1; else "trap_after_steps:N" with N in [0, 2^31).
int64_t parse_cuda_fault() {
  const char* v = std::getenv("OSPREY_CUDA_FAULT");
  if (!v || !*v) return -1;
  const std::string s(v);
  const std::string prefix = "trap_after_steps:";
  const std::string n = s.rfind(prefix, 0) == 0 ? s.substr(prefix.size()) : "";
  const bool digits = !n.empty() && n.size() <= 10 && std::all_of(n.begin(), n.end(), [](unsigned char c) { return std::isdigit(c); });
  if (!digits || std::stoll(n) > INT32_MAX)
    throw InvalidInput("OSPREY_CUDA_FAULT=" + s + ": expected trap_after_steps:N with N an integer in [0, " +
                       std::to_string(INT32_MAX) + "]");
  return std::stoll(n);
}

EnvOptions read_env() {
  EnvOptions o;
  o.kv_inplace_write = parse_switch(std::getenv("OSPREY_KV_INPLACE_WRITE"), true);
  o.kv_step = parse_int("OSPREY_KV_STEP", 256, 1, kMaxKvStep);
  o.n_threads = parse_int("OSPREY_THREADS", 0, 0, kMaxCpuThreads);
  if (const char* v = std::getenv("OSPREY_LOG_LEVEL"); v && *v) o.log_level = v;
  if (const char* v = std::getenv("OSPREY_DEVICE"); v && *v) o.device = v;
  if (const char* v = std::getenv("OSPREY_CPU_LEVEL"); v && *v) o.cpu_level = v;
  if (const char* v = std::getenv("OSPREY_CPU_Q4_ACTIVATIONS"); v && *v) {
    const std::string a = v;
    if (a != "int8" && a != "int16")
      throw InvalidInput("OSPREY_CPU_Q4_ACTIVATIONS=" + a + ": expected int16 (the default) or int8");
    o.cpu_q4_int8_activations = a == "int8";
  }
  o.cpu_amx = parse_strict_switch("OSPREY_CPU_AMX");
  o.force_sync = parse_switch(std::getenv("OSPREY_FORCE_SYNC"), false);
  o.cuda_graphs = parse_switch(std::getenv("OSPREY_CUDA_GRAPHS"), true);
  o.cuda_sample_rows = parse_switch(std::getenv("OSPREY_CUDA_SAMPLE_ROWS"), true);
  o.cuda_pdl = parse_switch(std::getenv("OSPREY_CUDA_PDL"), true);
  o.cuda_quant_mma = parse_switch(std::getenv("OSPREY_CUDA_QUANT_MMA"), true);
  o.cuda_fp8_weights = parse_strict_switch("OSPREY_CUDA_FP8_WEIGHTS");
  o.cuda_fp8_mma = parse_switch(std::getenv("OSPREY_CUDA_FP8_MMA"), true);
  o.cuda_fp8_activations = parse_switch(std::getenv("OSPREY_CUDA_FP8_ACTIVATIONS"), false);
  o.cuda_fault_trap_after_steps = parse_cuda_fault();
  o.paged_split_keys = parse_int("OSPREY_PAGED_SPLIT_KEYS", 0, 0, 1 << 20);
  if (o.paged_split_keys % 64 != 0)
    throw InvalidInput("OSPREY_PAGED_SPLIT_KEYS must be 0 or a multiple of 64, got " + std::to_string(o.paged_split_keys));
  o.hf_hub_cache = read_string("HF_HUB_CACHE");
  o.hf_home = read_string("HF_HOME");
  o.xdg_cache_home = read_string("XDG_CACHE_HOME");
  o.home = read_string("HOME");
  o.hf_endpoint = read_string("HF_ENDPOINT", o.hf_endpoint);
  o.hf_token = read_string("HF_TOKEN");
  o.hf_hub_offline = parse_strict_switch("HF_HUB_OFFLINE").value_or(false);
  if (const char* v = std::getenv("XDG_DATA_HOME"); v && v[0] == '/') {
    o.data_home = v;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    o.data_home = std::string(home) + "/.local/share";
  }
  return o;
}

}  // namespace

const EnvOptions& env_options() {
  static const EnvOptions options = read_env();
  return options;
}

}  // namespace osprey
