// The graph.nnef text: a lexer (identifiers, numbers, strings, punctuation, `#` comments) and a recursive
// descent parser of the flat syntax — `version`, `extension` lines, one `graph` with its inputs and outputs
// and a body of `lhs = op<type>(args, key = value);` statements. Every error carries line:column.
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "io/nnef/nnef_internal.h"

namespace mgn::nnef_impl {

const char* kind_name(Expr::Kind k) {
  switch (k) {
    case Expr::Kind::Id: return "an identifier";
    case Expr::Kind::Int: return "an integer";
    case Expr::Kind::Float: return "a number";
    case Expr::Kind::Bool: return "a logical";
    case Expr::Kind::Str: return "a string";
    case Expr::Kind::Array: return "an array";
    case Expr::Kind::Tuple: return "a tuple";
    case Expr::Kind::Call: return "an operation call";
  }
  return "?";
}

namespace {

// Nesting depth of arrays/tuples: a bound keeps hostile input from exhausting the stack.
constexpr int kMaxDepth = 64;

struct Token {
  enum class T : uint8_t { Id, Int, Float, Str, Punct, End };
  T t = T::End;
  std::string text;
  double num = 0;
  int line = 1, col = 1;
};

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& origin) : src_(src), origin_(origin) {}

  Token next() {
    skip_space();
    Token k;
    k.line = line_;
    k.col = col_;
    if (pos_ >= src_.size()) return k;
    char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t b = pos_;
      while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) adv();
      k.t = Token::T::Id;
      k.text = src_.substr(b, pos_ - b);
      return k;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) ||
        ((c == '-' || c == '.') && pos_ + 1 < src_.size() &&
         (std::isdigit(static_cast<unsigned char>(src_[pos_ + 1])) || (c == '-' && src_[pos_ + 1] == '.')))) {
      size_t b = pos_;
      bool is_float = false;
      if (c == '-') adv();
      while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) adv();
      if (pos_ < src_.size() && src_[pos_] == '.') {
        is_float = true;
        adv();
        while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) adv();
      }
      if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
        is_float = true;
        adv();
        if (pos_ < src_.size() && (src_[pos_] == '+' || src_[pos_] == '-')) adv();
        if (pos_ >= src_.size() || !std::isdigit(static_cast<unsigned char>(src_[pos_])))
          fail(k, "malformed number exponent");
        while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) adv();
      }
      k.text = src_.substr(b, pos_ - b);
      k.t = is_float ? Token::T::Float : Token::T::Int;
      k.num = std::strtod(k.text.c_str(), nullptr);
      if (!std::isfinite(k.num)) fail(k, "number '" + k.text + "' is out of range");
      if (!is_float && std::fabs(k.num) > 9.0e15) fail(k, "integer '" + k.text + "' is out of range");
      return k;
    }
    if (c == '\'' || c == '"') {
      adv();
      size_t b = pos_;
      while (pos_ < src_.size() && src_[pos_] != c && src_[pos_] != '\n') adv();
      if (pos_ >= src_.size() || src_[pos_] != c) fail(k, "unterminated string");
      k.t = Token::T::Str;
      k.text = src_.substr(b, pos_ - b);
      adv();
      return k;
    }
    if (c == '-' && pos_ + 1 < src_.size() && src_[pos_ + 1] == '>') {
      adv();
      adv();
      k.t = Token::T::Punct;
      k.text = "->";
      return k;
    }
    if (std::string("()[]{},;=<>:").find(c) != std::string::npos) {
      adv();
      k.t = Token::T::Punct;
      k.text = std::string(1, c);
      return k;
    }
    std::string shown = std::isprint(static_cast<unsigned char>(c)) ? std::string(1, c)
                                                                     : "\\x" + std::to_string(int(static_cast<unsigned char>(c)));
    fail(k, "unexpected character '" + shown + "'");
  }

  [[noreturn]] void fail(const Token& at, const std::string& what) const {
    throw Error(origin_ + ":" + std::to_string(at.line) + ":" + std::to_string(at.col) + ": " + what);
  }

 private:
  void adv() {
    if (src_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }
  void skip_space() {
    while (pos_ < src_.size()) {
      char c = src_[pos_];
      if (c == '#') {
        while (pos_ < src_.size() && src_[pos_] != '\n') adv();
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        adv();
      } else {
        break;
      }
    }
  }
  const std::string& src_;
  const std::string& origin_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
};

class Parser {
 public:
  Parser(const std::string& text, const std::string& origin) : lex_(text, origin) { tok_ = lex_.next(); }

