// MLX affine quantization (formats/quant_affine.h): `<prefix>.weight` u32 [out, in * bits / 32]
// with `.scales` and `.biases` [out, in / group] (f16 | bf16), as config.json's "quantization"
// declares it; GGUF's block types reach it repacked (formats/gguf_model.h). The affine kernels
// (backend/quant.h) run it, and AWQ and GPTQ after their repack.
#include "formats/quant_affine.h"

#include "backend/ops.h"
#include "backend/quant_args.h"
#include "core/error.h"
#include "formats/safetensors.h"

namespace osprey {
namespace {

const QuantizedMatrix& affine_of(const LinearWeight& w) { return *w.payload<QuantizedMatrix>(); }

}  // namespace

Array AffinePayloadMethod::linear(const Array& x, const LinearWeight& w, const Array& bias) const {
  return ops::linear(x, affine_of(w), bias);
}
Array AffinePayloadMethod::embedding(const LinearWeight& table, const Array& ids, float scale) const {
  return ops::embedding(affine_of(table), ids, scale);
}
int64_t AffinePayloadMethod::out_features(const LinearWeight& w) const { return affine_of(w).out_features(); }
int64_t AffinePayloadMethod::in_features(const LinearWeight& w) const { return affine_of(w).in_features(); }
size_t AffinePayloadMethod::nbytes(const LinearWeight& w) const { return affine_of(w).nbytes(); }
DType AffinePayloadMethod::value_dtype(const LinearWeight& w) const { return affine_value_dtype(affine_of(w)); }
const void* AffinePayloadMethod::storage(const LinearWeight& w) const {
  const QuantizedMatrix& q = affine_of(w);
  return q.tiles_only() ? q.cpu_tiles.raw() : q.packed.raw();
}
void AffinePayloadMethod::finish(LinearWeight& w, LinearLoader& loader, bool table) const {
  finish_affine(*w.payload<QuantizedMatrix>(), loader, table);
}
bool AffinePayloadMethod::stacks_with(const LinearWeight& a, const LinearWeight& b) const {
  return b.payload<QuantizedMatrix>() && affine_stacks_with(affine_of(a), affine_of(b));
}
LinearWeight AffinePayloadMethod::stack(const std::vector<LinearWeight>& parts) const {
  std::vector<const QuantizedMatrix*> qs;
  bool one_method = true;
  for (const LinearWeight& p : parts) {
    qs.push_back(&affine_of(p));
    one_method = one_method && &p.method() == this;
  }
  // Parts of several methods (GGUF block types of one affine setting) stack as the layout
  // they share.
  return LinearWeight(one_method ? static_cast<const QuantMethod&>(*this) : affine_method(), stack_affine(qs));
}

void finish_affine(QuantizedMatrix& q, LinearLoader& loader, bool table) {
  ops::repack_for_cpu(q);
  if (table || !loader.cpu_tiles_only())
    ops::release_mapped_source(q);
  else
    ops::keep_tiles_only(q);
}

bool affine_stacks_with(const QuantizedMatrix& a, const QuantizedMatrix& b) {
  return b.bits == a.bits && b.group_size == a.group_size && b.scales.dtype() == a.scales.dtype() &&
         b.packed.is_contiguous() && b.in_features() == a.in_features();
}

QuantizedMatrix stack_affine(const std::vector<const QuantizedMatrix*>& parts) {
  std::vector<Array> packed, scales, biases;
  for (const QuantizedMatrix* q : parts) {
    packed.push_back(q->packed);
    scales.push_back(q->scales);
    biases.push_back(q->biases);
  }
  QuantizedMatrix f;
  f.packed = stack_rows(packed);
  f.scales = stack_rows(scales);
  f.biases = stack_rows(biases);
  f.bits = parts[0]->bits;
  f.group_size = parts[0]->group_size;
  ops::repack_for_cpu(f);
  return f;
}

DType affine_value_dtype(const QuantizedMatrix& q) { return q.tiles_only() ? q.tiles_scale_dtype : q.scales.dtype(); }

QuantizedMatrix place_repacked_int(LinearLoader& loader, const LinearRequest& r, const WeightSlice& s,
                                   RepackedInt& repacked) {
  QuantizedMatrix& q = repacked.q;
  const int64_t group = q.group_size, per = 32 / q.bits;
  if (s.col0 % group != 0 || s.cols % group != 0)
    throw InvalidInput("tensor " + r.prefix + ".qweight is quantized in groups of " + std::to_string(group) +
                       " inputs: a tensor-parallel rank's columns " + range_str(s.col0, s.cols) + " of its " +
                       std::to_string(r.in) + " inputs do not fall on whole groups (use fewer ranks)");
  q.packed = slice_2d(q.packed, s.row0, s.rows, s.col0 / per, s.cols / per);
  q.scales = slice_2d(q.scales, s.row0, s.rows, s.col0 / group, s.cols / group);
  q.biases = slice_2d(q.biases, s.row0, s.rows, s.col0 / group, s.cols / group);
  loader.converted(repacked.source_bytes, q.nbytes());
  q.packed = ops::to_device(q.packed, loader.device());
  q.scales = ops::to_device(q.scales, loader.device());
  q.biases = ops::to_device(q.biases, loader.device());
  loader.count_weights(s.rows * s.cols, QuantSetting{q.bits, q.group_size});
  return q;
}

LinearWeight load_affine(const AffinePayloadMethod& as, LinearLoader& loader, const LinearRequest& r) {
  const SafeTensors& st = loader.tensors();
  const QuantConfig& quant = loader.quant();
  const std::string& prefix = r.prefix;
  const int64_t out = r.out, in = r.in;
  const std::string wname = prefix + ".weight", sname = prefix + ".scales", bname = prefix + ".biases";
  const TensorInfo& wi = st.info(wname);
  if (quant.hub.present())
    throw InvalidInput("tensor " + wname + " is an MLX-quantized weight (" + tensor_str(wi) + "), but " +
                       quant.where + " names quant_method \"" + quant.hub.name + "\"");
  if (!quant.present())
    throw InvalidInput("tensor " + wname + " is quantized (" + tensor_str(wi) +
                       (st.contains(sname) ? ", with " + sname : std::string()) +
                       "), but config.json has no \"quantization\" object");
  if (wi.dtype != DType::u32 || wi.shape.n != 2 || wi.shape[0] != out)
    throw InvalidInput("tensor " + wname + " is " + tensor_str(wi) + ", but a quantized weight must be uint32[" +
                       std::to_string(out) + ", " + std::to_string(in) + " * bits / 32]");
  const int64_t packed_in = wi.shape[1];
  const int bits = (packed_in * 32) % in == 0 ? int(packed_in * 32 / in) : 0;
  if (!supported_quant_bits(bits))
    throw InvalidInput("tensor " + wname + " is " + tensor_str(wi) + ": a packed width of " +
                       std::to_string(packed_in) + " words fits no supported bit count for " + std::to_string(in) +
                       " inputs (width * 32 / inputs must be 2, 3, 4, 6 or 8)");
  for (const std::string& name : {sname, bname})
    if (!st.contains(name))
      throw InvalidInput("missing tensor " + name + ": the quantized weight " + wname +
                         " needs both .scales and .biases (in " + st.source().string() + ")");
  const TensorInfo& si = st.info(sname);
  const TensorInfo& bi = st.info(bname);
  if ((si.dtype != DType::f16 && si.dtype != DType::bf16) || si.shape.n != 2 || si.shape[0] != out ||
      si.shape[1] <= 0)
    throw InvalidInput("tensor " + sname + " is " + tensor_str(si) + ", but float16 or bfloat16 [" +
                       std::to_string(out) + ", " + std::to_string(in) + " / group_size] is expected");
  if (r.dtype && si.dtype != *r.dtype)
    throw InvalidInput("tensor " + sname + " is " + tensor_str(si) + ", but the model's other weights are " +
                       dtype_name(*r.dtype));
  if (bi.dtype != si.dtype || !(bi.shape == si.shape))
    throw InvalidInput("tensor " + bname + " is " + tensor_str(bi) + ", but it must match " + sname + " (" +
                       tensor_str(si) + ")");
  const int64_t n_groups = si.shape[1];
  const int group = in % n_groups == 0 ? int(in / n_groups) : 0;
  if (!supported_quant_group(bits, group))
    throw InvalidInput("tensor " + sname + " is " + tensor_str(si) + ": " + std::to_string(n_groups) +
                       " groups per row " +
                       (group == 0 ? "do not divide the " + std::to_string(in) + " inputs"
                                   : "make a group size of " + std::to_string(group)) +
                       " (the group size must be 32, 64 or 128, or 16 with 8 bits, and divide the inputs)");
  const QuantSetting found{bits, group};
  const std::optional<QuantSetting> expected = quant.for_module(prefix);
  if (!expected)
    throw InvalidInput("tensor " + wname + " is quantized, but " + quant.where + " marks " + prefix +
                       " as not quantized (false)");
  if (!(*expected == found))
    throw InvalidInput("tensor " + wname + " is " + setting_str(found) + " by its shapes, but " + quant.where +
                       " says " + setting_str(*expected) + " for " + prefix);
  QuantizedMatrix q;
  q.bits = bits;
  q.group_size = group;
  for (const std::string& name : {wname, sname, bname}) loader.mark_read(name);
  const WeightSlice s = resolve_slice(r.slice, wname, out, in);
  if (s.col0 % group != 0 || s.cols % group != 0)
    throw InvalidInput("tensor " + wname + " is quantized in groups of " + std::to_string(group) +
                       " inputs: a tensor-parallel rank's columns " + range_str(s.col0, s.cols) + " of its " +
                       std::to_string(in) + " inputs do not fall on whole groups (use fewer ranks, or a "
                       "checkpoint whose group size divides " + std::to_string(in) + " / ranks)");
  // A group of `group` inputs is group * bits / 32 packed words (whole words: every supported
  // group size is a multiple of 32) and one scale and one bias.
  const int64_t words = group * bits / 32;
  q.packed = loader.place(slice_2d(st.get(wname), s.row0, s.rows, s.col0 / group * words, s.cols / group * words));
  q.scales = loader.place(slice_2d(st.get(sname), s.row0, s.rows, s.col0 / group, s.cols / group));
  q.biases = loader.place(slice_2d(st.get(bname), s.row0, s.rows, s.col0 / group, s.cols / group));
  loader.count_weights(s.rows * s.cols, found);
  return LinearWeight(as, std::move(q));
}

namespace {

class MlxAffineMethod final : public AffinePayloadMethod {
 public:
  const char* name() const override { return "mlx-affine"; }

  bool claims(const SafeTensors& st, const QuantConfig& quant, const std::string& prefix) const override {
    const std::string weight = prefix + ".weight";
    if (quant.hub.present() && st.contains(prefix + ".qweight")) return false;
    if (st.contains(weight) && st.info(weight).float8_e4m3) return false;
    return (st.contains(weight) && st.info(weight).dtype == DType::u32) || st.contains(prefix + ".scales") ||
           st.contains(prefix + ".biases");
  }

  LinearWeight load(LinearLoader& loader, const LinearRequest& r) const override {
    return load_affine(*this, loader, r);
  }
};

}  // namespace

const QuantMethod& affine_method() {
  static const MlxAffineMethod method;
  return method;
}

}  // namespace osprey
