#include "bench/pushpull/tls_cost.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <future>

#include "bench/common/stats.h"
#include "bench/common/table.h"
#include "common/tls_gen.h"
#include "common/tls_stream.h"

namespace trellis::bench {

StatusOr<TlsFiles> BenchTlsFiles(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError("cannot create " + dir + ": " + ec.message());
  return WriteJobCertificates(dir);
}

StatusOr<std::string> ProbeTlsOffload(const TlsFiles& files) {
  TRELLIS_ASSIGN_OR_RETURN(TlsPtr tls, LoadTls(files));
  if (!tls) return std::string("off");
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 1) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (l >= 0) close(l);
    return UnavailableError("cannot listen on loopback for the TLS probe");
  }
  int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int s = -1;
  if (c >= 0 && connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    s = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
  }
  close(l);
  if (s < 0) {
    if (c >= 0) close(c);
    return UnavailableError("cannot connect on loopback for the TLS probe");
  }
  auto server = std::async(std::launch::async,
                           [&] { return TlsStream::Handshake(*tls->server_ctx, s, 10000); });
  auto client = TlsStream::Handshake(*tls->client_ctx, c, 10000);
  auto served = server.get();
  std::string out;
  if (client.ok() && served.ok()) out = (*client)->OffloadName();
  client = StatusOr<std::unique_ptr<TlsStream>>(nullptr);
  served = StatusOr<std::unique_ptr<TlsStream>>(nullptr);
  close(c);
  close(s);
  if (out.empty()) return UnavailableError("the TLS probe's handshake failed");
  return out;
}

void PrintTlsCost(const std::vector<uint64_t>& sizes, const std::vector<std::string>& plain_runs,
                  const std::map<std::string, std::map<uint64_t, TrellisSizeResult>>& results,
                  const std::string& offload, std::ostream& out) {
  out << "\nTLS cost (GB/s per worker, plain and mutual TLS in this run; record layer: " << offload
      << "):\n\n";
  std::vector<std::string> header = {"size"};
  for (const std::string& name : plain_runs) {
    header.push_back(name);
    header.push_back("+ TLS");
    header.push_back("TLS / plain");
  }
  Table table(header);
  auto ratio = [](double num, double den) { return den > 0 ? Fixed(num / den, 2) : "-"; };
  auto find = [&](const std::string& run, uint64_t size) -> const TrellisSizeResult* {
    auto r = results.find(run);
    if (r == results.end()) return nullptr;
    auto s = r->second.find(size);
    return s == r->second.end() ? nullptr : &s->second;
  };
  for (uint64_t size : sizes) {
    std::vector<std::string> row = {FormatBytes(size)};
    for (const std::string& name : plain_runs) {
      const TrellisSizeResult* plain = find(name, size);
      const TrellisSizeResult* tls = find(name + " tls", size);
      row.push_back(plain ? Fixed(plain->gbytes_per_s_per_worker, 2) : "-");
      row.push_back(tls ? Fixed(tls->gbytes_per_s_per_worker, 2) : "-");
      row.push_back(plain && tls ? ratio(tls->gbytes_per_s_per_worker, plain->gbytes_per_s_per_worker)
                                 : "-");
    }
    table.AddRow(row);
  }
  table.Print(out);
}

}  // namespace trellis::bench
