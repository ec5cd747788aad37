// The headers most test objects read, parsed once per set of compile flags into a precompiled
// header (Makefile: TEST_PCH) instead of once per object, about a second of the compiler each.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>
