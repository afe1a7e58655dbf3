#include "formats/hub_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/ops.h"
#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "formats/config_reader.h"
#include "formats/quant_method.h"  // tensor_str
#include "formats/safetensors.h"

namespace osprey {
namespace {

std::string dims(int64_t a, int64_t b) { return "[" + std::to_string(a) + ", " + std::to_string(b) + "]"; }

// The CPU array of tensor `name`, checked to be `dtype` [rows, cols].
Array get_2d(const SafeTensors& st, const std::string& name, DType dtype, int64_t rows, int64_t cols,
             const std::string& what) {
  if (!st.contains(name)) throw InvalidInput("missing tensor " + name + " (" + what + ")");
  const TensorInfo& ti = st.info(name);
  if (ti.dtype != dtype || ti.shape.n != 2 || ti.shape[0] != rows || ti.shape[1] != cols)
    throw InvalidInput("tensor " + name + " is " + tensor_str(ti) + ", but " + what + " is " + dtype_name(dtype) +
                       dims(rows, cols));
  return st.get(name);
}

float scale_at(const Array& s, int64_t i) {
  return s.dtype() == DType::f16 ? f16_to_f32(s.data<uint16_t>()[i]) : bf16_to_f32(s.data<uint16_t>()[i]);
}

uint16_t to_half(float v, DType dt) { return dt == DType::f16 ? f32_to_f16(v) : f32_to_bf16(v); }

int int_field(const ConfigReader& c, const char* key, const char* alias) {
  return int(c.has(key) ? c.get_int(key) : c.get_int(alias));
}

}  // namespace

float e4m3_to_float(uint8_t v) {
  const int e = (v >> 3) & 15, m = v & 7;
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  if (e == 15 && m == 7) return std::nanf("");
  if (e == 0) return sign * std::ldexp(float(m) / 8.0f, -6);
  return sign * std::ldexp(1.0f + float(m) / 8.0f, e - 7);
}

uint8_t float_to_e4m3(double v) {
  static const std::vector<double> kPositive = [] {
    std::vector<double> t(127);  // codes 0..126: the non-negative finite values, increasing
    for (int c = 0; c < 127; ++c) t[size_t(c)] = e4m3_to_float(uint8_t(c));
    return t;
  }();
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::min(std::fabs(v), 448.0);
  const size_t hi = size_t(std::lower_bound(kPositive.begin(), kPositive.end(), a) - kPositive.begin());
  size_t code = hi;
  if (hi > 0 && kPositive[hi] != a) {
    const double below = a - kPositive[hi - 1], above = kPositive[hi] - a;
    code = below < above ? hi - 1 : above < below ? hi : ((hi - 1) % 2 == 0 ? hi - 1 : hi);
  }
  return code == 0 ? 0 : uint8_t(code) | sign;
}

Fp8Rows quantize_fp8_rows(const Array& w, DType scale_dtype) {
  const Array f = ops::cast(w, DType::f32);
  const int64_t out = f.dim(0), in = f.dim(1);
  Fp8Rows r;
  r.codes = Array::empty({out, in}, DType::u8);
  r.scales = Array::empty({out, 1}, scale_dtype);
  const float* src = f.data<float>();
  auto* codes = r.codes.data<uint8_t>();
  cpu_pool().parallel_for(out, 16, [&](int64_t o0, int64_t o1, int) {
    for (int64_t o = o0; o < o1; ++o) {
      float amax = 0;
      for (int64_t i = 0; i < in; ++i) amax = std::max(amax, std::fabs(src[o * in + i]));
      float scale = amax > 0 ? amax / 448.0f : 1.0f;
      if (scale_dtype == DType::f32) {
        r.scales.data<float>()[o] = scale;
      } else {
        const uint16_t h = to_half(scale, scale_dtype);
        r.scales.data<uint16_t>()[o] = h;
        scale = scale_dtype == DType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      for (int64_t i = 0; i < in; ++i) codes[o * in + i] = float_to_e4m3(double(src[o * in + i]) / double(scale));
    }
  });
  return r;
}

HubQuant parse_hub_quant(const ConfigReader& c, const std::string& method) {
  HubQuant q;
  q.name = method;
  q.where = c.where();
  if (method == "awq") {
    q.method = HubQuantMethod::awq;
    q.bits = int_field(c, "bits", "w_bit");
    q.group_size = int_field(c, "group_size", "q_group_size");
    const std::string version = c.get_string("version", "gemm");
    std::string v = version;
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
    if (v != "gemm")
      throw Unsupported(q.where + ": field \"version\": AWQ \"" + version +
                        "\" packing is not supported (Osprey reads AWQ's \"gemm\" packing)");
    if (!c.get_bool("zero_point", true))
      throw Unsupported(q.where + ": field \"zero_point\": AWQ without zero points is not supported");
    if (q.bits != 4) c.fail("bits", "AWQ checkpoints are read with 4 bits, got " + std::to_string(q.bits));
  } else if (method == "gptq") {
    q.method = HubQuantMethod::gptq;
    q.bits = int(c.get_int("bits"));
    q.group_size = int(c.get_int("group_size"));
    if (q.bits != 4 && q.bits != 8) c.fail("bits", "GPTQ checkpoints are read with 4 or 8 bits, got " + std::to_string(q.bits));
    const char* fkey = c.has("checkpoint_format") ? "checkpoint_format" : "format";
    const std::string format = c.get_string(fkey, "gptq");
    if (format == "gptq")
      q.zero_offset = 1;  // AutoGPTQ's format: the stored zero points are z - 1
    else if (format != "gptq_v2")
      throw Unsupported(q.where + ": field \"" + fkey + "\": \"" + format +
                        "\" is not supported (Osprey reads \"gptq\" and \"gptq_v2\")");
  } else if (method == "compressed-tensors") {
    q.method = HubQuantMethod::fp8;
    const std::string format = c.get_string("format", "");
    if (format != "float-quantized" && format != "naive-quantized")
      throw Unsupported(q.where + ": field \"format\": compressed-tensors \"" + format +
                        "\" is not supported (Osprey reads \"float-quantized\" FP8 weights)");
    const auto groups = c.get_object("config_groups");
    if (!groups) c.fail("config_groups", "missing");
    for (const auto& [name, g] : groups->json().items()) {
      const ConfigReader group(g, groups->where() + ": " + name);
      const auto w = group.get_object("weights");
      if (!w) group.fail("weights", "missing");
      if (w->get_int("num_bits") != 8 || w->get_string("type") != "float")
        throw Unsupported(w->where() + ": only 8-bit float (FP8 e4m3) weights are supported, got " + w->json().dump());
      const std::string strategy = w->get_string("strategy", "tensor");
      if (strategy == "block") {
        const auto bs = w->json().value("block_structure", nlohmann::json::array({128, 128}));
        if (!bs.is_array() || bs.size() != 2 || !bs[0].is_number_integer() || !bs[1].is_number_integer())
          w->fail("block_structure", "expected [rows, cols], got " + bs.dump());
        q.block_rows = bs[0].get<int64_t>();
        q.block_cols = bs[1].get<int64_t>();
      } else if (strategy != "tensor" && strategy != "channel") {
        throw Unsupported(w->where() + ": field \"strategy\": \"" + strategy +
                          "\" is not supported (tensor, channel or block)");
      }
      // The activations: null (or absent) is weights-only FP8, whose inputs stay 16-bit.
      const nlohmann::json& acts = g.contains("input_activations") ? g["input_activations"] : nlohmann::json();
      if (acts.is_null()) {
        q.fp8_activations = false;
      } else {
        const ConfigReader a(acts, group.where() + ": input_activations");
        if (!acts.is_object()) a.fail("input_activations", "expected an object or null, got " + acts.dump());
        if (a.get_int("num_bits", 8) != 8 || a.get_string("type", "float") != "float")
          throw Unsupported(a.where() + ": only 8-bit float (FP8 e4m3) activations are supported, got " + acts.dump());
        const bool dynamic = a.get_bool("dynamic", false);
        const std::string as = a.get_string("strategy", "tensor");
        if (!dynamic || as != "token")
          q.fp8_activation_note = std::string("the checkpoint declares ") + (dynamic ? "dynamic" : "static") + " " +
                                  as + " activation scales; they run dynamic per token";
      }
    }
  } else if (method == "fbgemm_fp8") {
    q.method = HubQuantMethod::fp8;
  } else if (method == "fp8") {
    q.method = HubQuantMethod::fp8;
    const std::string scheme = c.get_string("activation_scheme", "dynamic");
    if (scheme != "dynamic" && scheme != "static")
      c.fail("activation_scheme", "expected \"dynamic\" or \"static\", got \"" + scheme + "\"");
    if (scheme == "static") q.fp8_activation_note = "the checkpoint declares static activation scales; they run dynamic per token";
    const std::string fmt = c.get_string("fmt", "e4m3");
    if (fmt != "e4m3") c.fail("fmt", "only \"e4m3\" FP8 weights are supported, got \"" + fmt + "\"");
    if (c.has("weight_block_size")) {
      const auto& bs = c.json()["weight_block_size"];
      if (!bs.is_array() || bs.size() != 2 || !bs[0].is_number_integer() || !bs[1].is_number_integer() ||
          bs[0].get<int64_t>() <= 0 || bs[1].get<int64_t>() <= 0)
        c.fail("weight_block_size", "expected [rows, cols], got " + bs.dump());
      q.block_rows = bs[0].get<int64_t>();
      q.block_cols = bs[1].get<int64_t>();
    }
  } else if (method == "modelopt") {
    q.method = HubQuantMethod::fp8;
    const std::string algo = c.get_string("quant_algo");
    if (algo != "FP8") throw Unsupported(q.where + ": field \"quant_algo\": \"" + algo + "\" is not supported (FP8)");
    q.fp8_activation_note = "ModelOpt FP8 declares static per-tensor activation scales; they run dynamic per token";
  } else {
    throw Unsupported(q.where + ": quant_method \"" + method +
                      "\" is not supported (Osprey reads MLX affine, awq, gptq, compressed-tensors, fbgemm_fp8, fp8 "
                      "and modelopt FP8)");
  }
  if (q.method == HubQuantMethod::awq || q.method == HubQuantMethod::gptq) {
    if (q.group_size != -1 && (q.group_size < 32 || q.group_size % 32 != 0))
      c.fail("group_size", "must be -1 or a multiple of 32, got " + std::to_string(q.group_size));
  }
  return q;
}

HubQuant parse_modelopt_quant(const std::filesystem::path& path) {
  const ConfigReader file = ConfigReader::load(path);
  const auto q = file.get_object("quantization");
  if (!q) file.fail("quantization", "missing");
  const std::string algo = q->get_string("quant_algo");
  if (algo != "FP8")
    throw Unsupported(q->where() + ": field \"quant_algo\": \"" + algo + "\" is not supported (FP8)");
  HubQuant h;
  h.method = HubQuantMethod::fp8;
  h.name = "modelopt";
  h.where = q->where();
  return h;
}

// Unpacks the codes and zero points of the checkpoint, finds the input order that makes every
// group contiguous, and packs the codes along the inputs as backend/quant.h lays them out.
// Exact but for the biases, which round -s * z once to the scales' dtype.
RepackedInt repack_int_quant(const SafeTensors& st, const HubQuant& hq, const std::string& prefix, int64_t out,
                             int64_t in, std::optional<DType> dtype) {
  const bool awq = hq.method == HubQuantMethod::awq;
  const int bits = hq.bits, per = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const int64_t g = hq.group_size == -1 ? in : hq.group_size;
  const std::string qw = prefix + ".qweight", qz = prefix + ".qzeros", sc = prefix + ".scales",
                    gi = prefix + ".g_idx";
  if (in % g != 0)
    throw InvalidInput(hq.where + ": group_size " + std::to_string(g) + " does not divide the " + std::to_string(in) +
                       " inputs of " + prefix);
  if (out % per != 0 || in % per != 0)
    throw InvalidInput("layer " + prefix + " " + dims(out, in) + ": its sizes must be multiples of " +
                       std::to_string(per) + " to be packed " + std::to_string(bits) + "-bit");
  const int64_t ng = in / g;
  RepackedInt r;
  const Array qweight = awq ? get_2d(st, qw, DType::i32, in, out / per, "AWQ's qweight [in, out / 8]")
                            : get_2d(st, qw, DType::i32, in / per, out, "GPTQ's qweight [in * bits / 32, out]");
  const Array qzeros = get_2d(st, qz, DType::i32, ng, out / per, "the zero points [in / group_size, out * bits / 32]");
  if (!st.contains(sc)) throw InvalidInput("missing tensor " + sc + " (the scales of " + qw + ")");
  const TensorInfo& si = st.info(sc);
  if ((si.dtype != DType::f16 && si.dtype != DType::bf16) || si.shape.n != 2 || si.shape[0] != ng || si.shape[1] != out)
    throw InvalidInput("tensor " + sc + " is " + tensor_str(si) + ", but the scales are float16 or bfloat16" +
                       dims(ng, out));
  if (dtype && si.dtype != *dtype)
    throw InvalidInput("tensor " + sc + " is " + tensor_str(si) + ", but the model's other weights are " +
                       dtype_name(*dtype));
  const Array scales = st.get(sc);
  r.tensors = {qw, qz, sc};

  // group of input i, and the order of the inputs that makes the groups contiguous
  std::vector<int32_t> group(static_cast<size_t>(in));
  for (int64_t i = 0; i < in; ++i) group[size_t(i)] = int32_t(i / g);
  if (!awq && st.contains(gi)) {
    const TensorInfo& ti = st.info(gi);
    if (ti.dtype != DType::i32 || ti.shape.n != 1 || ti.shape[0] != in)
      throw InvalidInput("tensor " + gi + " is " + tensor_str(ti) + ", but g_idx is int32[" + std::to_string(in) + "]");
    const Array a = st.get(gi);
    for (int64_t i = 0; i < in; ++i) {
      const int32_t v = a.data<int32_t>()[i];
      if (v < 0 || v >= ng)
        throw InvalidInput("tensor " + gi + ": input " + std::to_string(i) + " is in group " + std::to_string(v) +
                           ", outside the " + std::to_string(ng) + " groups");
      group[size_t(i)] = v;
    }
    r.tensors.push_back(gi);
  }
  std::vector<int32_t> perm(static_cast<size_t>(in));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return group[size_t(a)] < group[size_t(b)]; });
  bool identity = true;
  for (int64_t j = 0; j < in; ++j) {
    if (group[size_t(perm[size_t(j)])] != j / g)
      throw InvalidInput("tensor " + gi + " does not put " + std::to_string(g) + " inputs in each of its " +
                         std::to_string(ng) + " groups");
    identity = identity && perm[size_t(j)] == j;
  }

