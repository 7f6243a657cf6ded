//===- Json.cpp - the small JSON reader of the attnres runtime ------------===//

#include "Json.h"

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
    if (c == '-' || (c >= '0' && c <= '9')) {
      const char *start = text.c_str() + position;
      char *end = nullptr;
      value.number = std::strtod(start, &end);
      if (end == start)
        return fail("malformed number");
      value.kind = Value::Kind::Number;
      position += end - start;
      return true;
    }
    return fail(std::string("unexpected character '") + c + "'");
  }

  bool parseString(std::string &out) {
    ++position; // opening quote
    while (position < text.size()) {
      char c = text[position++];
      if (c == '"')
        return true;
      if (c != '\\') {
        out += c;
        continue;
      }
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
        if (position + 4 > text.size())
          return fail("truncated \\u escape");
        unsigned code =
            std::strtoul(text.substr(position, 4).c_str(), nullptr, 16);
        position += 4;
        // The compiler writes ASCII; encode what it could write as UTF-8.
        if (code < 0x80) {
          out += static_cast<char>(code);
        } else if (code < 0x800) {
          out += static_cast<char>(0xC0 | (code >> 6));
          out += static_cast<char>(0x80 | (code & 0x3F));
        } else {
          out += static_cast<char>(0xE0 | (code >> 12));
          out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (code & 0x3F));
        }
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
