//===- Json.cpp - the small JSON reader of the attnres runtime ------------===//

#include "Json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace attnres::json {
namespace {

class Parser {
public:
  explicit Parser(const std::string &text) : text(text) {}

  bool document(Value &value, std::string &error) {
    if (!parseValue(value, 0)) {
      error = message;
      return false;
    }
    skipSpace();
    if (position != text.size()) {
      error = at("unexpected text after the document");
      return false;
    }
    return true;
  }

private:
  const std::string &text;
  size_t position = 0;
  std::string message;

  std::string at(const std::string &what) {
    return what + " at offset " + std::to_string(position);
  }
  bool fail(const std::string &what) {
    message = at(what);
    return false;
  }
  void skipSpace() {
    while (position < text.size() &&
           (text[position] == ' ' || text[position] == '\n' ||
            text[position] == '\r' || text[position] == '\t'))
      ++position;
  }
  bool literal(const char *word) {
    size_t length = std::char_traits<char>::length(word);
    if (text.compare(position, length, word) != 0)
      return false;
    position += length;
    return true;
  }

  bool parseValue(Value &value, int depth) {
    if (depth > 64)
      return fail("nesting too deep");
    skipSpace();
    if (position >= text.size())
      return fail("unexpected end of the document");
    char c = text[position];
    if (c == '{')
      return parseObject(value, depth);
    if (c == '[')
      return parseArray(value, depth);
    if (c == '"') {
      value.kind = Value::Kind::String;
      return parseString(value.string);
    }
    if (literal("true")) {
      value.kind = Value::Kind::Bool;
      value.boolean = true;
      return true;
    }
    if (literal("false")) {
      value.kind = Value::Kind::Bool;
      return true;
    }
    if (literal("null"))
      return true;
    if (c == '-' || isDigit(c))
      return parseNumber(value);
    return fail(std::string("unexpected character '") + c + "'");
  }

  static bool isDigit(char c) { return c >= '0' && c <= '9'; }
  static int hexDigit(char c) {
    if (isDigit(c))
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
      return c - 'A' + 10;
    return -1;
  }

  /// A number exactly as JSON spells it (-?(0|[1-9]d*)(.d+)?([eE][+-]?d+)?):
  /// strtod alone would also take "-inf", "-nan" and hexadecimal floats.
  /// Finite only: 1e400 is refused, not made infinite.
  bool parseNumber(Value &value) {
    size_t start = position;
    auto digits = [&] {
      size_t first = position;
      while (position < text.size() && isDigit(text[position]))
        ++position;
      return position > first;
    };
    if (text[position] == '-')
      ++position;
    if (position < text.size() && text[position] == '0')
      ++position;
    else if (!digits())
      return fail("malformed number");
    if (position < text.size() && text[position] == '.') {
      ++position;
      if (!digits())
        return fail("malformed number");
    }
    if (position < text.size() &&
        (text[position] == 'e' || text[position] == 'E')) {
      ++position;
      if (position < text.size() &&
          (text[position] == '+' || text[position] == '-'))
        ++position;
      if (!digits())
        return fail("malformed number");
    }
    std::string spelled = text.substr(start, position - start);
    value.number = std::strtod(spelled.c_str(), nullptr);
    if (!std::isfinite(value.number)) {
      position = start;
      return fail("number out of range");
    }
    value.kind = Value::Kind::Number;
    return true;
  }

  /// Four hexadecimal digits of a \\u escape, or -1.
  long hexQuad() {
    if (position + 4 > text.size())
      return -1;
    long code = 0;
    for (int i = 0; i < 4; ++i) {
      int digit = hexDigit(text[position + i]);
      if (digit < 0)
        return -1;
      code = code * 16 + digit;
    }
    position += 4;
    return code;
  }

