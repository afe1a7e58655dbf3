// osprey: the command-line front end. Maps errors to exit codes: 0 success, 1 a runtime
// error (bad checkpoint, config, input or I/O, output that cannot be written), 2 a usage
// error (unknown flag, a value out of range, a missing argument).
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <new>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"

namespace {

// Everything written to stdout reached it; else an error naming the cause (a full disk,
// /dev/full, a closed pipe), so that a lost output never exits 0.
int check_stdout(int code) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && !std::ferror(stdout)) return code;
  std::fprintf(stderr, "osprey: error: cannot write the output to stdout%s%s\n", errno ? ": " : "",
               errno ? std::strerror(errno) : "");
  return code == 0 ? 1 : code;
}

}  // namespace

int main(int argc, char** argv) {
  osprey::install_mapped_file_fault_handler();
  CLI::App app{"Osprey: LLM inference for NVIDIA GPUs and x86-64 CPUs"};
  app.set_version_flag("--version", std::string("osprey ") + OSPREY_VERSION + " (" + OSPREY_GIT_COMMIT + ")");
  app.require_subcommand(1);
  std::map<CLI::App*, osprey::cli::Command> commands;
  auto add = [&](const char* name, const char* help, auto adder) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands[sub] = adder(*sub);
  };
  add("generate", "Generate text from a prompt", osprey::cli::add_generate);
  add("tokenize", "Print the token ids of a text as a JSON array", osprey::cli::add_tokenize);
  add("bench", "Measure prompt and generation throughput (after llama-bench)", osprey::cli::add_bench);
  add("chat", "Chat with the model through its chat template", osprey::cli::add_chat);
  add("template", "Print a chat request rendered with the model's chat template", osprey::cli::add_template);
  add("serve", "Serve the model over an OpenAI-compatible HTTP API", osprey::cli::add_serve);
  add("pull", "Download a model from the Hugging Face Hub into its cache (org/name[:revision])", osprey::cli::add_pull);
  add("convert", "Quantize a checkpoint to MLX affine 2/3/4/6/8-bit (mlx-lm's layout)", osprey::cli::add_convert);
  // llama-server's two-letter short flag, which CLI11 cannot declare (serve only: elsewhere
  // "-np" may be a value, such as a prompt).
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "serve")
    for (std::string& a : args)
      if (a == "-np") a = "--parallel";
  // vLLM's -tp, the same way (generate and bench; not where it is the prompt's text).
  if (!args.empty() && (args[0] == "generate" || args[0] == "bench"))
    for (size_t i = 1; i < args.size(); ++i)
      if (args[i] == "-tp" && args[i - 1] != "-p" && args[i - 1] != "--prompt") args[i] = "--tensor-parallel";
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    // The process-wide settings from the environment; the commands read the rest of
    // env_options() and pass it down.
    const osprey::EnvOptions& env = osprey::env_options();
    osprey::set_log_level(osprey::parse_log_level(env.log_level, "OSPREY_LOG_LEVEL"));
    osprey::set_cpu_threads(env.n_threads);
    for (auto& [sub, run] : commands)
      if (sub->parsed()) return check_stdout(run());
  } catch (const osprey::cli::UsageError& e) {
    std::fprintf(stderr, "osprey: error: %s\nRun with --help for more information.\n", e.what());
    return check_stdout(2);
  } catch (const osprey::Error& e) {
    std::fprintf(stderr, "osprey: error: %s\n", e.what());
    return check_stdout(1);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "osprey: error: out of memory: an allocation failed (a size from a file, flag or environment "
                 "variable may be too large for this machine)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "osprey: internal error: %s\n", e.what());
    return 1;
  }
  return check_stdout(0);
}
