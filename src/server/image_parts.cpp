#include "server/image_parts.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "server/base64.h"
#include "server/request_fields.h"

namespace osprey {
namespace {
// A namespace of its own: the library is built in unity batches.
namespace image_parts {

using ojson = nlohmann::ordered_json;
using namespace request_fields;  // fail, get, kind_of, only, string_at

constexpr const char* kMediaTypes[] = {"image/png", "image/jpeg", "image/webp", "image/gif"};

// The file a data: URL holds, checked: "data:<media type>;base64,<data>".
std::string data_url_bytes(const std::string& url, const std::string& at, size_t max_bytes) {
  if (url.rfind("data:", 0) != 0) {
    const std::string scheme = url.substr(0, std::min(url.find(':'), size_t(16)));
    fail(at, "is an image URL of another kind than data: (" + (url.find(':') == std::string::npos ? "no scheme" : scheme) +
                 "): this server fetches nothing; send the image inline as data:image/png;base64,...");
  }
  const size_t comma = url.find(',');
  if (comma == std::string::npos) fail(at, "is a data: URL without the ',' before its data");
  const std::string head = url.substr(5, comma - 5);  // "image/png;base64"
  const size_t semi = head.find(';');
  const std::string media = head.substr(0, semi);
  const std::string params = semi == std::string::npos ? "" : head.substr(semi);
  if (std::find(std::begin(kMediaTypes), std::end(kMediaTypes), media) == std::end(kMediaTypes))
    fail(at, "is a data: URL of media type \"" + media.substr(0, 64) +
                 "\": images are image/png, image/jpeg, image/webp or image/gif");
  if (params != ";base64") fail(at, "is a data: URL without ';base64': the image's bytes must be base64");
  const size_t n_text = url.size() - comma - 1;
  if (n_text / 4 * 3 > max_bytes + 2)
    fail(at, "is an image of about " + std::to_string(n_text / 4 * 3) + " bytes, past this server's limit of " +
                 std::to_string(max_bytes) + " bytes per image");
  std::string bytes;
  size_t bad = 0;
  if (!base64_decode(std::string_view(url).substr(comma + 1), bytes, bad))
    fail(at, "holds malformed base64: " + (bad < n_text ? "character " + std::to_string(bad) + " of the data is not base64"
                                                         : "its " + std::to_string(n_text) +
                                                               " characters end inside a group of four"));
  if (bytes.empty()) fail(at, "is an empty image (no data after the comma)");
  if (bytes.size() > max_bytes)
    fail(at, "is an image of " + std::to_string(bytes.size()) + " bytes, past this server's limit of " +
                 std::to_string(max_bytes) + " bytes per image");
  return bytes;
}

RequestImage read_image_part(const ojson& part, const std::string& at, const ImagePartOptions& o) {
  if (o.converted)
    only(part, at, {"type", "image_url", "at"});
  else
    only(part, at, {"type", "image_url"});
  const ojson* u = get(part, "image_url");
  if (!u) fail(at + ".image_url", "is required");
  if (!u->is_object()) fail(at + ".image_url", "must be an object {\"url\", \"detail\"}, not " + kind_of(*u));
  only(*u, at + ".image_url", {"url", "detail"});
  const std::string detail = string_at(*u, "detail", at + ".image_url", false);
  if (!detail.empty() && detail != "auto" && detail != "low" && detail != "high")
    fail(at + ".image_url.detail", "must be \"auto\", \"low\" or \"high\", not \"" + detail.substr(0, 64) + "\"");
  RequestImage im;
  im.at = at;
  if (detail == "high") im.pan_and_scan = true;
  if (detail == "low") im.pan_and_scan = false;
  im.bytes = data_url_bytes(string_at(*u, "url", at + ".image_url", true), at, o.max_bytes);
  try {
    im.pixels = decode_image(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(im.bytes.data()), im.bytes.size()), o.limits);
  } catch (const Error& e) {  // InvalidInput (malformed, truncated, too large) or Unsupported
    fail(at, std::string("is an image this server cannot read: ") + e.what());
  }
  return im;
}

}  // namespace image_parts
}  // namespace

std::vector<RequestImage> take_image_parts(nlohmann::ordered_json& request, const ImagePartOptions& options) {
  using namespace image_parts;
  std::vector<RequestImage> images;
  auto messages = request.find("messages");
  if (messages == request.end() || !messages->is_array()) return images;
  for (size_t i = 0; i < messages->size(); ++i) {
    ojson& m = (*messages)[i];
    if (!m.is_object() || !m.contains("content") || !m["content"].is_array()) continue;
    for (size_t k = 0; k < m["content"].size(); ++k) {
      ojson& part = m["content"][k];
      const std::string type = part.is_object() && part.contains("type") && part["type"].is_string()
                                   ? part["type"].get<std::string>()
                                   : "";
      std::string at = "messages[" + std::to_string(i) + "].content[" + std::to_string(k) + "]";
      if (options.converted && part.is_object() && part.contains("at") && part["at"].is_string())
        at = part["at"].get<std::string>();
      if (type == "image" || type == "input_image")
        fail(at, "is an '" + type + "' part: chat completions take images as {\"type\": \"image_url\", \"image_url\": "
                 "{\"url\": \"data:image/png;base64,...\"}}");
      if (type != "image_url") continue;
      if (!options.no_images.empty()) fail(at, "is an image, and " + options.no_images);
      const std::string role = m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "";
      if (role != "user") fail(at, "is an image in a '" + role + "' message: images go in user messages");
      images.push_back(read_image_part(part, at, options));
      part = ojson{{"type", "image"}};
    }
  }
  return images;
}

}  // namespace osprey