  static void appendUtf8(std::string &out, unsigned long code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  /// The length of the well-formed UTF-8 sequence at `position` (RFC 3629:
  /// no overlong forms, no surrogates, nothing past U+10FFFF), or 0.
  size_t utf8Length() const {
    auto byte = [&](size_t i) {
      return static_cast<unsigned char>(text[position + i]);
    };
    unsigned char lead = byte(0);
    size_t length = lead < 0x80                    ? 1
                    : lead >= 0xC2 && lead <= 0xDF ? 2
                    : lead >= 0xE0 && lead <= 0xEF ? 3
                    : lead >= 0xF0 && lead <= 0xF4 ? 4
                                                   : 0;
    if (!length || position + length > text.size())
      return 0;
    for (size_t i = 1; i < length; ++i)
      if ((byte(i) & 0xC0) != 0x80)
        return 0;
    if ((lead == 0xE0 && byte(1) < 0xA0) || (lead == 0xED && byte(1) > 0x9F) ||
        (lead == 0xF0 && byte(1) < 0x90) || (lead == 0xF4 && byte(1) > 0x8F))
      return 0;
    return length;
  }

  bool parseString(std::string &out) {
    ++position; // opening quote
    while (position < text.size()) {
      char c = text[position];
      if (c == '"') {
        ++position;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20)
        return fail("control character in a string");
      if (c != '\\') {
        size_t length = utf8Length();
        if (!length)
          return fail("malformed UTF-8 in a string");
        out.append(text, position, length);
        position += length;
        continue;
      }
      ++position;
      if (position >= text.size())
        break;
      char escape = text[position++];
      switch (escape) {
      case '"':
      case '\\':
      case '/':
        out += escape;
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'u': {
        long code = hexQuad();
        if (code < 0)
          return fail("\\u needs four hexadecimal digits");
        if (code >= 0xDC00 && code <= 0xDFFF)
          return fail("lone low surrogate in a \\u escape");
        if (code >= 0xD800 && code <= 0xDBFF) {
          // A pair of escapes spells one code point past U+FFFF.
          if (!literal("\\u"))
            return fail("lone high surrogate in a \\u escape");
          long low = hexQuad();
          if (low < 0xDC00 || low > 0xDFFF)
            return fail("lone high surrogate in a \\u escape");
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        appendUtf8(out, static_cast<unsigned long>(code));
        break;
      }
      default:
        return fail("unknown escape");
      }
    }
    return fail("unterminated string");
  }

  bool parseArray(Value &value, int depth) {
    value.kind = Value::Kind::Array;
    ++position;
    skipSpace();
    if (position < text.size() && text[position] == ']') {
      ++position;
      return true;
    }
    while (true) {
      value.array.emplace_back();
      if (!parseValue(value.array.back(), depth + 1))
        return false;
      skipSpace();
      if (position < text.size() && text[position] == ',') {
        ++position;
        continue;
      }
      if (position < text.size() && text[position] == ']') {
        ++position;
        return true;
      }
      return fail("expected ',' or ']'");
    }
  }

  bool parseObject(Value &value, int depth) {
    value.kind = Value::Kind::Object;
    ++position;
    skipSpace();
    if (position < text.size() && text[position] == '}') {
      ++position;
      return true;
    }
    while (true) {
      skipSpace();
      if (position >= text.size() || text[position] != '"')
        return fail("expected a key");
      std::string key;
      if (!parseString(key))
        return false;
      skipSpace();
      if (position >= text.size() || text[position] != ':')
        return fail("expected ':'");
      ++position;
      if (!parseValue(value.object[key], depth + 1))
        return false;
      skipSpace();
      if (position < text.size() && text[position] == ',') {
        ++position;
        continue;
      }
      if (position < text.size() && text[position] == '}') {
        ++position;
        return true;
      }
      return fail("expected ',' or '}'");
    }
  }
};

void printString(const std::string &text, std::string &out) {
  out += '"';
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
      out += buffer;
    } else {
      out += c;
    }
  }
  out += '"';
}

void printValue(const Value &value, std::string &out) {
  switch (value.kind) {
  case Value::Kind::Null:
    out += "null";
    return;
  case Value::Kind::Bool:
    out += value.boolean ? "true" : "false";
    return;
  case Value::Kind::Number: {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%.17g", value.number);
    out += buffer;
    return;
  }
  case Value::Kind::String:
    printString(value.string, out);
    return;
  case Value::Kind::Array: {
    out += '[';
    bool first = true;
    for (const Value &element : value.array) {
      if (!first)
        out += ',';
      first = false;
      printValue(element, out);
    }
    out += ']';
    return;
  }
  case Value::Kind::Object: {
    out += '{';
    bool first = true;
    for (const auto &[key, element] : value.object) {
      if (!first)
        out += ',';
      first = false;
      printString(key, out);
      out += ':';
      printValue(element, out);
    }
    out += '}';
    return;
  }
  }
}

} // namespace

bool parse(const std::string &text, Value &value, std::string &error) {
  return Parser(text).document(value, error);
}

std::string print(const Value &value) {
  std::string out;
  printValue(value, out);
  return out;
}

} // namespace attnres::json
