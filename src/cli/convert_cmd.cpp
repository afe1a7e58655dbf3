// osprey convert: parses the flags, checks the folders and prints; formats/convert.h converts.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "backend/quant.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/progress.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/convert.h"
#include "formats/gguf_writer.h"

namespace osprey::cli {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kMaxShardMib = int64_t(1) << 30;  // 1 PiB

struct ConvertOptions {
  std::string model;
  std::string output;
  std::string to = "mlx";
  int bits = 0;        // 0: the default, 4 (mlx only)
  int group_size = 0;  // 0: the default, 64 (mlx only)
  std::string dtype;
  std::string outtype;  // gguf only: f16 (default), q8_0, q4_0 or q4_k
  int64_t shard_mib = 5120;  // at most kMaxShardMib, so that the bytes fit in 64 bits
  int threads = -1;
  std::string fp8_activations;  // fp8 only: "token" (the default) or "none"
};

DType parse_dtype(const std::string& name) {
  if (name == "float16" || name == "f16" || name == "fp16") return DType::f16;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  throw UsageError("--dtype: \"" + name + "\" is not supported (float16 or bfloat16)");
}

// --to gguf: one file, not a folder.
int run_convert_gguf(const ConvertOptions& o) {
  if (o.bits != 0 || o.group_size != 0 || !o.dtype.empty())
    throw UsageError("--q-bits, --q-group-size and --dtype do not apply to --to gguf (use --outtype)");
  const std::string name = o.outtype.empty() ? "f16" : o.outtype;
  const auto type = parse_gguf_outtype(name);
  if (!type) throw UsageError("--outtype: \"" + name + "\" is not supported (f16, bf16, q8_0, q4_0 or q4_k)");
  const fs::path src = o.model, dst = o.output;
  std::error_code ec;
  if (!fs::is_directory(src, ec)) throw IoError("-m " + src.string() + ": model folder does not exist");
  if (dst.extension() != ".gguf") throw UsageError("-o " + dst.string() + ": a GGUF output file name ends in .gguf");
  if (fs::exists(dst, ec)) throw InvalidInput("-o " + dst.string() + ": exists; refusing to overwrite it");
  ProgressBar bar("converting " + src.filename().string());
  GgufConvertSummary s;
  try {
    s = convert_to_gguf(src, dst, *type, [&](size_t done, size_t total) { bar.update(done, total); });
    bar.finish();
  } catch (...) {
    fs::remove(dst, ec);
    throw;
  }
  std::fprintf(stderr, "converted %s: %zu tensors (%zu quantized, %s), %.1f MiB -> %s\n", src.string().c_str(),
               s.n_tensors, s.n_quantized, name.c_str(), double(s.bytes) / (1024.0 * 1024.0), dst.string().c_str());
  if (s.tokenizer_left_out)
    std::fprintf(stderr, "warning: %s/tokenizer.json is not written to the GGUF file (its family has no llama.cpp "
                         "pre-tokenizer name); the file runs on token ids only, and llama.cpp needs a tokenizer to "
                         "load it\n", src.string().c_str());
  return 0;
}

int run_convert(ConvertOptions o) {
  if (o.threads >= 0) set_cpu_threads(o.threads);
  if (o.to != "fp8" && !o.fp8_activations.empty()) throw UsageError("--fp8-activations applies to --to fp8 only");
  if (o.to == "gguf") return run_convert_gguf(o);
  if (!o.outtype.empty()) throw UsageError("--outtype applies to --to gguf only");
  if (o.to != "mlx" && o.to != "fp8") throw UsageError("--to: \"" + o.to + "\" is not supported (mlx, fp8 or gguf)");
  const bool fp8 = o.to == "fp8";
  if (fp8 && (o.bits != 0 || o.group_size != 0))
    throw UsageError("--q-bits and --q-group-size do not apply to --to fp8 (one scale per output row)");
  if (o.bits == 0) o.bits = 4;
  if (o.group_size == 0) o.group_size = 64;
  if (!supported_quant_bits(o.bits))
    throw UsageError("--q-bits: " + std::to_string(o.bits) + " is not supported (2, 3, 4, 6 or 8)");
  if (!supported_group_size(o.group_size))
    throw UsageError("--q-group-size: " + std::to_string(o.group_size) + " is not supported (32, 64 or 128)");
  if (o.shard_mib < 1 || o.shard_mib > kMaxShardMib)
    throw UsageError("--max-shard-mib: " + std::to_string(o.shard_mib) + " is out of range [1, " +
                     std::to_string(kMaxShardMib) + "]");
  std::optional<DType> dtype;
  if (!o.dtype.empty()) dtype = parse_dtype(o.dtype);

  const fs::path src = o.model, dst = o.output;
  std::error_code ec;
  if (!fs::is_directory(src, ec)) throw IoError("-m " + src.string() + ": model folder does not exist");
  if (fs::exists(dst, ec) && (!fs::is_directory(dst, ec) || !fs::is_empty(dst, ec)))
    throw InvalidInput("-o " + dst.string() + ": exists and is not an empty folder; refusing to overwrite it");

  const bool created = !fs::exists(dst, ec);
  fs::create_directories(dst, ec);
  if (ec) throw IoError("-o " + dst.string() + ": cannot create the folder: " + ec.message());
  ConvertParams p;
  p.target = fp8 ? ConvertTarget::fp8 : ConvertTarget::mlx;
  p.fp8_activations = o.fp8_activations != "none";
  p.bits = o.bits;
  p.group_size = o.group_size;
  p.dtype = dtype;
  p.shard_bytes = size_t(o.shard_mib) << 20;
  ProgressBar bar("converting " + src.filename().string());
  p.progress = [&](size_t done, size_t total) { bar.update(done, total); };
  ConvertSummary s;
  try {
    s = convert_checkpoint(src, dst, p);
    bar.finish();
  } catch (...) {
    if (created) fs::remove_all(dst, ec);
    else
      for (const auto& e : fs::directory_iterator(dst, ec)) fs::remove_all(e.path(), ec);
    throw;
  }
  const std::string how = fp8 ? "FP8 e4m3, one scale per row" : "Q" + std::to_string(o.bits) + " g" + std::to_string(o.group_size);
  std::fprintf(stderr, "converted %s: %zu tensors quantized (%s, %s scales), %zu kept dense; %.1f MiB in %zu file%s -> %s\n",
               src.string().c_str(), s.n_quantized, how.c_str(), dtype_name(s.dtype), s.n_dense,
               double(s.bytes) / (1024.0 * 1024.0), s.n_files, s.n_files == 1 ? "" : "s", dst.string().c_str());
  return 0;
}

}  // namespace

