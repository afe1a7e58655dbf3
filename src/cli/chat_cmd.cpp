// osprey chat: an interactive conversation with the checkpoint's chat template. Each turn
// renders the whole conversation, keeps the longest prefix its tokens share with what the
// KV cache holds, and prefills only the rest. When the conversation outgrows the context, the
// oldest turns leave it (the system prompt stays). /image FILE attaches an image to the next
// message (a model with a vision tower): the template gets an image part before its text, and
// a cached prefix is kept only up to the first image that is not the one its rows were computed
// with.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

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
#include "engine/generation_config.h"
#include "serve/generate.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "bundle/model_bundle.h"
#include "bundle/model_files.h"
#include "formats/gguf_model.h"
#include "vision/image_decode.h"
#include "vision/image_prompt.h"

namespace osprey::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

struct ChatOptions {
  std::string model;
  bool download = false;
  std::string system;
  std::string template_name;
  int n_predict = 512;  // -1: until the context is full
  int ctx_size = 0;     // 0: the model's
  SamplerParams sampler;
  SpeculativeParams spec;
  int threads = -1;
  std::string device;
  std::string cache_type_k, cache_type_v;  // --cache-type-k, --cache-type-v
  std::optional<bool> pan_and_scan;        // --pan-and-scan / --no-pan-and-scan
  bool json = false;
  bool verbose = false;
};

struct ChatSampling {
  SamplerParams params;
  std::string defaults;  // where the values no flag set come from
};

// The model's sampling defaults (its generation_config.json's values over llama.cpp's, the
// bundle's rule), each sampler flag given on the command line over them; the seed is the flags'.
ChatSampling chat_sampling(const ChatOptions& o, const ModelBundle& bundle, const CLI::App& app) {
  ChatSampling s{o.sampler, bundle.sampling.source};
  fill_unset_sampler_fields(s.params, bundle.sampling.params, given_sampler_flags(app));
  return s;
}

// Rounded to 6 digits, so that a float setting prints as it was written (0.8, not 0.800000011).
double printable(float v) { return std::round(double(v) * 1e6) / 1e6; }

ordered_json sampler_json(const ChatSampling& s) {
  const SamplerParams& p = s.params;
  ordered_json j = {{"temperature", printable(p.temperature)}, {"top_k", p.top_k},
                    {"top_p", printable(p.top_p)}, {"min_p", printable(p.min_p)}};
  if (p.typical_p < 1.0f) j["typical_p"] = printable(p.typical_p);  // named only when on
  j["repeat_penalty"] = printable(p.repetition_penalty);
  j["repeat_last_n"] = p.repeat_last_n;
  j["defaults"] = s.defaults;
  return j;
}

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

// Installs the Ctrl-C handler that sets g_interrupted (without SA_RESTART, so that a blocked
// read returns) for its lifetime.
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

const char* const kHelp =
    "/help          this list\n"
    "/reset         start the conversation over (the system prompt stays)\n"
    "/system TEXT   set the system prompt (/system alone shows it)\n"
    "/save FILE     write the conversation to FILE as JSON {\"messages\": [...]}\n"
    "/load FILE     continue a conversation that /save wrote\n"
    "/image FILE    attach an image (PNG, JPEG, WebP, GIF) to your next message (models with a vision tower)\n"
    "/exit, /quit   leave (also Ctrl-D, or Ctrl-C twice at the prompt)\n"
    "A line ending in \\ continues on the next line; \"\"\" opens and closes a block of lines.\n"
    "Ctrl-C stops a reply.\n";

// Joins input lines into messages: a line ending in '\' continues on the next one (the '\'
// becomes a line break); a line starting with """ opens a block that a line ending in """
// closes (the quotes are dropped, the lines joined with '\n').
class MessageReader {
 public:
  // Takes one line; returns the message when the line completes one.
  std::optional<std::string> push(const std::string& line) {
    if (mode_ == Mode::block) {
      if (ends_with_quotes(line)) {
        add(line.substr(0, line.size() - 3), false);
        return finish();
      }
      add(line, true);
      return std::nullopt;
    }
    if (mode_ == Mode::none && line.rfind("\"\"\"", 0) == 0) {
      const std::string rest = line.substr(3);
      if (ends_with_quotes(rest)) return rest.substr(0, rest.size() - 3);
      mode_ = Mode::block;
      if (!rest.empty()) add(rest, true);
      return std::nullopt;
    }
    if (!line.empty() && line.back() == '\\') {
      mode_ = Mode::continued;
      add(line.substr(0, line.size() - 1), true);
      return std::nullopt;
    }
    add(line, true);
    return finish();
  }
  // Whether a message is open (a block, or a line that ended in '\').
  bool pending() const { return mode_ != Mode::none; }
  void clear() {
    mode_ = Mode::none;
    text_.clear();
    n_lines_ = 0;
  }

