// The NCCL communicator: one process, one thread and one CUDA stream per GPU (rank i on
// devices[i]). Each collective is enqueued on the calling rank's compute stream (the CUDA
// backend's stream of the device current on that thread), so it runs in order with the
// rank's kernels and a captured decode step records it. Built only when CMake found NCCL
// (OSPREY_HAVE_NCCL).
#include <nccl.h>

#include <string>

#include "backend/cuda/runtime.h"
#include "backend/ops.h"
#include "core/error.h"
#include "backend/communicator.h"

namespace osprey {
namespace {

[[noreturn]] void throw_nccl_error(ncclResult_t r, const char* expr, const char* file, int line) {
  throw Error(std::string("NCCL error ") + ncclGetErrorString(r) + " (" + std::to_string(int(r)) + ") in " + expr +
              " at " + file + ":" + std::to_string(line));
}

#define OSPREY_NCCL_CHECK(expr)                                                                 \
  do {                                                                                          \
    ncclResult_t osprey_nccl_ = (expr);                                                         \
    if (osprey_nccl_ != ncclSuccess) throw_nccl_error(osprey_nccl_, #expr, __FILE__, __LINE__); \
  } while (0)

// A [rows, cols] view of `base`'s buffer starting at element `first`, rows `stride` apart.
Array cols_view(const Array& base, int64_t first, int64_t rows, int64_t cols, int64_t stride) {
  return Array::strided(base.buffer(), base.byte_offset() + size_t(first) * sizeof(float), {rows, cols},
                        {stride, 1}, DType::f32);
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device)
      : comm_(comm), rank_(rank), size_(size), device_(device) {}
  ~NcclCommunicator() override {
    // NOTE: ncclCommDestroy waits for the communicator's pending work; it does not throw.
    if (comm_) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum_(Array& x) override {
    check(x, "all_reduce_sum_");
    if (size_ == 1) return;
    OSPREY_NCCL_CHECK(ncclAllReduce(x.raw(), x.raw(), size_t(x.numel()), ncclFloat, ncclSum, comm_, cuda::stream()));
  }

  Array all_gather_cols(const Array& x, int64_t total) override {
    check(x, "all_gather_cols");
    const ShardRange mine = shard_range(total, shard());
    if (x.ndim() != 2 || x.dim(1) != mine.count())
      throw InvalidInput("all_gather_cols: rank " + std::to_string(rank_) + " holds " + describe(x) + ", but [rows, " +
                         std::to_string(mine.count()) + "] of " + std::to_string(total) + " columns is expected");
    if (size_ == 1) return x;
    const int64_t rows = x.dim(0);
    const Device dev = Device::cuda(device_);
    Array out = Array::empty({rows, total}, DType::f32, dev);
    // ncclAllGather moves equal counts laid out rank after rank. One row split evenly is
    // already that layout; otherwise each part goes through a [rows, width] slot padded to the
    // widest part, and the slots are copied into their columns.
    const int64_t width = (total + size_ - 1) / size_;
    if (rows == 1 && total % size_ == 0) {
      OSPREY_NCCL_CHECK(ncclAllGather(x.raw(), out.raw(), size_t(width), ncclFloat, comm_, cuda::stream()));
      return out;
    }
    Array send = Array::empty({rows, width}, DType::f32, dev);
    ops::copy_into(cols_view(send, 0, rows, mine.count(), width), x);
    Array recv = Array::empty({int64_t(size_), rows, width}, DType::f32, dev);
    OSPREY_NCCL_CHECK(ncclAllGather(send.raw(), recv.raw(), size_t(rows * width), ncclFloat, comm_, cuda::stream()));
    for (int r = 0; r < size_; ++r) {
      const ShardRange cols = shard_range(total, {r, size_});
      if (cols.count() == 0) continue;
      ops::copy_into(cols_view(out, cols.begin, rows, cols.count(), total),
                     cols_view(recv, int64_t(r) * rows * width, rows, cols.count(), width));
    }
    return out;
  }

  void barrier() override {
    // A one-element all-reduce that every rank waits for.
    if (!token_.defined()) token_ = ops::to_device(Array::zeros({1}, DType::f32), Device::cuda(device_));
    OSPREY_NCCL_CHECK(ncclAllReduce(token_.raw(), token_.raw(), 1, ncclFloat, ncclSum, comm_, cuda::stream()));
    OSPREY_CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
  }

 private:
  void check(const Array& x, const char* what) const {
    if (!(x.device() == Device::cuda(device_)) || x.dtype() != DType::f32 || !x.is_contiguous())
      throw InvalidInput(std::string(what) + ": rank " + std::to_string(rank_) +
                         " takes contiguous float32 arrays on cuda:" + std::to_string(device_) + ", got " +
                         describe(x) + " on " + x.device().str());
  }

  ncclComm_t comm_ = nullptr;
  int rank_, size_, device_;
  Array token_;
};

}  // namespace

bool nccl_available() { return true; }

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices) {
  if (devices.empty()) throw InvalidInput("an NCCL communicator group needs at least one device");
  int n_visible = 0;
  OSPREY_CUDA_CHECK(cudaGetDeviceCount(&n_visible));
  for (int d : devices)
    if (d < 0 || d >= n_visible)
      throw InvalidInput("tensor parallelism over " + std::to_string(devices.size()) + " GPUs needs cuda:" +
                         std::to_string(d) + ", but " + std::to_string(n_visible) + " CUDA device" +
                         (n_visible == 1 ? " is" : "s are") + " visible");
  const int n = int(devices.size());
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  OSPREY_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<NcclCommunicator>(comms[size_t(r)], r, n, devices[size_t(r)]));
  return out;
}

}  // namespace osprey
