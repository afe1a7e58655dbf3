#pragma once
// Flag checks shared by the commands. A value out of its range is a usage error (exit 2) whose
// message names the flag, the value and the range; CLI11 reports it before the command runs.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "sample/sampler.h"
#include "grammar/grammar.h"
#include "serve/speculative.h"

namespace osprey::cli {

// Real numbers: finite (no nan or inf) and within [lo, hi]; `lo_open` / `hi_open` exclude
// the bound.
CLI::Validator real_range(double lo, double hi, bool lo_open = false, bool hi_open = false);
// Integers (of any width, signed or not): the text is a plain decimal in [lo, hi].
CLI::Validator int_range(int64_t lo, int64_t hi);
// An integer option in [lo, hi] (int_range) whose default shows in --help.
template <class T>
CLI::Option* add_int_option(CLI::App& app, const std::string& name, T& value, const std::string& help, int64_t lo,
                            int64_t hi) {
  return app.add_option(name, value, help)->check(int_range(lo, hi))->capture_default_str();
}
// An unsigned 64-bit integer written in decimal, without a sign (a seed).
CLI::Validator unsigned_u64();
// A comma-separated list of integers in [lo, hi] ("512,1024"); throws UsageError naming the
// flag for an empty item ("8,,16") or one that is not such an integer.
std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text, int64_t lo, int64_t hi);

// The sampling flags of generate and chat (--temp, --top-k, --top-p, --min-p,
// --repeat-penalty, --repeat-last-n, --seed), each range-checked as the sampler requires.
// Sets p.seed to random_seed() at once: a parse without --seed (or with --seed -1) samples
// with a fresh seed; --seed N stores N.
void add_sampler_options(CLI::App& app, SamplerParams& p, bool checkpoint_defaults = false);
// The sampler flags (add_sampler_options') that the command line gave.
std::vector<std::string> given_sampler_flags(const CLI::App& app);
// Each field of `p` whose flag is not in `given` taken from `defaults`: temperature, top-k,
// top-p, min-p, typical-p and the repetition penalty (the seed and --repeat-last-n stay p's).
void fill_unset_sampler_fields(SamplerParams& p, const SamplerParams& defaults, const std::vector<std::string>& given);

// Speculative decoding's flags (docs/design.md, "Speculative decoding"): --spec-ngram,
// --spec-ngram-min, --spec-ngram-max, --model-draft (-md, rewritten in main), --draft-p-min,
// --draft-max, --draft-min, --spec-min-acceptance, each range-checked.
void add_spec_options(CLI::App& app, SpeculativeParams& p);

// -m/--model (a folder holding `folder_holds`, or a Hub id; empty: the embedded default model)
// and --download (fetch a Hub model missing from the cache), in that order.
void add_model_options(CLI::App& app, std::string& model, bool& download, const std::string& folder_holds = "");
// --template-name: which of the folder's named chat templates.
CLI::Option* add_template_name_option(CLI::App& app, std::string& name);
// --cache-type-k and --cache-type-v (-ctk, -ctv, rewritten in main, as llama.cpp spells them):
// the KV cache's key and value types, f16, bf16, q8_0 or fp8, each checked at parse (a usage
// error lists the accepted ones). Empty (not given): the model's 16-bit type.
void add_cache_type_options(CLI::App& app, std::string& k, std::string& v);
// The DType of a value add_cache_type_options accepted; nullopt for an empty one.
std::optional<DType> cache_type(const std::string& value, const char* flag);
// --device: cpu, cuda or cuda:N.
CLI::Option* add_device_option(CLI::App& app, std::string& device);

// -t, --threads: 0 (one per core) up to the thread pool's bound.
CLI::Option* add_threads_option(CLI::App& app, int& threads);

// --pan-and-scan / --no-pan-and-scan: whether images are also cut into pan-and-scan crops
// (unset: the model's preprocessor_config.json says, off by default).
CLI::Option* add_pan_and_scan_option(CLI::App& app, std::optional<bool>& on);

// The most ranks --tensor-parallel takes.
inline constexpr int kMaxTensorParallel = 64;
// --tensor-parallel (-tp, rewritten in main): ranks in [1, kMaxTensorParallel]; whether the
// count divides the model's heads and the devices exist is checked at load.
CLI::Option* add_tensor_parallel_option(CLI::App& app, int& ranks);

// The grammar of --grammar-file (GBNF) or --json-schema (the schema, or @FILE) for `command`;
// a usage error names the flag at fault (both given, unreadable, invalid).
grammar::Grammar read_grammar_flags(const std::string& command, const std::string& grammar_file,
                                   const std::string& json_schema);

}  // namespace osprey::cli
