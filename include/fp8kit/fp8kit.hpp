// Everything public in fp8kit, in one include.
#pragma once

#include "fp8kit/codec.hpp"
#include "fp8kit/convert.hpp"
#include "fp8kit/cpu.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/float8.hpp"
#include "fp8kit/format.hpp"
#include "fp8kit/half.hpp"
#include "fp8kit/version.hpp"
