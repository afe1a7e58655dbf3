// osprey: the command-line front end. Maps errors to exit codes: 0 success, 1 a runtime
// error (bad checkpoint, config, input or I/O), 2 a usage error (unknown flag, bad value).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"

int main(int argc, char** argv) {
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
  add("convert", "Quantize a checkpoint to MLX affine 2/3/4/6/8-bit (mlx-lm's layout)", osprey::cli::add_convert);
  try {
    app.parse(argc, argv);
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
      if (sub->parsed()) return run();
  } catch (const osprey::Error& e) {
    std::fprintf(stderr, "osprey: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "osprey: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
