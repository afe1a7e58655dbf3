// Speculative decoding with a draft model (docs/design.md, "Speculative decoding"): the draft
// cache follows the accepted tokens by giving rows back and feeding what it misses; greedy output
// is byte-identical to plain greedy decoding; sampled drafts are accepted by rejection sampling
// whose output follows the target's distribution, checked against distributions computed here
// (softmax in double, independently of the sampler); drafts of another tokenizer are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cuda_available.h"
#include "backend/ops.h"
#include "core/error.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "serve/dense_backend.h"
#include "serve/draft_model.h"
#include "serve/generate.h"
#include "serve/prompt_cache.h"
#include "serve/scheduler.h"
#include "serve/scheduler_run.h"
#include "serve/speculative.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"
#include "vision/image_chat_model.h"

namespace osprey {
namespace {

std::filesystem::path draft_fixture(const std::string& name) { return testing::source_dir() / "tests/fixtures/models" / name; }

std::vector<int32_t> draft_prompt(int64_t vocab, uint32_t seed, size_t n = 40) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, int32_t(std::min<int64_t>(vocab, 500)) - 1);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = id(rng);
  return p;
}

GenerateResult draft_generate(Model& model, Model* draft, const std::vector<int32_t>& prompt, int n, bool inplace,
                              const SamplerParams& sp = {}, float p_min = 0.0f, int draft_max = 4) {
  KVCacheParams co;
  co.inplace = inplace;
  SequenceCache cache = model.make_cache(co);
  GenerateParams gp;
  gp.max_tokens = n;
  gp.sampler = sp;
  gp.draft_cache = co;
  if (draft) {
    gp.spec.model_draft = "draft";
    gp.spec.draft_p_min = p_min;
    gp.spec.draft_max = draft_max;
    gp.draft_model = draft;
  }
  return generate(model, cache, prompt, gp);
}

// A random Llama of the fixtures' vocabulary (512 ids), one layer: a smaller, different draft.
std::unique_ptr<Model> tiny_draft(const testing::TempDir& dir, uint32_t seed = 7) {
  nlohmann::json c = testing::tiny_llama_config();
  c["vocab_size"] = 512;
  c["num_hidden_layers"] = 1;
  c["max_position_embeddings"] = 2048;
  testing::write_tiny_llama(dir.path(), c, seed);
  return load_model(dir.path());
}

// softmax(l / t) over the k largest logits (k = 0: all), in double: the target's distribution as
// the sampler's chain defines it for temperature and top-k, computed without it.
std::vector<double> softmax_top_k(std::span<const float> l, double t, int k) {
  std::vector<double> p(l.size(), 0.0);
  std::vector<size_t> idx(l.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return l[a] > l[b]; });
  const size_t keep = k > 0 ? std::min(size_t(k), idx.size()) : idx.size();
  double s = 0;
  for (size_t j = 0; j < keep; ++j) s += p[idx[j]] = std::exp((double(l[idx[j]]) - double(l[idx[0]])) / t);
  for (double& x : p) x /= s;
  return p;
}

TokenDistribution as_distribution(const std::vector<double>& p) {
  TokenDistribution d;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0) d.push_back({int32_t(i), float(p[i])});
  return d;
}

// The chi-square critical value at false-alarm rate 1e-4 for `df` degrees of freedom
// (Wilson-Hilferty; z = 3.719 is the standard normal's 1 - 1e-4 quantile).
double chi2_critical_1e4(int df) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + 3.719 * std::sqrt(a), 3.0);
}

// Pearson's chi-square of `counts` against `expected` probabilities over n draws, cells with
// an expected count below 5 pooled into one; returns (statistic, degrees of freedom).
std::pair<double, int> chi_square(const std::map<int32_t, double>& counts, const std::map<int32_t, double>& expected,
                                  double n) {
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (const auto& [id, p] : expected) {
    const double e = n * p;
    const double o = counts.count(id) ? counts.at(id) : 0.0;
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++cells;
  }
  if (pooled_e > 0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1e-9);
    ++cells;
  }
  return {stat, std::max(1, cells - 1)};
}

}  // namespace