  // codes q[o][i] and zero points z[group][o]
  std::vector<uint8_t> q(size_t(out * in));
  const auto* qwp = reinterpret_cast<const uint32_t*>(qweight.data<int32_t>());
  static constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble j holds column 8c + kAwqOrder[j]
  if (awq) {
    for (int64_t i = 0; i < in; ++i)
      for (int64_t c = 0; c < out / 8; ++c) {
        const uint32_t w = qwp[i * (out / 8) + c];
        for (int j = 0; j < 8; ++j) q[size_t((8 * c + kAwqOrder[j]) * in + i)] = uint8_t((w >> (4 * j)) & 15);
      }
  } else {
    for (int64_t w = 0; w < in / per; ++w)
      for (int64_t o = 0; o < out; ++o) {
        const uint32_t word = qwp[w * out + o];
        for (int j = 0; j < per; ++j) q[size_t(o * in + w * per + j)] = uint8_t((word >> (bits * j)) & mask);
      }
  }
  std::vector<int32_t> z(size_t(ng * out));
  const auto* qzp = reinterpret_cast<const uint32_t*>(qzeros.data<int32_t>());
  for (int64_t k = 0; k < ng; ++k)
    for (int64_t c = 0; c < out / per; ++c) {
      const uint32_t word = qzp[k * (out / per) + c];
      for (int j = 0; j < per; ++j) {
        const int64_t o = per * c + (awq ? kAwqOrder[j] : j);
        z[size_t(k * out + o)] = int32_t((word >> (bits * j)) & mask) + hq.zero_offset;
      }
    }