Command add_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  app.add_option("-m,--model", o->model, "Source model folder (Hugging Face safetensors, f16/bf16/f32)")->required();
  app.add_option("-o,--output", o->output,
                 "Output folder (must not exist or be empty); with --to gguf, a new .gguf file")->required();
  app.add_option("--to", o->to,
                 "mlx (default): MLX affine quantization; fp8: FP8 e4m3 weights with one scale per output row, in "
                 "the compressed-tensors layout; gguf: one GGUF file as llama.cpp's converter writes it");
  app.add_option("--q-bits", o->bits, "Bits per weight: 2, 3, 4 (default), 6 or 8 (mlx only)");
  app.add_option("--q-group-size", o->group_size, "Weights per scale and bias: 32, 64 (default) or 128 (mlx only)");
  app.add_option("--dtype", o->dtype,
                 "float16 or bfloat16: scales, biases and unquantized tensors (default: the source's 16-bit "
                 "type; bfloat16 for a float32 source)");
  app.add_option("--outtype", o->outtype,
                 "gguf only: f16 (default), bf16, q8_0, q4_0 or q4_k (ggml's reference quantizers; norms stay F32)");
  app.add_option("--max-shard-mib", o->shard_mib, "Largest output file in MiB (default 5120)");
  app.add_option("--fp8-activations", o->fp8_activations,
                 "fp8 only: token (default): the checkpoint declares FP8 activations quantized per token at run "
                 "time (prompts and batches on the FP8 tensor cores, less accurate); none: weights-only FP8, "
                 "activations stay 16-bit")
      ->check(CLI::IsMember({"token", "none"}));
  add_threads_option(app, o->threads);
  return [o] { return run_convert(*o); };
}

}  // namespace osprey::cli
