// A GGUF writer for tests that shares no code with the reader: fields are appended as raw
// little-endian bytes, so a test can write a good file or break any field on purpose.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace hack::test {

class GgufWriter {
 public:
  // Value type codes of the GGUF spec.
  enum : uint32_t { u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8,
                    array = 9, u64 = 10, i64 = 11, f64 = 12 };

  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;  // ggml order
    uint32_t ggml_type;
    std::vector<unsigned char> data;
  };

  uint32_t version = 3;
  uint32_t alignment = 32;  // used for the data section; write general.alignment yourself to change it

  /// Metadata: key, type code, then the value's raw bytes (use the put_* helpers).
  void kv(const std::string& key, uint32_t type, const std::vector<unsigned char>& value) {
    put_string(kv_bytes_, key);
    put(kv_bytes_, type);
    kv_bytes_.insert(kv_bytes_.end(), value.begin(), value.end());
    ++n_kv_;
  }
  template <class T>
  void kv_scalar(const std::string& key, uint32_t type, T v) {
    std::vector<unsigned char> b;
    put(b, v);
    kv(key, type, b);
  }
  void kv_string(const std::string& key, const std::string& v) {
    std::vector<unsigned char> b;
    put_string(b, v);
    kv(key, string, b);
  }
  void kv_strings(const std::string& key, const std::vector<std::string>& v) {
    std::vector<unsigned char> b;
    put(b, uint32_t{string});
    put(b, static_cast<uint64_t>(v.size()));
    for (const std::string& s : v) put_string(b, s);
    kv(key, array, b);
  }
  template <class T>
  void kv_array(const std::string& key, uint32_t elem_type, const std::vector<T>& v) {
    std::vector<unsigned char> b;
    put(b, elem_type);
    put(b, static_cast<uint64_t>(v.size()));
    for (const T& x : v) put(b, x);
    kv(key, array, b);
  }

  void tensor(Tensor t) { tensors_.push_back(std::move(t)); }

  /// The file's bytes; tensor offsets are laid out at `alignment` unless `offsets` overrides.
  std::vector<unsigned char> bytes(const std::vector<uint64_t>& offsets = {}) const {
    std::vector<unsigned char> out;
    put(out, uint32_t{0x46554747});
    put(out, version);
    put(out, static_cast<uint64_t>(tensors_.size()));
    put(out, n_kv_);
    out.insert(out.end(), kv_bytes_.begin(), kv_bytes_.end());
    std::vector<uint64_t> at;
    uint64_t next = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      at.push_back(i < offsets.size() ? offsets[i] : next);
      next = (at.back() + t.data.size() + alignment - 1) / alignment * alignment;
      put_string(out, t.name);
      put(out, static_cast<uint32_t>(t.ne.size()));
      for (uint64_t n : t.ne) put(out, n);
      put(out, t.ggml_type);
      put(out, at.back());
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
    const size_t data = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const size_t end = data + at[i] + tensors_[i].data.size();
      if (out.size() < end) out.resize(end, 0);
      if (!tensors_[i].data.empty())
        std::memcpy(out.data() + data + at[i], tensors_[i].data.data(), tensors_[i].data.size());
    }
    return out;
  }

  void write(const std::filesystem::path& path) const {
    const std::vector<unsigned char> b = bytes();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }

  template <class T>
  static void put(std::vector<unsigned char>& out, T v) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.insert(out.end(), b, b + sizeof(T));
  }
  template <class T>
  static std::vector<unsigned char> bytes_of(const std::vector<T>& values) {
    std::vector<unsigned char> out(values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
    return out;
  }
  static void put_string(std::vector<unsigned char>& out, const std::string& s) {
    put(out, static_cast<uint64_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }

 private:
  uint64_t n_kv_ = 0;
  std::vector<unsigned char> kv_bytes_;
  std::vector<Tensor> tensors_;
};

}  // namespace hack::test
