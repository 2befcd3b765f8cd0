// TensorBuffer<T>: a growable array of T on tensor storage, with the few vector operations its users need: where
// ScaledTensor keeps its FP8 codes and scales, so that the allocation accounting (and, with the CUDA backend, the
// device) applies to them as to every Tensor.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <utility>

#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {

// The elements live in a 1-D Tensor of `capacity()` elements (64-byte aligned, counted by memory_stats(), on the
// CPU); the first size() of them are the buffer. Copies are deep (a buffer is a value, as std::vector is); moves
// take the storage. resize() value-initializes new elements (zero) and reallocates only to grow.
template <ElementType T>
class TensorBuffer {
 public:
  TensorBuffer() = default;
  TensorBuffer(const TensorBuffer& other) { *this = other; }
  TensorBuffer& operator=(const TensorBuffer& other) {
    if (this == &other) return *this;
    reserve_exactly(other.size_);
    size_ = other.size_;
    if (size_ != 0) std::memcpy(ptr_, other.ptr_, size_ * sizeof(T));
    return *this;
  }
  TensorBuffer(TensorBuffer&& other) noexcept
      : storage_(std::move(other.storage_)),
        ptr_(std::exchange(other.ptr_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        capacity_(std::exchange(other.capacity_, 0)) {}
  TensorBuffer& operator=(TensorBuffer&& other) noexcept {
    if (this == &other) return *this;
    storage_ = std::move(other.storage_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    return *this;
  }

  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  T* begin() { return ptr_; }
  T* end() { return ptr_ + size_; }
  const T* begin() const { return ptr_; }
  const T* end() const { return ptr_ + size_; }
  T& operator[](std::size_t i) { return ptr_[i]; }
  const T& operator[](std::size_t i) const { return ptr_[i]; }

  TensorBuffer(std::initializer_list<T> values) { assign(values.begin(), values.end()); }
  TensorBuffer& operator=(std::initializer_list<T> values) {
    assign(values.begin(), values.end());
    return *this;
  }

  // Capacity for n elements, keeping the contents (a new storage when it grows).
  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    TensorBuffer grown;
    grown.reserve_exactly(n);
    if (size_ != 0) std::memcpy(grown.data(), ptr_, size_ * sizeof(T));
    grown.size_ = size_;
    *this = std::move(grown);
  }
  // n elements; new ones are `value` (zero by default).
  void resize(std::size_t n, const T& value = T{}) {
    reserve(n);
    if (n > size_) std::fill(ptr_ + size_, ptr_ + n, value);
    size_ = n;
  }
  void assign(std::size_t n, const T& value) {
    clear();
    resize(n, value);
  }
  template <std::input_iterator It>
  void assign(It first, It last) {
    clear();
    if constexpr (std::forward_iterator<It>) {  // one storage of the right size, then a plain copy
      const auto n = static_cast<std::size_t>(std::distance(first, last));
      reserve_exactly(n);
      std::transform(first, last, ptr_, [](const auto& v) { return static_cast<T>(v); });
      size_ = n;
    } else {
      for (; first != last; ++first) push_back(static_cast<T>(*first));
    }
  }
  void push_back(const T& value) {
    if (size_ == capacity_) reserve(std::max<std::size_t>(16, 2 * capacity_));
    ptr_[size_++] = value;
  }
  void pop_back() { --size_; }
  void clear() { size_ = 0; }

  // The storage (capacity() elements; the buffer is its first size()).
  const Tensor& storage() const { return storage_; }

  friend bool operator==(const TensorBuffer& a, const TensorBuffer& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  // Fresh storage of exactly n elements when the current one is smaller (the contents are not kept).
  void reserve_exactly(std::size_t n) {
    if (n <= capacity_) return;
    storage_ = fp8kit::empty({static_cast<std::int64_t>(n)}, detail::kDTypeFor<T>);
    ptr_ = storage_.template data<T>();
    capacity_ = n;
  }

  Tensor storage_;
  T* ptr_ = nullptr;
  std::size_t size_ = 0, capacity_ = 0;
};

}  // namespace fp8kit
