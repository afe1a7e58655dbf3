// GPTQ (quant_method "gptq", formats/hub_quant.h): `<prefix>.qweight`, `.qzeros`, `.scales`
// and `.g_idx` repacked exactly into the MLX affine layout at load. With desc_act the inputs
// are sorted by g_idx so that each group is contiguous, and the payload's in_perm holds that
// order: linear gathers x by it before the affine kernels (ops::gather_inputs).
#include "backend/ops.h"
#include "core/error.h"
#include "formats/quant_affine.h"
#include "formats/safetensors.h"

namespace osprey {
namespace {

const PermutedMatrix& gptq_of(const LinearWeight& w) { return *w.payload<PermutedMatrix>(); }

class GptqMethod final : public QuantMethod {
 public:
  const char* name() const override { return "gptq"; }

  Array linear(const Array& x, const LinearWeight& w, const Array& bias) const override {
    const PermutedMatrix& p = gptq_of(w);
    if (p.in_perm.defined()) return ops::linear(ops::gather_inputs(x, p.in_perm), p.q, bias);
    return ops::linear(x, p.q, bias);
  }
  Array embedding(const LinearWeight& table, const Array& ids, float scale) const override {
    const PermutedMatrix& p = gptq_of(table);
    if (p.in_perm.defined())
      throw InvalidInput("embedding: a table whose columns are permuted (GPTQ desc_act) is not supported");
    return ops::embedding(p.q, ids, scale);
  }
  int64_t out_features(const LinearWeight& w) const override { return gptq_of(w).q.out_features(); }
  int64_t in_features(const LinearWeight& w) const override { return gptq_of(w).q.in_features(); }
  size_t nbytes(const LinearWeight& w) const override { return gptq_of(w).q.nbytes(); }
  DType value_dtype(const LinearWeight& w) const override { return affine_value_dtype(gptq_of(w).q); }
  const void* storage(const LinearWeight& w) const override {
    const QuantizedMatrix& q = gptq_of(w).q;
    return q.tiles_only() ? q.cpu_tiles.raw() : q.packed.raw();
  }

  bool claims(const SafeTensors& st, const QuantConfig& quant, const std::string& prefix) const override {
    return quant.hub.method == HubQuantMethod::gptq && st.contains(prefix + ".qweight");
  }

  LinearWeight load(LinearLoader& loader, const LinearRequest& r) const override {
    const WeightSlice s = resolve_slice(r.slice, r.prefix, r.out, r.in);
    RepackedInt repacked = repack_int_quant(loader.tensors(), loader.quant().hub, r.prefix, r.out, r.in, r.dtype);
    for (const std::string& name : repacked.tensors) loader.mark_read(name);
    if (repacked.perm.defined() && (s.col0 != 0 || s.cols != r.in))
      throw InvalidInput("tensor " + r.prefix + ".g_idx orders the inputs for desc_act: a tensor-parallel rank's "
                         "columns " + range_str(s.col0, s.cols) + " of its " + std::to_string(r.in) +
                         " inputs cannot be split from it (use one rank)");
    PermutedMatrix p;
    p.q = place_repacked_int(loader, r, s, repacked);
    // Layers with the same order share one array, and so may be stacked.
    if (repacked.perm.defined()) p.in_perm = loader.shared(repacked.perm);
    return LinearWeight(*this, std::move(p));
  }

  void finish(LinearWeight& w, LinearLoader& loader, bool table) const override {
    finish_affine(w.payload<PermutedMatrix>()->q, loader, table);
  }

  bool stacks_with(const LinearWeight& a, const LinearWeight& b) const override {
    if (!b.payload<PermutedMatrix>()) return false;
    const PermutedMatrix &pa = gptq_of(a), &pb = gptq_of(b);
    // One input order for all of them (the loader shares equal orders' array).
    return affine_stacks_with(pa.q, pb.q) && pb.in_perm.defined() == pa.in_perm.defined() &&
           (!pa.in_perm.defined() || pb.in_perm.raw() == pa.in_perm.raw());
  }

  LinearWeight stack(const std::vector<LinearWeight>& parts) const override {
    std::vector<const QuantizedMatrix*> qs;
    for (const LinearWeight& p : parts) qs.push_back(&gptq_of(p).q);
    PermutedMatrix f;
    f.q = stack_affine(qs);
    f.in_perm = gptq_of(parts[0]).in_perm;
    return LinearWeight(*this, std::move(f));
  }
};

}  // namespace

const QuantMethod& gptq_method() {
  static const GptqMethod method;
  return method;
}

}  // namespace osprey
