#include "bench/pushpull/tls_cost.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <future>

#include "bench/common/stats.h"
#include "bench/common/table.h"
#include "common/tls/tls_gen.h"
#include "common/tls/tls_stream.h"

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

void PrintTlsCost(const PassResult& pass, std::ostream& out) {
  out << "\nTLS cost (" << pass.condition << "; GB/s, sum over workers; plain, then mutual TLS 1.3 "
      << "right after it; data link record layer: " << pass.tls_offload << "):\n\n";
  std::vector<std::string> plain;
  for (const std::string& c : pass.columns) {
    if (!IsTlsColumn(c)) plain.push_back(c);
  }
  std::vector<std::string> header = {"size"};
  for (const std::string& name : plain) {
    header.push_back(name);
    header.push_back("+ TLS");
    header.push_back("TLS / plain");
  }
  Table table(header);
  auto sum = [&](const std::string& column, uint64_t size) -> double {
    auto c = pass.trellis.find(column);
    if (c == pass.trellis.end()) return -1;
    auto s = c->second.find(size);
    auto w = pass.workers.find(column);
    if (s == c->second.end() || w == pass.workers.end()) return -1;
    return s->second.gbytes_per_s_per_worker * w->second;
  };
  for (const auto& [size, echo] : pass.tcp) {
    std::vector<std::string> row = {FormatBytes(size)};
    for (const std::string& name : plain) {
      const double a = sum(name, size), b = sum(name + " tls", size);
      row.push_back(a < 0 ? "-" : Fixed(a, 2));
      row.push_back(b < 0 ? "-" : Fixed(b, 2));
      row.push_back(a > 0 && b >= 0 ? Fixed(b / a, 2) : "-");
    }
    table.AddRow(row);
  }
  table.Print(out);
}

}  // namespace trellis::bench
