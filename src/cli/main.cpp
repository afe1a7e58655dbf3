// osprey: the command-line front end. Maps errors to exit codes: 0 success, 1 a runtime
// error (bad checkpoint, config, input or I/O, output that cannot be written), 2 a usage
// error (unknown flag, a value out of range, a missing argument).
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu_level.h"
#include "backend/cuda_available.h"
#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/suggest.h"
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

// Help as llama.cpp and ollama print it: the default at the end of the description
// ("(default: 128)") and descriptions wrapped to the terminal's usual width.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() {
    column_width(32);
    label("SUBCOMMAND", "COMMAND");
    label("Subcommands", "Commands");
  }

  // One blank line before a group: CLI11 writes one between groups and another at the head of
  // each, so the groups after the first ("Options", which holds --help) lose theirs.
  std::string make_group(std::string group, bool is_positional, std::vector<const CLI::Option*> opts) const override {
    const bool first = group == "Options" || is_positional;
    std::string out = CLI::Formatter::make_group(std::move(group), is_positional, std::move(opts));
    if (!first && !out.empty() && out.front() == '\n') out.erase(0, 1);
    return out;
  }

  std::string make_option_opts(const CLI::Option* opt) const override {
    if (!opt->get_option_text().empty()) return " " + opt->get_option_text();
    std::string out;
    // "INT:INT in [0, 9]" (the type, then the validator's words) shows as "INT in [0, 9]".
    if (opt->get_type_size() != 0 && !opt->get_type_name().empty()) {
      const std::string type = opt->get_type_name();
      const size_t colon = type.find(':');
      out += " " + (colon == std::string::npos ? type : type.substr(colon + 1));
    }
    if (!opt->get_excludes().empty()) {
      out += " (not with";
      for (const CLI::Option* other : opt->get_excludes()) out += " " + other->get_name();
      out += ")";
    }
    return out;
  }

  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string desc = opt->get_description();
    if (opt->get_type_size() != 0 && !opt->get_default_str().empty()) desc += " (default: " + opt->get_default_str() + ")";
    return wrap(desc, kWidth - get_column_width());
  }

 private:
  static constexpr size_t kWidth = 100;

  // Breaks `text` at spaces into lines of at most `width` characters (a longer word stays whole).
  static std::string wrap(const std::string& text, size_t width) {
    std::istringstream words(text);
    std::string out, line, word;
    while (words >> word) {
      if (!line.empty() && line.size() + 1 + word.size() > width) {
        out += line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + word;
    }
    return out + line;
  }
};

// "osprey generate": the command line up to the subcommand being parsed.
std::string command_path(const CLI::App& app) {
  std::string path = "osprey";
  for (const CLI::App* sub : app.get_subcommands()) path += " " + sub->get_name();
  return path;
}

// The arguments CLI11 did not take, as an error naming the first and, where one is near, the
// name that was probably meant.
std::string unknown_argument_message(const CLI::App& app, const std::vector<std::string>& extras) {
  std::string where;
  const CLI::App* scope = &app;
  for (const CLI::App* sub : app.get_subcommands()) {
    where += (where.empty() ? "" : " ") + sub->get_name();
    scope = sub;
  }
  if (!where.empty()) where += ": ";
  for (const std::string& arg : extras) {
    if (arg.size() < 2 || arg[0] != '-') continue;
    const std::string name = arg.substr(0, arg.find('='));
    std::vector<std::string> known;
    for (const CLI::Option* opt : scope->get_options()) {
      if (name.rfind("--", 0) == 0)
        for (const std::string& l : opt->get_lnames()) known.push_back("--" + l);
      else
        for (const std::string& s : opt->get_snames()) known.push_back("-" + s);
    }
    const std::string near = name.rfind("--", 0) == 0 ? osprey::cli::closest_name(name, known) : "";
    return where + "unknown option '" + name + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?");
  }
  std::string listed;
  for (const std::string& arg : extras) listed += (listed.empty() ? "" : " ") + arg;
  return where + "unexpected argument" + (extras.size() > 1 ? "s" : "") + " '" + listed + "'";
}

}  // namespace

