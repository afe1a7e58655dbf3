#include "engine/sharded_model.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "backend/cuda_available.h"
#include "backend/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "backend/communicator.h"

namespace osprey {
namespace {

// One thread per rank, each running the jobs it is given in order. run() gives every rank
// its job and returns when all are done, rethrowing the lowest rank's exception.
class RankThreads {
 public:
  // `cpu_threads`: the CPU pool of each rank thread (ops on different ranks run concurrently,
  // and a pool serves one caller at a time).
  RankThreads(int n, int cpu_threads) : slots_(size_t(n)) {
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r, cpu_threads] { loop(r, cpu_threads); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void run(const std::function<void(int rank)>& job) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &job;
    for (Slot& s : slots_) s.error = nullptr;
    pending_ = int(slots_.size());
    ++generation_;
    cv_.notify_all();
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    for (Slot& s : slots_)
      if (s.error) std::rethrow_exception(s.error);
  }

 private:
  struct Slot {
    std::exception_ptr error;
  };

  void loop(int rank, int cpu_threads) {
    ThreadPool pool(cpu_threads);
    ScopedCpuPool scoped(pool);
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      std::exception_ptr error;
      try {
        (*job)(rank);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      slots_[size_t(rank)].error = error;
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<Slot> slots_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

class ShardedModel final : public Model {
 public:
  ShardedModel(const std::filesystem::path& dir, int n, const LoadOptions& options) {
    const Device dev = options.device;
    if (dev.is_cpu()) {
      comms_ = make_cpu_communicators(n);
    } else {
      const int n_devices = cuda_device_count();
      if (dev.index + n > n_devices)
        throw InvalidInput("--tensor-parallel " + std::to_string(n) + " on " + dev.str() + " needs CUDA devices " +
                           std::to_string(dev.index) + " .. " + std::to_string(dev.index + n - 1) + ", but " +
                           std::to_string(n_devices) + (n_devices == 1 ? " is" : " are") + " visible");
      if (!nccl_available())
        throw Unsupported("--tensor-parallel " + std::to_string(n) +
                          " on CUDA needs NCCL, and this build has none (CMake found no nccl.h and libnccl; "
                          "install NCCL, or the CUDA toolkit that ships it, and rebuild)");
      std::vector<int> devices;
      for (int r = 0; r < n; ++r) devices.push_back(dev.index + r);
      comms_ = make_nccl_communicators(devices);
    }
    // The CPU's threads split evenly between the ranks; on CUDA each rank thread mostly
    // enqueues, and its pool serves only the host-side work.
    const int cpu_threads = dev.is_cpu() ? std::max(1, cpu_pool().n_threads() / n) : 1;
    threads_ = std::make_unique<RankThreads>(n, cpu_threads);
    ranks_.resize(size_t(n));
    // Each rank loads its slice on its own thread (on CUDA: with its device current there).
    threads_->run([&](int r) {
      LoadOptions o = options;
      o.comm = comms_[size_t(r)].get();
      if (!dev.is_cpu()) o.device = Device::cuda(dev.index + r);
      if (r != 0) o.progress = nullptr;  // rank 0 reports for all
      ranks_[size_t(r)] = load_model(dir, o);
    });
    info_ = ranks_[0]->info();
    info_.device = dev;
    info_.weight_bytes = 0;
    info_.n_params = 0;
    // NOTE: the totals over the ranks count a replicated weight (the embedding, a K/V head
    // shared by ranks) once per rank: what the devices hold, not what the checkpoint holds.
    for (const auto& m : ranks_) {
      info_.weight_bytes += m->info().weight_bytes;
      info_.n_params += m->info().n_params;
    }
  }

  ~ShardedModel() override {
    // Each rank model is freed on its own thread (on CUDA: with its device current), and
    // before the communicators it holds.
    try {
      threads_->run([&](int r) { ranks_[size_t(r)].reset(); });
    } catch (...) {
      // Freeing does not throw; if it did, the models go below on this thread.
    }
    ranks_.clear();
    threads_.reset();
  }

  SequenceCache make_cache(const KVCacheParams& options) const override {
    std::vector<SequenceCache> parts;
    for (const auto& m : ranks_) parts.push_back(m->make_cache(options));
    return SequenceCache::concat(std::move(parts));
  }

  // The step runs on several threads and devices: one captured graph on rank 0's stream would
  // miss the others' work.
  bool replayable_step() const override { return false; }

 protected:
  Array forward_tokens(const Array& tokens, const Array& positions, SequenceCache& cache, bool all_logits) override {
    const size_t n_layers = size_t(info_.n_layers), n = ranks_.size();
    if (cache.n_layers() != n * n_layers)
      throw InvalidInput("a tensor-parallel model of " + std::to_string(n) + " ranks takes the cache its make_cache() "
                         "made (" + std::to_string(n * n_layers) + " layers), got one of " +
                         std::to_string(cache.n_layers()));
    std::vector<SequenceCache> views;
    for (size_t r = 0; r < n; ++r) views.push_back(cache.share_layers(r * n_layers, n_layers));
    Array logits;
    threads_->run([&](int r) {
      Model& m = *ranks_[size_t(r)];
      const Device d = m.info().device;
      Array out = m.forward(ops::to_device(tokens, d), ops::to_device(positions, d), views[size_t(r)], all_logits);
      if (r == 0) logits = out;
    });
    return logits;
  }

  KVCacheParams layer_cache_params(int64_t, const KVCacheParams&) const override {
    throw Unsupported("a tensor-parallel model's layers are split across ranks: its caches come from make_cache() "
                      "(the paged KV pool does not serve it yet)");
  }

 private:
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::unique_ptr<RankThreads> threads_;
  std::vector<std::unique_ptr<Model>> ranks_;
};

}  // namespace

std::unique_ptr<Model> load_sharded_model(const std::filesystem::path& dir, int n_ranks, const LoadOptions& options) {
  if (n_ranks < 1)
    throw InvalidInput("--tensor-parallel must be at least 1, got " + std::to_string(n_ranks));
  if (n_ranks == 1) return load_model(dir, options);
  return std::make_unique<ShardedModel>(dir, n_ranks, options);
}

}  // namespace osprey
