#pragma once
// A jinja2 interpreter for chat templates, with the semantics of Python jinja2 under
// transformers' settings: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
// with loop controls, `tojson` as json.dumps(ensure_ascii=False), and the globals
// raise_exception and strftime_now (plus jinja2's range, namespace and dict).
//
// Errors: InvalidInput for a syntax error, a runtime type error, an undefined value used
// where jinja2 raises, and raise_exception(msg) (whose text is msg itself); Unsupported for
// a jinja2 feature outside the implemented subset. Messages other than raise_exception's
// name the template line.
#include <memory>
#include <string>

#include "chat/jinja_value.h"

namespace osprey::jinja {

struct Stmt;

class Template {
 public:
  // Parses source; throws on a syntax error or an unsupported statement.
  explicit Template(const std::string& source);

  // Renders with the given top-level variables. Thread-safe: a Template is immutable.
  std::string render(const Dict& variables) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
};

}  // namespace osprey::jinja