TEST(DraftSampling, DrawFromIsTheInverseCdfInIdOrder) {
  const TokenDistribution d = {{2, 0.25f}, {5, 0.5f}, {9, 0.25f}};
  EXPECT_EQ(draw_from(d, 0.0), 2);
  EXPECT_EQ(draw_from(d, 0.2499), 2);
  EXPECT_EQ(draw_from(d, 0.25), 5);
  EXPECT_EQ(draw_from(d, 0.7499), 5);
  EXPECT_EQ(draw_from(d, 0.75), 9);
  EXPECT_EQ(draw_from(d, 0.9999999), 9);
  EXPECT_EQ(draw_from({}, 0.5), -1);
  // A point mass (a greedy draft against a greedy target) is accepted exactly when it is p's.
  EXPECT_TRUE(speculative_accept({{4, 1.0f}}, {{4, 1.0f}}, 4, 0.999, 0.5).accepted);
  const SpeculativeVerdict v = speculative_accept({{4, 1.0f}}, {{6, 1.0f}}, 6, 0.0, 0.5);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 4);
}

// The acceptance rule over 60000 proposals x ~ q on a 6-token vocabulary: the emitted token's
// histogram against p (computed here as softmax(l / T), optionally top-k cut) by chi-square at
// alpha = 1e-4, and the acceptance count against its exact rate sum_x min(p(x), q(x)) by a
// two-sided z-test at alpha = 1e-4. Two cases (q covering p's support, and q reaching tokens p
// cuts away, which must never be emitted): four tests, a false-alarm rate below 4e-4 in all.
TEST(DraftSampling, AcceptedAndResampledTokensFollowTheTargetDistribution) {
  const std::vector<float> target_logits = {1.2f, 0.3f, -0.5f, 2.0f, 0.9f, -1.5f};
  const std::vector<float> draft_logits = {0.2f, 1.1f, -0.1f, 1.6f, 0.4f, 0.8f};
  for (int top_k : {0, 3}) {
    SCOPED_TRACE("top_k " + std::to_string(top_k));
    const std::vector<double> p = softmax_top_k(target_logits, 0.9, top_k);
    const std::vector<double> q = softmax_top_k(draft_logits, 0.8, 0);
    const TokenDistribution pd = as_distribution(p), qd = as_distribution(q);
    std::mt19937_64 rng(1234 + uint64_t(top_k));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    constexpr int kN = 60000;
    std::map<int32_t, double> emitted;
    int64_t n_accept = 0;
    for (int i = 0; i < kN; ++i) {
      const int32_t x = draw_from(qd, u(rng));
      const SpeculativeVerdict v = speculative_accept(pd, qd, x, u(rng), u(rng));
      ASSERT_GT(p[size_t(v.token)], 0.0) << "emitted token " << v.token << ", which the target cut away";
      if (v.accepted) {
        EXPECT_EQ(v.token, x);
        ++n_accept;
      }
      emitted[v.token] += 1;
    }
    std::map<int32_t, double> expected;
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] > 0) expected[int32_t(i)] = p[i];
    const auto [stat, df] = chi_square(emitted, expected, kN);
    EXPECT_LT(stat, chi2_critical_1e4(df)) << "df " << df;
    double rate = 0;
    for (size_t i = 0; i < p.size(); ++i) rate += std::min(p[i], q[i]);
    const double z = (double(n_accept) - kN * rate) / std::sqrt(kN * rate * (1 - rate));
    EXPECT_LT(std::fabs(z), 3.89) << "accepted " << n_accept << " of " << kN << ", expected rate " << rate;
  }
}

