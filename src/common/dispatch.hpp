// Internal: the one dispatch mechanism of every kernel family: a table of kernels per ISA level, and the pick for
// the level in force (active_isa(): the CPU's best, capped by FP8KIT_ISA or set_max_isa()).
#pragma once

#include <array>
#include <cstddef>

#include "fp8kit/common/cpu.hpp"

namespace fp8kit::detail {

// A family's tables, indexed by level. A level without a table of its own runs the nearest one below it;
// scalar always has one. Every table type has `std::string_view name` (the kernel's name, as `fp8kit info` prints
// it) and `Isa isa` (the level it needs).
template <typename Table>
class IsaTables {
 public:
  using Entries = std::array<const Table*, kAllIsas.size()>;
  explicit IsaTables(const Entries& tables) : tables_(tables) {}

  // The table of the highest level <= isa that has one.
  const Table& at(Isa isa) const {
    for (auto level = static_cast<std::size_t>(isa); level > 0; --level) {
      if (tables_[level] != nullptr) return *tables_[level];
    }
    return *tables_[0];
  }
  // The table for the level in force now.
  const Table& active() const { return at(active_isa()); }
  // The table written for exactly this level, or nullptr.
  const Table* written_for(Isa isa) const { return tables_[static_cast<std::size_t>(isa)]; }

 private:
  Entries tables_;
};

}  // namespace fp8kit::detail
