#pragma once
// The images of a chat request (docs/server.md, "Images"): OpenAI `image_url` parts whose URL is
// a base64 `data:` URL, read, decoded and checked before anything runs; each becomes the
// `{"type": "image"}` part that chat templates (Gemma 3's) render as the image's marker.
// Anthropic's image blocks and the Responses API's input_image parts reach here as image_url
// parts (anthropic_api.cpp, responses_api.cpp). The server fetches nothing: any other URL is
// refused.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vision/image_decode.h"

namespace osprey {

// The most bytes one image's file may have once its base64 is decoded (the request body's own
// limit, --max-body-mib, applies first).
inline constexpr size_t kMaxImageBytes = size_t(20) << 20;

struct ImagePartOptions {
  // "": the model takes images; else why it does not (the 400's reason).
  std::string no_images;
  size_t max_bytes = kMaxImageBytes;
  ImageDecodeLimits limits;  // the decoder's pixel limit
  // The request was another API's (Anthropic's, the Responses API's), made a chat request by
  // this server: each image part holds "at", its place in the request as sent, which errors
  // name. A chat request's own parts may not hold it.
  bool converted = false;
};

struct RequestImage {
  std::string at;     // the part's place: "messages[1].content[0]"
  std::string bytes;  // the file, as sent (the prompt cache's salt)
  RgbImage pixels;
  // The part's `detail`: "high" cuts the image into pan-and-scan crops as well, "low" does
  // not; "auto" or none leaves it to the server (the processor's do_pan_and_scan, or
  // --pan-and-scan).
  std::optional<bool> pan_and_scan;
};

// Takes the image parts out of `request`'s messages, in prompt order, each replaced by
// {"type": "image"}. Throws ApiError (400) naming the part (`messages[i].content[j]`) and the
// reason: a model without images, a part outside a user message, a URL that is not a base64
// data: URL of image/png, image/jpeg, image/webp or image/gif, bad base64, a file past
// max_bytes or the pixel limit, or one the decoder refuses (malformed, truncated, unsupported).
// A `detail` of "auto", "low" or "high" sets RequestImage::pan_and_scan; any other value is
// refused.
std::vector<RequestImage> take_image_parts(nlohmann::ordered_json& request, const ImagePartOptions& options);

}  // namespace osprey
