#include "chat/reasoning.h"

#include <algorithm>

namespace osprey {
namespace {

constexpr const char* kOpen = "<think>";
constexpr const char* kClose = "</think>";

bool rs_is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// The length of the longest suffix of s that is a proper prefix of marker.
size_t rs_partial_marker(const std::string& s, const std::string& marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.compare(s.size() - n, n, marker, 0, n) == 0) return n;
  return 0;
}

}  // namespace

ReasoningFormat reasoning_format(const std::string& template_source) {
  return template_source.find(kClose) != std::string::npos ? ReasoningFormat::think : ReasoningFormat::none;
}

bool prompt_opens_think(const std::string& prompt) {
  const size_t open = prompt.rfind(kOpen);
  if (open == std::string::npos) return false;
  if (prompt.find(kClose, open) != std::string::npos) return false;
  for (size_t i = open + std::string(kOpen).size(); i < prompt.size(); ++i)
    if (!rs_is_space(prompt[i])) return false;
  return true;
}

ReasoningParser::ReasoningParser(bool prompt_opens) : state_(prompt_opens ? State::reasoning : State::start) {}

void ReasoningParser::step(ReasoningOutput& out, bool at_end) {
  const std::string open = kOpen, close = kClose;
  while (true) {
    switch (state_) {
      case State::start: {
        size_t i = 0;
        while (i < buf_.size() && rs_is_space(buf_[i])) ++i;
        const std::string rest = buf_.substr(i);
        if (rest.compare(0, open.size(), open) == 0) {
          buf_.erase(0, i + open.size());
          state_ = State::reasoning;
          continue;
        }
        if (!at_end && open.compare(0, rest.size(), rest) == 0) return;  // still possibly "<think>"
        state_ = State::content;
        continue;
      }
      case State::reasoning: {
        const size_t p = buf_.find(close);
        if (p != std::string::npos) {
          out.reasoning += buf_.substr(0, p);
          buf_.erase(0, p + close.size());
          state_ = State::after_close;
          continue;
        }
        const size_t hold = at_end ? 0 : rs_partial_marker(buf_, close);
        out.reasoning += buf_.substr(0, buf_.size() - hold);
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case State::after_close: {
        size_t i = 0;
        while (i < buf_.size() && rs_is_space(buf_[i])) ++i;
        buf_.erase(0, i);
        if (buf_.empty() && !at_end) return;
        state_ = State::content;
        continue;
      }
      case State::content:
        out.content += buf_;
        buf_.clear();
        return;
    }
  }
}

ReasoningOutput ReasoningParser::push(const std::string& text) {
  ReasoningOutput out;
  buf_ += text;
  step(out, false);
  return out;
}

ReasoningOutput ReasoningParser::finish() {
  ReasoningOutput out;
  step(out, true);
  return out;
}

}  // namespace osprey