  Document document() {
    Document d;
    expect_id("version");
    if (tok_.t != Token::T::Float && tok_.t != Token::T::Int) fail("expected a version number after 'version'");
    d.version = tok_.text;
    take();
    expect(";");
    while (is_id("extension")) {
      take();
      for (;;) {
        if (tok_.t != Token::T::Id) fail("expected an extension name");
        d.extensions.push_back(tok_.text);
        take();
        if (!is_punct(",")) break;
        take();
      }
      expect(";");
    }
    if (is_id("fragment"))
      fail("fragment definitions are not supported (export the graph flat, without KHR_enable_fragment_definitions)");
    expect_id("graph");
    if (tok_.t != Token::T::Id) fail("expected the graph's name");
    d.name = tok_.text;
    take();
    d.inputs = id_list();
    expect("->");
    d.outputs = id_list();
    expect("{");
    while (!is_punct("}")) {
      if (tok_.t == Token::T::End) fail("unexpected end of file: the graph body has no closing '}'");
      d.stmts.push_back(statement());
    }
    take();
    if (tok_.t != Token::T::End) fail("unexpected text after the graph body");
    return d;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { lex_.fail(tok_, what); }
  std::string shown() const {
    switch (tok_.t) {
      case Token::T::End: return "end of file";
      case Token::T::Str: return "string '" + tok_.text + "'";
      default: return "'" + tok_.text + "'";
    }
  }
  void take() { tok_ = lex_.next(); }
  bool is_punct(const char* p) const { return tok_.t == Token::T::Punct && tok_.text == p; }
  bool is_id(const char* p) const { return tok_.t == Token::T::Id && tok_.text == p; }
  void expect(const char* p) {
    if (!is_punct(p)) fail(std::string("expected '") + p + "', found " + shown());
    take();
  }
  void expect_id(const char* p) {
    if (!is_id(p)) fail(std::string("expected '") + p + "', found " + shown());
    take();
  }
  std::vector<std::string> id_list() {
    expect("(");
    std::vector<std::string> v;
    if (is_punct(")")) {
      take();
      return v;
    }
    for (;;) {
      if (tok_.t != Token::T::Id) fail("expected an identifier, found " + shown());
      v.push_back(tok_.text);
      take();
      if (is_punct(")")) break;
      expect(",");
    }
    take();
    return v;
  }

  Expr value(int depth) {
    if (depth > kMaxDepth) fail("arrays and tuples nested too deeply");
    Expr e;
    e.line = tok_.line;
    e.col = tok_.col;
    switch (tok_.t) {
      case Token::T::Id:
        if (tok_.text == "true" || tok_.text == "false") {
          e.kind = Expr::Kind::Bool;
          e.b = tok_.text == "true";
        } else {
          e.kind = Expr::Kind::Id;
          e.s = tok_.text;
        }
        take();
        if (e.kind == Expr::Kind::Id && (is_punct("(") || is_punct("<"))) return call(std::move(e), depth + 1);
        return e;
      case Token::T::Int:
      case Token::T::Float:
        e.kind = tok_.t == Token::T::Int ? Expr::Kind::Int : Expr::Kind::Float;
        e.num = tok_.num;
        take();
        return e;
      case Token::T::Str:
        e.kind = Expr::Kind::Str;
        e.s = tok_.text;
        take();
        return e;
      case Token::T::Punct:
        if (is_punct("[") || is_punct("(")) {
          bool array = is_punct("[");
          const char* close = array ? "]" : ")";
          e.kind = array ? Expr::Kind::Array : Expr::Kind::Tuple;
          take();
          if (is_punct(close)) {
            take();
            return e;
          }
          for (;;) {
            e.items.push_back(value(depth + 1));
            if (is_punct(close)) break;
            expect(",");
          }
          take();
          // A parenthesized single value is just that value.
          if (!array && e.items.size() == 1) return std::move(e.items[0]);
          return e;
        }
        break;
      case Token::T::End: break;
    }
    fail("expected a value, found " + shown());
  }

  // The rest of `op<generic>(args)` after the op's name (held in `e`).
  Expr call(Expr e, int depth) {
    if (depth > kMaxDepth) fail("operation calls nested too deeply");
    e.kind = Expr::Kind::Call;
    if (is_punct("<")) {
      take();
      if (tok_.t != Token::T::Id) fail("expected a type name in '<...>', found " + shown());
      e.generic = tok_.text;
      take();
      expect(">");
    }
    expect("(");
    bool named = false;
    if (!is_punct(")")) {
      for (;;) {
        Token at = tok_;
        Expr v = value(depth + 1);
        if (v.kind == Expr::Kind::Id && is_punct("=")) {
          take();
          for (const std::string& k : e.names)
            if (k == v.s) lex_.fail(at, "argument '" + v.s + "' is given twice");
          named = true;
          e.names.push_back(v.s);
          e.items.push_back(value(depth + 1));
        } else {
          if (named) lex_.fail(at, "a positional argument follows a named one");
          e.names.emplace_back();
          e.items.push_back(std::move(v));
        }
        if (is_punct(")")) break;
        expect(",");
      }
    }
    take();
    return e;
  }

  Stmt statement() {
    Stmt s;
    s.lhs = value(0);
    auto check_lhs = [&](const Expr& e, auto&& self) -> void {
      if (e.kind == Expr::Kind::Id) return;
      if (e.kind == Expr::Kind::Array || e.kind == Expr::Kind::Tuple) {
        for (const Expr& i : e.items) self(i, self);
        return;
      }
      lex_.fail(Token{Token::T::End, "", 0, e.line, e.col},
                std::string("the left side of '=' must be identifiers, found ") + kind_name(e.kind));
    };
    check_lhs(s.lhs, check_lhs);
    expect("=");
    if (tok_.t != Token::T::Id) fail("expected an operation name, found " + shown());
    Expr op;
    op.s = tok_.text;
    op.line = tok_.line;
    op.col = tok_.col;
    take();
    if (!is_punct("(") && !is_punct("<")) fail("expected '(' after operation '" + op.s + "', found " + shown());
    s.call = call(std::move(op), 1);
    expect(";");
    return s;
  }

  mutable Lexer lex_;
  Token tok_;
};

}  // namespace

Document parse(const std::string& text, const std::string& origin) { return Parser(text, origin).document(); }

}  // namespace mgn::nnef_impl
