// Shared test helpers: relative errors and deterministic random data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mgn::test {

// ||a - b|| / ||b||; 0 when both are zero. Sizes must match.
double rel_l2(const std::vector<double>& a, const std::vector<double>& b);
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b);
std::vector<double> random_normal(size_t n, uint64_t seed, double scale = 1.0);
std::vector<double> random_uniform(size_t n, uint64_t seed, double lo, double hi);

}  // namespace mgn::test
