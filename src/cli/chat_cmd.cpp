// osprey chat: an interactive conversation with the checkpoint's chat template. Each turn
// renders the whole conversation, keeps the longest prefix its tokens share with what the
// KV cache holds, and prefills only the rest.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include <editline/readline.h>

#include "backend/device_select.h"
#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/progress.h"
#include "core/env.h"
#include "core/error.h"
#include "core/file_read.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace osprey::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

struct ChatOptions {
  std::string model;
  bool download = false;
  std::string system;
  std::string template_name;
  int n_predict = 512;
  SamplerParams sampler;
  int threads = -1;
  std::string device;
  bool json = false;
};

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

// Installs the reply's Ctrl-C handler for its lifetime; outside a reply Ctrl-C quits.
class SigintScope {
 public:
  SigintScope() {
    g_interrupted = false;
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_);
  }
  ~SigintScope() { sigaction(SIGINT, &old_, nullptr); }

 private:
  struct sigaction old_ {};
};

class Chat {
 public:
  Chat(const ChatOptions& o, const std::string& dir)
      : o_(o), tok_(Tokenizer::load(dir)), tpl_(ChatTemplate::load(dir, o.template_name)) {
    ProgressBar bar("loading " + fs::path(dir).filename().string());
    LoadOptions lo;
    lo.device = select_device(o.device.empty() ? env_options().device : o.device);
    lo.progress = [&](size_t done, size_t total) { bar.update(done, total); };
    model_ = load_model(dir, lo);
    gp_ = generate_params(env_options());
    gp_.max_tokens = o.n_predict;
    gp_.sampler = o.sampler;
    validate(gp_.sampler);
    gp_.stop_ids = model_->info().eos_ids;
    for (int32_t id : tok_.eos_ids())
      if (std::find(gp_.stop_ids.begin(), gp_.stop_ids.end(), id) == gp_.stop_ids.end()) gp_.stop_ids.push_back(id);
    const EnvOptions& env = env_options();
    KVCacheParams co;
    co.step = env.kv_step;
    co.inplace = env.kv_inplace_write;
    cache_ = model_->make_cache(co);
    reset();
  }

  void reset() {
    messages_ = ordered_json::array();
    if (!o_.system.empty()) messages_.push_back({{"role", "system"}, {"content", o_.system}});
    if (cache_.offset() > 0) cache_.trim(cache_.offset());
    cached_.clear();
  }

  void save(const std::string& path) const {
    std::ofstream out(path, std::ios::binary);
    if (!out) throw IoError(path + ": cannot write file");
    out << ordered_json{{"messages", messages_}}.dump(2) << "\n";
    if (!out) throw IoError(path + ": write failed");
  }

