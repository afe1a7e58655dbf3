// osprey: the command-line front end. Maps errors to exit codes: 0 success, 1 a runtime
// error (bad checkpoint, config, input or I/O), 2 a usage error (unknown flag, bad value).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

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
  add("chat", "Chat with the model through its chat template", osprey::cli::add_chat);
  add("template", "Print a chat request rendered with the model's chat template", osprey::cli::add_template);
  add("serve", "Serve the model over an OpenAI-compatible HTTP API", osprey::cli::add_serve);
  add("convert", "Quantize a checkpoint to MLX affine 2/3/4/6/8-bit (mlx-lm's layout)", osprey::cli::add_convert);
  // llama-server's two-letter short flag, which CLI11 cannot declare (serve only: elsewhere
  // "-np" may be a value, such as a prompt).
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "serve")
    for (std::string& a : args)
      if (a == "-np") a = "--parallel";
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