 private:
  enum class Mode { none, continued, block };
  static bool ends_with_quotes(const std::string& s) { return s.size() >= 3 && s.compare(s.size() - 3, 3, "\"\"\"") == 0; }
  // `always`: add an empty line too (a closing """ alone on its line adds nothing).
  void add(const std::string& line, bool always) {
    if (line.empty() && !always) return;
    if (n_lines_++ > 0) text_ += '\n';
    text_ += line;
  }
  std::string finish() {
    std::string out = std::move(text_);
    clear();
    return out;
  }
  Mode mode_ = Mode::none;
  std::string text_;
  int n_lines_ = 0;
};

class Chat {
 public:
  // `bundle` holds a tokenizer and a chat template.
  Chat(const ChatOptions& o, const std::string& dir, ModelBundle bundle, const ChatSampling& sampling)
      : o_(o),
        sampling_(sampling),
        system_(o.system),
        bundle_(std::move(bundle)),
        tok_(*bundle_.tokenizer),
        tpl_(*bundle_.chat_template) {
    ProgressBar bar("loading " + fs::path(dir).filename().string());
    LoadOptions lo;
    lo.device = select_device(o.device.empty() ? env_options().device : o.device);
    lo.progress = [&](size_t done, size_t total) { bar.update(done, total); };
    model_ = load_model(dir, lo);
    if (!is_gguf_path(dir)) {
      lo.progress = nullptr;
      encoder_ = load_image_encoder(dir, lo);
      if (encoder_ && o.pan_and_scan) encoder_->processor.do_pan_and_scan = *o.pan_and_scan;
    }
    if (o.pan_and_scan && !encoder_)
      throw UsageError("--pan-and-scan: " + model_name(dir) + " takes no images (a text-only model: it has no vision tower)");
    const int64_t model_ctx = model_->info().max_position_embeddings;
    if (o.ctx_size > 0 && model_ctx > 0 && o.ctx_size > model_ctx)
      throw UsageError("-c/--ctx-size " + std::to_string(o.ctx_size) + " exceeds the model's context of " +
                       std::to_string(model_ctx) + " tokens");
    ctx_ = o.ctx_size > 0 ? o.ctx_size : model_ctx;
    gp_ = generate_params(env_options());
    gp_.sampler = sampling.params;
    validate(gp_.sampler);
    gp_.spec = o.spec;
    // The draft's cache lives for one turn: each turn's first draft feeds it the conversation.
    draft_ = load_draft_model(o.spec, *model_, &tok_, model_->info().device, false);
    gp_.draft_model = draft_.get();
    gp_.stop_ids = bundle_.stop_ids(model_->info().eos_ids);
    const EnvOptions& env = env_options();
    KVCacheParams co;
    co.step = env.kv_step;
    co.inplace = env.kv_inplace_write;
    co.k_type = cache_type(o.cache_type_k, "--cache-type-k");
    co.v_type = cache_type(o.cache_type_v, "--cache-type-v");
    cache_ = model_->make_cache(co);
    reset();
  }

  // The context in tokens (0: the model names none).
  int64_t context() const { return ctx_; }
  Device device() const { return model_->info().device; }

  void reset() {
    messages_ = ordered_json::array();
    if (!system_.empty()) messages_.push_back({{"role", "system"}, {"content", system_}});
    if (cache_.offset() > 0) cache_.trim(cache_.offset());
    cached_.clear();
    images_.clear();
    pending_.clear();
    cached_images_.clear();
  }

