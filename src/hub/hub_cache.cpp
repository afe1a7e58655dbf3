#include "hub/hub_cache.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <system_error>

#include "core/error.h"
#include "core/file_read.h"
#include "hub/hub_download.h"

namespace osprey::hub {
namespace fs = std::filesystem;

namespace {

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// One part of a repo id, as huggingface_hub's validate_repo_id accepts it.
bool valid_id_part(const std::string& s) {
  if (s.empty() || !is_word_char(s.front()) || !is_word_char(s.back())) return false;
  for (char c : s)
    if (!is_word_char(c) && c != '.' && c != '-') return false;
  return s.find("--") == std::string::npos && s.find("..") == std::string::npos;
}

bool valid_revision(const std::string& r) {
  if (r.empty() || r.front() == '/' || r.back() == '/') return false;
  if (r.find("..") != std::string::npos || r.find("//") != std::string::npos) return false;
  for (char c : r)
    if (!is_word_char(c) && c != '.' && c != '-' && c != '/' && c != '+') return false;
  return true;
}

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// `p` with a leading "~/" (or a lone "~") taken as the home folder.
fs::path expand_home(const std::string& p, const std::string& home) {
  if (p == "~") return home;
  if (p.rfind("~/", 0) == 0 && !home.empty()) return fs::path(home) / p.substr(2);
  return p;
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

// The files of a snapshot, as paths within it.
std::vector<std::string> snapshot_files(const fs::path& snapshot) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(snapshot, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (!it->is_directory(ec)) files.push_back(it->path().lexically_relative(snapshot).generic_string());
  std::sort(files.begin(), files.end());
  return files;
}

// Whether pick_gguf_file finds the file (a snapshot that lacks it may be completed by a download).
bool has_gguf_tagged(const std::vector<std::string>& files, const HubId& id) {
  try {
    pick_gguf_file(files, id);
    return true;
  } catch (const InvalidInput&) {
    return false;
  }
}

}  // namespace

std::string HubId::spec() const {
  if (!quant.empty()) return repo() + ":" + quant;
  return revision == "main" ? repo() : repo() + ":" + revision;
}

bool is_gguf_quant_tag(const std::string& tag) {
  std::string t;
  for (char c : tag) t.push_back(char(std::toupper(static_cast<unsigned char>(c))));
  if (t.rfind("UD-", 0) == 0) t = t.substr(3);
  if (t.empty() || !std::all_of(t.begin(), t.end(), [](char c) { return is_word_char(c); })) return false;
  if (t == "F32" || t == "F16" || t == "BF16" || t.rfind("MXFP4", 0) == 0) return true;
  auto digit_after = [&](size_t n) { return t.size() > n && std::isdigit(static_cast<unsigned char>(t[n])); };
  return (t[0] == 'Q' && digit_after(1)) || ((t.rfind("IQ", 0) == 0 || t.rfind("TQ", 0) == 0) && digit_after(2));
}

std::string pick_gguf_file(const std::vector<std::string>& files, const HubId& id) {
  auto lower = [](std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string tag = lower(id.quant);
  std::vector<std::string> ggufs, matches;
  for (const std::string& f : files) {
    const std::string base = lower(fs::path(f).filename().string());
    if (base.size() <= 5 || base.compare(base.size() - 5, 5, ".gguf") != 0 || base.rfind("mmproj", 0) == 0) continue;
    ggufs.push_back(f);
    std::string stem = base.substr(0, base.size() - 5);
    // A split file's parts (name-00001-of-00003.gguf) match by the name before the numbering.
    static const std::regex split(R"(-\d{5}-of-\d{5}$)");
    stem = std::regex_replace(stem, split, "");
    if (stem.size() > tag.size() && stem.compare(stem.size() - tag.size(), tag.size(), tag) == 0) {
      const char before = stem[stem.size() - tag.size() - 1];
      if (before == '-' || before == '.' || before == '_') matches.push_back(f);
    } else if (stem == tag) {
      matches.push_back(f);
    }
  }
  std::string listed;
  for (const std::string& f : ggufs) listed += (listed.empty() ? "" : ", ") + f;
  if (listed.empty()) listed = "none";
  if (matches.size() == 1) {
    static const std::regex split(R"(-\d{5}-of-\d{5}\.gguf$)", std::regex::icase);
    if (std::regex_search(matches[0], split))
      throw InvalidInput(id.spec() + ": " + matches[0] + " is one part of a split GGUF file, which Osprey does not read "
                         "(merge the parts with llama.cpp's gguf-split --merge)");
    return matches[0];
  }
  throw InvalidInput(id.spec() + ": " + (matches.empty() ? "no GGUF file of " + id.repo() + " is tagged " + id.quant
                                                          : "several GGUF files of " + id.repo() + " are tagged " + id.quant) +
                     " (its GGUF files: " + listed + ")");
}

std::optional<HubId> parse_hub_id(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string id = spec.substr(0, colon);
  const size_t slash = id.find('/');
  if (slash == std::string::npos || id.size() > 96) return std::nullopt;
  HubId h;
  h.org = id.substr(0, slash);
  h.name = id.substr(slash + 1);
  if (!valid_id_part(h.org) || !valid_id_part(h.name)) return std::nullopt;
  if (colon != std::string::npos && is_gguf_quant_tag(spec.substr(colon + 1))) {
    h.quant = spec.substr(colon + 1);
  } else if (colon != std::string::npos) {
    h.revision = spec.substr(colon + 1);
    if (!valid_revision(h.revision))
      throw InvalidInput("-m " + spec + ": \"" + h.revision +
                         "\" is not a revision (a branch, tag or commit hash, without \"..\" or a leading or "
                         "trailing '/')");
  }
  return h;
}

bool is_commit_hash(const std::string& r) {
  if (r.size() != 40) return false;
  for (char c : r)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

ResolveOptions resolve_options(const EnvOptions& env) {
  ResolveOptions o;
  if (!env.hf_hub_cache.empty())
    o.cache_dir = expand_home(env.hf_hub_cache, env.home);
  else if (!env.hf_home.empty())
    o.cache_dir = expand_home(env.hf_home, env.home) / "hub";
  else if (!env.xdg_cache_home.empty())
    o.cache_dir = expand_home(env.xdg_cache_home, env.home) / "huggingface" / "hub";
  else if (!env.home.empty())
    o.cache_dir = fs::path(env.home) / ".cache" / "huggingface" / "hub";
  o.endpoint = env.hf_endpoint;
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  o.token = env.hf_token;
  o.offline = env.hf_hub_offline;
  return o;
}

fs::path repo_cache_dir(const fs::path& cache_dir, const HubId& id) {
  return cache_dir / ("models--" + id.org + "--" + id.name);
}

std::optional<fs::path> find_cached_snapshot(const fs::path& cache_dir, const HubId& id) {
  const fs::path repo = repo_cache_dir(cache_dir, id);
  std::string commit = id.revision;
  if (!is_commit_hash(commit)) {
    const fs::path ref = repo / "refs" / id.revision;
    if (!path_exists(ref)) return std::nullopt;
    commit = trim(read_regular_file(ref));
    if (!is_commit_hash(commit))
      throw InvalidInput(ref.string() + ": expected a commit hash (40 hex digits), found \"" + commit.substr(0, 80) +
                         "\"");
  }
  const fs::path snapshot = repo / "snapshots" / commit;
  std::error_code ec;
  if (!fs::is_directory(snapshot, ec)) return std::nullopt;
  return snapshot;
}

std::vector<std::string> missing_model_files(const fs::path& snapshot) {
  std::vector<std::string> missing;
  for (const char* f : {"config.json", "tokenizer.json"})
    if (!path_exists(snapshot / f)) missing.push_back(f);
  if (path_exists(snapshot / "model.safetensors")) return missing;
  const fs::path index = snapshot / "model.safetensors.index.json";
  if (!path_exists(index)) {
    missing.push_back("model.safetensors");
    return missing;
  }
  for (const std::string& s : index_shards(read_safetensors_index(index)))
    if (!path_exists(snapshot / s)) missing.push_back(s);
  return missing;
}

std::string resolve_model(const std::string& spec, const ResolveOptions& o) {
  if (spec.empty()) throw InvalidInput("-m: empty model name");
  std::error_code ec;
  const fs::path path(spec);
  if (fs::exists(path, ec)) {
    if (fs::is_directory(path, ec)) return spec;
    if (path.extension() == ".gguf") {
      if (!fs::is_regular_file(path, ec)) throw IoError("-m " + spec + ": not a regular file");
      return spec;  // a GGUF file holds the whole model
    }
    if (!fs::is_regular_file(path, ec)) throw IoError("-m " + spec + ": not a model folder or a file in one");
    const fs::path parent = path.parent_path();
    return parent.empty() ? "." : parent.string();
  }
  std::optional<HubId> id = parse_hub_id(spec);
  if (!id) throw IoError("model folder " + spec + " does not exist (nor is it a Hub id, org/name[:revision])");
  if (o.cache_dir.empty())
    throw IoError("-m " + spec +
                  ": no such folder, and no Hugging Face cache folder to look in (set HF_HUB_CACHE, HF_HOME or HOME)");
  std::optional<fs::path> snapshot = find_cached_snapshot(o.cache_dir, *id);
  if (!id->quant.empty()) {
    if (snapshot) {
      const std::vector<std::string> cached = snapshot_files(*snapshot);
      if (!o.download || has_gguf_tagged(cached, *id)) return (*snapshot / pick_gguf_file(cached, *id)).string();
    }
    if (o.download) {
      const fs::path fetched = download_model(*id, o);
      return (fetched / pick_gguf_file(snapshot_files(fetched), *id)).string();
    }
  } else if (snapshot && (!o.download || missing_model_files(*snapshot).empty())) {
    return snapshot->string();
  }
  if (o.download) return download_model(*id, o).string();
  throw IoError("-m " + spec + ": no such folder, and the Hub model " + id->spec() +
                " is not in the Hugging Face cache (" + o.cache_dir.string() + "): run `osprey pull " + id->spec() +
                "`, or add --download");
}

}  // namespace osprey::hub
