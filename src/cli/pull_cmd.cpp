// osprey pull: fetches a model from the Hugging Face Hub into the Hugging Face cache, and the
// -m resolution every command shares (a folder, a file in one, or a Hub id).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/progress.h"
#include "core/env.h"
#include "hub/hub_cache.h"
#include "hub/hub_download.h"

namespace osprey::cli {
namespace {

// hub::ResolveOptions from the environment, drawing one progress bar per downloaded file.
hub::ResolveOptions hub_options(bool download) {
  hub::ResolveOptions o = hub::resolve_options(env_options());
  o.download = download;
  auto bar = std::make_shared<std::unique_ptr<ProgressBar>>();
  auto current = std::make_shared<std::string>();
  o.progress = [bar, current](const std::string& file, uint64_t done, uint64_t total) {
    if (!*bar || *current != file) {
      *current = file;
      *bar = std::make_unique<ProgressBar>(file);
    }
    (*bar)->update(size_t(done), size_t(total));
  };
  return o;
}

struct PullOptions {
  std::string model;
};

int run_pull(const PullOptions& o) {
  std::optional<hub::HubId> id = hub::parse_hub_id(o.model);
  if (!id)
    throw UsageError("pull: \"" + o.model + "\" is not a Hub id (org/name, org/name:revision or org/name:QUANT)");
  // A GGUF tag: the one file it picks, fetched unless the cache holds it.
  const std::string folder = id->quant.empty() ? hub::download_model(*id, hub_options(true)).string()
                                               : hub::resolve_model(id->spec(), hub_options(true));
  std::printf("%s\n", folder.c_str());
  return 0;
}

}  // namespace

std::string model_folder(const std::string& model, bool download) {
  return model.empty() ? default_model_dir() : hub::resolve_model(model, hub_options(download));
}

Command add_pull(CLI::App& app) {
  auto o = std::make_shared<PullOptions>();
  app.add_option("model", o->model, "Hub id: org/name or org/name:revision (a branch, tag or commit)")->required();
  return [o] { return run_pull(*o); };
}

}  // namespace osprey::cli