  // the MLX group: the largest supported size that divides the checkpoint's
  const int mg = g % 128 == 0 ? 128 : g % 64 == 0 ? 64 : 32;
  const int64_t mgroups = in / mg;
  QuantizedMatrix& m = r.q;
  m.bits = bits;
  m.group_size = mg;
  m.packed = Array::zeros({out, in / per}, DType::u32);
  m.scales = Array::empty({out, mgroups}, si.dtype);
  m.biases = Array::empty({out, mgroups}, si.dtype);
  auto* packed = m.packed.data<uint32_t>();
  auto* ms = m.scales.data<uint16_t>();
  auto* mb = m.biases.data<uint16_t>();
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t j = 0; j < in; ++j)
      packed[o * (in / per) + j / per] |= uint32_t(q[size_t(o * in + perm[size_t(j)])]) << (bits * (j % per));
    for (int64_t k = 0; k < mgroups; ++k) {
      const int64_t src_group = k * mg / g;
      const float s = scale_at(scales, src_group * out + o);
      ms[o * mgroups + k] = scales.data<uint16_t>()[src_group * out + o];
      mb[o * mgroups + k] = to_half(-s * float(z[size_t(src_group * out + o)]), si.dtype);
    }
  }
  if (!identity) {
    r.perm = Array::empty({in}, DType::i32);
    std::memcpy(r.perm.raw(), perm.data(), perm.size() * sizeof(int32_t));
  }
  r.source_bytes = qweight.nbytes() + qzeros.nbytes() + scales.nbytes() + (r.tensors.size() > 3 ? size_t(in) * 4 : 0);
  return r;
}

