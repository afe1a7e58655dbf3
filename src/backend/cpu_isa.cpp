#include "backend/cpu_isa.h"

#include "backend/cpu_level.h"

namespace osprey {

const char* cpu_isa_name() {
  switch (cpu_level()) {
    case CpuLevel::scalar: return "scalar";
    case CpuLevel::v3: return "AVX2";
    case CpuLevel::v4: return "AVX-512";
    case CpuLevel::v4_bf16: return "AVX-512 BF16";
  }
  return "?";
}

}  // namespace osprey
