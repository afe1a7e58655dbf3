#include "vision/vision_tower.h"

#include <algorithm>
#include <cmath>

#include "backend/ops.h"
#include "core/error.h"
#include "formats/config_reader.h"
#include "formats/safetensors.h"
#include "model/weight_loader.h"

namespace osprey {

struct VisionTower::Layer {
  Array ln1_w, ln1_b, ln2_w, ln2_b;  // [hidden] f32
  Array wq, wk, wv, wo;              // [hidden, hidden]
  Array bq, bk, bv, bo;              // [hidden] f32
  Array fc1, fc2;                    // [intermediate, hidden], [hidden, intermediate]
  Array b1, b2;
};

namespace {

// The first of `candidates` + `suffix` that `st` holds, as its prefix; "" when none does.
std::string find_prefix(const SafeTensors& st, std::initializer_list<const char*> candidates, const std::string& suffix) {
  for (const char* c : candidates)
    if (st.contains(c + suffix)) return c;
  return "";
}

// A float tensor of `shape` as a contiguous f32 host array (any float dtype in the file).
Array host_f32(const SafeTensors& st, const std::string& name, const Shape& shape) {
  const TensorInfo& info = st.info(name);
  if (!is_float(info.dtype))
    throw InvalidInput("tensor " + name + " in " + st.source().string() + " is " + dtype_name(info.dtype) +
                       ", expected a float type");
  const Array a = st.get(name, info.dtype, shape);
  return ops::cast(a, DType::f32);  // a contiguous copy
}

// An [n, c] f32 array as [c, n] (contiguous).
Array transposed(const Array& x) {
  const int64_t n = x.dim(0), c = x.dim(1);
  Array out = Array::empty({c, n}, DType::f32, x.device());
  ops::copy_into(out, Array::strided(x.buffer(), x.byte_offset(), {c, n}, {1, c}, x.dtype()));
  return out;
}

// k or v rows [n, heads * hd] f32 (contiguous) as attention's [heads, n, hd] f16.
Array heads_f16(const Array& x, int64_t heads) {
  const int64_t n = x.dim(0), hd = x.dim(1) / heads;
  Array out = Array::empty({heads, n, hd}, DType::f16, x.device());
  ops::copy_into(out, Array::strided(x.buffer(), x.byte_offset(), {heads, n, hd}, {hd, heads * hd, 1}, x.dtype()));
  return out;
}

}  // namespace

int64_t VisionConfig::tokens_per_side() const {
  return int64_t(std::llround(std::sqrt(double(mm_tokens_per_image))));
}

std::optional<VisionConfig> parse_gemma3_vision_config(const ConfigReader& c) {
  const std::optional<ConfigReader> v = c.get_object("vision_config");
  if (!v) return std::nullopt;
  VisionConfig cfg;
  const std::string type = v->get_string("model_type", "siglip_vision_model");
  if (type != "siglip_vision_model")
    throw Unsupported(v->where() + ": field \"model_type\": " + type + " is not supported (siglip_vision_model is)");
  v->get_choice("hidden_act", "gelu_pytorch_tanh", {"gelu_pytorch_tanh"});
  cfg.hidden_size = v->get_int("hidden_size", cfg.hidden_size);
  cfg.intermediate_size = v->get_int("intermediate_size", cfg.intermediate_size);
  cfg.n_layers = v->get_int("num_hidden_layers", cfg.n_layers);
  cfg.n_heads = v->get_int("num_attention_heads", cfg.n_heads);
  cfg.image_size = v->get_int("image_size", cfg.image_size);
  cfg.patch_size = v->get_int("patch_size", cfg.patch_size);
  cfg.layer_norm_eps = v->get_float("layer_norm_eps", cfg.layer_norm_eps);
  if (v->get_int("num_channels", 3) != 3) v->fail("num_channels", "must be 3 (RGB)");
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
                          "patch_size"})
    if (v->has(key) && v->get_int(key) <= 0) v->fail(key, "must be positive");
  if (cfg.hidden_size % cfg.n_heads != 0)
    v->fail("num_attention_heads", "must divide hidden_size " + std::to_string(cfg.hidden_size));
  if (cfg.image_size % cfg.patch_size != 0)
    v->fail("image_size", std::to_string(cfg.image_size) + " is not a whole number of patches of " +
                              std::to_string(cfg.patch_size));
  if (!(cfg.layer_norm_eps > 0)) v->fail("layer_norm_eps", "must be positive");
  cfg.mm_tokens_per_image = c.get_int("mm_tokens_per_image", cfg.mm_tokens_per_image);
  const int64_t side = cfg.tokens_per_side();
  if (cfg.mm_tokens_per_image <= 0 || side * side != cfg.mm_tokens_per_image || cfg.patches_per_side() % side != 0)
    c.fail("mm_tokens_per_image", std::to_string(cfg.mm_tokens_per_image) + " must be a square whose side divides the " +
                                      std::to_string(cfg.patches_per_side()) + " patches per side");
  const std::optional<ConfigReader> text = c.get_object("text_config");
  if (!text) c.fail("text_config", "missing");
  cfg.text_hidden_size = text->get_int("hidden_size", 2304);  // Gemma3TextConfig's default
  if (c.has("image_token_index")) cfg.image_token_id = c.get_token_id("image_token_index");
  if (c.has("boi_token_index")) cfg.boi_token_id = c.get_token_id("boi_token_index");
  if (c.has("eoi_token_index")) cfg.eoi_token_id = c.get_token_id("eoi_token_index");
  return cfg;
}

