// The interpreter's semantics against python3-jinja2 under transformers' settings:
// tests/fixtures/chat_templates/semantics.json (tools/render_chat_templates.py) holds each
// template, its variables and jinja2's output or error.
#include <gtest/gtest.h>

#include <fstream>

#include "chat/jinja.h"
#include "core/error.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::ordered_json;

jinja::Value to_value(const ordered_json& j) {
  using jinja::Value;
  if (j.is_null()) return Value::none();
  if (j.is_boolean()) return Value::boolean(j.get<bool>());
  if (j.is_number_integer()) return Value::integer(j.get<int64_t>());
  if (j.is_number_float()) return Value::floating(j.get<double>());
  if (j.is_string()) return Value::string(j.get<std::string>());
  if (j.is_array()) {
    jinja::List items;
    for (const auto& e : j) items.push_back(to_value(e));
    return Value::make_list(std::move(items));
  }
  Value d = Value::make_dict();
  for (auto it = j.begin(); it != j.end(); ++it) d.dict->set(it.key(), to_value(it.value()));
  return d;
}

ordered_json load_cases() {
  std::ifstream in(testing::source_dir() / "tests/fixtures/chat_templates/semantics.json");
  return ordered_json::parse(in);
}

jinja::Dict variables(const ordered_json& c) { return *to_value(c["variables"]).dict; }

std::string render(const std::string& source, const jinja::Dict& vars = {}) {
  return jinja::Template(source).render(vars);
}

}  // namespace

TEST(Jinja, MatchesJinja2OnEverySemanticsCase) {
  ordered_json cases = load_cases();
  ASSERT_GT(cases.size(), 60u);
  int n_checked = 0;
  for (const auto& c : cases) {
    if (!c.contains("output")) continue;
    const std::string name = c["name"];
    try {
      EXPECT_EQ(render(c["template"], variables(c)), c["output"].get<std::string>()) << name;
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << ": threw " << e.what();
    }
    ++n_checked;
  }
  EXPECT_GT(n_checked, 60);
}

TEST(Jinja, FailsWhereJinja2Fails) {
  int n_checked = 0;
  for (const auto& c : load_cases()) {
    if (!c.contains("error")) continue;
    const std::string name = c["name"];
    EXPECT_THROW(render(c["template"], variables(c)), InvalidInput) << name;
    ++n_checked;
  }
  EXPECT_GE(n_checked, 10);
}

TEST(Jinja, RaiseExceptionIsAnInputErrorWithTheTemplatesText) {
  for (const auto& c : load_cases()) {
    if (c["name"] != "raise_exception") continue;
    try {
      render(c["template"], variables(c));
      FAIL() << "no error";
    } catch (const InvalidInput& e) {
      EXPECT_EQ(std::string(e.what()), c["message"].get<std::string>());
    }
    return;
  }
  FAIL() << "no raise_exception case in the fixture";
}

// A fuzzer's find: a missing key whose bytes are not UTF-8 was read past its end while its
// repr went into the undefined value's message. The repr writes such bytes as \xNN.
TEST(Jinja, ReprOfAKeyThatIsNotUtf8StaysInBounds) {
  const std::string key = std::string("update\xff\xff", 8);
  EXPECT_EQ(render("{{ {'a': 1}['" + key + "'] is defined }}"), "False");
  try {
    render("{{ {'a': 1}['" + key + "'] + 1 }}");
    ADD_FAILURE() << "adding to an undefined value must fail";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("'update\\xff\\xff'"), std::string::npos) << e.what();
  }
}

TEST(Jinja, UnsupportedFeatureNamesItselfAndItsLine) {
  auto expect_unsupported = [](const std::string& source, const std::string& feature, int line) {
    try {
      render(source);
      ADD_FAILURE() << source << ": no error";
    } catch (const Unsupported& e) {
      std::string what = e.what();
      EXPECT_NE(what.find(feature), std::string::npos) << what;
      EXPECT_NE(what.find("line " + std::to_string(line)), std::string::npos) << what;
    }
  };
  expect_unsupported("a\n{% include 'x.jinja' %}", "'include'", 2);
  expect_unsupported("{% extends 'base' %}", "'extends'", 1);
  expect_unsupported("\n\n{{ x | urlencode }}", "filter 'urlencode'", 3);
  expect_unsupported("{{ 1 is escaped }}", "test 'escaped'", 1);
  expect_unsupported("{{ 'a'.zfill(3) }}", "str.zfill", 1);
  expect_unsupported("{{ '%s' % 1 }}", "formatting", 1);
  expect_unsupported("{% for x in y recursive %}{% endfor %}", "recursive", 1);
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  try {
    render("ok\n{{ 1 + }}");
    FAIL() << "no error";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(render("{{ 'unterminated }}"), InvalidInput);
  EXPECT_THROW(render("{% for x in y %}"), InvalidInput);
  EXPECT_THROW(render("{% endif %}"), Unsupported);
}

TEST(Jinja, StrftimeNowFormatsTheCurrentDate) {
  std::string year = render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

}  // namespace osprey
