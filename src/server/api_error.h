#pragma once
// An error answered with an HTTP status and an OpenAI error object:
// {"error": {"message", "type", "param", "code"}}.
#include <string>

#include <nlohmann/json.hpp>

namespace osprey {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault ("" when none)
  std::string code;   // a machine-readable code ("" when none)

  nlohmann::json body() const;
};

ApiError bad_request(const std::string& message, const std::string& param = "", const std::string& code = "");

}  // namespace osprey
