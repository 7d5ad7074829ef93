// Shared pieces of the NNEF importer: the syntax tree of a flat graph.nnef document and its parser.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mgn/nnef.h"

namespace mgn::nnef_impl {

// One expression: a literal, an identifier, an array, a tuple, or an operation call `op<generic>(args)`
// (nested calls are the compositional form of KHR_enable_operator_expressions).
struct Expr {
  enum class Kind : uint8_t { Id, Int, Float, Bool, Str, Array, Tuple, Call };
  Kind kind = Kind::Int;
  std::string s;  // identifier, string, or the called op
  double num = 0;  // Int and Float
  bool b = false;
  std::vector<Expr> items;         // elements, or a call's arguments (positional first)
  std::vector<std::string> names;  // a call's argument names, parallel to items ("" for positional ones)
  std::string generic;             // a call's type argument, "" when none
  int line = 0, col = 0;
};
const char* kind_name(Expr::Kind k);

// `lhs = op<generic>(positional..., name = value...);`
struct Stmt {
  Expr lhs;
  Expr call;  // Kind::Call
};

struct Document {
  std::string version;
  std::vector<std::string> extensions;
  std::string name;
  std::vector<std::string> inputs, outputs;
  std::vector<Stmt> stmts;
};

// Throws mgn::Error "origin:line:col: what" for any syntax error.
Document parse(const std::string& text, const std::string& origin);

}  // namespace mgn::nnef_impl
