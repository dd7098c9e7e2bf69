// Where a streaming JSON parser is in the document: the stack of open objects and arrays, the
// key or element index being read in each, and the keys each object has had so far, so that a
// refusal can name the value ("zero_optimization.stage", "groups[2].params[0].dtype") and a key
// repeated in one object can be found (nlohmann keeps the last of two equal keys silently).
// Used by the config reader (src/config/strict_parse.cpp) and the checkpoint manifest reader
// (src/core/checkpoint/checkpoint_manifest_json.cpp); it knows no JSON library. Not thread-safe (one
// parse).
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <vector>

namespace zoe {

class JsonPath {
 public:
  /// An object (`object` true) or array starts: one level deeper.
  void open(bool object) { frames_.push_back(Frame{object, {}, 0, {}}); }
  /// The innermost object or array ends; in an enclosing array it was one element.
  void close() {
    frames_.pop_back();
    value();
  }
  /// A scalar value was read; in an array it was one element.
  void value() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
  }
  /// The innermost object's next key; false if that object had it already (a duplicate).
  bool key(const std::string& k) {
    Frame& f = frames_.back();
    f.key = k;
    return f.keys.insert(k).second;
  }
  /// Levels open now.
  std::size_t depth() const { return frames_.size(); }
  /// The path of the value being read: `join(path, key)` for an object's key, "[i]" for an
  /// array element; it stops at an object whose first key has not been read yet.
  template <class Join>
  std::string str(Join join) const {
    std::string p;
    for (const Frame& f : frames_) {
      if (f.object && f.keys.empty()) break;
      if (f.object) {
        p = join(p, f.key);
      } else {
        p += '[';
        p += std::to_string(f.index);
        p += ']';
      }
    }
    return p;
  }

 private:
  struct Frame {
    bool object;
    std::string key;             // object: the key being read
    std::size_t index = 0;       // array: the element being read
    std::set<std::string> keys;  // object: keys seen
  };
  std::vector<Frame> frames_;
};

}  // namespace zoe