// The drafter's greedy drafts are the draft model's plain greedy decoding of the same tokens,
// also after its cache gave rejected rows back and was fed the accepted ones; and its cache
// copied for the first prompt write only: every later write (catch-up feeds and one-row steps)
// went in place, rows given back by moving the length.
TEST(DraftModel, GreedyDraftsArePlainDecodingOfTheDraftAcrossRewinds) {
  // Batch-invariant mode: a row's logits do not depend on how many rows its pass computed, so
  // that the catch-up feeds' rows and a plain prefill's agree bit for bit.
  struct Invariant {
    Invariant() { ops::set_batch_invariant(true); }
    ~Invariant() { ops::set_batch_invariant(false); }
  } invariant;
  auto draft = load_model(draft_fixture("qwen3"));
  KVCacheParams co;
  DraftModelOptions o;
  o.cache = co;
  o.p_min = 0;
  ModelDrafter drafter(*draft, o);
  const int h = drafter.begin();
  std::vector<int32_t> seq = draft_prompt(512, 3);
  std::mt19937 rng(5);
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const DraftProposal d = drafter.draft(h, seq, 5, SamplerParams{}, 0);
    const GenerateResult plain = draft_generate(*draft, nullptr, seq, 5, true);
    ASSERT_EQ(d.tokens, plain.tokens);
    EXPECT_TRUE(d.q.empty());
    // Accept a prefix of the draft (0 .. 5 tokens), then a token of the "target"'s own.
    const size_t a = size_t(rng() % 6);
    seq.insert(seq.end(), d.tokens.begin(), d.tokens.begin() + long(a));
    seq.push_back(int32_t(10 + rng() % 400));
  }
  const KVCounters c = drafter.kv_counters();
  EXPECT_EQ(c.n_copying_writes, uint64_t(draft->info().n_layers)) << "only the prompt's write copies";
  EXPECT_GT(c.n_inplace_writes, 0u);
  drafter.end(h);
  EXPECT_THROW(drafter.draft(h, seq, 5, SamplerParams{}, 0), InvalidInput);
}

// Greedy output with a draft model is byte-identical to plain greedy decoding, in both KV write
// arms, for a draft of another family (qwen3), a smaller random Llama, and the target itself
// (whose drafts are all accepted).
TEST(DraftModel, GreedyOutputIsIdenticalToPlainDecoding) {
  auto target = load_model(draft_fixture("llama"));
  testing::TempDir dir;
  auto tiny = tiny_draft(dir);
  auto qwen3 = load_model(draft_fixture("qwen3"));
  const std::vector<int32_t> prompt = draft_prompt(512, 17);
  constexpr int kN = 64;
  for (bool inplace : {true, false}) {
    SCOPED_TRACE(inplace ? "in place" : "copying");
    const GenerateResult plain = draft_generate(*target, nullptr, prompt, kN, inplace);
    ASSERT_EQ(plain.tokens.size(), size_t(kN));
    for (Model* d : {tiny.get(), qwen3.get(), target.get()}) {
      SCOPED_TRACE(d == target.get() ? "self" : d == tiny.get() ? "tiny llama" : "qwen3");
      const GenerateResult spec = draft_generate(*target, d, prompt, kN, inplace);
      EXPECT_EQ(spec.tokens, plain.tokens);
      EXPECT_GT(spec.stats.n_verify_steps, 0);
      EXPECT_GT(spec.stats.n_drafted, 0);
      if (d == target.get()) {
        EXPECT_EQ(spec.stats.n_accepted, spec.stats.n_drafted) << "the target drafting for itself";
        if (inplace) {
          // The target's cache: the prompt's write alone copied.
          EXPECT_EQ(spec.stats.kv.n_copying_writes, uint64_t(target->info().n_layers));
        }
      }
    }
  }
}

