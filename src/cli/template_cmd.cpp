#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "core/file_read.h"
#include "bundle/model_files.h"

namespace osprey::cli {
namespace {

struct TemplateOptions {
  std::string model;
  bool download = false;
  std::string request = "-";
  std::string name;
};

int run_template(const TemplateOptions& o) {
  const std::string dir = model_folder(o.model, o.download);
  ChatTemplate tpl = load_model_chat_template(dir, o.name);
  std::string text;
  std::string where = o.request == "-" ? std::string("stdin") : o.request;
  if (o.request == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    text = read_regular_file(o.request);
  }
  nlohmann::ordered_json request;
  try {
    request = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InvalidInput(where + ": malformed JSON request: " + e.what());
  }
  std::string out = tpl.render(request);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

Command add_template(CLI::App& app) {
  auto o = std::make_shared<TemplateOptions>();
  add_model_options(app, o->model, o->download, "Folder with tokenizer_config.json or chat_template.jinja");
  add_template_name_option(app, o->name);
  app.add_option("request", o->request, "JSON chat request file: messages, add_generation_prompt, tools, documents, chat_template_kwargs ('-', the default, reads stdin)");
  return [o] { return run_template(*o); };
}

}  // namespace osprey::cli
