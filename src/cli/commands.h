#pragma once
// Subcommands of the `osprey` CLI. Each registers its options on the app and returns the
// function that runs it; errors propagate as osprey exceptions to main().
#include <functional>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/env.h"
#include "core/error.h"
#include "serve/generate.h"

namespace CLI {
class App;
}
namespace osprey {
class Model;
class Tokenizer;
}

namespace osprey::cli {

using Command = std::function<int()>;

// A usage error found while a command runs (a missing argument, flags that do not fit
// together): main() prints it and exits 2, as for the flag errors CLI11 reports.
class UsageError : public InvalidInput {
 public:
  using InvalidInput::InvalidInput;
};

Command add_generate(CLI::App& app);
Command add_tokenize(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_convert(CLI::App& app);
Command add_template(CLI::App& app);
Command add_chat(CLI::App& app);
Command add_serve(CLI::App& app);
Command add_pull(CLI::App& app);
Command add_perplexity(CLI::App& app);

// The model folder -m names (hub::resolve_model, with the environment's Hugging Face cache):
// a folder, a file in one, or a Hub id in the cache, fetched first when `download` is set;
// the embedded default when `model` is empty.
std::string model_folder(const std::string& model, bool download);

// The model folder to use when -m is not given: the embedded default. Throws IoError with
// a hint when it has not been made.
std::string default_model_dir();

// The folder's name, as the banner and the server's model id show it ("models/demo/" -> "demo").
std::string model_name(const std::string& dir);
// The one-line banner on stderr: the model (its folder's name), what runs it ("cuda:0 NVIDIA
// H200, 139 GiB" or "CPU, 8 threads, AVX2"; "CPU (no CUDA device found), ..." when a CUDA build
// took the CPU without being asked to) and the context. `asked`: the --device the user gave.
void print_banner(const std::string& dir, const Device& device, const std::string& asked, int tensor_parallel,
                  int64_t context);

// GenerateParams with the environment's decode switches (OSPREY_FORCE_SYNC, OSPREY_CUDA_GRAPHS).
GenerateParams generate_params(const EnvOptions& env);

// --model-draft: the draft model `spec` names (a folder or a Hub id in the cache), loaded on
// `device` and checked against the target (check_draft_compatible: its tokenizer, or the
// vocabulary size when neither model carries one); null when spec names none. Throws
// UsageError for --spec-ngram given with it, InvalidInput for a draft that does not fit.
std::unique_ptr<Model> load_draft_model(const SpeculativeParams& spec, const Model& target,
                                        const Tokenizer* target_tokenizer, const Device& device, bool quiet);

}  // namespace osprey::cli
