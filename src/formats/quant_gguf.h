#pragma once
// GGUF's block types as quantization methods (docs/gguf.md, "Quantized types"): one method per
// type that Osprey reads (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K). Each owns how its
// blocks become the affine layout (formats/gguf_model.cpp repacks a GGUF file's matrices with
// it when the file is opened) and claims the modules whose tensor was of its type; its weights
// load as affine ones and run on the affine kernels.
#include <cstdint>

#include "formats/gguf.h"
#include "formats/quant_affine.h"

namespace osprey {

class GgufBlockMethod : public AffinePayloadMethod {
 public:
  GgufType type() const { return type_; }
  // Bits per repacked code and values per repacked scale and bias.
  int repacked_bits() const { return bits_; }
  int repacked_group() const { return group_; }
  const char* name() const override { return name_; }
  // One block of this type as affine groups of repacked_group() values: codes[block elements]
  // (each < 2^repacked_bits()), and a float16 scale and bias per group.
  virtual void affine_groups(const uint8_t* block, uint8_t* codes, uint16_t* scale, uint16_t* bias) const = 0;

  // A module of a GGUF checkpoint whose tensor was of this type (QuantConfig::gguf_types).
  bool claims(const SafeTensors& st, const QuantConfig& quant, const std::string& prefix) const override;
  LinearWeight load(LinearLoader& loader, const LinearRequest& r) const override;

 protected:
  GgufBlockMethod(GgufType type, int bits, int group, const char* name)
      : type_(type), bits_(bits), group_(group), name_(name) {}

 private:
  GgufType type_;
  int bits_, group_;
  const char* name_;
};

// The registry's method of block type `type`; nullptr when none reads it.
const GgufBlockMethod* gguf_block_method(GgufType type);

}  // namespace osprey
