// Text from untrusted sources (file names, keys, metadata, tensor names) made safe to print on one line: what an
// error message or a progress line quotes of a file can never write control sequences to the user's terminal.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fp8kit {

// Printable ASCII as is; a backslash as \\ and every other byte (control characters, ESC, DEL, each byte of a
// multi-byte or invalid UTF-8 sequence) as \xNN; cut after `limit` bytes with "...".
std::string printable(std::string_view text, std::size_t limit = 120);
// printable(text) in single quotes: 'w'.
std::string quoted(std::string_view text);

}  // namespace fp8kit