namespace {

// An FP8 layer's checkpoint tensors, checked: the codes, the scales as f32 and their layout.
struct Fp8Source {
  enum Kind { tensor, channel, block } kind = tensor;
  std::string wn, sn;
  Array w;  // u8 [out, in] (the codes' bytes)
  Array s;  // f32: [1], [out] or [ceil(out / block_rows), ceil(in / block_cols)]
  int64_t bcols = 0;
  size_t source_bytes = 0;

  float scale(const HubQuant& hq, int64_t o, int64_t i) const {
    const float* sp = s.data<float>();
    return kind == tensor ? sp[0] : kind == channel ? sp[o] : sp[(o / hq.block_rows) * bcols + i / hq.block_cols];
  }
};

Fp8Source read_fp8(const SafeTensors& st, const HubQuant& hq, const std::string& prefix, int64_t out, int64_t in) {
  Fp8Source r;
  r.wn = prefix + ".weight";
  r.sn = st.contains(prefix + ".weight_scale_inv") ? prefix + ".weight_scale_inv" : prefix + ".weight_scale";
  if (!st.contains(r.wn)) throw InvalidInput("missing tensor " + r.wn);
  const TensorInfo& wi = st.info(r.wn);
  if (!wi.float8_e4m3 || wi.shape.n != 2 || wi.shape[0] != out || wi.shape[1] != in)
    throw InvalidInput("tensor " + r.wn + " is " + (wi.float8_e4m3 ? "F8_E4M3" + wi.shape.str() : tensor_str(wi)) +
                       ", but the FP8 weight is F8_E4M3" + dims(out, in));
  r.w = st.get(r.wn);
  if (!st.contains(r.sn))
    throw InvalidInput("missing tensor " + prefix + ".weight_scale (or .weight_scale_inv): the FP8 weight " + r.wn +
                       " needs its scales");
  const TensorInfo& si = st.info(r.sn);
  if (!is_float(si.dtype))
    throw InvalidInput("tensor " + r.sn + " is " + tensor_str(si) + ", but FP8 scales are float");
  r.s = ops::cast(st.get(r.sn), DType::f32);
  // The scale of element (o, i): one for the tensor, one per row, or one per block.
  const int64_t n = r.s.numel();
  const int64_t brows = (out + hq.block_rows - 1) / hq.block_rows;
  r.bcols = (in + hq.block_cols - 1) / hq.block_cols;
  if (n == 1)
    r.kind = Fp8Source::tensor;
  else if (n == out && (si.shape.n == 1 || (si.shape.n == 2 && si.shape[1] == 1)))
    r.kind = Fp8Source::channel;
  else if (si.shape.n == 2 && si.shape[0] == brows && si.shape[1] == r.bcols)
    r.kind = Fp8Source::block;
  else
    throw InvalidInput("tensor " + r.sn + " is " + tensor_str(si) + ", but FP8 scales of a " + dims(out, in) +
                       " weight are one value, one per row [" + std::to_string(out) + ", 1], or one per " +
                       dims(hq.block_rows, hq.block_cols) + " block " + dims(brows, r.bcols));
  const auto* codes = static_cast<const uint8_t*>(r.w.raw());
  for (int64_t k = 0; k < out * in; ++k)
    if ((codes[k] & 0x7f) == 0x7f)
      throw InvalidInput("tensor " + r.wn + ": element [" + std::to_string(k / in) + ", " + std::to_string(k % in) +
                         "] is NaN");
  r.source_bytes = r.w.nbytes() + si.nbytes;
  return r;
}

}  // namespace

