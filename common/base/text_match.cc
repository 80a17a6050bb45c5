#include "common/base/text_match.h"

namespace trellis::text {
namespace {

bool Digit(char c) { return c >= '0' && c <= '9'; }
bool LowerAlnum(char c) { return Digit(c) || (c >= 'a' && c <= 'z'); }

// Skips digits from *i; true when there was at least one.
bool Digits(std::string_view s, size_t* i) {
  const size_t start = *i;
  while (*i < s.size() && Digit(s[*i])) ++*i;
  return *i > start;
}

// A decimal without sign or exponent: [0-9]+(\.[0-9]*)? or \.[0-9]+, from *i.
bool Decimal(std::string_view s, size_t* i) {
  if (Digits(s, i)) {
    if (*i < s.size() && s[*i] == '.') {
      ++*i;
      Digits(s, i);
    }
    return true;
  }
  if (*i < s.size() && s[*i] == '.') {
    ++*i;
    return Digits(s, i);
  }
  return false;
}

// [eE][-+]?[0-9]+ from *i to the end.
bool ExponentToEnd(std::string_view s, size_t i) {
  if (i >= s.size() || (s[i] != 'e' && s[i] != 'E')) return false;
  ++i;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  return Digits(s, &i) && i == s.size();
}

}  // namespace

bool IsDns1123Label(std::string_view s) {
  if (s.empty() || s.size() > 63 || !LowerAlnum(s.front()) || !LowerAlnum(s.back())) return false;
  for (char c : s) {
    if (!LowerAlnum(c) && c != '-') return false;
  }
  return true;
}

bool IsDns1123Subdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    const std::string_view label = s.substr(start, dot == std::string_view::npos ? dot : dot - start);
    // A subdomain's labels are not limited to 63 characters on their own here: the whole name is.
    if (label.empty() || !LowerAlnum(label.front()) || !LowerAlnum(label.back())) return false;
    for (char c : label) {
      if (!LowerAlnum(c) && c != '-') return false;
    }
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

bool IsIntText(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  return Digits(s, &i) && i == s.size();
}

bool IsFloatText(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  if (!Decimal(s, &i)) return false;
  return i == s.size() || ExponentToEnd(s, i);
}

bool IsQuantity(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && s[i] == '+') ++i;
  if (!Decimal(s, &i)) return false;
  if (i == s.size()) return true;
  const std::string_view rest = s.substr(i);
  if (ExponentToEnd(s, i)) return true;
  if (rest.size() == 1) return std::string_view("numkMGTPE").find(rest[0]) != std::string_view::npos;
  return rest.size() == 2 && rest[1] == 'i' && std::string_view("KMGTPE").find(rest[0]) != std::string_view::npos;
}

}  // namespace trellis::text
