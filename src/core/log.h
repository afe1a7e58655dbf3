#pragma once
// The one leveled logger. Lines go to stderr as "osprey: <level>: <message>" when their level
// is at or above the threshold (info unless set_log_level says otherwise; the CLI passes
// OSPREY_LOG_LEVEL). Thread-safe.
#include <string>

namespace osprey {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

// "error", "warn" (or "warning"), "info", "debug"; throws InvalidInput naming `what` otherwise.
LogLevel parse_log_level(const std::string& name, const std::string& what);
void set_log_level(LogLevel level);
bool log_enabled(LogLevel level);
void log_message(LogLevel level, const std::string& message);

inline void log_warn(const std::string& m) { log_message(LogLevel::warn, m); }
inline void log_info(const std::string& m) { log_message(LogLevel::info, m); }
inline void log_debug(const std::string& m) {
  if (log_enabled(LogLevel::debug)) log_message(LogLevel::debug, m);
}

}  // namespace osprey
