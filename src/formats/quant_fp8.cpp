// FP8 e4m3 (compressed-tensors, fbgemm_fp8, fp8 with block scales, ModelOpt; formats/hub_quant.h):
// a float8_e4m3fn `<prefix>.weight` with per-tensor, per-row or block scales. The backend's
// device policy (ops::keep_fp8_weights, docs/design.md "FP8") decides per layer whether it stays
// FP8 (an Fp8Matrix, run by backend/cuda/fp8_linear.h; W8A8 where the checkpoint declares FP8
// activations) or is dequantized at load into a dense weight.
#include "backend/ops.h"
#include "core/error.h"
#include "core/log.h"
#include "formats/quant_method.h"
#include "formats/safetensors.h"

namespace osprey {
namespace {

const Fp8Matrix& fp8_of(const LinearWeight& w) { return *w.payload<Fp8Matrix>(); }

class Fp8Method final : public QuantMethod {
 public:
  const char* name() const override { return "fp8"; }

  Array linear(const Array& x, const LinearWeight& w, const Array& bias) const override {
    return ops::linear(x, fp8_of(w), bias);
  }
  Array embedding(const LinearWeight&, const Array&, float) const override {
    throw InvalidInput("embedding: an FP8 table is not supported (FP8 embeddings are dequantized at load)");
  }
  int64_t out_features(const LinearWeight& w) const override { return fp8_of(w).out_features(); }
  int64_t in_features(const LinearWeight& w) const override { return fp8_of(w).in_features(); }
  size_t nbytes(const LinearWeight& w) const override { return fp8_of(w).nbytes(); }
  DType value_dtype(const LinearWeight& w) const override { return fp8_of(w).scales.dtype(); }
  const void* storage(const LinearWeight& w) const override { return fp8_of(w).codes.raw(); }

  bool claims(const SafeTensors& st, const QuantConfig& quant, const std::string& prefix) const override {
    const std::string weight = prefix + ".weight";
    return quant.hub.method == HubQuantMethod::fp8 && !st.contains(prefix + ".qweight") && st.contains(weight) &&
           st.info(weight).float8_e4m3;
  }

  LinearWeight load(LinearLoader& loader, const LinearRequest& r) const override {
    const SafeTensors& st = loader.tensors();
    const HubQuant& hq = loader.quant().hub;
    const std::string& prefix = r.prefix;
    const int64_t out = r.out, in = r.in;
    const Device device = loader.device();
    const WeightSlice s = resolve_slice(r.slice, prefix, out, in);
    // Static activation scales (W8A8 checkpoints): the weights run against unquantized activations.
    if (st.contains(prefix + ".input_scale")) loader.mark_read(prefix + ".input_scale");
    // FP8 stays FP8 where the backend's policy says (ops::keep_fp8_weights, from LoadOptions::
    // keep_fp8 and the scale groups); an embedding table is dequantized.
    std::optional<LoadedFp8> kept;
    if (!r.table && ops::keep_fp8_weights(device, loader.keep_fp8(), 1)) {
      kept = load_fp8(st, hq, prefix, out, in);
      if (!ops::keep_fp8_weights(device, loader.keep_fp8(), kept->m.scales.dim(1))) kept.reset();
    }
    if (kept) {
      const LoadedFp8& f = *kept;
      for (const std::string& name : f.tensors) loader.mark_read(name);
      const int64_t groups = f.m.scales.dim(1), group = in / groups;
      if (groups > 1 && (s.col0 % group != 0 || s.cols % group != 0))
        throw InvalidInput("tensor " + prefix + ".weight has FP8 block scales over groups of " +
                           std::to_string(group) + " inputs: a tensor-parallel rank's columns " +
                           range_str(s.col0, s.cols) + " of its " + std::to_string(in) +
                           " inputs do not fall on whole groups (use fewer ranks)");
      if (loader.first_time("fp8"))
        log_info(st.source().string() + ": FP8 (" + hq.name + ", " +
                 (hq.fp8_activations ? "FP8 activations declared" : "weights only") + ") weights stay FP8 on " +
                 device.str() + "; " + ops::fp8_kept_note(device, groups, hq.fp8_activations) +
                 (hq.fp8_activation_note.empty() ? "" : " (" + hq.fp8_activation_note + ")"));
      Fp8Matrix m;
      m.fp8_activations = hq.fp8_activations;
      m.codes = ops::to_device(slice_2d(f.m.codes, s.row0, s.rows, s.col0, s.cols), device);
      m.scales = ops::to_device(
          slice_2d(f.m.scales, s.row0, s.rows, groups > 1 ? s.col0 / group : 0, groups > 1 ? s.cols / group : 1),
          device);
      loader.converted(f.source_bytes, m.nbytes());
      loader.count_weights(s.rows * s.cols, std::nullopt);
      return LinearWeight(*this, std::move(m));
    }
    const DType to = r.dtype.value_or(DType::bf16);
    DequantizedFp8 d = dequantize_fp8(st, hq, prefix, out, in, to);
    for (const std::string& name : d.tensors) loader.mark_read(name);
    if (loader.first_time("fp8"))
      log_info(st.source().string() + ": FP8 (" + hq.name + ") weights are dequantized to " + dtype_name(to) +
               " at load" + ops::fp8_dequantized_note(device) + "; activations are not quantized");
    Array w = slice_2d(d.w, s.row0, s.rows, s.col0, s.cols);
    loader.converted(d.source_bytes, w.nbytes());
    loader.count_weights(s.rows * s.cols, std::nullopt);
    return dense_weight(ops::to_device(w, device));
  }

  bool stacks_with(const LinearWeight& a, const LinearWeight& b) const override {
    if (!b.payload<Fp8Matrix>()) return false;
    const Fp8Matrix &fa = fp8_of(a), &fb = fp8_of(b);
    return fb.scales.dim(1) == fa.scales.dim(1) && fb.codes.is_contiguous() &&
           fb.fp8_activations == fa.fp8_activations && fb.in_features() == fa.in_features();
  }

  LinearWeight stack(const std::vector<LinearWeight>& parts) const override {
    std::vector<Array> codes, scales;
    for (const LinearWeight& p : parts) {
      codes.push_back(fp8_of(p).codes);
      scales.push_back(fp8_of(p).scales);
    }
    Fp8Matrix f;
    f.codes = stack_rows(codes);
    f.scales = stack_rows(scales);
    f.fp8_activations = fp8_of(parts[0]).fp8_activations;
    return LinearWeight(*this, std::move(f));
  }
};

}  // namespace

const QuantMethod& fp8_method() {
  static const Fp8Method method;
  return method;
}

}  // namespace osprey
