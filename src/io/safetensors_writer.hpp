// The writer's step below write_safetensors, for writers of several files that commit them together
// (write_sharded_safetensors): it validates and streams one file image into an AtomicFile without committing.
#pragma once

#include <map>
#include <span>
#include <string>

#include "fp8kit/io/atomic_file.hpp"
#include "fp8kit/io/safetensors.hpp"

namespace fp8kit::detail {

// Validates `entries` and `metadata` as serialize_safetensors does, then writes the image into `file`.
void write_safetensors_to(AtomicFile& file, std::span<const SafetensorsEntry> entries,
                          const std::map<std::string, std::string>& metadata);

}  // namespace fp8kit::detail
