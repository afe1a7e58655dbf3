// The cost of a speculative verify against one-row decode steps (serve/speculative.h,
// DraftPacer's cost model): c(k), the time of a verify of the last token and k drafted ones
// over the time of a one-row step, on the paged backend for batches of B sequences and on the
// dense backend for one. Usage: osprey_spec_verify_bench MODEL_DIR [ROUNDS [THREADS]]
// (default 15 rounds, 2 threads). Each round times every arm once, 10 calls each, in
// alternating order; prints per arm the median over rounds of milliseconds per call and the
// lowest and highest round, then c(k) per batch and the acceptance (accepted over drafted)
// at which drafting breaks even, (c(k) - 1) / k against the step a drafting sequence takes
// (batch-invariant) and (V - S) / (S k) against the default-mode step of the same batch (S),
// which a step paused for the batch takes. Wall time (the machine's load shows in the spread).
// Every round starts fresh sequences of 64 prompt tokens; every call adds one row net (a
// verify's drafted rows are given back), so a sequence grows by 5 rows per arm over a round.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "serve/dense_backend.h"
#include "serve/paged_backend.h"
#include "serve/prompt_cache.h"

namespace {

using namespace osprey;
using Clock = std::chrono::steady_clock;

constexpr int kCalls = 5;
constexpr int64_t kPrompt = 64;
const std::vector<int> kDrafts = {1, 2, 4, 8};

struct Seqs {
  SequenceBackend* backend = nullptr;
  std::vector<int> handles;
  std::vector<int32_t> last;
};

void stop(Seqs& s) {
  for (int h : s.handles) s.backend->end(h, {});
}

Seqs start(SequenceBackend& b, int n, int64_t vocab, std::mt19937& rng) {
  Seqs s;
  s.backend = &b;
  std::uniform_int_distribution<int32_t> id(3, int32_t(std::min<int64_t>(vocab, 500)) - 1);
  std::vector<float> logits;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(kPrompt);
    for (int32_t& t : prompt) t = id(rng);
    auto begun = b.begin(prompt, "bench" + std::to_string(i));
    if (!begun || !b.reserve(begun->handle, kPrompt)) {
      std::fprintf(stderr, "no room for the bench's sequences\n");
      std::exit(1);
    }
    b.prefill(begun->handle, prompt, false, logits);
    s.handles.push_back(begun->handle);
    s.last.push_back(prompt.back());
  }
  return s;
}

// One-row step of every sequence, in batch-invariant mode or not.
void step(Seqs& s, bool invariant) {
  std::vector<SequenceBackend::DecodeInput> in(s.handles.size());
  for (size_t i = 0; i < in.size(); ++i) {
    s.backend->reserve(s.handles[i], 1);
    in[i].handle = s.handles[i];
    in[i].token = s.last[i];
    in[i].greedy = true;
    in[i].invariant = invariant;
  }
  std::vector<SequenceBackend::DecodeOutput> out;
  s.backend->decode(in, out, {});
  for (size_t i = 0; i < in.size(); ++i) s.last[i] = out[i].token >= 0 ? out[i].token : 5;
}