VisionTower::VisionTower(const VisionConfig& config, const SafeTensors& st, const LoadOptions& options)
    : cfg_(config), device_(options.device) {
  const std::string T = find_prefix(st, {"vision_tower.vision_model.", "vision_tower.", "model.vision_tower.vision_model.",
                                         "model.vision_tower."},
                                    "embeddings.patch_embedding.weight");
  if (T.empty())
    throw InvalidInput("missing tensor: " + st.source().string() +
                       " has no vision_tower.vision_model.embeddings.patch_embedding.weight (nor the same under "
                       "vision_tower. or model.vision_tower.): the checkpoint's config has a vision_config but no "
                       "vision tower");
  const std::string P = find_prefix(st, {"multi_modal_projector.", "model.multi_modal_projector."},
                                    "mm_input_projection_weight");
  if (P.empty())
    throw InvalidInput("missing tensor: " + st.source().string() + " has no multi_modal_projector.mm_input_projection_weight");
  WeightLoader w(st, options);
  for (const std::string& name : st.names())  // the language model is the decoder's to read
    if (name.rfind(T, 0) != 0 && name.rfind(P, 0) != 0) w.ignore(name);

  const int64_t h = cfg_.hidden_size, f = cfg_.intermediate_size, p = cfg_.patch_size, n = cfg_.n_patches();
  patch_w_ = w.constant(host_f32(st, T + "embeddings.patch_embedding.weight", {h, 3, p, p}).reshape({h, 3 * p * p}));
  w.ignore(T + "embeddings.patch_embedding.weight");
  patch_b_ = w.vector_f32(T + "embeddings.patch_embedding.bias", h);
  pos_ = ops::cast(w.matrix(T + "embeddings.position_embedding.weight", n, h), DType::f32);
  for (int64_t i = 0; i < cfg_.n_layers; ++i) {
    const std::string l = T + "encoder.layers." + std::to_string(i) + ".";
    Layer L;
    L.ln1_w = w.vector_f32(l + "layer_norm1.weight", h);
    L.ln1_b = w.vector_f32(l + "layer_norm1.bias", h);
    L.ln2_w = w.vector_f32(l + "layer_norm2.weight", h);
    L.ln2_b = w.vector_f32(l + "layer_norm2.bias", h);
    L.wq = w.matrix(l + "self_attn.q_proj.weight", h, h);
    L.wk = w.matrix(l + "self_attn.k_proj.weight", h, h);
    L.wv = w.matrix(l + "self_attn.v_proj.weight", h, h);
    L.wo = w.matrix(l + "self_attn.out_proj.weight", h, h);
    L.bq = w.vector_f32(l + "self_attn.q_proj.bias", h);
    L.bk = w.vector_f32(l + "self_attn.k_proj.bias", h);
    L.bv = w.vector_f32(l + "self_attn.v_proj.bias", h);
    L.bo = w.vector_f32(l + "self_attn.out_proj.bias", h);
    L.fc1 = w.matrix(l + "mlp.fc1.weight", f, h);
    L.b1 = w.vector_f32(l + "mlp.fc1.bias", f);
    L.fc2 = w.matrix(l + "mlp.fc2.weight", h, f);
    L.b2 = w.vector_f32(l + "mlp.fc2.bias", h);
    layers_.push_back(std::move(L));
  }
  post_w_ = w.vector_f32(T + "post_layernorm.weight", h);
  post_b_ = w.vector_f32(T + "post_layernorm.bias", h);
  // SigLIP's attention-pooling head (vision_use_head) is not on Gemma 3's path.
  for (const std::string& name : st.names())
    if (name.rfind(T + "head.", 0) == 0) w.ignore(name);

  const int64_t side = cfg_.tokens_per_side(), k = cfg_.pool_kernel(), pps = cfg_.patches_per_side();
  Array pool = Array::zeros({cfg_.mm_tokens_per_image, n}, DType::f32);
  for (int64_t ty = 0; ty < side; ++ty)
    for (int64_t tx = 0; tx < side; ++tx)
      for (int64_t dy = 0; dy < k; ++dy)
        for (int64_t dx = 0; dx < k; ++dx)
          pool.data<float>()[(ty * side + tx) * n + (ty * k + dy) * pps + tx * k + dx] = 1.0f / float(k * k);
  pool_ = w.constant(pool);
  soft_norm_w_ = w.vector_f32(P + "mm_soft_emb_norm.weight", h);
  const Array proj = host_f32(st, P + "mm_input_projection_weight", {h, cfg_.text_hidden_size});
  w.ignore(P + "mm_input_projection_weight");
  proj_ = w.constant(transposed(proj));
  w.finish();
}

