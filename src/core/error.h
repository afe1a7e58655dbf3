#pragma once
// The one error hierarchy. Library code throws these; the CLI and server catch them and
// map them to an exit code or an HTTP status. Messages name the file, tensor, field or flag
// at fault.
#include <stdexcept>
#include <string>

namespace osprey {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Malformed or inconsistent input: a checkpoint, config, request or flag.
class InvalidInput : public Error {
 public:
  using Error::Error;
};

// Well-formed input that this build does not support (a model_type, a dtype, a device).
class Unsupported : public Error {
 public:
  using Error::Error;
};

class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// The device cannot run anything more in this process: an error that poisons its context
// (an illegal address, a launch failure, an uncorrectable ECC error). Every later call fails
// the same way, so a server reports itself unhealthy and exits for its supervisor to restart
// it rather than failing each request.
class DeviceLost : public Error {
 public:
  using Error::Error;
};

// A file that cannot be opened, mapped or read.
class IoError : public Error {
 public:
  using Error::Error;
};

}  // namespace osprey
