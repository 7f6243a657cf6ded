//===- Json.h - reading manifest.json in the attnres runtime ----*- C++ -*-===//
//
// The runtime reads manifest.json without LLVM or MLIR, with nlohmann/json
// (Debian's nlohmann-json3-dev, header-only): strict RFC 8259 (numbers as
// JSON spells them, \u escapes with surrogates in pairs, no raw control
// characters, well-formed UTF-8), plus a nesting limit and finite numbers.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_RUNTIME_JSON_H
#define ATTNRES_RUNTIME_JSON_H

#include <nlohmann/json.hpp>

#include <string>

namespace attnres::json {

using Value = nlohmann::json;

/// Parses `text`; on failure returns false and describes the problem in
/// printable ASCII (the parser's own message quotes the bytes it read).
bool parse(const std::string &text, Value &value, std::string &error);

/// `object[key]`, or null when `object` is not an object or lacks `key`.
const Value *member(const Value &object, const char *key);

/// `value` as a string ("" when it is not one).
const std::string &text(const Value *value);

/// Writes `value` back as compact JSON.
std::string print(const Value &value);

} // namespace attnres::json

#endif // ATTNRES_RUNTIME_JSON_H
