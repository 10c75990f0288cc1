#include "hack/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "hack/core/error.h"
#include "src/core/device_memory.h"

namespace hack {

std::string_view memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::host: return "host";
    case MemoryKind::pinned: return "pinned";
    case MemoryKind::device: return "device";
    case MemoryKind::borrowed: return "borrowed";
  }
  return "?";
}

Buffer Buffer::allocate(MemoryKind kind, size_t bytes, int device_index) {
  Buffer b;
  b.kind_ = kind;
  b.bytes_ = bytes;
  b.device_index_ = device_index;
  const size_t alloc_bytes = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  switch (kind) {
    case MemoryKind::host:
      b.data_ = std::aligned_alloc(64, alloc_bytes);
      HACK_CHECK(b.data_ != nullptr, "host allocation of {} bytes failed", bytes);
      std::memset(b.data_, 0, alloc_bytes);
      break;
    case MemoryKind::pinned: b.data_ = detail::pinned_alloc(alloc_bytes); break;
    case MemoryKind::device: b.data_ = detail::device_alloc(alloc_bytes, device_index); break;
    case MemoryKind::borrowed: fail("Buffer::allocate cannot allocate borrowed memory");
  }
  return b;
}

Buffer Buffer::borrow(void* data, size_t bytes, std::shared_ptr<const void> keepalive) {
  Buffer b;
  b.kind_ = MemoryKind::borrowed;
  b.data_ = data;
  b.bytes_ = bytes;
  b.keepalive_ = std::move(keepalive);
  return b;
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      kind_(o.kind_),
      device_index_(o.device_index_),
      keepalive_(std::move(o.keepalive_)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    kind_ = o.kind_;
    device_index_ = o.device_index_;
    keepalive_ = std::move(o.keepalive_);
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() noexcept {
  if (data_ == nullptr) return;
  switch (kind_) {
    case MemoryKind::host: std::free(data_); break;
    case MemoryKind::pinned: detail::pinned_free(data_); break;
    case MemoryKind::device: detail::device_free(data_, device_index_); break;
    case MemoryKind::borrowed: break;
  }
  data_ = nullptr;
  keepalive_.reset();
}

namespace {
Tensor::Shape to_shape(std::initializer_list<int64_t> dims, int* ndim) {
  HACK_CHECK(dims.size() <= Tensor::kMaxDims, "tensor rank {} exceeds {}", dims.size(), Tensor::kMaxDims);
  Tensor::Shape s{0, 0, 0, 0};
  size_t i = 0;
  for (int64_t d : dims) {
    HACK_CHECK(d >= 0, "negative tensor dim {}", d);
    s[i++] = d;
  }
  *ndim = static_cast<int>(dims.size());
  return s;
}
// A block type's rows are whole blocks: the last dim is a multiple of the block.
void check_whole_blocks(DType dtype, const Tensor::Shape& shape, int ndim) {
  const size_t block = dtype_block_elems(dtype);
  if (block == 1) return;
  HACK_CHECK(ndim >= 1 && shape[static_cast<size_t>(ndim - 1)] % static_cast<int64_t>(block) == 0,
             "a {} tensor's rows must be whole blocks of {} elements (last dim {})", dtype_name(dtype), block,
             ndim >= 1 ? shape[static_cast<size_t>(ndim - 1)] : 0);
}

}  // namespace

int64_t Tensor::numel() const {
  if (ndim_ == 0) return buffer_ ? 1 : 0;
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= shape_[static_cast<size_t>(i)];
  return n;
}

Tensor Tensor::empty(DType dtype, std::initializer_list<int64_t> shape, MemoryKind kind) {
  int ndim = 0;
  Tensor::Shape s = to_shape(shape, &ndim);
  return empty(dtype, s, ndim, kind);
}

Tensor Tensor::empty(DType dtype, const Shape& shape, int ndim, MemoryKind kind) {
  check_whole_blocks(dtype, shape, ndim);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.ndim_ = ndim;
  t.buffer_ = std::make_shared<Buffer>(Buffer::allocate(kind, t.bytes()));
  return t;
}

Tensor Tensor::view(DType dtype, std::initializer_list<int64_t> shape, const void* data,
                    std::shared_ptr<const void> keepalive) {
  int ndim = 0;
  Tensor::Shape s = to_shape(shape, &ndim);
  return view(dtype, s, ndim, data, std::move(keepalive));
}

Tensor Tensor::view(DType dtype, const Shape& shape, int ndim, const void* data,
                    std::shared_ptr<const void> keepalive) {
  check_whole_blocks(dtype, shape, ndim);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.ndim_ = ndim;
  t.buffer_ = std::make_shared<Buffer>(Buffer::borrow(const_cast<void*>(data), t.bytes(), std::move(keepalive)));
  return t;
}

std::string Tensor::describe() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape_[static_cast<size_t>(i)]);
  }
  s += "] ";
  s += dtype_name(dtype_);
  return s;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t count) const {
  HACK_CHECK(ndim_ >= 1 && begin >= 0 && count >= 0 && begin + count <= shape_[0],
             "slice_rows({}, {}) out of range for {}", begin, count, describe());
  Tensor t = *this;
  t.shape_[0] = count;
  t.offset_bytes_ += static_cast<size_t>(begin) * (bytes() / static_cast<size_t>(shape_[0] ? shape_[0] : 1));
  return t;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> shape) const {
  int ndim = 0;
  Tensor::Shape s = to_shape(shape, &ndim);
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= s[static_cast<size_t>(i)];
  HACK_CHECK(n == numel(), "reshape of {} to {} elements", describe(), n);
  check_whole_blocks(dtype_, s, ndim);
  Tensor t = *this;
  t.shape_ = s;
  t.ndim_ = ndim;
  return t;
}

}  // namespace hack
