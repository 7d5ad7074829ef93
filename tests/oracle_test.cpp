// PyTorch oracle tests for the CPU reference executor: every case file written by tests/oracle/gen_oracle.py
// (PyTorch, float64 on f32-rounded inputs) is rebuilt with the builder API, run on the CPU executor in f32
// mode and compared by relative L2 error with the case's tolerance. A coverage test fails when an IR op
// appears in no case's graph.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "backend/cpu/executor.h"
#include "ir/graph.h"
#include "oracle/registry.h"
#include "support/test_util.h"

using namespace mgn;

namespace {

std::vector<std::string> all_cases() {
  try {
    return oracle::case_files(MGN_ORACLE_DIR);
  } catch (const Error&) {
    return {};
  }
}

std::string case_label(const testing::TestParamInfo<std::string>& info) {
  std::string s = std::filesystem::path(info.param).stem().string();
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

void feed(cpu::Executor& ex, const oracle::Case& c) {
  for (size_t i = 0; i < c.inputs.size(); ++i)
    ex.set_input("in." + std::to_string(i), c.input_values[i].to_f64());
}

}  // namespace

TEST(Oracle, CasesExist) {
  auto files = all_cases();
  ASSERT_GT(files.size(), 100u) << "oracle data missing in " << MGN_ORACLE_DIR;
}

class OracleForward : public testing::TestWithParam<std::string> {};

TEST_P(OracleForward, CpuMatchesPyTorch) {
  oracle::Case c = oracle::load_case(GetParam());
  cpu::Executor ex(c.graph->ir());
  feed(ex, c);
  ex.run();
  const cpu::Buffer& out = ex.output("out");
  ASSERT_EQ(out.shape, c.expected.shape) << c.name;
  std::vector<double> want = c.expected.to_f64();
  ASSERT_EQ(out.v.size(), want.size());
  if (out.dtype == DType::I32 || out.dtype == DType::Bool) {
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(out.v[i], want[i]) << c.name << " element " << i;
  } else {
    for (double v : out.v) ASSERT_TRUE(std::isfinite(v)) << c.name << ": non-finite output";
    double err = test::rel_l2(out.v, want);
    EXPECT_LE(err, c.tol) << c.name << ": relative L2 error " << err;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, OracleForward, testing::ValuesIn(all_cases()), case_label);

// Every op of the IR must be exercised by at least one oracle case (forward cases, and the derivative
// ops through their own cases). Exempt: sources and assign, which have no PyTorch counterpart and are
// covered by the executor and training tests.
TEST(Oracle, EveryOpIsCovered) {
  std::set<ir::Op> seen;
  for (const std::string& f : all_cases()) {
    oracle::Case c = oracle::load_case(f);
    for (const ir::Node& n : c.graph->ir().nodes()) seen.insert(n.op);
  }
  const std::set<ir::Op> exempt = {ir::Op::Input, ir::Op::Parameter, ir::Op::Constant, ir::Op::Full,
                                   ir::Op::Assign};
  std::vector<std::string> missing;
  for (int i = 0; i < ir::kOpCount; ++i) {
    ir::Op op = ir::Op(i);
    if (!seen.count(op) && !exempt.count(op)) missing.push_back(ir::op_name(op));
  }
  std::string list;
  for (const auto& m : missing) list += " " + m;
  EXPECT_TRUE(missing.empty()) << "ops without an oracle case:" << list;
}