// With --draft-p-min, an unsure draft stops early: at 1 a random model drafts nothing (its top
// probability stays below 1), at 0 it always drafts; the output is plain decoding's either way.
TEST(DraftModel, ProbabilityFloorStopsDraftsAndKeepsTheOutput) {
  auto target = load_model(draft_fixture("llama"));
  auto qwen3 = load_model(draft_fixture("qwen3"));
  const std::vector<int32_t> prompt = draft_prompt(512, 19);
  const GenerateResult plain = draft_generate(*target, nullptr, prompt, 32, true);
  const GenerateResult all = draft_generate(*target, qwen3.get(), prompt, 32, true, {}, 0.0f);
  const GenerateResult none = draft_generate(*target, qwen3.get(), prompt, 32, true, {}, 1.0f);
  EXPECT_EQ(all.tokens, plain.tokens);
  EXPECT_EQ(none.tokens, plain.tokens);
  EXPECT_GT(all.stats.n_drafted, 0);
  EXPECT_EQ(none.stats.n_drafted, 0) << "a random model's top probability reached 1";
}

// Sampled requests end to end: the second generated token (the first one drafted and verified
// by rejection sampling) over 3000 seeds, against its exact marginal under the target, sum over
// t0 of p(t0) p(t1 | t0), each p a top-8 softmax at T = 1 of the target's logits computed here by
// plain forward passes. Target: a random tiny Llama (vocab 64); draft: the same weights with
// another RoPE base, so that q is near p but not p and drafts are both accepted and rejected
// (the resampling from max(0, p - q) matters: drawing from p instead fails this test).
// Chi-square at alpha = 1e-4 (Wilson-Hilferty's critical value), for t0 and for t1: a
// false-alarm rate below 2e-4. The same seed repeats the reply.
TEST(DraftModel, SampledOutputFollowsTheTargetDistribution) {
  testing::TempDir target_dir, draft_dir;
  nlohmann::json c = testing::tiny_llama_config();
  testing::write_tiny_llama(target_dir.path(), c, 3);
  c["rope_theta"] = 300.0;
  testing::write_tiny_llama(draft_dir.path(), c, 3);
  auto target = load_model(target_dir.path());
  auto draft = load_model(draft_dir.path());
  constexpr int kTopK = 8;
  constexpr double kTemp = 1.0;
  const std::vector<int32_t> prompt = draft_prompt(64, 23, 12);
  SamplerParams sp;
  sp.temperature = float(kTemp);
  sp.top_k = kTopK;
  auto last_logits = [&](const std::vector<int32_t>& tokens) {
    SequenceCache c = target->make_cache({});
    Array out = target->forward(testing::tokens_of(tokens), c, false);
    return std::vector<float>(out.data<float>(), out.data<float>() + out.numel());
  };
  const std::vector<double> p0 = softmax_top_k(last_logits(prompt), kTemp, kTopK);
  std::map<int32_t, double> e0, e1;
  for (size_t a = 0; a < p0.size(); ++a) {
    if (p0[a] <= 0) continue;
    e0[int32_t(a)] = p0[a];
    std::vector<int32_t> t = prompt;
    t.push_back(int32_t(a));
    const std::vector<double> p1 = softmax_top_k(last_logits(t), kTemp, kTopK);
    for (size_t b = 0; b < p1.size(); ++b)
      if (p1[b] > 0) e1[int32_t(b)] += p0[a] * p1[b];
  }
  constexpr int kN = 3000;
  std::map<int32_t, double> c0, c1;
  int64_t drafted = 0, accepted = 0;
  for (int i = 0; i < kN; ++i) {
    sp.seed = uint64_t(1000 + i);
    // Three tokens: the first from the prompt, the second drafted (draft-max 1) and verified,
    // the third the verify step's own.
    const GenerateResult r = draft_generate(*target, draft.get(), prompt, 3, true, sp, 0.0f, 1);
    ASSERT_EQ(r.tokens.size(), 3u);
    c0[r.tokens[0]] += 1;
    c1[r.tokens[1]] += 1;
    drafted += r.stats.n_drafted;
    accepted += r.stats.n_accepted;
  }
  EXPECT_EQ(drafted, kN);
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  const auto [s0, df0] = chi_square(c0, e0, kN);
  const auto [s1, df1] = chi_square(c1, e1, kN);
  EXPECT_LT(s0, chi2_critical_1e4(df0)) << "df " << df0;
  EXPECT_LT(s1, chi2_critical_1e4(df1)) << "df " << df1 << ", " << accepted << " of " << drafted << " drafts accepted";

  // The same seed, the same reply.
  sp.seed = 99;
  const std::vector<int32_t> long_prompt = draft_prompt(64, 29);
  const GenerateResult a = draft_generate(*target, draft.get(), long_prompt, 40, true, sp);
  const GenerateResult b = draft_generate(*target, draft.get(), long_prompt, 40, true, sp);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(a.stats.n_drafted, 0);
}

