// The one shape of a refusal test: the call throws fp8kit::Error of the given kind, in one line, naming each part.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>

#include "fp8kit/common/error.hpp"

namespace fp8kit::testing {

template <class Call>
void expect_error(Call&& call, ErrorKind kind, std::initializer_list<std::string_view> parts,
                  const std::string& context = "") {
  try {
    call();
    ADD_FAILURE() << context << ": no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), kind) << context << ": " << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << context << ": " << what;
    for (std::string_view part : parts) EXPECT_NE(what.find(part), std::string::npos) << context << ": " << what;
  }
}

}  // namespace fp8kit::testing
