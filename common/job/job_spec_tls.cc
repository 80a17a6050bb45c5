#include "common/job/job_spec_tls.h"

#include <string>

namespace trellis {
namespace {

constexpr size_t kMaxPathBytes = 4096;
constexpr size_t kMaxDnsNameBytes = 253;

// A DNS name as certificates carry it: labels of [a-z0-9-], dot-separated (checked by hand,
// no regex on untrusted input).
bool IsDnsName(const std::string& s) {
  if (s.empty() || s.size() > kMaxDnsNameBytes) return false;
  size_t label = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '.') {
      if (label == 0 || label > 63 || s[i - 1] == '-' || s[i - label] == '-') return false;
      label = 0;
      continue;
    }
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
    ++label;
  }
  return true;
}

bool PathField(const yaml::MapReader& m, std::string_view key, std::string* out) {
  std::string v;
  if (!m.GetString(key, &v)) return false;
  if (v.empty() || v.size() > kMaxPathBytes || v.find('\0') != std::string::npos) {
    m.errors()->AddGot(m.Path(key), "must be a file path of 1.." + std::to_string(kMaxPathBytes) +
                                        " bytes", m.Get(key));
    return false;
  }
  *out = std::move(v);
  return true;
}

}  // namespace

void ParseTlsSpec(const yaml::MapReader& spec, TlsSpec* out) {
  yaml::MapReader tls(spec.Get("tls"), spec.Path("tls"), spec.errors(),
                      {"secretName", "caFile", "certFile", "keyFile", "serverName"});
  std::string v;
  if (tls.GetString("secretName", &v)) {
    if (!IsDnsName(v)) {
      tls.errors()->AddGot(tls.Path("secretName"),
                           "must be a Secret name (lowercase DNS subdomain, at most 253 bytes)",
                           tls.Get("secretName"));
    } else {
      out->secretName = v;
    }
  }
  if (tls.GetString("serverName", &v)) {
    if (!IsDnsName(v)) {
      tls.errors()->AddGot(tls.Path("serverName"),
                           "must be a DNS name (lowercase letters, digits, '-', '.')",
                           tls.Get("serverName"));
    } else {
      out->serverName = v;
    }
  }
  const bool ca = PathField(tls, "caFile", &out->caFile);
  const bool cert = PathField(tls, "certFile", &out->certFile);
  const bool key = PathField(tls, "keyFile", &out->keyFile);
  if (!out->secretName.empty()) {
    // The operator mounts the Secret there (keys of a kubernetes.io/tls Secret + ca.crt).
    const std::string dir(kTlsMountDir);
    if (!tls.Has("caFile")) out->caFile = dir + "/ca.crt";
    if (!tls.Has("certFile")) out->certFile = dir + "/tls.crt";
    if (!tls.Has("keyFile")) out->keyFile = dir + "/tls.key";
    return;
  }
  if (!(tls.Has("caFile") || tls.Has("certFile") || tls.Has("keyFile"))) return;
  // Half a TLS setup is a mistake, not "TLS off".
  const char* rule = "required when spec.tls sets any of caFile, certFile, keyFile";
  if (!tls.Has("caFile")) tls.errors()->Add(tls.Path("caFile"), rule);
  if (!tls.Has("certFile")) tls.errors()->Add(tls.Path("certFile"), rule);
  if (!tls.Has("keyFile")) tls.errors()->Add(tls.Path("keyFile"), rule);
  if (!(ca && cert && key)) {
    out->caFile.clear();
    out->certFile.clear();
    out->keyFile.clear();
  }
}

}  // namespace trellis
