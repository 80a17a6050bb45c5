// A plain-text table with aligned columns, for benchmark output that people paste into docs
// (also renders as a Markdown table).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace trellis::bench {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  // Rows shorter than the header are padded with empty cells.
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Markdown pipe table with padded columns.
  void Print(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// Fixed-point formatting helper: Fixed(0.7812, 2) == "0.78".
std::string Fixed(double value, int digits);

}  // namespace trellis::bench
