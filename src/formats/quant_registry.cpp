// The registry of quantization methods (formats/quant_method.h): one line per method, in the
// order detection asks them. A new method is its own file and a line here.
#include "core/error.h"
#include "formats/quant_method.h"
#include "formats/safetensors.h"

namespace osprey {

// Each method's file defines its one object.
const QuantMethod& awq_method();
const QuantMethod& gptq_method();
const QuantMethod& gguf_q8_0_method();
const QuantMethod& gguf_q4_0_method();
const QuantMethod& gguf_q4_1_method();
const QuantMethod& gguf_q5_0_method();
const QuantMethod& gguf_q5_1_method();
const QuantMethod& gguf_q4_k_method();
const QuantMethod& gguf_q5_k_method();
const QuantMethod& gguf_q6_k_method();

const std::vector<const QuantMethod*>& quant_methods() {
  // Formats that name their own tensors (AWQ's and GPTQ's .qweight, FP8's float8 .weight)
  // first; GGUF's block types (by the type config.json records for a repacked module) before
  // MLX affine's .scales and .biases, which their repacked tensors also are; a float .weight last.
  static const std::vector<const QuantMethod*> methods = {
      &awq_method(),     // quant_awq.cpp
      &gptq_method(),    // quant_gptq.cpp
      &fp8_method(),     // quant_fp8.cpp
      &gguf_q8_0_method(), &gguf_q4_0_method(), &gguf_q4_1_method(), &gguf_q5_0_method(),  // quant_gguf.cpp
      &gguf_q5_1_method(), &gguf_q4_k_method(), &gguf_q5_k_method(), &gguf_q6_k_method(),  // quant_gguf.cpp
      &affine_method(),  // quant_affine.cpp
      &dense_method(),   // quant_dense.cpp
  };
  return methods;
}

const QuantMethod& quant_method_for(const SafeTensors& st, const QuantConfig& quant, const std::string& prefix) {
  for (const QuantMethod* m : quant_methods())
    if (m->claims(st, quant, prefix)) return *m;
  // No method reads the layout: it is one the config does not declare.
  const HubQuant& hq = quant.hub;
  const std::string weight = prefix + ".weight";
  if (hq.present() && st.contains(prefix + ".qweight"))
    throw InvalidInput("tensor " + prefix + ".qweight is an AWQ or GPTQ weight, but " + hq.where +
                       " names quant_method \"" + hq.name + "\"");
  if (st.contains(weight) && st.info(weight).float8_e4m3) {
    if (hq.present())
      throw InvalidInput("tensor " + weight + " is float8_e4m3fn, but " + hq.where + " names quant_method \"" +
                         hq.name + "\"");
    throw InvalidInput("tensor " + weight + " is float8_e4m3fn " + st.info(weight).shape.str() +
                       ", but config.json has no quantization_config naming an FP8 method (compressed-tensors, "
                       "fbgemm_fp8, fp8, modelopt) and there is no hf_quant_config.json");
  }
  throw InvalidInput("module " + prefix + ": no quantization method reads its tensors (in " + st.source().string() +
                     ")");
}

const QuantMethod& method_of(const LinearWeight& w) {
  // Every handle is made by a QuantMethod (the registry's objects and the factories above).
  return static_cast<const QuantMethod&>(w.method());
}

}  // namespace osprey
