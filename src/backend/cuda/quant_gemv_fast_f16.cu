// The fast GEMV kernels of quant_gemv.cuh for f16 scales (one file each, so they compile in
// parallel).
#include "backend/cuda/quant_gemv.cuh"

namespace osprey::cuda::qgemv {

template void launch_fast<false>(const GemvParams&, int, int, cudaStream_t);

}  // namespace osprey::cuda::qgemv