  // /image FILE: decoded and encoded now (errors name the file), sent with the next message.
  void attach_image(const std::string& file) {
    if (!encoder_) throw InvalidInput("/image: this model takes no image input (a text-only model: it has no vision tower)");
    const std::string bytes = read_regular_file(file);
    RgbImage img;
    try {
      img = decode_image(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    } catch (const Error& e) {
      throw InvalidInput("/image " + file + ": " + e.what());
    }
    const int64_t width = img.width, height = img.height;
    std::vector<RgbImage> one;
    one.push_back(std::move(img));
    const ImageViews v = image_views(std::move(one), encoder_->processor);
    const std::vector<int64_t> starts(v.views.size(), 0);
    std::vector<ImageSpan> spans = encode_prompt_images(*encoder_, starts, v.views);
    for (size_t i = 0; i < spans.size(); ++i)
      pending_.push_back({next_image_++, std::move(spans[i].embeds), i == 0 ? v.n_crops[0] : 0, i > 0});
    std::fprintf(stderr, "image %s (%lldx%lld%s) attached to your next message\n", file.c_str(), (long long)width,
                 (long long)height, v.n_crops[0] > 0 ? (", " + std::to_string(v.n_crops[0]) + " pan-and-scan crops").c_str() : "");
  }

  // Replaces the system prompt of the conversation (the turns stay); empty removes it.
  void set_system(const std::string& text) {
    system_ = text;
    const bool has = !messages_.empty() && messages_[0].value("role", "") == "system";
    if (text.empty()) {
      if (has) messages_.erase(messages_.begin());
    } else if (has) {
      messages_[0]["content"] = text;
    } else {
      messages_.insert(messages_.begin(), ordered_json{{"role", "system"}, {"content", text}});
    }
  }
  const std::string& system() const { return system_; }

  void save(const std::string& path) const {
    if (!images_.empty() || !pending_.empty())
      throw InvalidInput("/save: the conversation holds images, which a saved conversation does not keep (/reset starts "
                         "one without them)");
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
    for (size_t i = 0; i < j["messages"].size(); ++i)
      if (image_parts(j["messages"][i]) > 0)
        throw InvalidInput(path + ": messages[" + std::to_string(i) + "] holds an image part: /load reads conversations of text");
    tpl_.render(ordered_json{{"messages", j["messages"]}, {"add_generation_prompt", false}});  // validates
    messages_ = j["messages"];
    images_.clear();
    pending_.clear();
    const ordered_json& first = messages_.empty() ? ordered_json() : messages_[0];
    system_ = first.is_object() && first.value("role", "") == "system" && first["content"].is_string()
                  ? first["content"].get<std::string>()
                  : "";
  }

  // One user message in, one reply out (streamed unless --json).
  void turn(const std::string& user) {
    ordered_json messages = messages_;
    std::vector<ChatImage> images = images_;  // the conversation's images, in order
    if (pending_.empty()) {
      messages.push_back({{"role", "user"}, {"content", user}});
    } else {
      // As generate --chat --image: the images before the text.
      ordered_json parts = ordered_json::array();
      for (const ChatImage& im : pending_)
        if (!im.is_crop) parts.push_back({{"type", "image"}});
      parts.push_back({{"type", "text"}, {"text", user}});
      messages.push_back({{"role", "user"}, {"content", parts}});
      images.insert(images.end(), pending_.begin(), pending_.end());
    }
    std::vector<int32_t> ids = encode(messages, images);
    // Room for the reply: -n tokens, at most a quarter of the context. Below that, the oldest
    // turns leave the conversation.
    const int64_t want = o_.n_predict < 0 ? ctx_ : std::min<int64_t>(o_.n_predict, ctx_);
    const int64_t room = std::max<int64_t>(1, std::min<int64_t>(want, ctx_ / 4));
    int n_dropped = 0;
    while (ctx_ > 0 && int64_t(ids.size()) + room > ctx_) {
      const int64_t dropped_images = drop_oldest_turn(messages);
      if (dropped_images < 0) break;
      images.erase(images.begin(), images.begin() + long(views_of_first(images, dropped_images)));
      ++n_dropped;
      ids = encode(messages, images);
    }
    if (ctx_ > 0 && int64_t(ids.size()) >= ctx_)
      throw InvalidInput("this message" + std::string(system_.empty() ? "" : " and the system prompt") + " take " +
                         std::to_string(ids.size()) + " tokens, and the context holds " + std::to_string(ctx_) +
                         ": write a shorter message, shorten the system prompt (/system TEXT), /reset, or give a "
                         "larger -c/--ctx-size");
    if (n_dropped > 0)
      std::fprintf(stderr, "osprey: the conversation filled the context of %lld tokens: dropped the %s (%zu messages remain)\n",
                   (long long)ctx_, n_dropped == 1 ? "oldest turn" : (std::to_string(n_dropped) + " oldest turns").c_str(),
                   messages.size());

    size_t keep = 0;
    while (keep < ids.size() && keep < cached_.size() && ids[keep] == cached_[keep]) ++keep;
    if (keep == ids.size()) --keep;  // at least one token to prefill, for the next logits
    // Image rows are kept only for the same image at the same place, and an image is never cut
    // between the cache and the pass.
    const std::vector<int64_t> starts = image_starts(ids, images.size());
    for (size_t i = 0; i < starts.size() && starts[i] < int64_t(keep); ++i) {
      const bool same = std::find(cached_images_.begin(), cached_images_.end(), std::make_pair(starts[i], images[i].serial)) !=
                        cached_images_.end();
      if (!same || starts[i] + images[i].embeds.dim(0) > int64_t(keep)) {
        keep = size_t(starts[i]);
        break;
      }
    }
    // A sliding-window layer that no longer holds the rows before `keep` cannot rewind to it:
    // the conversation is then computed from the start.
    if (cache_.offset() > int64_t(keep) && !cache_.can_trim(cache_.offset() - int64_t(keep))) keep = 0;
    if (cache_.offset() > int64_t(keep)) cache_.trim(cache_.offset() - int64_t(keep));
    cached_.resize(keep);

    GenerateParams gp = gp_;
    for (size_t i = 0; i < starts.size(); ++i)
      if (starts[i] >= int64_t(keep)) gp.images.push_back({starts[i] - int64_t(keep), images[i].embeds});
    gp.max_tokens = int(o_.n_predict < 0 ? INT_MAX : o_.n_predict);
    if (ctx_ > 0) gp.max_tokens = int(std::min<int64_t>(gp.max_tokens, ctx_ - int64_t(ids.size())));
    Tokenizer::StreamDecoder stream(tok_);
    GenerateResult r;
    {
      SigintScope sigint;
      r = generate(*model_, cache_, std::span<const int32_t>(ids).subspan(keep), gp, [&](int32_t token) {
        if (!o_.json) {
          std::string piece = stream.push(token);
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        }
        return !g_interrupted.load();
      });
    }
    const bool interrupted = g_interrupted.load();
    cached_ = ids;
    cached_.insert(cached_.end(), r.tokens.begin(), r.tokens.end());
    if (cache_.offset() > int64_t(cached_.size())) {
      const int64_t extra = cache_.offset() - int64_t(cached_.size());
      cache_.trim(cache_.can_trim(extra) ? extra : cache_.offset());  // else the next turn starts over
    }
    cached_.resize(size_t(cache_.offset()));

    std::string reply = tok_.decode(r.tokens, true);
    cached_images_.clear();
    for (size_t i = 0; i < starts.size(); ++i) cached_images_.emplace_back(starts[i], images[i].serial);
    images_ = std::move(images);
    pending_.clear();
    messages_ = std::move(messages);
    messages_.push_back({{"role", "assistant"}, {"content", reply}});
    const GenerateStats& s = r.stats;
    if (o_.json) {
      ordered_json j = {{"text", reply},
                        {"tokens", r.tokens},
                        {"stop_reason", interrupted ? std::string("interrupted") : s.stop_reason},
                        {"conversation_tokens", ids.size()},
                        {"cached_tokens", keep},
                        {"dropped_turns", n_dropped},
                        {"context", ctx_},
                        {"prompt_n", s.n_prompt},
                        {"predicted_n", s.n_generated},
                        {"seed", gp_.sampler.seed},
                        {"sampler", sampler_json(sampling_)},
                        {"drafted_n", s.n_drafted},
                        {"accepted_n", s.n_accepted},
                        {"verify_steps", s.n_verify_steps},
                        {"acceptance", s.acceptance()},
                        {"draft_stops", s.n_draft_stops},
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
                 interrupted ? " | interrupted" : "");
  }

 private:
  // An image of the conversation: its soft tokens, and a number no other image of this chat has.
  // One view of an attached image: the image itself, or one of its pan-and-scan crops, which
  // follow it.
  struct ChatImage {
    uint64_t serial = 0;
    Array embeds;      // [mm_tokens_per_image, hidden] on the model's device
    size_t crops = 0;  // the image's: how many crops follow it
    bool is_crop = false;
  };

  // How many views the first n images of `images` take (each image and its crops).
  static size_t views_of_first(const std::vector<ChatImage>& images, int64_t n) {
    size_t at = 0;
    for (int64_t k = 0; k < n && at < images.size(); ++k) at += 1 + images[at].crops;
    return at;
  }

  // The number of image parts in a message's content.
  static int64_t image_parts(const ordered_json& m) {
    int64_t n = 0;
    if (m.is_object() && m.contains("content") && m["content"].is_array())
      for (const ordered_json& part : m["content"])
        if (part.is_object() && part.value("type", "") == "image") ++n;
    return n;
  }

  // Where each image's tokens start in `ids`: one run per image of the conversation.
  std::vector<int64_t> image_starts(const std::vector<int32_t>& ids, size_t n_images) const {
    if (!encoder_) return {};
    std::vector<int64_t> starts = image_token_runs(ids, encoder_->tower->config());
    if (starts.size() != n_images)
      throw InvalidInput("the conversation holds the tokens of " + std::to_string(starts.size()) + " image(s) for " +
                         std::to_string(n_images) + " attached: a message's text may not write image tokens");
    return starts;
  }

  std::vector<int32_t> encode(const ordered_json& messages, const std::vector<ChatImage>& images) const {
    std::string text = tpl_.render(ordered_json{{"messages", messages}, {"add_generation_prompt", true}});
    std::vector<size_t> n_crops;
    for (const ChatImage& im : images)
      if (!im.is_crop) n_crops.push_back(im.crops);
    if (!images.empty()) text = expand_image_markers(text, encoder_->tower->config(), std::span<const size_t>(n_crops));
    // The template writes BOS itself: no second one from the post-processor.
    std::vector<int32_t> ids = tok_.encode(text, false);
    if (ids.empty()) throw InvalidInput("chat: the rendered conversation has no tokens");
    return ids;
  }

  // Removes the first turn after the system prompt: its messages up to the next user message.
  // Returns the number of image parts it held; -1 (nothing removed) when only the system prompt
  // and the newest (last) message are left.
  static int64_t drop_oldest_turn(ordered_json& messages) {
    size_t first = 0;
    while (first < messages.size() && messages[first].is_object() && messages[first].value("role", "") == "system")
      ++first;
    if (first + 1 >= messages.size()) return -1;
    size_t end = first + 1;
    while (end + 1 < messages.size() && !(messages[end].is_object() && messages[end].value("role", "") == "user")) ++end;
    int64_t n_images = 0;
    for (size_t i = first; i < end; ++i) n_images += image_parts(messages[i]);
    messages.erase(messages.begin() + long(first), messages.begin() + long(end));
    return n_images;
  }

  ChatOptions o_;
  ChatSampling sampling_;
  std::string system_;
  ModelBundle bundle_;       // tokenizer and template (both present), stop ids
  const Tokenizer& tok_;
  const ChatTemplate& tpl_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Model> draft_;  // --model-draft
  int64_t ctx_ = 0;
  GenerateParams gp_;
  SequenceCache cache_;
  ordered_json messages_;
  std::vector<int32_t> cached_;  // the tokens whose K/V rows cache_ holds
  std::optional<ImageEncoder> encoder_;  // the vision tower, for a model that takes images
  std::vector<ChatImage> images_;        // the images of messages_, in order
  std::vector<ChatImage> pending_;       // /image: for the next message
  std::vector<std::pair<int64_t, uint64_t>> cached_images_;  // (first token, serial) of the images in cache_
  uint64_t next_image_ = 1;
};

// Runs a /command; returns false for /exit and /quit.
bool command(Chat& chat, const std::string& line) {
  const size_t space = line.find(' ');
  const std::string cmd = line.substr(0, space);
  const size_t at = space == std::string::npos ? space : line.find_first_not_of(' ', space);
  const std::string arg = at == std::string::npos ? "" : line.substr(at);
  const bool takes_arg = cmd == "/system" || cmd == "/save" || cmd == "/load" || cmd == "/image";
  if (!takes_arg && !arg.empty() && (cmd == "/quit" || cmd == "/exit" || cmd == "/help" || cmd == "/reset"))
    throw InvalidInput(cmd + " takes no argument (\"" + arg + "\")");
  if (cmd == "/quit" || cmd == "/exit") return false;
  if (cmd == "/help") {
    std::fputs(kHelp, stderr);
  } else if (cmd == "/reset") {
    chat.reset();
  } else if (cmd == "/system") {
    if (arg.empty())
      std::fprintf(stderr, "system prompt: %s\n", chat.system().empty() ? "(none)" : chat.system().c_str());
    else
      chat.set_system(arg);
  } else if (cmd == "/image") {
    // A file that cannot be attached is reported and the chat goes on, in scripts too.
    try {
      if (arg.empty()) throw InvalidInput("/image: give a file name");
      chat.attach_image(arg);
    } catch (const Error& e) {
      std::fprintf(stderr, "osprey: error: %s\n", e.what());
    }
  } else if (cmd == "/save" || cmd == "/load") {
    if (arg.empty()) throw InvalidInput(cmd + ": give a file name");
    if (cmd == "/save") chat.save(arg);
    else chat.load(arg);
  } else {
    throw InvalidInput("unknown command " + cmd + " (/help lists the commands)");
  }
  return true;
}

// Scripts: one message per line (or as the multi-line rules join them), one reply per
// message; an error ends the run.
int run_script(Chat& chat) {
  MessageReader reader;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!reader.pending() && line.rfind("/", 0) == 0) {
      if (!command(chat, line)) return 0;
      continue;
    }
    if (std::optional<std::string> message = reader.push(line); message && !message->empty()) chat.turn(*message);
  }
  if (reader.pending())
    throw InvalidInput("the input ended inside a message of several lines (an open \"\"\" block, or a last line ending in \\)");
  return 0;
}

