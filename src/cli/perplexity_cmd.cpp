// osprey perplexity: the perplexity of a model on a text, after llama.cpp's perplexity tool,
// and the KL divergence of a model's next-token distributions from a base model's.
//
// The text is tokenized once (with the BOS the tokenizer's post-processor adds) and cut into
// non-overlapping chunks of --ctx-size tokens; each chunk is one forward pass from an empty
// cache, its first token replaced by BOS when the tokenizer adds one. Only the second half of
// each chunk is scored: the logits at positions [ctx/2, ctx-1) predict the tokens after them.
// PPL = exp(mean NLL); its error is exp(mean) times the standard error of the mean NLL.
//
// Base file (--kl-divergence-base without --kl-divergence writes it), little endian:
//   "OSPKLD01" | u32 ctx | u32 vocab | u32 n_chunks | u32 n_tokens | i32 tokens[n_tokens]
//   then per scored position: f32 min, f32 scale, u16 q[vocab], the log-softmax being
//   min + q * scale (65535 levels between the row's least and greatest log-prob).
// The tokens evaluated must equal the header's and the vocab sizes must agree.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/device_select.h"
#include "backend/ops.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "core/env.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/sharded_model.h"
#include "model/model.h"
#include "bundle/model_files.h"
#include "tokenizer/tokenizer.h"

namespace osprey::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'O', 'S', 'P', 'K', 'L', 'D', '0', '1'};

struct PerplexityOptions {
  std::string model;
  bool download = false;
  std::string file;
  int64_t ctx = 0;  // 0: 512, or the model's context when smaller
  int64_t chunks = -1;
  std::string device;
  std::string cache_type_k, cache_type_v;  // --cache-type-k, --cache-type-v
  int threads = -1;
  std::string output = "text";
  std::string kl_base;
  bool kl = false;
};

// Mean and standard error of the mean of a sample.
struct Moments {
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  void add(double v) { sum += v, sum2 += v * v, ++n; }
  double mean() const { return n ? sum / double(n) : 0.0; }
  double stderr_of_mean() const {
    if (n < 2) return 0.0;
    const double m = mean(), var = sum2 / double(n) - m * m;
    return var > 0 ? std::sqrt(var / double(n - 1)) : 0.0;
  }
};

