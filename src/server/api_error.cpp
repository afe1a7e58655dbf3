#include "server/api_error.h"

namespace osprey {

nlohmann::json ApiError::body() const {
  nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return {{"error", e}};
}

ApiError bad_request(const std::string& message, const std::string& param, const std::string& code) {
  ApiError e;
  e.status = 400;
  e.message = message;
  e.param = param;
  e.code = code;
  return e;
}

}  // namespace osprey
