#pragma once
// An `osprey serve --port 0` child process for tests of the command itself (signals, exit
// codes): its pid, the port its log names, and its stderr in a file. Every wait is bounded.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "support/test_util.h"

namespace osprey::testing {

struct ServeProcess {
  pid_t pid = -1;
  int port = -1;  // -1 when "serving" was not logged within a minute
  std::string log_path;
};

// Starts `[env] osprey serve --port 0 <flags>` (env: "NAME=value ..." for the child alone) and
// waits up to a minute for it to listen and load.
inline ServeProcess start_serve(const std::string& flags, const std::string& env = "") {
  static std::atomic<int> counter{0};
  ServeProcess p;
  p.log_path = (std::filesystem::temp_directory_path() /
                ("osprey-serve-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".log"))
                   .string();
  p.pid = ::fork();
  if (p.pid == 0) {
    const std::string cmd =
        "exec env " + env + " " + std::string(OSPREY_BINARY) + " serve --port 0 " + flags + " 2>" + p.log_path;
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
    ::_exit(127);
  }
  for (int i = 0; i < 1200 && p.port < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::string log = read_file(p.log_path);
    const size_t at = log.find("serving ");
    const size_t port_at = log.find("listening on http://127.0.0.1:");
    if (at != std::string::npos && port_at != std::string::npos)
      p.port = std::stoi(log.substr(port_at + std::strlen("listening on http://127.0.0.1:")));
  }
  return p;
}

// waitpid() for at most `limit`: the wait status, or nothing (the child is then killed with
// SIGKILL and reaped, so that a hung server fails the test instead of hanging it).
inline std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return std::nullopt;
}

}  // namespace osprey::testing