// The line editor's key reader: a Ctrl-C (the signal, or the key when the terminal passes it
// through) ends the line being edited as end-of-file, with g_interrupted set.
extern "C" int read_key(FILE*) {
  for (;;) {
    if (g_interrupted) return EOF;  // a Ctrl-C before the editor read its first key
    unsigned char c = 0;
    const ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n == 1) {
      if (c != 3) return c;
      g_interrupted = true;
      return EOF;
    }
    if (n < 0 && errno == EINTR && !g_interrupted) continue;
    return EOF;
  }
}

// The line editor's history, kept in <data home>/osprey/chat_history across runs. A history
// that cannot be read or written is a warning, once; the chat goes on.
class History {
 public:
  explicit History(const std::string& data_home) {
    stifle_history(1000);
    if (data_home.empty()) {
      std::fprintf(stderr, "osprey: warning: neither XDG_DATA_HOME nor HOME is set: the chat history is not kept\n");
      return;
    }
    const fs::path dir = fs::path(data_home) / "osprey";
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
      warn("cannot create " + dir.string() + ": " + ec.message());
      return;
    }
    path_ = (dir / "chat_history").string();
    if (fs::exists(path_, ec) && read_history(path_.c_str()) != 0) warn("cannot read " + path_);
  }

  void add(const std::string& line) {
    add_history(line.c_str());
    if (!path_.empty() && write_history(path_.c_str()) != 0) warn("cannot write " + path_);
  }

 private:
  void warn(const std::string& what) {
    if (!warned_) std::fprintf(stderr, "osprey: warning: %s: the chat history is not kept\n", what.c_str());
    warned_ = true;
  }
  std::string path_;
  bool warned_ = false;
};

