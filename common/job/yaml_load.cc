#include "common/job/yaml_load.h"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <yaml-cpp/eventhandler.h>

namespace trellis::yaml {
namespace {

// Counts documents, notices the parser standing still (yaml-cpp's bug shows as one document
// after another made of a single null at the same position), and measures what each document
// expands to with its aliases resolved: yaml-cpp shares an aliased node, but anything that walks
// or copies the tree (emitting a pod template, converting it to JSON) expands every alias, so a
// few hundred bytes of nested aliases stand for gigabytes.
class DocumentProbe : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {
    events_ = 0;
    null_at_ = -1;
    open_.clear();
    anchors_.clear();
    total_ = {};
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (events_++ == 0) {
      null_at_ = mark.pos;
      null_mark_ = mark;
    }
    Leaf({1, 0}, anchor);
  }
  void OnAlias(const YAML::Mark&, YAML::anchor_t anchor) override {
    ++events_;
    auto it = anchors_.find(anchor);
    Add(it == anchors_.end() ? Size{1, 0} : it->second);
  }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t anchor,
                const std::string& value) override {
    ++events_;
    Leaf({1, value.size()}, anchor);
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    ++events_;
    open_.push_back({{1, 0}, anchor});
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    ++events_;
    open_.push_back({{1, 0}, anchor});
  }
  void OnMapEnd() override { Close(); }

  // The position of a lone null when the whole document was just that, else -1.
  int lone_null_at() const { return events_ == 1 ? null_at_ : -1; }
  const YAML::Mark& null_mark() const { return null_mark_; }
  // The document expanded past kMaxExpandedNodes or kMaxExpandedBytes.
  bool too_big() const { return too_big_; }

 private:
  struct Size {
    uint64_t nodes = 0;
    uint64_t bytes = 0;  // scalar text
  };
  struct Open {
    Size size;
    YAML::anchor_t anchor;
  };
  void Leaf(Size s, YAML::anchor_t anchor) {
    if (anchor != YAML::NullAnchor) anchors_[anchor] = s;
    Add(s);
  }
  void Close() {
    if (open_.empty()) return;
    const Open done = open_.back();
    open_.pop_back();
    if (done.anchor != YAML::NullAnchor) anchors_[done.anchor] = done.size;
    Add(done.size);
  }
  // Sizes saturate at the limits, so sums of aliases of aliases cannot overflow.
  void Add(Size s) {
    Size& to = open_.empty() ? total_ : open_.back().size;
    to.nodes = std::min<uint64_t>(to.nodes + s.nodes, kMaxExpandedNodes + 1);
    to.bytes = std::min<uint64_t>(to.bytes + s.bytes, kMaxExpandedBytes + 1);
    if (to.nodes > kMaxExpandedNodes || to.bytes > kMaxExpandedBytes) too_big_ = true;
  }

  int events_ = 0;
  int null_at_ = -1;
  YAML::Mark null_mark_;
  std::vector<Open> open_;                      // containers not closed yet, innermost last
  std::unordered_map<YAML::anchor_t, Size> anchors_;  // expanded size of each anchored node
  Size total_;
  bool too_big_ = false;
};

Status Malformed(const YAML::Mark& mark, const std::string& reason) {
  std::string where;
  if (!mark.is_null()) {
    where = "line " + std::to_string(mark.line + 1) + ", column " +
            std::to_string(mark.column + 1) + ": ";
  }
  return InvalidArgumentError(where + "malformed YAML: " + reason);
}

}  // namespace

StatusOr<YAML::Node> LoadFirstDocument(std::string_view text, int* documents) {
  *documents = 0;
  const std::string owned(text);
  try {
    std::istringstream in(owned);
    YAML::Parser parser(in);
    DocumentProbe probe;
    int previous_null = -1;
    while (*documents < 2 && parser.HandleNextDocument(probe)) {
      if (probe.too_big()) {
        *documents = 0;
        return InvalidArgumentError(
            "document too large: with its aliases expanded it holds more than " +
            std::to_string(kMaxExpandedNodes) + " values or " +
            std::to_string(kMaxExpandedBytes >> 20) + " MiB of text (no job needs that much; "
            "aliases of aliases are the usual cause)");
      }
      const int null_at = probe.lone_null_at();
      if (null_at >= 0 && null_at == previous_null) {
        // The parser did not move: a token no document can start with (yaml-cpp#1040).
        *documents = 0;
        return Malformed(probe.null_mark(), "unexpected character");
      }
      previous_null = null_at;
      ++*documents;
    }
    if (*documents == 0) return YAML::Node(YAML::NodeType::Undefined);
    // A second parse for the tree: YAML::Load reads only the first document.
    return YAML::Load(owned);
  } catch (const YAML::Exception& e) {
    return Malformed(e.mark, e.msg.empty() ? e.what() : e.msg);
  } catch (const std::exception& e) {
    return InternalError(std::string("YAML parser failed: ") + e.what());
  }
}

}  // namespace trellis::yaml
