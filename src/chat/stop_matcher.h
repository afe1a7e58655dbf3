#pragma once
// Stop strings matched on the text of a reply as it streams, across token boundaries. Text
// that might be the start of a stop string is held back until it is known not to be; the
// stop string itself and everything after it are never emitted.
#include <string>
#include <vector>

namespace osprey {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Appends `text`; returns what may be emitted now. After a match, returns the text before
  // it and stopped() turns true; later calls return "".
  std::string push(const std::string& text);
  // The text still held back (at the end of the reply); "" after a match.
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string that matched ("" before a match).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace osprey