int run_interactive(Chat& chat) {
  // Before the editor's first use: it installs no signal handlers of its own, and reads keys
  // through read_key so that Ctrl-C reaches the loop below.
  rl_catch_signals = 0;
  rl_getc_function = read_key;
  using_history();
  History history(env_options().data_home);
  SigintScope sigint;
  std::fprintf(stderr, "Type a message and press Enter; /help lists the commands. Ctrl-C stops a reply; /exit or Ctrl-D leaves.\n");
  MessageReader reader;
  bool warned = false;  // the last prompt ended with a Ctrl-C
  for (;;) {
    char* raw = readline(reader.pending() ? "... " : "> ");
    if (g_interrupted) {
      g_interrupted = false;  // a Ctrl-C from here on counts as the second
      std::free(raw);
      reader.clear();
      if (warned) {
        std::fputc('\n', stderr);
        break;
      }
      std::fprintf(stderr, "\n(press Ctrl-C again or /exit to leave)\n");
      warned = true;
      continue;
    }
    if (!raw) {  // Ctrl-D
      std::fputc('\n', stderr);
      break;
    }
    warned = false;
    std::string line(raw);
    std::free(raw);
    if (!line.empty()) history.add(line);
    try {
      if (!reader.pending() && line.rfind("/", 0) == 0) {
        if (!command(chat, line)) break;
        continue;
      }
      if (std::optional<std::string> message = reader.push(line); message && !message->empty()) chat.turn(*message);
    } catch (const InvalidInput& e) {
      std::fprintf(stderr, "osprey: error: %s\n", e.what());
    } catch (const IoError& e) {
      std::fprintf(stderr, "osprey: error: %s\n", e.what());
    }
    g_interrupted = false;  // a Ctrl-C that stopped the reply is spent
  }
  return 0;
}

