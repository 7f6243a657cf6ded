//===- Json.cpp - reading manifest.json in the attnres runtime ------------===//

#include "Json.h"

#include "attnres/Bundle/ManifestSchema.h"

#include <cmath>
#include <cstdio>

using attnres::json::Value;

namespace {

/// The parser's message without its "[json.exception...] " prefix, every
/// byte outside printable ASCII written as \xNN (it quotes what it read,
/// malformed UTF-8 included, and the message must reach Python as text).
std::string describe(const std::string &what) {
  std::string message = what;
  if (!message.empty() && message[0] == '[')
    if (size_t end = message.find("] "); end != std::string::npos)
      message = message.substr(end + 2);
  std::string printable;
  for (unsigned char c : message) {
    if (c >= 0x20 && c < 0x7f) {
      printable += static_cast<char>(c);
      continue;
    }
    char escaped[8];
    std::snprintf(escaped, sizeof(escaped), "\\x%02x", c);
    printable += escaped;
  }
  return printable;
}

/// Whether `text` nests arrays and objects deeper than kMaxDepth levels,
/// found in one pass over its bytes (brackets inside strings do not
/// count). The check runs before the parser builds anything: a
/// parser callback would do it too, but nlohmann/json's callback parser
/// scans a parent array at the end of each of its objects, quadratic in
/// the length of the array.
bool nestsTooDeep(const std::string &text) {
  int depth = 0;
  bool inString = false, escaped = false;
  for (char c : text) {
    if (inString) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > attnres::manifest::kMaxDepth)
        return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

/// Whether every number under `value` is finite (the parser turns a
/// too-large exponent into an error, but not every path into a number).
bool allFinite(const Value &value) {
  if (value.is_number_float())
    return std::isfinite(value.get<double>());
  if (value.is_structured())
    for (const Value &element : value)
      if (!allFinite(element))
        return false;
  return true;
}

} // namespace

bool attnres::json::parse(const std::string &text, Value &value,
                          std::string &error) {
  // Refused before a deep document is built (and later walked
  // recursively).
  if (nestsTooDeep(text)) {
    error = "nesting deeper than " + std::to_string(manifest::kMaxDepth);
    return false;
  }
  try {
    value = Value::parse(text);
  } catch (const nlohmann::json::exception &failure) {
    error = describe(failure.what());
    return false;
  }
  if (!allFinite(value)) {
    error = "a number is not finite";
    return false;
  }
  return true;
}

const Value *attnres::json::member(const Value &object, const char *key) {
  if (!object.is_object())
    return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

const std::string &attnres::json::text(const Value *value) {
  static const std::string empty;
  return value && value->is_string() ? value->get_ref<const std::string &>()
                                     : empty;
}

std::string attnres::json::print(const Value &value) {
  // Strings were checked to be UTF-8 when parsed; replace keeps a
  // programming error from throwing here.
  return value.dump(-1, ' ', false, Value::error_handler_t::replace);
}