// The server's engine: several sequences on a two-slot dense backend with a draft model, each
// reply the same as without, and the prompt cache's entries unchanged by later verifies.
TEST(DraftModel, SchedulerSequencesMatchPlainDecoding) {
  auto model = load_model(draft_fixture("llama"));
  auto qwen3 = load_model(draft_fixture("qwen3"));
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t seed : {41u, 43u, 47u}) prompts.push_back(draft_prompt(512, seed));
  SchedulerOptions with_draft;
  with_draft.spec.model_draft = "qwen3";
  with_draft.spec.draft_p_min = 0;
  with_draft.draft_model = qwen3.get();
  const testing::DenseRun plain = testing::run_on_dense_backend(*model, SchedulerOptions{}, prompts, 30);
  const testing::DenseRun spec = testing::run_on_dense_backend(*model, with_draft, prompts, 30);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.n_verify_steps, 0u);
  EXPECT_GT(spec.stats.n_drafted_tokens, 0u);

  // A draft source named but not loaded, and both sources at once, are refused.
  PromptCache pc(0);
  DenseSlotBackend backend(*model, pc, DenseBackendOptions{});
  SchedulerOptions so;
  so.engine_thread = false;
  so.spec.model_draft = "qwen3";
  EXPECT_NE(testing::error_of<InvalidInput>([&] { Scheduler s(backend, so); }).find("not loaded"), std::string::npos);
  so.spec.ngram = true;
  so.draft_model = qwen3.get();
  EXPECT_NE(testing::error_of<InvalidInput>([&] { Scheduler s(backend, so); }).find("two draft sources"),
            std::string::npos);
}

// CUDA: greedy output with a draft model (another family, and the target itself) equals plain
// decoding on the device, in both KV arms (GTEST_SKIP without one).
TEST(DraftModelCuda, GreedyOutputIsIdenticalToPlainDecoding) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
  LoadOptions lo;
  lo.device = Device::cuda(0);
  auto target = load_model(draft_fixture("llama"), lo);
  auto qwen3 = load_model(draft_fixture("qwen3"), lo);
  const std::vector<int32_t> prompt = draft_prompt(512, 17);
  for (bool inplace : {true, false}) {
    SCOPED_TRACE(inplace ? "in place" : "copying");
    const GenerateResult plain = draft_generate(*target, nullptr, prompt, 64, inplace);
    for (Model* d : {qwen3.get(), target.get()}) {
      const GenerateResult spec = draft_generate(*target, d, prompt, 64, inplace);
      EXPECT_EQ(spec.tokens, plain.tokens);
      EXPECT_GT(spec.stats.n_verify_steps, 0);
      if (d == target.get()) EXPECT_EQ(spec.stats.n_accepted, spec.stats.n_drafted);
    }
  }
}

