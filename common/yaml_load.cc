#include "common/yaml_load.h"

#include <sstream>
#include <string>

#include <yaml-cpp/eventhandler.h>

namespace trellis::yaml {
namespace {

// Counts documents and notices the parser standing still: yaml-cpp's bug shows as one
// document after another made of a single null at the same position.
class DocumentProbe : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {
    events_ = 0;
    null_at_ = -1;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override {
    if (events_++ == 0) {
      null_at_ = mark.pos;
      null_mark_ = mark;
    }
  }
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override { ++events_; }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {
    ++events_;
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    ++events_;
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    ++events_;
  }
  void OnMapEnd() override {}

  // The position of a lone null when the whole document was just that, else -1.
  int lone_null_at() const { return events_ == 1 ? null_at_ : -1; }
  const YAML::Mark& null_mark() const { return null_mark_; }

 private:
  int events_ = 0;
  int null_at_ = -1;
  YAML::Mark null_mark_;
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
