#pragma once
// Every OSPREY_ environment variable is read here, once, into EnvOptions; components take
// the values they need through their own parameter structs. docs/environment-variables.md
// lists them all, with the Hugging Face variables read for models named by Hub id.
#include <cstdint>
#include <optional>
#include <string>

namespace osprey {

// The largest OSPREY_KV_STEP: a step reserves that many rows per layer at once.
inline constexpr int kMaxKvStep = 1 << 16;

struct EnvOptions {
  bool kv_inplace_write = true;  // OSPREY_KV_INPLACE_WRITE: 0/false/off/no disable
  int kv_step = 256;             // OSPREY_KV_STEP: cache capacity grows in steps of this many rows
  int n_threads = 0;             // OSPREY_THREADS: CPU worker threads (0: one per physical core)
  std::string log_level = "info";  // OSPREY_LOG_LEVEL: error, warn, info, debug
  std::string device;              // OSPREY_DEVICE: cpu, cuda or cuda:N (empty: choose)
  bool force_sync = false;         // OSPREY_FORCE_SYNC: 1 turns pipelined decode off (CUDA)
  bool cuda_graphs = true;         // OSPREY_CUDA_GRAPHS: 0 turns decode-step graph replay off
  bool cuda_sample_rows = true;    // OSPREY_CUDA_SAMPLE_ROWS: 0 samples batched sequences on the host
  int paged_split_keys = 0;        // OSPREY_PAGED_SPLIT_KEYS: keys per split of paged attention (0: chosen)
  bool cuda_pdl = true;            // OSPREY_CUDA_PDL: 0 turns programmatic dependent launch off
  bool cuda_quant_mma = true;      // OSPREY_CUDA_QUANT_MMA: 4-bit layers of 4-16 rows on the tensor-core kernel
  // OSPREY_CUDA_FP8_WEIGHTS: on keeps FP8 checkpoints' weights FP8 on CUDA, off dequantizes
  // them at load; unset: kept where they run on the FP8 tensor cores (model/weight_loader.h).
  std::optional<bool> cuda_fp8_weights;
  bool cuda_fp8_mma = true;        // OSPREY_CUDA_FP8_MMA: FP8 layers of 2+ rows on the FP8 tensor cores (W8A8)
  bool cuda_fp8_activations = false;  // OSPREY_CUDA_FP8_ACTIVATIONS: W8A8 for weights-only FP8 too
  std::string cpu_level;           // OSPREY_CPU_LEVEL: scalar, v3, v4, v4-bf16 (empty: the CPU's best)
  // OSPREY_CPU_Q4_ACTIVATIONS: how the CPU's 4-bit integer kernels round x: "int16" (the
  // default: a high and a low int8 part per value) or "int8" (the high part alone, as
  // llama.cpp's Q8 activations: half the integer work; backend/cpu/quant_int8.h).
  bool cpu_q4_int8_activations = false;
  // OSPREY_CPU_AMX: 1/true/on/yes runs the CPU's 4- and 8-bit tile kernels' prompts on AMX-INT8
  // (an error where the CPU or OS does not offer it); unset or 0/false/off/no: never.
  std::optional<bool> cpu_amx;
  // OSPREY_CUDA_FAULT=trap_after_steps:N: the decode step after the Nth of a model on CUDA
  // traps on the device (a drill of a sticky device error); -1 when unset.
  int64_t cuda_fault_trap_after_steps = -1;
  // huggingface_hub's variables, raw (hub/hub_cache.h's resolve_options orders the cache's).
  std::string hf_hub_cache;    // HF_HUB_CACHE: the Hub cache folder
  std::string hf_home;         // HF_HOME: its parent (the cache is $HF_HOME/hub)
  std::string xdg_cache_home;  // XDG_CACHE_HOME: else $XDG_CACHE_HOME/huggingface/hub
  std::string home;            // HOME: else ~/.cache/huggingface/hub
  std::string hf_endpoint = "https://huggingface.co";  // HF_ENDPOINT
  std::string hf_token;        // HF_TOKEN: sent as "Authorization: Bearer"
  bool hf_hub_offline = false;  // HF_HUB_OFFLINE: 1/true/on/yes forbid downloads
  // The user's data folder (XDG Base Directory): XDG_DATA_HOME when it is an absolute path,
  // else $HOME/.local/share; empty when neither is set. osprey chat keeps its history there.
  std::string data_home;
};

// Read once, on first use; later changes to the environment are not seen.
const EnvOptions& env_options();

// Parses a boolean switch the way all OSPREY_ switches are parsed: 0/false/off/no (any case)
// are false, anything else is true; `fallback` when unset or empty.
bool parse_switch(const char* value, bool fallback);

}  // namespace osprey
