#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <string>

#include "core/error.h"
#include "backend/communicator.h"

namespace osprey {

ShardRange shard_range(int64_t n, const ShardSpec& s) {
  const int64_t base = n / s.size, extra = n % s.size;
  const int64_t begin = s.rank * base + std::min<int64_t>(s.rank, extra);
  return {begin, begin + base + (s.rank < extra ? 1 : 0)};
}

namespace {

// What the ranks of one process share: a barrier and the arrays each rank published for the
// collective in progress.
class CpuGroup {
 public:
  explicit CpuGroup(int n) : n_(n), published_(size_t(n)) {}
  int size() const { return n_; }

  // A reusable barrier: the last rank to arrive opens the current generation.
  void barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }

  void publish(int rank, const Array& a) { published_[size_t(rank)] = a; }
  const Array& published(int rank) const { return published_[size_t(rank)]; }
  // The sum of an all-reduce, written by every rank (a slice each) between two barriers.
  float* sum_buffer(int64_t n) {
    // Grown by rank 0 alone, before the barrier that lets the others write into it.
    if (int64_t(sum_.size()) < n) sum_.resize(size_t(n));
    return sum_.data();
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<Array> published_;
  std::vector<float> sum_;
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<CpuGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  void all_reduce_sum_(Array& x) override {
    check(x, "all_reduce_sum_");
    const int n_ranks = size();
    if (n_ranks == 1) return;
    const int64_t n = x.numel();
    group_->publish(rank_, x);
    float* sum = rank_ == 0 ? group_->sum_buffer(n) : nullptr;
    group_->barrier();  // every x published, the sum buffer sized
    for (int r = 0; r < n_ranks; ++r)
      if (group_->published(r).numel() != n)
        throw InvalidInput("all_reduce_sum_: rank " + std::to_string(r) + " reduces " +
                           describe(group_->published(r)) + ", rank " + std::to_string(rank_) + " " + describe(x));
    sum = group_->sum_buffer(0);
    // Each rank sums its slice of the elements, always in rank order, so that the result does
    // not depend on which rank computed which element.
    const ShardRange mine = shard_range(n, {rank_, n_ranks});
    for (int64_t i = mine.begin; i < mine.end; ++i) {
      float s = group_->published(0).data<float>()[i];
      for (int r = 1; r < n_ranks; ++r) s += group_->published(r).data<float>()[i];
      sum[i] = s;
    }
    group_->barrier();  // the whole sum written
    std::copy(sum, sum + n, x.data<float>());
    group_->publish(rank_, Array());
    group_->barrier();  // every rank has read the sum: the buffer may be reused
  }

  Array all_gather_cols(const Array& x, int64_t total) override {
    check(x, "all_gather_cols");
    const int n_ranks = size();
    if (x.ndim() != 2) throw InvalidInput("all_gather_cols: " + describe(x) + " is not [rows, columns]");
    if (n_ranks == 1) {
      if (x.dim(1) != total)
        throw InvalidInput("all_gather_cols: " + describe(x) + " of a single rank is not [rows, " +
                           std::to_string(total) + "]");
      return x;
    }
    const int64_t rows = x.dim(0);
    group_->publish(rank_, x);
    // Every rank checks every part after this barrier, so that a bad part makes all of them
    // throw the same error rather than leaving the others waiting.
    group_->barrier();
    Array out = Array::empty({rows, total}, DType::f32);
    for (int r = 0; r < n_ranks; ++r) {
      const Array& part = group_->published(r);
      const ShardRange cols = shard_range(total, {r, n_ranks});
      if (part.ndim() != 2 || part.dim(0) != rows || part.dim(1) != cols.count())
        throw InvalidInput("all_gather_cols: rank " + std::to_string(r) + " holds " + describe(part) + ", but [" +
                           std::to_string(rows) + ", " + std::to_string(cols.count()) + "] is expected");
      for (int64_t i = 0; i < rows; ++i)
        std::copy_n(part.data<float>() + i * cols.count(), cols.count(), out.data<float>() + i * total + cols.begin);
    }
    group_->barrier();  // every rank has read every part
    group_->publish(rank_, Array());
    return out;
  }

  void barrier() override { group_->barrier(); }

 private:
  void check(const Array& x, const char* what) const {
    if (!x.device().is_cpu() || x.dtype() != DType::f32 || !x.is_contiguous())
      throw InvalidInput(std::string(what) + ": the CPU communicator takes contiguous float32 CPU arrays, got " +
                         describe(x) + " on " + x.device().str());
  }

  std::shared_ptr<CpuGroup> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int n) {
  if (n < 1) throw InvalidInput("a communicator group needs at least 1 rank, got " + std::to_string(n));
  auto group = std::make_shared<CpuGroup>(n);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<CpuCommunicator>(group, r));
  return out;
}

#ifndef OSPREY_HAVE_NCCL
bool nccl_available() { return false; }

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices) {
  throw Unsupported("tensor parallelism over " + std::to_string(devices.size()) +
                    " CUDA devices needs NCCL, and this build has none (CMake found no nccl.h and libnccl; "
                    "install NCCL, or the CUDA toolkit that ships it, and rebuild)");
}
#endif

}  // namespace osprey