  void load(const std::string& path) {
    const std::string text = read_regular_file(path);
    ordered_json j;
    try {
      j = ordered_json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw InvalidInput(path + ": malformed JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("messages") || !j["messages"].is_array())
      throw InvalidInput(path + ": expected {\"messages\": [...]}");
    tpl_.render(ordered_json{{"messages", j["messages"]}, {"add_generation_prompt", false}});  // validates
    messages_ = j["messages"];
  }

  // One user message in, one reply out (streamed unless --json).
  void turn(const std::string& user) {
    ordered_json messages = messages_;
    messages.push_back({{"role", "user"}, {"content", user}});
    std::string text = tpl_.render(ordered_json{{"messages", messages}, {"add_generation_prompt", true}});
    // The template writes BOS itself: no second one from the post-processor.
    std::vector<int32_t> ids = tok_.encode(text, false);
    if (ids.empty()) throw InvalidInput("chat: the rendered conversation has no tokens");
    size_t keep = 0;
    while (keep < ids.size() && keep < cached_.size() && ids[keep] == cached_[keep]) ++keep;
    if (keep == ids.size()) --keep;  // at least one token to prefill, for the next logits
    // A sliding-window layer that no longer holds the rows before `keep` cannot rewind to it:
    // the conversation is then computed from the start.
    if (cache_.offset() > int64_t(keep) && !cache_.can_trim(cache_.offset() - int64_t(keep))) keep = 0;
    if (cache_.offset() > int64_t(keep)) cache_.trim(cache_.offset() - int64_t(keep));
    cached_.resize(keep);

    Tokenizer::StreamDecoder stream(tok_);
    GenerateResult r;
    {
      SigintScope sigint;
      r = generate(*model_, cache_, std::span<const int32_t>(ids).subspan(keep), gp_, [&](int32_t token) {
        if (!o_.json) {
          std::string piece = stream.push(token);
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        }
        return !g_interrupted.load();
      });
    }
    cached_ = ids;
    cached_.insert(cached_.end(), r.tokens.begin(), r.tokens.end());
    if (cache_.offset() > int64_t(cached_.size())) {
      const int64_t extra = cache_.offset() - int64_t(cached_.size());
      cache_.trim(cache_.can_trim(extra) ? extra : cache_.offset());  // else the next turn starts over
    }
    cached_.resize(size_t(cache_.offset()));

    std::string reply = tok_.decode(r.tokens, true);
    messages_ = std::move(messages);
    messages_.push_back({{"role", "assistant"}, {"content", reply}});
    const GenerateStats& s = r.stats;
    if (o_.json) {
      ordered_json j = {{"text", reply},
                        {"tokens", r.tokens},
                        {"stop_reason", g_interrupted ? std::string("interrupted") : s.stop_reason},
                        {"conversation_tokens", ids.size()},
                        {"cached_tokens", keep},
                        {"prompt_n", s.n_prompt},
                        {"predicted_n", s.n_generated},
                        {"kv_inplace_writes", s.kv.n_inplace_writes},
                        {"kv_copying_writes", s.kv.n_copying_writes}};
      std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      std::printf("%s\n", line.c_str());
    } else {
      std::string rest = stream.flush();
      std::fwrite(rest.data(), 1, rest.size(), stdout);
      std::fputc('\n', stdout);
    }
    std::fflush(stdout);
    std::fprintf(stderr, "prompt: %lld new tokens (%zu from the cache), %.1f t/s | decode: %lld tokens, %.1f t/s | kv writes: %llu in place, %llu copying%s\n",
                 (long long)s.n_prompt, keep, s.prompt_tps(), (long long)s.n_generated, s.decode_tps(),
                 (unsigned long long)s.kv.n_inplace_writes, (unsigned long long)s.kv.n_copying_writes,
                 g_interrupted ? " | interrupted" : "");
  }

 private:
  ChatOptions o_;
  Tokenizer tok_;
  ChatTemplate tpl_;
  std::unique_ptr<Model> model_;
  GenerateParams gp_;
  SequenceCache cache_;
  ordered_json messages_;
  std::vector<int32_t> cached_;  // the tokens whose K/V rows cache_ holds
};

// Runs a /command; returns false for /quit.
bool command(Chat& chat, const std::string& line) {
  std::string cmd = line.substr(0, line.find(' '));
  std::string arg = line.size() > cmd.size() ? line.substr(cmd.size() + 1) : "";
  if (cmd == "/quit" || cmd == "/exit") return false;
  if (cmd == "/reset") {
    chat.reset();
  } else if (cmd == "/save" || cmd == "/load") {
    if (arg.empty()) throw InvalidInput(cmd + ": give a file name");
    if (cmd == "/save") chat.save(arg);
    else chat.load(arg);
  } else {
    throw InvalidInput("unknown command " + cmd + " (/reset, /save FILE, /load FILE, /quit)");
  }
  return true;
}

int run_chat(const ChatOptions& o) {
  if (o.threads >= 0) set_cpu_threads(o.threads);
  const std::string dir = model_folder(o.model, o.download);
  if (!fs::exists(dir)) throw IoError("model folder " + dir + " does not exist");
  Chat chat(o, dir);
  const bool tty = isatty(STDIN_FILENO);
  if (!tty) {
    // Scripts: one user message per line, one reply per message; errors end the run.
    std::string line;
    while (std::getline(std::cin, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("/", 0) == 0) {
        if (!command(chat, line)) break;
        continue;
      }
      chat.turn(line);
    }
    return 0;
  }
  std::fprintf(stderr, "/reset, /save FILE, /load FILE, /quit; Ctrl-C stops a reply, Ctrl-D leaves\n");
  using_history();
  while (char* raw = readline("> ")) {
    std::string line(raw);
    std::free(raw);
    if (line.empty()) continue;
    add_history(line.c_str());
    try {
      if (line[0] == '/') {
        if (!command(chat, line)) break;
        continue;
      }
      chat.turn(line);
    } catch (const InvalidInput& e) {
      std::fprintf(stderr, "osprey: error: %s\n", e.what());
    } catch (const IoError& e) {
      std::fprintf(stderr, "osprey: error: %s\n", e.what());
    }
  }
  return 0;
}

}  // namespace

Command add_chat(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  app.add_option("-m,--model", o->model, "Model folder with a chat template, or a Hub id org/name[:revision] (default: the embedded default model)");
  app.add_flag("--download", o->download, "Fetch a Hub model missing from the Hugging Face cache (as osprey pull does)");
  app.add_option("--system", o->system, "System message opening the conversation");
  app.add_option("--template-name", o->template_name, "Which of the folder's named templates (default: \"default\")");
  app.add_option("-n,--n-predict", o->n_predict, "Most tokens per reply")->check(int_range(0, INT32_MAX));
  add_sampler_options(app, o->sampler);
  app.add_option("--device", o->device, "cpu, cuda or cuda:N (default: OSPREY_DEVICE, else cuda when present)");
  add_threads_option(app, o->threads);
  app.add_flag("--json", o->json, "Print one JSON object per reply (text, tokens, cache counters) instead of streaming");
  return [o] { return run_chat(*o); };
}

}  // namespace osprey::cli
