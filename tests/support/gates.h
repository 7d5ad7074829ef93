// The strict gates the model tests share with the bench (bench/compare.py): a session's loss within 1e-4
// relative and every parameter gradient ("grad.<name>" outputs) within 1e-3 rel-L2 of a PyTorch reference's
// tensors of the same names.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "mgn/safetensors.h"
#include "mgn/session.h"
#include "support/test_util.h"

namespace mgn::test {

// `params`: a map keyed by parameter name (its values are not read).
template <class Params>
void expect_loss_and_gradients(Session& s, const std::map<std::string, StoredTensor>& ref, const Params& params) {
  const std::string who = s.backend();
  const double loss = ref.at("loss").to_f64()[0];
  EXPECT_NEAR(s.read_scalar("loss"), loss, 1e-4 * std::fabs(loss)) << who;
  for (const auto& [name, unused] : params) {
    const std::vector<float> g = s.read("grad." + name);
    EXPECT_LT(rel_l2(std::vector<double>(g.begin(), g.end()), ref.at("grad." + name).to_f64()), 1e-3)
        << who << " " << name;
  }
}

}  // namespace mgn::test
