#include "backend/cpu_isa.h"

namespace osprey {

// The same tests as the kernels' headers, on the same flags (the whole build shares them).
const char* cpu_isa_name() {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  return "AVX2";
#else
  return "scalar";
#endif
}

}  // namespace osprey
