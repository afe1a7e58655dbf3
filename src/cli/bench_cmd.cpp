// osprey bench: prompt-processing and generation throughput after llama-bench, with peak
// memory and the KV write counters per test. The measurement is serve/bench.h; this file
// parses flags and prints md, json or csv.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cuda_available.h"
#include "backend/device_select.h"
#include "backend/ops.h"
#include "cli/build_info.h"
#include "bundle/model_bundle.h"
#include "bundle/model_files.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "core/env.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/sharded_model.h"
#include "formats/safetensors.h"
#include "grammar/matcher.h"
#include "model/model.h"
#include "serve/batched_bench.h"
#include "serve/bench.h"
#include "tokenizer/tokenizer.h"

namespace osprey::cli {
namespace {

namespace fs = std::filesystem;

struct BenchOptions {
  std::string model;
  bool download = false;
  std::vector<int64_t> n_prompt{512};
  std::vector<int64_t> n_gen{128};
  std::vector<int64_t> depths{0};
  std::string n_prompt_arg = "512", n_gen_arg = "128", depths_arg = "0";  // as given; parsed into the above
  int repetitions = 5;
  int warmup = 1;
  std::string output = "md";
  int threads = -1;
  std::string device;
  std::string cache_type_k, cache_type_v;  // --cache-type-k, --cache-type-v
  int tensor_parallel = 1;
  uint64_t seed = 1234;
  std::string batch_arg;  // --batch: batch sizes of the batched test ("" : the llama-bench tests)
  std::vector<int64_t> batch;
  int64_t block_size = 16;
  bool batch_invariant = false;
  SpeculativeParams spec;  // tg tests: speculative decoding
  std::string grammar_file;  // --batch: constrain every sequence to this GBNF grammar
  std::string json_schema;   // --batch: ... or to JSON valid against this schema (text or @FILE)
  // How generated tokens are chosen (tg tests and --batch): greedy unless --temp > 0; the
  // sampling seed is fixed, so that runs repeat.
  SamplerParams sampler;
};


struct Header {
  std::string commit = build_commit();
  std::string version = OSPREY_VERSION;
  std::string cpu;
  int n_threads = 0;
  std::string backend = "CPU";
  std::string model_path, model_name, model_type, weight_dtype;
  size_t weight_bytes = 0;
  uint64_t n_params = 0;
  bool kv_inplace = true;
  int kv_step = 256;
  // The KV cache's key and value types (--cache-type-k/-v, else the model's) and the bytes one
  // position takes over all layers (keys and values).
  std::string kv_type_k, kv_type_v;
  uint64_t kv_token_bytes = 0;
  std::string constraint;  // --batch: the grammar every sequence is held to ("" : none)
  std::string sampling;    // sampling_label() ("" : greedy)
};

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t b = line.find_first_not_of(" \t", colon + 1);
    return b == std::string::npos ? "unknown" : line.substr(b);
  }
  return "unknown";
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// "temperature 0.8, top-p 0.95" for a sampled bench ("" for greedy).
std::string sampling_label(const SamplerParams& p) {
  if (!(p.temperature > 0.0f)) return "";
  std::string s = fmt("temperature %g", double(p.temperature));
  if (p.top_k > 0) s += ", top-k " + std::to_string(p.top_k);
  if (p.top_p < 1.0f) s += fmt(", top-p %g", double(p.top_p));
  if (p.min_p > 0.0f) s += fmt(", min-p %g", double(p.min_p));
  return s;
}

std::string human_bytes(double b) {
  if (b >= double(1ull << 30)) return fmt("%.2f GiB", b / double(1ull << 30));
  if (b >= double(1ull << 20)) return fmt("%.2f MiB", b / double(1ull << 20));
  return fmt("%.2f KiB", b / 1024.0);
}

std::string human_count(double n) {
  if (n >= 1e9) return fmt("%.2f B", n / 1e9);
  if (n >= 1e6) return fmt("%.2f M", n / 1e6);
  return fmt("%.2f K", n / 1e3);
}

nlohmann::json test_json(const BenchResult& r, uint64_t kv_token_bytes) {
  std::vector<int64_t> ns;
  for (double s : r.seconds) ns.push_back(int64_t(s * 1e9 + 0.5));
  const bool pp = r.test.kind == BenchTest::Kind::prompt;
  return {{"name", r.test.name()},
          {"n_prompt", pp ? r.test.n_tokens : 0},
          {"n_gen", pp ? 0 : r.test.n_tokens},
          {"n_depth", r.test.depth},
          {"avg_ts", r.stats.mean},
          {"stddev_ts", r.stats.stddev},
          {"median_ts", r.stats.median},
          {"min_ts", r.stats.min},
          {"max_ts", r.stats.max},
          {"samples_ts", r.tps},
          {"samples_ns", ns},
          {"memory",
           {{"peak_alloc_bytes", r.memory.test.alloc_bytes},
            {"peak_reserved_bytes", r.memory.test.reserved_bytes},
            {"peak_rss_bytes", r.memory.test.rss_bytes},
            {"timed",
             {{"peak_alloc_bytes", r.memory.timed.alloc_bytes},
              {"peak_reserved_bytes", r.memory.timed.reserved_bytes},
              {"peak_rss_bytes", r.memory.timed.rss_bytes}}},
            {"rss_scope", r.memory.rss_per_test ? "test" : "process"}}},
          {"speculative", {{"drafted_n", r.n_drafted}, {"accepted_n", r.n_accepted}}},
          {"kv",
           {{"cache_bytes", kv_token_bytes * uint64_t(r.test.depth + r.test.n_tokens)},
            {"inplace_writes", r.kv.n_inplace_writes},
            {"copying_writes", r.kv.n_copying_writes},
            {"bytes_copied", r.kv.bytes_copied}}}};
}

void print_json(const Header& h, const BenchOptions& o, const std::vector<BenchResult>& results) {
  nlohmann::json j;
  j["osprey"] = {{"version", h.version}, {"commit", h.commit}};
  j["machine"] = {{"cpu", h.cpu}, {"n_threads", h.n_threads}, {"backend", h.backend}, {"gpu", nullptr}};
  j["model"] = {{"path", h.model_path},       {"name", h.model_name},       {"model_type", h.model_type},
                {"weight_dtype", h.weight_dtype}, {"weight_bytes", h.weight_bytes}, {"n_params", h.n_params}};
  j["kv"] = {{"inplace_write", h.kv_inplace},
             {"step", h.kv_step},
             {"type_k", h.kv_type_k},
             {"type_v", h.kv_type_v},
             {"bytes_per_token", h.kv_token_bytes}};
  j["params"] = {{"repetitions", o.repetitions}, {"warmup", o.warmup}, {"seed", o.seed}};
  if (!h.sampling.empty()) j["params"]["sampling"] = h.sampling;
  j["tests"] = nlohmann::json::array();
  for (const BenchResult& r : results) j["tests"].push_back(test_json(r, h.kv_token_bytes));
  std::printf("%s\n", j.dump(2).c_str());
}

void print_csv(const Header& h, const std::vector<BenchResult>& results) {
  std::printf(
      "build_commit,cpu_info,n_threads,backend,model,model_type,weight_dtype,model_size,model_n_params,"
      "kv_inplace_write,test,n_prompt,n_gen,n_depth,repetitions,avg_ts,stddev_ts,median_ts,min_ts,max_ts,"
      "peak_alloc_bytes,peak_reserved_bytes,peak_rss_bytes,timed_peak_alloc_bytes,timed_peak_reserved_bytes,"
      "timed_peak_rss_bytes,kv_inplace_writes,kv_copying_writes,kv_bytes_copied\n");
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  for (const BenchResult& r : results) {
    const bool pp = r.test.kind == BenchTest::Kind::prompt;
    std::printf("%s,%s,%d,%s,%s,%s,%s,%zu,%llu,%d,%s,%lld,%lld,%lld,%zu,%.4f,%.4f,%.4f,%.4f,%.4f,%zu,%zu,%zu,%zu,%zu,%zu,%llu,%llu,%llu\n",
                h.commit.c_str(), quoted(h.cpu).c_str(), h.n_threads, h.backend.c_str(), quoted(h.model_name).c_str(),
                h.model_type.c_str(), h.weight_dtype.c_str(), h.weight_bytes, (unsigned long long)h.n_params,
                int(h.kv_inplace), quoted(r.test.name()).c_str(), (long long)(pp ? r.test.n_tokens : 0),
                (long long)(pp ? 0 : r.test.n_tokens), (long long)r.test.depth, r.tps.size(), r.stats.mean,
                r.stats.stddev, r.stats.median, r.stats.min, r.stats.max, r.memory.test.alloc_bytes,
                r.memory.test.reserved_bytes, r.memory.test.rss_bytes, r.memory.timed.alloc_bytes,
                r.memory.timed.reserved_bytes, r.memory.timed.rss_bytes, (unsigned long long)r.kv.n_inplace_writes,
                (unsigned long long)r.kv.n_copying_writes, (unsigned long long)r.kv.bytes_copied);
  }
}

void print_md(const Header& h, const BenchOptions& o, const std::vector<BenchResult>& results) {
  std::printf("osprey %s (%s) | %s: %s, %d threads | KV in-place writes: %s (OSPREY_KV_INPLACE_WRITE), step %d\n",
              h.version.c_str(), h.commit.c_str(), h.backend.c_str(), h.cpu.c_str(), h.n_threads,
              h.kv_inplace ? "on" : "off", h.kv_step);
  std::printf("model: %s (%s, %s, %zu weight bytes, %llu params) | %d runs + %d warmup per test\n",
              h.model_path.c_str(), h.model_type.c_str(), h.weight_dtype.c_str(), h.weight_bytes,
              (unsigned long long)h.n_params, o.repetitions, o.warmup);
  if (!h.sampling.empty()) std::printf("tg tokens sampled: %s\n", h.sampling.c_str());
  std::printf("KV cache: %s keys, %s values, %llu bytes a token (%.2f MiB at the deepest test)\n", h.kv_type_k.c_str(),
              h.kv_type_v.c_str(), (unsigned long long)h.kv_token_bytes, [&] {
                int64_t rows = 0;
                for (const BenchResult& r : results) rows = std::max(rows, r.test.depth + r.test.n_tokens);
                return double(h.kv_token_bytes * uint64_t(rows)) / (1 << 20);
              }());
  std::printf("\n");
  std::printf(
      "| model | size | params | backend | threads | test | t/s | median t/s | peak alloc (test / timed) | "
      "peak reserved (test / timed) | peak RSS (test / timed) | kv writes in place / copying |\n");
  std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  auto pair = [](size_t test, size_t timed) { return human_bytes(double(test)) + " / " + human_bytes(double(timed)); };
  for (const BenchResult& r : results) {
    const MemoryPeaks &a = r.memory.test, &b = r.memory.timed;
    std::printf("| %s %s %s | %s | %s | %s | %d | %s | %.2f ± %.2f | %.2f | %s | %s | %s%s | %llu / %llu |\n",
                h.model_name.c_str(), h.model_type.c_str(), h.weight_dtype.c_str(),
                human_bytes(double(h.weight_bytes)).c_str(), human_count(double(h.n_params)).c_str(),
                h.backend.c_str(), h.n_threads, r.test.name().c_str(), r.stats.mean, r.stats.stddev, r.stats.median,
                pair(a.alloc_bytes, b.alloc_bytes).c_str(), pair(a.reserved_bytes, b.reserved_bytes).c_str(),
                pair(a.rss_bytes, b.rss_bytes).c_str(), r.memory.rss_per_test ? "" : " (process)",
                (unsigned long long)r.kv.n_inplace_writes, (unsigned long long)r.kv.n_copying_writes);
  }
}

// llama-batched-bench's table: PP, TG and B, rows held, prompt and generation seconds and
// tokens per second (aggregate), and the generation rate of one sequence.
void print_batched(const Header& h, const std::vector<BatchedBenchResult>& results, bool invariant,
                   const std::string& output) {
  if (output == "json") {
    nlohmann::json j;
    j["build_commit"] = h.commit;
    j["backend"] = h.backend;
    j["model"] = h.model_path;
    j["model_type"] = h.model_type;
    j["weight_dtype"] = h.weight_dtype;
    j["batch_invariant"] = invariant;
    j["constraint"] = h.constraint;
    if (!h.sampling.empty()) j["sampling"] = h.sampling;
    for (const BatchedBenchResult& r : results)
      j["results"].push_back({{"pp", r.n_prompt}, {"tg", r.n_gen}, {"b", r.batch}, {"n_kv", r.n_kv},
                              {"t_pp", r.t_prompt}, {"s_pp", r.prompt_tps()}, {"t_tg", r.t_gen},
                              {"s_tg", r.gen_tps()}, {"s_tg_per_seq", r.gen_tps_per_sequence()},
                              {"t", r.t_prompt + r.t_gen}, {"s", r.total_tps()},
                              {"peak_reserved_bytes", r.peak_reserved_bytes}, {"kv_pool_bytes", r.pool_bytes}});
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("osprey %s (%s) | %s | model: %s (%s, %s) | batch invariant: %s | constrained: %s\n\n",
              h.version.c_str(), h.commit.c_str(), h.backend.c_str(), h.model_path.c_str(), h.model_type.c_str(),
              h.weight_dtype.c_str(), invariant ? "on" : "off", h.constraint.empty() ? "no" : h.constraint.c_str());
  if (!h.sampling.empty()) std::printf("tokens sampled: %s\n\n", h.sampling.c_str());
  std::printf("| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | S_TG per seq t/s | T s | S t/s | KV pool | "
              "peak reserved |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const BatchedBenchResult& r : results)
    std::printf("| %lld | %lld | %d | %lld | %.3f | %.2f | %.3f | %.2f | %.2f | %.3f | %.2f | %s | %s |\n",
                (long long)r.n_prompt, (long long)r.n_gen, r.batch, (long long)r.n_kv, r.t_prompt, r.prompt_tps(),
                r.t_gen, r.gen_tps(), r.gen_tps_per_sequence(), r.t_prompt + r.t_gen, r.total_tps(),
                human_bytes(double(r.pool_bytes)).c_str(), human_bytes(double(r.peak_reserved_bytes)).c_str());
}

int run_bench_cmd(const BenchOptions& o) {
  const std::vector<BenchTest> tests = make_bench_tests(o.n_prompt, o.n_gen, o.depths);
  if (tests.empty()) throw UsageError("bench: no tests (every -p and -n value is 0)");
  if (!o.batch.empty() && (o.n_prompt.size() != 1 || o.n_gen.size() != 1 || o.n_prompt[0] < 1 || o.n_gen[0] < 1 ||
                           o.depths.size() != 1 || o.depths[0] != 0))
    throw UsageError("bench --batch: give one prompt size (-p) and one generation length (-n), both >= 1, and no depth");
  if (!o.batch.empty() && o.spec.enabled())
    throw UsageError(std::string("bench --batch with ") + o.spec.flag() +
                     ": --batch drives the paged backend's decode steps itself and drafts nothing "
                     "(serve drafts with the paged layout)");
  if (o.threads >= 0) set_cpu_threads(o.threads);
  const std::string dir = model_folder(o.model, o.download);
  if (!fs::exists(dir)) throw IoError("model folder " + dir + " does not exist");

  const EnvOptions& env = env_options();
  LoadOptions lo;
  lo.device = select_device(o.device.empty() ? env.device : o.device);
  if (!o.batch.empty() && o.tensor_parallel > 1)
    throw UsageError("bench --batch runs on the paged KV pool, which does not serve --tensor-parallel yet");
  std::unique_ptr<Model> model = load_sharded_model(dir, o.tensor_parallel, lo);
  const ModelInfo& info = model->info();

  Header h;
  h.cpu = cpu_model_name();
  h.n_threads = cpu_pool().n_threads();
  if (!lo.device.is_cpu()) h.backend = "CUDA (" + cuda_description(lo.device.index) + ")";
  if (o.tensor_parallel > 1) h.backend += ", tensor parallel " + std::to_string(o.tensor_parallel);
  h.model_path = dir;
  h.model_name = model_name(dir);
  if (!o.model.empty() && !fs::exists(o.model)) h.model_name = o.model;  // a Hub id names itself
  h.model_type = info.model_type;
  h.weight_dtype = dtype_name(info.weight_dtype);
  if (info.quant_bits > 0)
    h.weight_dtype = "q" + std::to_string(info.quant_bits) + " g" + std::to_string(info.quant_group_size) + " (" +
                     h.weight_dtype + " scales)";
  h.weight_bytes = info.weight_bytes;
  h.n_params = info.n_params;
  h.kv_inplace = env.kv_inplace_write;
  h.kv_step = env.kv_step;
  {
    KVCacheParams types;
    types.k_type = cache_type(o.cache_type_k, "--cache-type-k");
    types.v_type = cache_type(o.cache_type_v, "--cache-type-v");
    // A tensor-parallel model's layers are split across ranks (kv_params throws): the types as
    // given, no byte count.
    h.kv_type_k = o.cache_type_k.empty() ? "model" : o.cache_type_k;
    h.kv_type_v = o.cache_type_v.empty() ? "model" : o.cache_type_v;
    for (int64_t l = 0; l < (o.tensor_parallel > 1 ? 0 : info.n_layers); ++l) {
      const KVCacheParams p = model->kv_params(l, types);
      h.kv_token_bytes += p.row_bytes(1);
      if (l == 0) {
        h.kv_type_k = kv_cache_type_name(p.key_dtype());
        h.kv_type_v = kv_cache_type_name(p.value_dtype());
      }
    }
  }
  if (!(o.sampler.temperature > 0.0f) && (o.sampler.top_k > 0 || o.sampler.top_p < 1.0f || o.sampler.min_p > 0.0f))
    throw UsageError("bench --top-k/--top-p/--min-p: need --temp > 0 (the generated tokens are greedy without it)");
  if (o.sampler.temperature > 0.0f && (!o.grammar_file.empty() || !o.json_schema.empty()))
    throw UsageError("bench --temp with --grammar-file/--json-schema: the constrained bench decodes greedily");
  validate(o.sampler);
  h.sampling = sampling_label(o.sampler);

  if (!o.batch.empty()) {
    BatchedBenchParams bb;
    bb.n_prompt = o.n_prompt[0];
    bb.n_gen = o.n_gen[0];
    bb.batch_sizes.assign(o.batch.begin(), o.batch.end());
    bb.block_size = o.block_size;
    bb.seed = o.seed;
    bb.graphs = env.cuda_graphs;
    bb.inplace = env.kv_inplace_write;
    bb.k_type = cache_type(o.cache_type_k, "--cache-type-k");
    bb.v_type = cache_type(o.cache_type_v, "--cache-type-v");
    bb.split_keys = env.paged_split_keys;
    bb.sampler = o.sampler;
    if (!o.grammar_file.empty() || !o.json_schema.empty()) {
      bb.grammar = std::make_shared<const grammar::Grammar>(read_grammar_flags("bench", o.grammar_file, o.json_schema));
      const ModelBundle bundle = load_model_bundle(dir);
      if (!bundle.tokenizer) throw UsageError("bench --grammar-file/--json-schema: needs the model's tokenizer.json");
      bb.trie = grammar::TokenTrie::from_tokenizer(*bundle.tokenizer);
      bb.end_ids = bundle.stop_ids(info.eos_ids);
      h.constraint = !o.grammar_file.empty() ? "grammar " + o.grammar_file : "JSON schema " + o.json_schema;
    }
    ops::set_batch_invariant(o.batch_invariant);
    print_batched(h, run_batched_bench(*model, bb), o.batch_invariant, o.output);
    return 0;
  }

  BenchParams bp;
  bp.repetitions = o.repetitions;
  bp.warmup = o.warmup;
  bp.seed = o.seed;
  bp.cache.step = env.kv_step;
  bp.cache.inplace = env.kv_inplace_write;
  bp.cache.k_type = cache_type(o.cache_type_k, "--cache-type-k");
  bp.cache.v_type = cache_type(o.cache_type_v, "--cache-type-v");
  bp.decode = generate_params(env);
  bp.decode.sampler = o.sampler;
  bp.decode.spec = o.spec;
  std::optional<Tokenizer> tokenizer;
  if (!o.spec.model_draft.empty() && model_has_tokenizer(dir)) tokenizer = load_model_tokenizer(dir);
  std::unique_ptr<Model> draft =
      load_draft_model(o.spec, *model, tokenizer ? &*tokenizer : nullptr, info.device, o.output != "md");
  bp.decode.draft_model = draft.get();

  std::vector<BenchResult> results;
  for (const BenchTest& t : tests) results.push_back(run_bench(*model, t, bp));

  if (o.output == "json")
    print_json(h, o, results);
  else if (o.output == "csv")
    print_csv(h, results);
  else
    print_md(h, o, results);
  return 0;
}

}  // namespace

Command add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  constexpr int64_t kMaxSize = int64_t(1) << 24;
  add_model_options(app, o->model, o->download);
  app.add_option("-p,--n-prompt", o->n_prompt_arg, "Prompt sizes to time, comma-separated (0: no pp test)")
      ->capture_default_str();
  app.add_option("-n,--n-gen", o->n_gen_arg, "Generation lengths to time, comma-separated (0: no tg test)")
      ->capture_default_str();
  app.add_option("-d,--n-depth", o->depths_arg, "Cache depths the tests start from, comma-separated")
      ->capture_default_str();
  app.add_option("-r,--repetitions", o->repetitions, "Measured runs per test")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--warmup", o->warmup, "Unmeasured runs per test, before the measured ones")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("-o,--output", o->output, "Output format")
      ->check(CLI::IsMember({"md", "json", "csv"}))
      ->capture_default_str();
  add_device_option(app, o->device);
  add_cache_type_options(app, o->cache_type_k, o->cache_type_v);
  add_threads_option(app, o->threads);
  add_tensor_parallel_option(app, o->tensor_parallel);
  app.add_option("--seed", o->seed, "Seed of the random prompt tokens")->check(unsigned_u64())->capture_default_str();
  o->sampler.seed = 0x5eed;
  app.add_option("--temp", o->sampler.temperature, "Sample the generated tokens at this temperature (tg tests and --batch; 0: greedy)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  app.add_option("--top-k", o->sampler.top_k, "With --temp: top-k (0: off)")->check(CLI::Range(0, INT32_MAX));
  app.add_option("--top-p", o->sampler.top_p, "With --temp: top-p (1: off)")->check(CLI::Range(1e-9, 1.0));
  app.add_option("--min-p", o->sampler.min_p, "With --temp: min-p (0: off)")->check(CLI::Range(0.0, 0.999999));
  app.add_option("--batch", o->batch_arg,
                 "Batch sizes to time as llama-batched-bench does (e.g. 1,4,16,64): each decodes that many sequences "
                 "of -p prompt and -n generated tokens together");
  app.add_option("--block-size", o->block_size, "--batch: rows per KV block")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str()
      ->group("Advanced");
  add_spec_options(app, o->spec);
  app.add_flag("--batch-invariant", o->batch_invariant, "--batch: batch-invariant kernels (docs/design.md)")
      ->group("Advanced");
  app.add_option("--grammar-file", o->grammar_file,
                 "--batch: constrain every sequence to a GBNF grammar read from this file (docs/benchmarks.md)");
  app.add_option("--json-schema", o->json_schema,
                 "--batch: constrain every sequence to JSON valid against this JSON Schema (the text, or @FILE)");
  return [o] {
    if (!o->batch_arg.empty()) o->batch = parse_int_list("--batch", o->batch_arg, 1, 4096);
    if (o->batch_arg.empty() && (!o->grammar_file.empty() || !o->json_schema.empty()))
      throw UsageError("bench --grammar-file/--json-schema: constrain the --batch test only; give --batch");
    o->n_prompt = parse_int_list("--n-prompt", o->n_prompt_arg, 0, kMaxSize);
    o->n_gen = parse_int_list("--n-gen", o->n_gen_arg, 0, kMaxSize);
    o->depths = parse_int_list("--n-depth", o->depths_arg, 0, kMaxSize);
    return run_bench_cmd(*o);
  };
}

}  // namespace osprey::cli
