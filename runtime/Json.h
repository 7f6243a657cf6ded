//===- Json.h - the small JSON reader of the attnres runtime ----*- C++ -*-===//
//
// The runtime reads manifest.json without LLVM or MLIR: this is a strict
// reader of the JSON the compiler writes (objects, arrays, strings with the
// usual escapes, numbers, true, false, null).
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_RUNTIME_JSON_H
#define ATTNRES_RUNTIME_JSON_H

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace attnres::json {

struct Value {
  enum class Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object
  } kind = Kind::Null;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<Value> array;
  std::map<std::string, Value> object;

  const Value *get(const std::string &key) const {
    auto it = object.find(key);
    return it == object.end() ? nullptr : &it->second;
  }
};

/// Parses `text`; on failure returns false and describes the problem.
bool parse(const std::string &text, Value &value, std::string &error);

/// Writes `value` back as compact JSON.
std::string print(const Value &value);

} // namespace attnres::json

#endif // ATTNRES_RUNTIME_JSON_H
