#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "core/error.h"

namespace osprey {
namespace {

std::atomic<int> g_threshold{int(LogLevel::info)};

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warning";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "?";
}

}  // namespace

LogLevel parse_log_level(const std::string& s, const std::string& what) {
  if (s == "error") return LogLevel::error;
  if (s == "warn" || s == "warning") return LogLevel::warn;
  if (s == "info") return LogLevel::info;
  if (s == "debug") return LogLevel::debug;
  throw InvalidInput(what + "=" + s + ": expected error, warn, info or debug");
}

void set_log_level(LogLevel level) { g_threshold.store(int(level), std::memory_order_relaxed); }

bool log_enabled(LogLevel level) { return int(level) <= g_threshold.load(std::memory_order_relaxed); }

void log_message(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "osprey: %s: %s\n", level_name(level), message.c_str());
}

}  // namespace osprey
