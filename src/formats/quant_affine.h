#pragma once
// What the methods whose codes are MLX affine (backend/quant.h's QuantizedMatrix) share: the
// affine kernels, stacking and the CPU tiles. MLX's own method (quant_affine.cpp) and the
// formats repacked into its layout at load (AWQ; GPTQ through its PermutedMatrix) use them.
#include <vector>

#include "formats/hub_quant.h"
#include "formats/quant_method.h"

namespace osprey {

// A method whose payload is a QuantizedMatrix: the affine kernels, stacking and CPU tiles. A
// format repacked into the affine layout derives from it and adds its name, detection and load.
// Weights of two such methods stack (into an mlx-affine weight) when their settings agree.
class AffinePayloadMethod : public QuantMethod {
 public:
  Array linear(const Array& x, const LinearWeight& w, const Array& bias) const override;
  Array embedding(const LinearWeight& table, const Array& ids, float scale) const override;
  int64_t out_features(const LinearWeight& w) const override;
  int64_t in_features(const LinearWeight& w) const override;
  size_t nbytes(const LinearWeight& w) const override;
  DType value_dtype(const LinearWeight& w) const override;
  const void* storage(const LinearWeight& w) const override;
  void finish(LinearWeight& w, LinearLoader& loader, bool table) const override;
  bool stacks_with(const LinearWeight& a, const LinearWeight& b) const override;
  LinearWeight stack(const std::vector<LinearWeight>& parts) const override;
};

// The CPU tiles of an affine matrix just loaded (ops::repack_for_cpu); a weight only linear
// reads then keeps the tiles alone (ops::keep_tiles_only, with LoadOptions::cpu_tiles_only), a
// table keeps its packed words with their mapped pages released (ops::release_mapped_source).
void finish_affine(QuantizedMatrix& q, LinearLoader& loader, bool table);
// Whether b stacks under a: the same bits, group size, scale dtype and inputs, b contiguous.
bool affine_stacks_with(const QuantizedMatrix& a, const QuantizedMatrix& b);
// The matrices' rows stacked into one, with its CPU tiles where the level reads them.
QuantizedMatrix stack_affine(const std::vector<const QuantizedMatrix*>& parts);
DType affine_value_dtype(const QuantizedMatrix& q);

// Loads module r.prefix's affine tensors (`.weight` u32 [out, in * bits / 32], `.scales` and
// `.biases` [out, in / group] f16 | bf16) as a weight of method `as`: checked against the
// config's setting for the module (InvalidInput naming the tensor), sliced on whole groups and
// placed. MLX's method and GGUF's block types (repacked when the file is opened) load so.
LinearWeight load_affine(const AffinePayloadMethod& as, LinearLoader& loader, const LinearRequest& r);

// An AWQ or GPTQ layer repacked by repack_int_quant, sliced to r's rows or columns (on whole
// groups, else InvalidInput naming the tensor) and placed on the device, its reading counted.
QuantizedMatrix place_repacked_int(LinearLoader& loader, const LinearRequest& r, const WeightSlice& s,
                                   RepackedInt& repacked);

}  // namespace osprey
