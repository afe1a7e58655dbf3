// AWQ (quant_method "awq", formats/hub_quant.h): `<prefix>.qweight`, `.qzeros` and `.scales`
// repacked exactly into the MLX affine layout at load, then run by the affine kernels.
#include "formats/quant_affine.h"
#include "formats/safetensors.h"

namespace osprey {
namespace {

class AwqMethod final : public AffinePayloadMethod {
 public:
  const char* name() const override { return "awq"; }

  bool claims(const SafeTensors& st, const QuantConfig& quant, const std::string& prefix) const override {
    return quant.hub.method == HubQuantMethod::awq && st.contains(prefix + ".qweight");
  }

  LinearWeight load(LinearLoader& loader, const LinearRequest& r) const override {
    const WeightSlice s = resolve_slice(r.slice, r.prefix, r.out, r.in);
    RepackedInt repacked = repack_int_quant(loader.tensors(), loader.quant().hub, r.prefix, r.out, r.in, r.dtype);
    for (const std::string& name : repacked.tensors) loader.mark_read(name);
    return LinearWeight(*this, place_repacked_int(loader, r, s, repacked));
  }
};

}  // namespace

const QuantMethod& awq_method() {
  static const AwqMethod method;
  return method;
}

}  // namespace osprey