VisionTower::~VisionTower() = default;

Array VisionTower::encode_patches(const Array& pixel_values) const {
  const int64_t S = cfg_.image_size, p = cfg_.patch_size, pps = cfg_.patches_per_side(), n = cfg_.n_patches();
  const int64_t h = cfg_.hidden_size, heads = cfg_.n_heads, hd = h / heads;
  if (pixel_values.dtype() != DType::f32 || pixel_values.ndim() != 3 || pixel_values.dim(0) != 3 ||
      pixel_values.dim(1) != S || pixel_values.dim(2) != S || !pixel_values.device().is_cpu() ||
      !pixel_values.is_contiguous())
    throw InvalidInput("vision tower: pixel values must be a contiguous float32 [3, " + std::to_string(S) + ", " +
                       std::to_string(S) + "] host array, got " + describe(pixel_values));
  // [n_patches, 3 p p]: patch (py, px) holds pixel_values[c, py p + dy, px p + dx] at c p p + dy p + dx.
  Array patches = Array::empty({n, 3 * p * p}, DType::f32);
  const float* px_in = pixel_values.data<float>();
  float* out = patches.data<float>();
  for (int64_t py = 0; py < pps; ++py)
    for (int64_t px = 0; px < pps; ++px)
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t dy = 0; dy < p; ++dy)
          for (int64_t dx = 0; dx < p; ++dx)
            *out++ = px_in[(c * S + py * p + dy) * S + px * p + dx];
  Array x = ops::linear(ops::to_device(patches, device_), patch_w_, patch_b_);  // [n, h]: the residual stream
  ops::add_(x, pos_);
  const float eps = float(cfg_.layer_norm_eps), scale = float(1.0 / std::sqrt(double(hd)));
  Array ones;  // gelu_tanh(a) as gelu_tanh_mul(a, 1)
  for (const Layer& L : layers_) {
    Array a = ops::layer_norm(x, L.ln1_w, L.ln1_b, eps);
    const Array q = ops::linear(a, L.wq, L.bq).reshape({n, heads, hd});
    const Array k = heads_f16(ops::linear(a, L.wk, L.bk), heads);  // [heads, n, hd]
    const Array v = heads_f16(ops::linear(a, L.wv, L.bv), heads);
    ops::add_(x, ops::linear(ops::attention_unmasked(q, k, v, scale), L.wo, L.bo));
    a = ops::layer_norm(x, L.ln2_w, L.ln2_b, eps);
    const Array up = ops::linear(a, L.fc1, L.b1);  // [n, f]
    if (!ones.defined()) {
      Array host = Array::empty(up.shape(), DType::f32);
      std::fill(host.data<float>(), host.data<float>() + host.numel(), 1.0f);
      ones = ops::to_device(host, device_);
    }
    ops::add_(x, ops::linear(ops::gelu_tanh_mul(up, ones), L.fc2, L.b2));
  }
  return ops::layer_norm(x, post_w_, post_b_, eps);
}

Array VisionTower::project(const Array& patches) const {
  if (patches.ndim() != 2 || patches.dim(0) != cfg_.n_patches() || patches.dim(1) != cfg_.hidden_size)
    throw InvalidInput("vision projector: expected [" + std::to_string(cfg_.n_patches()) + ", " +
                       std::to_string(cfg_.hidden_size) + "] patches, got " + describe(patches));
  // pool [T, n] @ patches [n, h] as linear(pool, patches^T).
  const Array pooled = ops::linear(pool_, transposed(patches));  // [T, h]
  return ops::linear(ops::rms_norm(pooled, soft_norm_w_, float(cfg_.layer_norm_eps), /*unit_offset=*/true), proj_);
}

std::optional<ImageEncoder> load_image_encoder(const std::filesystem::path& dir, const LoadOptions& options) {
  const ConfigReader c = ConfigReader::load(dir / "config.json");
  if (c.get_string("model_type", "") != "gemma3") return std::nullopt;
  const std::optional<VisionConfig> cfg = parse_gemma3_vision_config(c);
  if (!cfg) return std::nullopt;
  const SafeTensors st = SafeTensors::open(dir);
  ImageEncoder enc;
  enc.tower = std::make_unique<VisionTower>(*cfg, st, options);
  enc.processor = load_image_processor_config(dir, cfg->image_size);
  if (enc.processor.height != cfg->image_size || enc.processor.width != cfg->image_size)
    throw InvalidInput((dir / "preprocessor_config.json").string() + ": field \"size\": " +
                       std::to_string(enc.processor.height) + "x" + std::to_string(enc.processor.width) +
                       " differs from the vision tower's image_size " + std::to_string(cfg->image_size));
  return enc;
}

}  // namespace osprey
