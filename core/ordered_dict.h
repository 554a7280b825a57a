// File: ordered_dict.h
// `OrderedDict<V>`: string keys in insertion order with O(1) lookup, the
// container behind a module's parameters, buffers and children (PyTorch's
// OrderedDict: overwriting a key keeps its position, erasing and re-inserting
// appends it at the end).
//
// Example:
//   OrderedDict<int> d;
//   d.Set("b", 1);
//   d.Set("a", 2);
//   d.Set("b", 3);          // keeps position 0
//   for (const auto& item : d) ...   // ("b", 3), ("a", 2)
#ifndef MODELSTATE_CORE_ORDERED_DICT_H_
#define MODELSTATE_CORE_ORDERED_DICT_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace modelstate {

// Thread-compatible.
template <typename V>
class OrderedDict {
 public:
  struct Item {
    std::string key;
    V value;
  };
  using const_iterator = typename std::vector<Item>::const_iterator;
  using iterator = typename std::vector<Item>::iterator;

  // Inserts `key` at the end, or overwrites its value in place.
  void Set(std::string key, V value) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      items_[it->second].value = std::move(value);
      return;
    }
    index_.emplace(key, items_.size());
    items_.push_back(Item{std::move(key), std::move(value)});
  }

  // Returns the value of `key`, or nullptr.
  const V* Find(absl::string_view key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].value;
  }
  V* Find(absl::string_view key) {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].value;
  }
  bool Contains(absl::string_view key) const { return index_.contains(key); }

  // Position of `key`, or -1.
  ptrdiff_t IndexOf(absl::string_view key) const {
    auto it = index_.find(key);
    return it == index_.end() ? -1 : static_cast<ptrdiff_t>(it->second);
  }

  // Removes `key`; later items move up one place. Returns false if absent.
  bool Erase(absl::string_view key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    size_t pos = it->second;
    index_.erase(it);
    items_.erase(items_.begin() + static_cast<ptrdiff_t>(pos));
    for (size_t i = pos; i < items_.size(); ++i) index_[items_[i].key] = i;
    return true;
  }

  // Inserts `key` at `position` (0 = first). REQUIRES: !Contains(key).
  void InsertAt(size_t position, std::string key, V value) {
    if (position > items_.size()) position = items_.size();
    items_.insert(items_.begin() + static_cast<ptrdiff_t>(position),
                  Item{std::move(key), std::move(value)});
    for (size_t i = position; i < items_.size(); ++i) {
      index_[items_[i].key] = i;
    }
  }

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const Item& at(size_t i) const { return items_[i]; }
  Item& at(size_t i) { return items_[i]; }
  const_iterator begin() const { return items_.begin(); }
  const_iterator end() const { return items_.end(); }
  iterator begin() { return items_.begin(); }
  iterator end() { return items_.end(); }

  std::vector<std::string> Keys() const {
    std::vector<std::string> keys;
    keys.reserve(items_.size());
    for (const Item& item : items_) keys.push_back(item.key);
    return keys;
  }

 private:
  std::vector<Item> items_;
  absl::flat_hash_map<std::string, size_t> index_;
};

}  // namespace modelstate

#endif  // MODELSTATE_CORE_ORDERED_DICT_H_
