/// @file tensor.h
/// @brief Buffers (host, pinned, device memory, or a borrowed view such as an mmap) and
/// Tensor, a typed view of up to 4 dims into a buffer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>

#include "hack/core/dtype.h"

namespace hack {

enum class MemoryKind : uint8_t {
  host,      ///< pageable host memory, 64-byte aligned
  pinned,    ///< page-locked host memory (cudaMallocHost); needs the CUDA build
  device,    ///< GPU memory (cudaMalloc); needs the CUDA build and a device
  borrowed,  ///< memory owned by someone else (an mmap, a caller's array)
};

std::string_view memory_kind_name(MemoryKind k);

/// An owned (or borrowed) span of bytes. Move-only RAII.
class Buffer {
 public:
  Buffer() = default;
  /// Allocates `bytes` of the given kind (device: on `device_index`). Throws hack::Error.
  static Buffer allocate(MemoryKind kind, size_t bytes, int device_index = 0);
  /// Wraps memory owned elsewhere; `keepalive` holds its owner (may be null).
  static Buffer borrow(void* data, size_t bytes, std::shared_ptr<const void> keepalive);

  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemoryKind kind() const { return kind_; }
  int device_index() const { return device_index_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::host;
  int device_index_ = 0;
  std::shared_ptr<const void> keepalive_;
};

/// A typed, row-major view of up to 4 dims. Copies share the buffer.
class Tensor {
 public:
  static constexpr int kMaxDims = 4;
  using Shape = std::array<int64_t, kMaxDims>;

  Tensor() = default;
  /// New zero-initialised host tensor (or uninitialised pinned/device tensor).
  static Tensor empty(DType dtype, std::initializer_list<int64_t> shape, MemoryKind kind = MemoryKind::host);
  static Tensor empty(DType dtype, const Shape& shape, int ndim, MemoryKind kind = MemoryKind::host);
  /// View of borrowed memory, kept alive by `keepalive`. A block type's last dim must be a
  /// multiple of its block (dtype_block_elems), as every constructor checks.
  static Tensor view(DType dtype, std::initializer_list<int64_t> shape, const void* data,
                     std::shared_ptr<const void> keepalive);
  static Tensor view(DType dtype, const Shape& shape, int ndim, const void* data,
                     std::shared_ptr<const void> keepalive);

  bool defined() const { return buffer_ != nullptr; }
  DType dtype() const { return dtype_; }
  int ndim() const { return ndim_; }
  int64_t dim(int i) const { return shape_[static_cast<size_t>(i)]; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const;
  /// Bytes of the elements; a block type (dtype_is_quantized) holds whole blocks per row.
  size_t bytes() const { return dtype_bytes(dtype_, static_cast<size_t>(numel())); }
  MemoryKind memory_kind() const { return buffer_ ? buffer_->kind() : MemoryKind::host; }
  /// "[4096, 2048] bf16"
  std::string describe() const;

  void* raw() const { return static_cast<char*>(buffer_->data()) + offset_bytes_; }
  template <class T>
  T* data() const { return static_cast<T*>(raw()); }

  /// Rows [begin, begin + count) of dim 0, sharing the buffer.
  Tensor slice_rows(int64_t begin, int64_t count) const;
  /// Same bytes, new shape (numel must match).
  Tensor reshape(std::initializer_list<int64_t> shape) const;

 private:
  std::shared_ptr<Buffer> buffer_;
  size_t offset_bytes_ = 0;
  DType dtype_ = DType::f32;
  Shape shape_{0, 0, 0, 0};
  int ndim_ = 0;
};

/// Whether this process was built with CUDA and sees at least one device.
bool cuda_device_available();

}  // namespace hack