int main(int argc, char** argv) {
  osprey::install_mapped_file_fault_handler();
  CLI::App app{"Osprey: LLM inference for NVIDIA GPUs and x86-64 CPUs", "osprey"};
  app.formatter(std::make_shared<HelpFormatter>());
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    return "osprey: error: " + std::string(e.what()) + "\nRun '" + command_path(*a) + " --help' for the options.\n";
  });
  app.set_version_flag("--version", std::string("osprey ") + OSPREY_VERSION + " (" + osprey::build_commit() + ")");
  app.require_subcommand(1);
  std::map<CLI::App*, osprey::cli::Command> commands;
  std::vector<std::string> command_names;
  auto add = [&](const char* name, const char* help, auto adder) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands[sub] = adder(*sub);
    command_names.push_back(name);
  };
  add("generate", "Generate text from a prompt", osprey::cli::add_generate);
  add("tokenize", "Print the token ids of a text as a JSON array", osprey::cli::add_tokenize);
  add("bench", "Measure prompt and generation throughput (after llama-bench)", osprey::cli::add_bench);
  add("perplexity", "Perplexity of a model on a text, and KL divergence from a base model (after llama.cpp's perplexity)", osprey::cli::add_perplexity);
  add("chat", "Chat with the model through its chat template", osprey::cli::add_chat);
  add("template", "Print a chat request rendered with the model's chat template", osprey::cli::add_template);
  add("serve", "Serve the model over an OpenAI-compatible HTTP API", osprey::cli::add_serve);
  add("pull", "Download a model from the Hugging Face Hub into its cache (org/name[:revision])", osprey::cli::add_pull);
  add("convert", "Quantize a checkpoint to MLX affine 2/3/4/6/8-bit (mlx-lm's layout) or FP8 (compressed-tensors)", osprey::cli::add_convert);
  // llama-server's two-letter short flag, which CLI11 cannot declare (serve only: elsewhere
  // "-np" may be a value, such as a prompt).
  std::vector<std::string> args(argv + 1, argv + argc);
  const auto usage_error = [](const std::string& message) {
    std::fprintf(stderr, "osprey: error: %s\nRun 'osprey --help' for the commands.\n", message.c_str());
    return 2;
  };
  if (args.empty()) return usage_error("give a command: " + [&] {
    std::string list;
    for (const std::string& n : command_names) list += (list.empty() ? "" : ", ") + n;
    return list;
  }());
  if (args[0][0] == '-' && args[0] != "-h" && args[0] != "--help" && args[0] != "--version") {
    const std::string name = args[0].substr(0, args[0].find('='));
    const std::string near = osprey::cli::closest_name(name, {"--help", "--version"});
    return usage_error("unknown option '" + name + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?") +
                       " (options of a command follow its name: osprey generate --help)");
  }
  if (args[0][0] != '-' && std::find(command_names.begin(), command_names.end(), args[0]) == command_names.end()) {
    const std::string near = osprey::cli::closest_name(args[0], command_names);
    return usage_error("unknown command '" + args[0] + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?"));
  }
  if (!args.empty() && args[0] == "serve")
    for (std::string& a : args)
      if (a == "-np") a = "--parallel";
  // vLLM's -tp, the same way (generate and bench; not where it is the value of a text flag).
  if (!args.empty() && (args[0] == "generate" || args[0] == "bench"))
    for (size_t i = 1; i < args.size(); ++i) {
      const std::string& before = args[i - 1];
      if (args[i] == "-tp" && before != "-p" && before != "--prompt" && before != "--stop" && before != "--system")
        args[i] = "--tensor-parallel";
    }
  // llama.cpp's -md for --model-draft, -ctk and -ctv for --cache-type-k and --cache-type-v, the
  // same way (-md: generate, chat, bench, serve; -ctk, -ctv: those and perplexity).
  if (!args.empty() && (args[0] == "generate" || args[0] == "chat" || args[0] == "bench" || args[0] == "serve" ||
                        args[0] == "perplexity"))
    for (size_t i = 1; i < args.size(); ++i) {
      const std::string& before = args[i - 1];
      if (before == "-p" || before == "--prompt" || before == "--stop" || before == "--system") continue;
      if (args[i] == "-md" && args[0] != "perplexity") args[i] = "--model-draft";
      if (args[i] == "-ctk") args[i] = "--cache-type-k";
      if (args[i] == "-ctv") args[i] = "--cache-type-v";
    }
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ExtrasError&) {
    std::fprintf(stderr, "osprey: error: %s\nRun '%s --help' for the options.\n",
                 unknown_argument_message(app, app.remaining(true)).c_str(), command_path(app).c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    // The command's models and caches are gone when this runs (on return or while an error
    // unwinds): the device's memory goes back to the driver before the process ends.
    struct ReleaseDevice {
      ~ReleaseDevice() { osprey::release_cuda_device(); }
    } release_device;
    // The process-wide settings from the environment; the commands read the rest of
    // env_options() and pass it down.
    const osprey::EnvOptions& env = osprey::env_options();
    osprey::set_log_level(osprey::parse_log_level(env.log_level, "OSPREY_LOG_LEVEL"));
    osprey::set_cpu_threads(env.n_threads);
    osprey::select_cpu_level(env.cpu_level);
    for (auto& [sub, run] : commands)
      if (sub->parsed()) return check_stdout(run());
  } catch (const osprey::cli::UsageError& e) {
    std::fprintf(stderr, "osprey: error: %s\nRun '%s --help' for the options.\n", e.what(), command_path(app).c_str());
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
