// libFuzzer target: a GGUF file from an untrusted source (core/gguf_file.h). Parse the bytes;
// when they parse, read every metadata value through its accessors and open every tensor,
// dequantizing its first row, as Model::load would.
//
// Oracle: parsing and reading either succeed or throw hack::Error; ASan/UBSan catch any read
// outside the input.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "hack/core/error.h"
#include "hack/core/gguf_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = std::make_shared<std::vector<unsigned char>>(data, data + size);
  try {
    const hack::GgufFile g =
        hack::GgufFile::parse(std::span<const unsigned char>(bytes->data(), bytes->size()), bytes, "fuzz.gguf");
    for (const auto& [key, value] : g.metadata()) {
      try {
        (void)value.as_int(key);
      } catch (const hack::Error&) {
      }
      try {
        (void)value.as_strings(key);
      } catch (const hack::Error&) {
      }
    }
    for (const hack::GgufTensorInfo& t : g.tensors()) {
      try {
        const hack::Tensor x = g.tensor(t);
        const size_t row = static_cast<size_t>(x.dim(x.ndim() - 1));
        if (row <= (size_t{1} << 16)) {
          std::vector<float> out(row);
          hack::convert_to_f32(x.dtype(), x.raw(), out.data(), row);
        }
      } catch (const hack::Error&) {
      }
    }
  } catch (const hack::Error&) {
  }
  return 0;
}
