#pragma once
// Turning a device name (from --device or OSPREY_DEVICE) into a Device.
#include <string>

#include "core/device.h"

namespace osprey {

// "cpu", "cuda" (= cuda:0) or "cuda:N". Empty: cuda:0 when a CUDA device is present, else
// cpu. Throws InvalidInput for a malformed name and Unsupported when CUDA is asked for and
// this build or machine has none (never a silent fall back to the CPU).
Device select_device(const std::string& name);

}  // namespace osprey
