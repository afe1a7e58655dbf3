#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "tokenizer/tokenizer.h"
#include "bundle/model_files.h"

namespace osprey::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  bool download = false;
  std::string text;
  bool special = false;
};

int run_tokenize(const TokenizeOptions& o) {
  const std::string dir = model_folder(o.model, o.download);
  Tokenizer tok = load_model_tokenizer(dir);
  std::string text = o.text;
  if (text == "-") text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  nlohmann::json ids = tok.encode(text, o.special);
  std::printf("%s\n", ids.dump().c_str());
  return 0;
}

}  // namespace

Command add_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  add_model_options(app, o->model, o->download, "Folder with tokenizer.json");
  app.add_flag("--special", o->special, "Add what the post-processor adds (BOS)");
  app.add_option("text", o->text, "Text to tokenize ('-' reads stdin)")->required();
  return [o] { return run_tokenize(*o); };
}

}  // namespace osprey::cli