// A verify of the last token and k drafted ones for every sequence, its drafted rows given back.
void verify(Seqs& s, int k) {
  std::vector<std::vector<int32_t>> feeds(s.handles.size());
  std::vector<SequenceBackend::VerifyInput> items;
  for (size_t i = 0; i < feeds.size(); ++i) {
    s.backend->reserve(s.handles[i], k + 1);
    feeds[i].assign(size_t(k + 1), 7);
    feeds[i][0] = s.last[i];
    items.push_back({s.handles[i], feeds[i]});
  }
  std::vector<std::vector<float>> logits;
  s.backend->verify_batch(items, logits);
  for (size_t i = 0; i < feeds.size(); ++i) s.backend->rewind(s.handles[i], k);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [ROUNDS [THREADS]]\n", argv[0]);
    return 2;
  }
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 15;
  set_cpu_threads(argc > 3 ? std::atoi(argv[3]) : 2);
  auto model = load_model(argv[1]);
  const int64_t vocab = model->info().vocab_size;
  std::mt19937 rng(1);

  struct Arm {
    std::string name;
    std::function<void()> run;
  };
  std::vector<Arm> arms;
  std::map<int, Seqs> paged;
  std::vector<std::unique_ptr<PagedBackend>> paged_backends;
  for (int b : {1, 2, 4}) {
    PagedBackendOptions o;
    o.max_sequences = b;
    o.context_size = 512;
    o.prefix_cache = false;
    o.verify_rows = 9;
    paged_backends.push_back(std::make_unique<PagedBackend>(*model, o));
    paged[b] = start(*paged_backends.back(), b, vocab, rng);
  }
  PromptCache pc(0);
  DenseBackendOptions dopt;
  dopt.context_size = 512;
  DenseSlotBackend dense_backend(*model, pc, dopt);
  Seqs dense = start(dense_backend, 1, vocab, rng);

  for (auto& [b, s] : paged) {
    Seqs* sp = &s;
    arms.push_back({"paged B=" + std::to_string(b) + " step", [sp] { step(*sp, false); }});
    arms.push_back({"paged B=" + std::to_string(b) + " step invariant", [sp] { step(*sp, true); }});
    for (int k : kDrafts)
      arms.push_back({"paged B=" + std::to_string(b) + " verify k=" + std::to_string(k), [sp, k] { verify(*sp, k); }});
  }
  arms.push_back({"dense B=1 step", [&] { step(dense, false); }});
  arms.push_back({"dense B=1 step invariant", [&] { step(dense, true); }});
  for (int k : kDrafts) arms.push_back({"dense B=1 verify k=" + std::to_string(k), [&, k] { verify(dense, k); }});

  auto restart = [&] {
    for (size_t i = 0; i < paged_backends.size(); ++i) {
      const int b = 1 << i;
      stop(paged[b]);
      paged[b] = start(*paged_backends[i], b, vocab, rng);
    }
    stop(dense);
    dense = start(dense_backend, 1, vocab, rng);
  };
  for (Arm& a : arms) a.run();  // warm-up
  std::vector<std::vector<double>> ms(arms.size());
  for (int r = 0; r < rounds; ++r) {
    restart();
    for (size_t j = 0; j < arms.size(); ++j) {
      const size_t i = r % 2 == 0 ? j : arms.size() - 1 - j;
      const auto t0 = Clock::now();
      for (int c = 0; c < kCalls; ++c) arms[i].run();
      ms[i].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / kCalls);
    }
  }
  std::map<std::string, double> med;
  std::printf("%-28s %10s %10s %10s\n", "arm", "ms median", "min", "max");
  for (size_t i = 0; i < arms.size(); ++i) {
    med[arms[i].name] = median(ms[i]);
    std::printf("%-28s %10.3f %10.3f %10.3f\n", arms[i].name.c_str(), med[arms[i].name],
                *std::min_element(ms[i].begin(), ms[i].end()), *std::max_element(ms[i].begin(), ms[i].end()));
  }
  std::printf("\n%-12s %3s %8s %14s %16s\n", "backend", "k", "c(k)", "break-even a/k", "vs default step");
  auto report = [&](const std::string& prefix) {
    const double inv = med[prefix + " step invariant"], def = med[prefix + " step"];
    for (int k : kDrafts) {
      const double v = med[prefix + " verify k=" + std::to_string(k)];
      const double c = v / inv;
      std::printf("%-12s %3d %8.2f %14.3f %16.3f\n", prefix.c_str(), k, c, (c - 1) / k, (v / def - 1) / k);
    }
  };
  for (int b : {1, 2, 4}) report("paged B=" + std::to_string(b));
  report("dense B=1");
  return 0;
}