std::string read_text(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("perplexity: cannot read text file " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// log-softmax of one row into out.
void log_softmax(const float* x, int64_t n, std::vector<float>& out) {
  out.resize(size_t(n));
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - mx);
  const double lse = double(mx) + std::log(s);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = float(double(x[i]) - lse);
}

template <class T>
void put(std::ostream& o, const T& v) {
  o.write(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
T get(std::istream& in, const std::string& path) {
  T v;
  in.read(reinterpret_cast<char*>(&v), sizeof v);
  if (!in) throw InvalidInput("perplexity: base file " + path + " is truncated");
  return v;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = p * double(v.size() - 1);
  const size_t lo = size_t(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

// The base file of --kl-divergence-base: written by a plain run, read by --kl-divergence
// (the header checked against the run's ctx, vocab, chunks and tokens).
class BaseFile {
 public:
  static BaseFile create(const std::string& path, int64_t ctx, int64_t vocab, int64_t n_chunks,
                         const std::vector<int32_t>& tokens) {
    BaseFile f(path, vocab);
    f.out_.open(path, std::ios::binary);
    if (!f.out_) throw IoError("perplexity: cannot write base file " + path);
    f.out_.write(kMagic, 8);
    put(f.out_, uint32_t(ctx));
    put(f.out_, uint32_t(vocab));
    put(f.out_, uint32_t(n_chunks));
    put(f.out_, uint32_t(tokens.size()));
    f.out_.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 4));
    return f;
  }

  static BaseFile open(const std::string& path, int64_t ctx, int64_t vocab, int64_t n_chunks,
                       const std::vector<int32_t>& tokens) {
    BaseFile f(path, vocab);
    std::ifstream& in = f.in_;
    in.open(path, std::ios::binary);
    if (!in) throw IoError("perplexity: cannot read base file " + path);
    char magic[8];
    in.read(magic, 8);
    if (!in || std::memcmp(magic, kMagic, 8) != 0)
      throw InvalidInput("perplexity: " + path + " is not a base file written by --kl-divergence-base");
    const uint32_t b_ctx = get<uint32_t>(in, path), b_vocab = get<uint32_t>(in, path);
    const uint32_t b_chunks = get<uint32_t>(in, path), b_n = get<uint32_t>(in, path);
    if (b_vocab != uint32_t(vocab))
      throw InvalidInput("perplexity: the base file's vocab size " + std::to_string(b_vocab) + " differs from the model's " +
                         std::to_string(vocab));
    if (b_ctx != uint32_t(ctx))
      throw InvalidInput("perplexity: the base file was written with --ctx-size " + std::to_string(b_ctx) + ", not " +
                         std::to_string(ctx));
    if (b_chunks < uint32_t(n_chunks) || b_n != b_chunks * b_ctx)
      throw InvalidInput("perplexity: the base file holds " + std::to_string(b_chunks) + " chunks, fewer than the " +
                         std::to_string(n_chunks) + " evaluated");
    std::vector<int32_t> b_tokens(b_n);
    in.read(reinterpret_cast<char*>(b_tokens.data()), std::streamsize(b_n) * 4);
    if (!in) throw InvalidInput("perplexity: base file " + path + " is truncated");
    for (size_t i = 0; i < tokens.size(); ++i)
      if (b_tokens[i] != tokens[i])
        throw InvalidInput("perplexity: token " + std::to_string(i) + " of the text is " + std::to_string(tokens[i]) +
                           " but the base file has " + std::to_string(b_tokens[i]) +
                           " (a different text or tokenizer)");
    return f;
  }

  // One scored position's log-softmax, quantized to 16 bits between its least and greatest.
  void write_row(const std::vector<float>& lp) {
    const auto [mn, mx] = std::minmax_element(lp.begin(), lp.end());
    const float scale = (*mx - *mn) / 65535.0f;
    for (size_t i = 0; i < q_.size(); ++i) q_[i] = scale > 0 ? uint16_t(std::lround((lp[i] - *mn) / scale)) : 0;
    put(out_, *mn);
    put(out_, scale);
    out_.write(reinterpret_cast<const char*>(q_.data()), std::streamsize(q_.size() * 2));
  }

  // The next position's base log-softmax, dequantized into out.
  void read_row(std::vector<float>& out) {
    const float mn = get<float>(in_, path_), scale = get<float>(in_, path_);
    in_.read(reinterpret_cast<char*>(q_.data()), std::streamsize(q_.size() * 2));
    if (!in_) throw InvalidInput("perplexity: base file " + path_ + " is truncated");
    out.resize(q_.size());
    for (size_t i = 0; i < q_.size(); ++i) out[i] = mn + float(q_[i]) * scale;
  }

  void finish() {
    if (out_.is_open() && !out_.flush()) throw IoError("perplexity: cannot write base file " + path_);
  }

 private:
  BaseFile(std::string path, int64_t vocab) : path_(std::move(path)), q_(size_t(vocab)) {}

  std::string path_;
  std::ofstream out_;
  std::ifstream in_;
  std::vector<uint16_t> q_;
};

// The statistics of --kl-divergence over the scored positions.
struct KlStats {
  Moments base_nll, kld, ln_ratio;
  std::vector<double> klds;
  int64_t same_top = 0;

  // lp: the model's log-softmax; blp: the base's dequantized one (renormalised here);
  // nll: the model's NLL of the next token.
  void add(const std::vector<float>& lp, const std::vector<float>& blp, int32_t next, double nll) {
    double kl = 0, bsum = 0;
    for (float x : blp) bsum += std::exp(double(x));
    const double lb = std::log(bsum);
    size_t top_b = 0, top_m = 0;
    for (size_t i = 0; i < blp.size(); ++i) {
      const double pb = double(blp[i]) - lb;
      kl += std::exp(pb) * (pb - double(lp[i]));
      if (blp[i] > blp[top_b]) top_b = i;
      if (lp[i] > lp[top_m]) top_m = i;
    }
    kl = std::max(kl, 0.0);
    kld.add(kl);
    klds.push_back(kl);
    same_top += top_b == top_m;
    const double bv = -(double(blp[size_t(next)]) - lb);
    base_nll.add(bv);
    ln_ratio.add(nll - bv);
  }

  // Into j["kl_divergence"], and printed as llama.cpp prints them when text_out.
  void report(nlohmann::json& j, double ppl, double ppl_err, bool text_out) const {
    const double bppl = std::exp(base_nll.mean());
    const double top = double(same_top) / double(kld.n);
    const double top_err = std::sqrt(top * (1 - top) / double(std::max<int64_t>(1, kld.n - 1)));
    j["kl_divergence"] = {{"mean", kld.mean()},
                          {"mean_err", kld.stderr_of_mean()},
                          {"median", percentile(klds, 0.5)},
                          {"p90", percentile(klds, 0.9)},
                          {"p95", percentile(klds, 0.95)},
                          {"p99", percentile(klds, 0.99)},
                          {"max", percentile(klds, 1.0)},
                          {"min", percentile(klds, 0.0)},
                          {"same_top_p", top},
                          {"same_top_p_err", top_err},
                          {"base_ppl", bppl},
                          {"base_ppl_err", bppl * base_nll.stderr_of_mean()},
                          {"ln_ppl_ratio", ln_ratio.mean()},
                          {"ln_ppl_ratio_err", ln_ratio.stderr_of_mean()}};
    if (!text_out) return;
    std::printf("\n====== Perplexity statistics ======\n");
    std::printf("Mean PPL(Q)                   : %10.6f +/- %10.6f\n", ppl, ppl_err);
    std::printf("Mean PPL(base)                : %10.6f +/- %10.6f\n", bppl, bppl * base_nll.stderr_of_mean());
    std::printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f +/- %10.6f\n", ln_ratio.mean(), ln_ratio.stderr_of_mean());
    std::printf("Mean PPL(Q)/PPL(base)         : %10.6f\n", std::exp(ln_ratio.mean()));
    std::printf("\n====== KL divergence statistics ======\n");
    std::printf("Mean    KLD: %10.6f +/- %10.6f\n", kld.mean(), kld.stderr_of_mean());
    std::printf("Maximum KLD: %10.6f\n", percentile(klds, 1.0));
    std::printf("99.0%%   KLD: %10.6f\n", percentile(klds, 0.99));
    std::printf("95.0%%   KLD: %10.6f\n", percentile(klds, 0.95));
    std::printf("90.0%%   KLD: %10.6f\n", percentile(klds, 0.9));
    std::printf("Median  KLD: %10.6f\n", percentile(klds, 0.5));
    std::printf("Minimum KLD: %10.6f\n", percentile(klds, 0.0));
    std::printf("\n====== Token probability statistics ======\n");
    std::printf("Same top p: %6.3f +/- %5.3f %%\n", 100.0 * top, 100.0 * top_err);
  }
};

// The context size asked for (0: 512, or the model's context when smaller), checked.
int64_t chunk_size(int64_t asked, const ModelInfo& info) {
  int64_t ctx = asked;
  if (ctx == 0) ctx = info.max_position_embeddings > 0 ? std::min<int64_t>(512, info.max_position_embeddings) : 512;
  if (info.max_position_embeddings > 0 && ctx > info.max_position_embeddings)
    throw UsageError("perplexity: --ctx-size " + std::to_string(ctx) + " is past the model's context of " +
                     std::to_string(info.max_position_embeddings));
  if (ctx < 4) throw UsageError("perplexity: --ctx-size must be at least 4");
  return ctx;
}

int run_perplexity(const PerplexityOptions& o) {
  if (o.kl && o.kl_base.empty()) throw UsageError("perplexity --kl-divergence needs --kl-divergence-base FILE");
  if (o.threads >= 0) set_cpu_threads(o.threads);
  const std::string text = read_text(o.file);
  if (text.empty()) throw InvalidInput("perplexity: the text file " + o.file + " is empty");
  const std::string dir = model_folder(o.model, o.download);
  if (!fs::exists(dir)) throw IoError("model folder " + dir + " does not exist");
  Tokenizer tok = load_model_tokenizer(dir);

  const EnvOptions& env = env_options();
  LoadOptions lo;
  lo.device = select_device(o.device.empty() ? env.device : o.device);
  std::unique_ptr<Model> model = load_sharded_model(dir, 1, lo);
  const ModelInfo& info = model->info();
  const int64_t vocab = info.vocab_size;
  const int64_t ctx = chunk_size(o.ctx, info);

  std::vector<int32_t> tokens = tok.encode(text, true);
  const std::optional<int32_t> bos = tok.bos_id();
  const bool add_bos = bos && !tokens.empty() && tokens.front() == *bos;
  int64_t n_chunks = int64_t(tokens.size()) / ctx;
  if (n_chunks == 0)
    throw InvalidInput("perplexity: the text has " + std::to_string(tokens.size()) +
                       " tokens, fewer than one chunk of --ctx-size " + std::to_string(ctx));
  if (o.chunks >= 0) n_chunks = std::min(n_chunks, o.chunks);
  if (n_chunks == 0) throw UsageError("perplexity: --chunks 0 evaluates nothing");
  const int64_t first = ctx / 2;
  tokens.resize(size_t(n_chunks * ctx));

  const bool writing_base = !o.kl_base.empty() && !o.kl;
  std::optional<BaseFile> base;
  if (writing_base) base = BaseFile::create(o.kl_base, ctx, vocab, n_chunks, tokens);
  if (o.kl) base = BaseFile::open(o.kl_base, ctx, vocab, n_chunks, tokens);

  const bool text_out = o.output == "text";
  if (text_out)
    std::fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %lld, scoring %lld per chunk\n", tokens.size(),
                 (long long)n_chunks, (long long)ctx, (long long)(ctx - first - 1));
  Moments nll;
  KlStats kl;
  std::vector<double> chunk_ppl;
  std::vector<float> lp, blp;
  KVCacheParams co;
  co.k_type = cache_type(o.cache_type_k, "--cache-type-k");
  co.v_type = cache_type(o.cache_type_v, "--cache-type-v");
  for (int64_t c = 0; c < n_chunks; ++c) {
    std::vector<int32_t> in(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx);
    if (add_bos) in[0] = *bos;
    SequenceCache cache = model->make_cache(co);
    cache.reserve(ctx);
    Array logits = ops::to_device(model->forward(host_i32(in), cache, true), Device::cpu());
    const float* l = logits.data<float>();
    for (int64_t j = first; j < ctx - 1; ++j) {
      log_softmax(l + j * vocab, vocab, lp);
      const int32_t next = in[size_t(j + 1)];
      const double v = -double(lp[size_t(next)]);
      nll.add(v);
      if (writing_base) {
        base->write_row(lp);
      } else if (o.kl) {
        base->read_row(blp);
        kl.add(lp, blp, next, v);
      }
    }
    chunk_ppl.push_back(std::exp(nll.mean()));
    if (text_out) {
      std::printf("[%lld]%.4f,", (long long)(c + 1), chunk_ppl.back());
      std::fflush(stdout);
    }
  }
  if (text_out) std::printf("\n");
  if (base) base->finish();

  const double ppl = std::exp(nll.mean()), ppl_err = ppl * nll.stderr_of_mean();
  nlohmann::json j = {{"n_tokens", tokens.size()},   {"n_chunks", n_chunks}, {"ctx_size", ctx},
                      {"n_scored", nll.n},           {"ppl", ppl},           {"ppl_err", ppl_err},
                      {"mean_nll", nll.mean()},      {"chunk_ppl", chunk_ppl}};
  if (text_out) std::printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, ppl_err);
  if (o.kl) kl.report(j, ppl, ppl_err, text_out);
  if (!text_out) std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

}  // namespace

Command add_perplexity(CLI::App& app) {
  auto o = std::make_shared<PerplexityOptions>();
  add_model_options(app, o->model, o->download);
  app.add_option("-f,--file", o->file, "Text file to score ('-' reads stdin)")->required();
  add_int_option(app, "-c,--ctx-size", o->ctx, "Tokens per chunk (0: 512, or the model's context when smaller)", 0,
                 int64_t(1) << 24);
  add_int_option(app, "--chunks", o->chunks, "Score only the first N chunks (-1: all)", -1, int64_t(1) << 30);
  app.add_option("-o,--output", o->output, "Output format")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--kl-divergence-base", o->kl_base,
                 "Base log-probs file: written by a run without --kl-divergence, read by one with it");
  app.add_flag("--kl-divergence", o->kl, "Report the KL divergence from the --kl-divergence-base file's model");
  add_device_option(app, o->device);
  add_cache_type_options(app, o->cache_type_k, o->cache_type_v);
  add_threads_option(app, o->threads);
  return [o] { return run_perplexity(*o); };
}

}  // namespace osprey::cli
