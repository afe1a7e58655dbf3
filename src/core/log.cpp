#include "core/log.h"

#include <cstdio>
#include <mutex>

#include "core/env.h"

namespace osprey {
namespace {

LogLevel parse_level(const std::string& s) {
  if (s == "error") return LogLevel::error;
  if (s == "warn" || s == "warning") return LogLevel::warn;
  if (s == "debug") return LogLevel::debug;
  return LogLevel::info;
}

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

bool log_enabled(LogLevel level) {
  static const LogLevel threshold = parse_level(env_options().log_level);
  return level <= threshold;
}

void log_message(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "osprey: %s: %s\n", level_name(level), message.c_str());
}

}  // namespace osprey
