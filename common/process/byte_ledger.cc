#include "common/process/byte_ledger.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "common/base/logging.h"

namespace trellis {
namespace {

constexpr uint64_t kMagic = 0x52474445444c4c54ULL;  // "TLLEDGR" little-endian: our page
constexpr size_t kPageBytes = 4096;

std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace

StatusOr<ByteLedger::Page*> ByteLedger::Map(int fd, bool fresh) {
  void* p = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return InternalError("mmap of the byte ledger: " + ErrnoText(errno));
  if (fresh) {
    Page* page = new (p) Page{};
    page->magic = kMagic;
    return page;
  }
  // Created by the agent (constructed there); here only read and added to.
  Page* page = static_cast<Page*>(p);
  if (page->magic != kMagic) {
    ::munmap(p, kPageBytes);
    return InvalidArgumentError("descriptor is not a Trellis byte ledger");
  }
  return page;
}

StatusOr<std::unique_ptr<ByteLedger>> ByteLedger::Create() {
  int fd = ::memfd_create("trellis-byte-ledger", MFD_CLOEXEC);
  if (fd < 0) return InternalError("memfd_create: " + ErrnoText(errno));
  if (::ftruncate(fd, kPageBytes) != 0) {
    const int err = errno;
    ::close(fd);
    return InternalError("ftruncate of the byte ledger: " + ErrnoText(err));
  }
  auto page = Map(fd, /*fresh=*/true);
  if (!page.ok()) {
    ::close(fd);
    return page.status();
  }
  return std::unique_ptr<ByteLedger>(new ByteLedger(fd, *page));
}

ByteLedger* ByteLedger::ForThisProgram() {
  static ByteLedger* ledger = [] () -> ByteLedger* {
    const char* v = std::getenv(kEnvLedgerFd);
    if (v == nullptr || *v == '\0') return nullptr;
    char* end = nullptr;
    const long fd = std::strtol(v, &end, 10);
    struct stat st {};
    if (*end != '\0' || fd < 0 || fd > 1 << 20 || ::fstat(static_cast<int>(fd), &st) != 0 ||
        !S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(kPageBytes)) {
      TLOG_WARN << kEnvLedgerFd << "=" << v << ": not a byte ledger; byte totals cover this process only";
      return nullptr;
    }
    auto page = Map(static_cast<int>(fd), /*fresh=*/false);
    if (!page.ok()) {
      TLOG_WARN << kEnvLedgerFd << "=" << v << ": " << page.status().ToString()
                << "; byte totals cover this process only";
      return nullptr;
    }
    // The mapping is what counts; the program's own children must not get the descriptor.
    ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
    return new ByteLedger(static_cast<int>(fd), *page);  // lives as long as the process
  }();
  return ledger;
}

ByteLedger::~ByteLedger() {
  ::munmap(page_, kPageBytes);
  ::close(fd_);
}

void ByteLedger::FoldEnded() {
  page_->ended_pushed.fetch_add(page_->live_pushed.exchange(0));
  page_->ended_pulled.fetch_add(page_->live_pulled.exchange(0));
  page_->ended_programs.fetch_add(1);
}

}  // namespace trellis
