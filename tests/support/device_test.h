#pragma once
// A behaviour that holds on every device is one test, instantiated over the devices this
// machine has, never a CPU copy and a CUDA copy:
//
//   class MyOp : public testing::DeviceTest {};
//   TEST_P(MyOp, MatchesTheReference) { ... device() ... on_cuda() ... }
//   INSTANTIATE_TEST_SUITE_P(Devices, MyOp, OSPREY_DEVICE_LEVELS);   // Devices/MyOp.X/cpu_v3, .../cuda
//
// OSPREY_DEVICES gives "cpu" (the kernels at the host's best level) and "cuda": for tests of
// models and engine paths; OSPREY_MODELS_ON_DEVICES(models) gives every model of a list on
// each of them (<model>_<device>). OSPREY_DEVICE_LEVELS gives "cpu_<level>" for every level
// of the CPU kernels (a level the host lacks skips, naming it) and "cuda": for op tests.
// "cuda" is listed only where a CUDA device is present (a CUDA build on a machine with a GPU):
// elsewhere the CUDA instances do not exist rather than skip. A test that only one device can
// run stays a plain TEST (CUDA's: SKIP_WITHOUT_CUDA, support/numeric.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "backend/cuda_available.h"
#include "backend/ops.h"
#include "core/array.h"
#include "support/cpu_levels.h"

namespace osprey::testing {

// "cpu", then "cuda" where a device is present.
inline std::vector<std::string> devices() {
  std::vector<std::string> params = {"cpu"};
  if (cuda_available()) params.push_back("cuda");
  return params;
}

// "cpu_scalar", "cpu_v3", "cpu_v4", "cpu_v4_bf16", then "cuda" where a device is present.
inline std::vector<std::string> device_levels() {
  std::vector<std::string> params;
  for (CpuLevel level : kAllCpuLevels) params.push_back("cpu_" + cpu_level_param_name(level));
  if (cuda_available()) params.push_back("cuda");
  return params;
}

// For a "cpu_<level>" name of device_levels(): enter_cpu_level at that level. A test failure
// for a name that is no such level.
inline std::string enter_device_param(const std::string& param, std::optional<ScopedCpuLevel>& scope) {
  for (CpuLevel level : kAllCpuLevels)
    if (param == "cpu_" + cpu_level_param_name(level)) return enter_cpu_level(level, scope);
  ADD_FAILURE() << "not a device parameter: " << param;
  return {};
}

inline std::string device_param_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

#define OSPREY_DEVICES ::testing::ValuesIn(::osprey::testing::devices()), ::osprey::testing::device_param_name
#define OSPREY_DEVICE_LEVELS \
  ::testing::ValuesIn(::osprey::testing::device_levels()), ::osprey::testing::device_param_name

// A model (a fixture folder's name or a case of a table) on a device of devices(): the
// parameter of the suites that run every model through the same tests.
struct ModelCase {
  std::string model;
  std::string device;
};
inline const std::string& device_of(const std::string& param) { return param; }
inline const std::string& device_of(const ModelCase& param) { return param.device; }
// gtest's listing of the parameter (else a dump of the struct's bytes).
inline void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.model << " on " << c.device; }

// Every model of `models` on every device of devices().
inline std::vector<ModelCase> model_cases(const std::vector<std::string>& models) {
  std::vector<ModelCase> cases;
  for (const std::string& device : devices())
    for (const std::string& model : models) cases.push_back({model, device});
  return cases;
}
// "<model>_<device>", with '-' as '_' (gemma3-mm_cpu, llama_q4_cuda).
inline std::string model_case_name(const ::testing::TestParamInfo<ModelCase>& info) {
  std::string name = info.param.model + "_" + info.param.device;
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
}
#define OSPREY_MODELS_ON_DEVICES(models) \
  ::testing::ValuesIn(::osprey::testing::model_cases(models)), ::osprey::testing::model_case_name

// The fixture of a test parameterised by a device (a name of devices() or device_levels(), or
// a ModelCase). SetUp selects the device (and the CPU kernels' level, restored after the test)
// or skips, saying why; a fixture that overrides SetUp calls DeviceTestOf::SetUp() first and
// returns when IsSkipped().
template <class Param>
class DeviceTestOf : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const std::string& name = device_of(this->GetParam());
    if (name == "cuda") {
      if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_description();
      device_ = Device::cuda(0);
    } else if (name != "cpu") {
      if (const std::string skip = enter_device_param(name, cpu_level_); !skip.empty()) GTEST_SKIP() << skip;
    }
  }

  const Device& device() const { return device_; }
  bool on_cuda() const { return !device_.is_cpu(); }

  // A [shape] array of `dtype` on the device, from host elements of the same size.
  template <class T>
  Array upload(const std::vector<T>& v, const Shape& shape, DType dtype) const {
    Array a = Array::empty(shape, dtype);
    if (size_t(a.nbytes()) != v.size() * sizeof(T)) ADD_FAILURE() << "upload: size mismatch";
    std::memcpy(a.raw(), v.data(), std::min(size_t(a.nbytes()), v.size() * sizeof(T)));
    return ops::to_device(a, device_);
  }
  Array on_device(const std::vector<float>& v, const Shape& shape) const { return upload(v, shape, DType::f32); }
  Array on_device(const Array& host_array) const { return ops::to_device(host_array, device_); }

  // The elements of `a` on the host, in row-major order (a strided view is gathered first).
  template <class T>
  static std::vector<T> download(const Array& a) {
    Array h = ops::to_device(a.is_contiguous() ? a : ops::cast(a, a.dtype()), Device::cpu());
    return {h.data<T>(), h.data<T>() + h.numel()};
  }
  // The values of a floating-point array of any dtype as f32 on the host.
  static std::vector<float> host(const Array& a) {
    return download<float>(a.dtype() == DType::f32 ? a : ops::cast(a, DType::f32));
  }

 private:
  Device device_ = Device::cpu();
  std::optional<ScopedCpuLevel> cpu_level_;  // the kernels' level on a cpu_<level> parameter
};

using DeviceTest = DeviceTestOf<std::string>;

}  // namespace osprey::testing