int run_chat(const ChatOptions& o, const CLI::App& app) {
  if (o.threads >= 0) set_cpu_threads(o.threads);
  const std::string dir = model_folder(o.model, o.download);
  if (!fs::exists(dir)) throw IoError("model folder " + dir + " does not exist");
  BundleOptions bo;
  bo.require_chat_template = true;
  bo.template_name = o.template_name;
  bo.sampling_fallback = llama_cpp_sampling();
  bo.sampling_fallback_name = "llama.cpp defaults";
  ModelBundle bundle = load_model_bundle(dir, bo);
  if (!bundle.tokenizer) bundle.tokenizer = load_model_tokenizer(dir);  // names what is missing
  const ChatSampling sampling = chat_sampling(o, bundle, app);
  Chat chat(o, dir, std::move(bundle), sampling);
  print_banner(dir, chat.device(), o.device.empty() ? env_options().device : o.device, 1, chat.context());
  if (o.verbose) {
    const SamplerParams& p = sampling.params;
    std::fprintf(stderr,
                 "seed: %llu\nsampler: temperature %g, top-k %d, top-p %g, min-p %g, typical-p %g, repeat-penalty %g "
                 "(unset flags from %s)\ncontext: %lld tokens\n",
                 (unsigned long long)p.seed, printable(p.temperature), p.top_k, printable(p.top_p), printable(p.min_p),
                 printable(p.typical_p), printable(p.repetition_penalty), sampling.defaults.c_str(), (long long)chat.context());
  }
  return isatty(STDIN_FILENO) ? run_interactive(chat) : run_script(chat);
}

}  // namespace

