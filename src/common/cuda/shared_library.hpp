// A shared library of the CUDA toolkit loaded at run time (dlopen) and kept open for the process, its functions bound
// by name: how fp8kit reaches cuBLASLt and NCCL without linking them (linked, every program of a CUDA build would load
// them at start, 0.13 s for cuBLASLt's 500 MB, and refuse to start where they are missing). Host code, CUDA builds.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

namespace fp8kit::cuda_detail {

class SharedLibrary {
 public:
  // The first of `names` that loads; Error(kUnsupported) "CUDA: <what> could not be loaded (<the loader's message>):
  // <how>" when none does.
  SharedLibrary(std::initializer_list<std::string> names, std::string_view what, std::string_view how);
  // fn = the function `name`; Error(kUnsupported) naming it and the library when it has none (`how` says what to
  // install).
  template <typename Fn>
  void bind(const char* name, Fn& fn, std::string_view how) const {
    fn = reinterpret_cast<Fn>(symbol(name, how));
  }
  const std::string& name() const { return name_; }

 private:
  void* symbol(const char* name, std::string_view how) const;
  void* handle_ = nullptr;
  std::string name_;
};

}  // namespace fp8kit::cuda_detail