DequantizedFp8 dequantize_fp8(const SafeTensors& st, const HubQuant& hq, const std::string& prefix, int64_t out,
                              int64_t in, DType to) {
  const Fp8Source f = read_fp8(st, hq, prefix, out, in);
  DequantizedFp8 r;
  r.tensors = {f.wn, f.sn};
  r.w = Array::empty({out, in}, to);
  const auto* src = static_cast<const uint8_t*>(f.w.raw());
  float table[256];
  for (int v = 0; v < 256; ++v) table[v] = e4m3_to_float(uint8_t(v));
  cpu_pool().parallel_for(out, 16, [&](int64_t o0, int64_t o1, int) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t i = 0; i < in; ++i) {
        const float v = table[src[o * in + i]] * f.scale(hq, o, i);
        if (to == DType::f32)
          r.w.data<float>()[o * in + i] = v;
        else
          r.w.data<uint16_t>()[o * in + i] = to_half(v, to);
      }
  });
  r.source_bytes = f.source_bytes;
  return r;
}

LoadedFp8 load_fp8(const SafeTensors& st, const HubQuant& hq, const std::string& prefix, int64_t out, int64_t in) {
  const Fp8Source f = read_fp8(st, hq, prefix, out, in);
  // Block scales: groups of gcd(in, block_cols) inputs, each inside one block.
  const int64_t groups = f.kind == Fp8Source::block ? in / std::gcd(in, hq.block_cols) : 1;
  LoadedFp8 r;
  r.m.codes = Array::empty({out, in}, DType::u8);
  std::memcpy(r.m.codes.raw(), f.w.raw(), size_t(out * in));
  r.m.scales = Array::empty({out, groups}, DType::f32);
  float* sp = r.m.scales.data<float>();
  for (int64_t o = 0; o < out; ++o)
    for (int64_t g = 0; g < groups; ++g) sp[o * groups + g] = f.scale(hq, o, g * (in / groups));
  r.tensors = {f.wn, f.sn};
  r.source_bytes = f.source_bytes;
  return r;
}

}  // namespace osprey
