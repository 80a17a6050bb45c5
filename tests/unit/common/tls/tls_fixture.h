// Two jobs' certificates in a temporary directory: the job's own, and another job's (another CA),
// for the tests that check who TLS lets in.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "common/tls/tls.h"
#include "common/tls/tls_gen.h"

namespace trellis {

class TlsCerts {
 public:
  TlsCerts() {
    char tmpl[] = "/tmp/trellis-tls-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    job = Make("job", &job_files);
    other = Make("other", &other_files);
  }
  ~TlsCerts() { std::filesystem::remove_all(dir_); }

  TlsPtr job;    // the job's CA and certificate
  TlsPtr other;  // another job's
  TlsFiles job_files, other_files;

 private:
  TlsPtr Make(const std::string& name, TlsFiles* files) {
    std::filesystem::create_directories(dir_ + "/" + name);
    auto f = WriteJobCertificates(dir_ + "/" + name);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (!f.ok()) return nullptr;
    *files = *f;
    auto t = LoadTls(*f);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? *t : nullptr;
  }
  std::string dir_;
};

}  // namespace trellis