Command add_chat(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  add_model_options(app, o->model, o->download, "Model folder with a chat template");
  app.add_option("--system", o->system, "System message opening the conversation");
  add_template_name_option(app, o->template_name);
  app.add_option("-n,--n-predict", o->n_predict, "Most tokens per reply (default 512; -1: until the context is full)")
      ->check(int_range(-1, INT32_MAX));
  app.add_option("-c,--ctx-size", o->ctx_size,
                 "Context length in tokens (default 0: the model's); when the conversation fills it, the oldest turns "
                 "leave it")
      ->check(int_range(0, INT32_MAX));
  add_sampler_options(app, o->sampler, /*checkpoint_defaults=*/true);
  add_spec_options(app, o->spec);
  add_device_option(app, o->device);
  add_cache_type_options(app, o->cache_type_k, o->cache_type_v);
  add_threads_option(app, o->threads);
  add_pan_and_scan_option(app, o->pan_and_scan);
  app.add_flag("--json", o->json,
               "Print one JSON object per reply (text, tokens, seed, sampler settings, cache counters) instead of "
               "streaming");
  app.add_flag("-v,--verbose", o->verbose, "Print the seed, the sampler settings and the context on stderr");
  const CLI::App* parsed = &app;
  return [o, parsed] { return run_chat(*o, *parsed); };
}

}  // namespace osprey::cli