// A draft with sliding-window layers, or another tokenizer, is refused by name.
TEST(DraftModel, IncompatibleDraftsAreRefusedByName) {
  auto llama = load_model(draft_fixture("llama"));
  auto gemma = load_model(draft_fixture("gemma3"));
  EXPECT_NE(testing::error_of<InvalidInput>([&] { ModelDrafter d(*gemma, DraftModelOptions{}); }).find("sliding-window"),
            std::string::npos);

  // Neither carries a tokenizer: the vocabulary sizes are compared.
  testing::TempDir dir;
  nlohmann::json c = testing::tiny_llama_config();  // vocab 64
  testing::write_tiny_llama(dir.path(), c);
  auto small = load_model(dir.path());
  EXPECT_NO_THROW(check_draft_compatible(*llama, nullptr, *llama, nullptr, "d"));
  EXPECT_NE(testing::error_of<InvalidInput>([&] { check_draft_compatible(*llama, nullptr, *small, nullptr, "d"); })
                .find("vocabulary has 64 ids, the target's 512"),
            std::string::npos);

  // The demo's tokenizer against itself, and against copies changed in one token's text, in a
  // special flag, and in its merges (the same vocabulary splitting text differently).
  const std::filesystem::path demo = testing::source_dir() / "models/demo";
  const Tokenizer t = Tokenizer::load(demo);
  EXPECT_NO_THROW(check_draft_compatible(*llama, &t, *llama, &t, "d"));
  // Without tokenizer_config.json the eos id (its eos_token) is gone.
  {
    testing::TempDir d;
    testing::write_file(d / "tokenizer.json", testing::read_file(demo / "tokenizer.json"));
    const Tokenizer no_config = Tokenizer::load(d.path());
    EXPECT_NE(testing::error_of<InvalidInput>([&] { check_draft_compatible(*llama, &t, *llama, &no_config, "d"); })
                  .find("eos ids differ"),
              std::string::npos);
  }
  EXPECT_NE(testing::error_of<InvalidInput>([&] { check_draft_compatible(*llama, &t, *llama, nullptr, "d"); })
                .find("the draft model carries no tokenizer"),
            std::string::npos);
  const nlohmann::json base = nlohmann::json::parse(testing::read_file(demo / "tokenizer.json"));
  auto variant = [&](const std::function<void(nlohmann::json&)>& change) {
    testing::TempDir d;
    nlohmann::json j = base;
    change(j);
    testing::write_file(d / "tokenizer.json", j.dump());
    testing::write_file(d / "tokenizer_config.json", testing::read_file(demo / "tokenizer_config.json"));
    return Tokenizer::load(d.path());
  };
  // Two vocabulary entries' ids swapped.
  const Tokenizer swapped = variant([](nlohmann::json& j) {
    auto& vocab = j["model"]["vocab"];
    std::string a, b;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (it.value() == 2) a = it.key();
      if (it.value() == 3) b = it.key();
    }
    vocab[a] = 3;
    vocab[b] = 2;
  });
  const std::string e1 = testing::error_of<InvalidInput>([&] { check_draft_compatible(*llama, &t, *llama, &swapped, "d"); });
  EXPECT_NE(e1.find("--model-draft d"), std::string::npos) << e1;
  EXPECT_NE(e1.find("token 2 is"), std::string::npos) << e1;
  // An added token no longer special.
  ASSERT_TRUE(base.contains("added_tokens") && !base["added_tokens"].empty() && base["added_tokens"][0]["special"] == true);
  const Tokenizer unspecial = variant([](nlohmann::json& j) { j["added_tokens"][0]["special"] = false; });
  const std::string e2 = testing::error_of<InvalidInput>([&] { check_draft_compatible(*llama, &t, *llama, &unspecial, "d"); });
  EXPECT_NE(e2.find("special"), std::string::npos) << e2;
  // Merges dropped: the same ids, other splits of the probe text.
  const Tokenizer unmerged = variant([](nlohmann::json& j) { j["model"]["merges"] = nlohmann::json::array(); });
  const std::string e3 = testing::error_of<InvalidInput>([&] { check_draft_compatible(*llama, &t, *llama, &unmerged, "d"); });
  EXPECT_NE(e3.find("probe text"), std::string::npos) << e3;
}

// The flags: generate --json reports the drafts and gives plain decoding's tokens (-md is
// --model-draft); --spec-ngram with --model-draft, a sliding-window draft, a draft of another
// vocabulary, and serve given both draft sources are refused by name.
TEST(DraftCli, GenerateReportsDraftsAndRefusalsNameTheFlag) {
  const std::string llama = draft_fixture("llama").string();
  const std::string qwen3 = draft_fixture("qwen3").string();
  std::string ids;
  for (int32_t t : draft_prompt(512, 17)) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string base = "generate -m " + llama + " --token-ids " + ids + " -n 40 --temp 0 --ignore-eos -q --json";
  const auto plain = testing::run_osprey(base);
  const auto spec = testing::run_osprey(base + " -md " + qwen3 + " --draft-p-min 0 --draft-max 4");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  const auto jp = nlohmann::json::parse(plain.out), js = nlohmann::json::parse(spec.out);
  EXPECT_EQ(js["tokens"], jp["tokens"]);
  EXPECT_GT(js["timings"]["drafted_n"].get<int64_t>(), 0);
  EXPECT_LE(js["timings"]["accepted_n"].get<int64_t>(), js["timings"]["drafted_n"].get<int64_t>());

  const auto both = testing::run_osprey(base + " --spec-ngram --model-draft " + qwen3);
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("two draft sources"), std::string::npos) << both.err;
  const auto swa = testing::run_osprey(base + " --model-draft " + draft_fixture("gemma3").string());
  EXPECT_EQ(swa.exit_code, 1);
  EXPECT_NE(swa.err.find("sliding-window"), std::string::npos) << swa.err;
  testing::TempDir dir;
  testing::write_tiny_llama(dir.path(), testing::tiny_llama_config());  // vocab 64
  const auto vocab = testing::run_osprey(base + " --model-draft " + dir.path().string());
  EXPECT_EQ(vocab.exit_code, 1);
  EXPECT_NE(vocab.err.find("--model-draft"), std::string::npos) << vocab.err;
  EXPECT_NE(vocab.err.find("vocabulary"), std::string::npos) << vocab.err;
  const auto p_min = testing::run_osprey(base + " --model-draft " + qwen3 + " --draft-p-min 1.5");
  EXPECT_EQ(p_min.exit_code, 2);

  const auto serve_both = testing::run_osprey("serve -m " + llama + " --port 0 --spec-ngram --model-draft " + qwen3);
  EXPECT_EQ(serve_both.exit_code, 2);
  EXPECT_NE(serve_both.err.find("two draft sources"), std::string::npos) << serve_both.err;
  // A windowed model on the dense layout (rotating caches) cannot verify: serve refuses at start
  // instead of serving without drafts (bounded: a server that started would run until killed).
  testing::TempDir swa_dir;  // the gemma3 fixture with a tokenizer, which serve needs
  for (const char* f : {"model.safetensors", "config.json", "generation_config.json"})
    std::filesystem::create_symlink(draft_fixture("gemma3") / f, swa_dir.path() / f);
  testing::write_file(swa_dir.path() / "tokenizer.json", testing::image_chat::test_tokenizer().dump());
  const auto serve_swa = testing::run_osprey(
      "serve -m " + swa_dir.path().string() + " --port 0 --kv-layout dense --spec-ngram", "timeout 60");
  EXPECT_EQ(serve_swa.exit_code, 1) << serve_swa.err;
  EXPECT_NE(serve_swa.err.find("--kv-layout dense"), std::string::npos) << serve_swa.err;
  EXPECT_NE(serve_swa.err.find("sliding-window"), std::string::npos) << serve_swa.err;
}

}  // namespace osprey
