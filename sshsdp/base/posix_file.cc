// POSIX files with fsync and checked reads (see posix_file.h).
#include "sshsdp/base/posix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "sshsdp/base/crc32.h"
#include "sshsdp/base/error.h"

namespace sshsdp {

OutFile::OutFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  SSHSDP_CHECK(fd_ >= 0, IoError, "{}: cannot create: {}", path_, std::strerror(errno));
}

OutFile::~OutFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutFile::Write(const void* data, size_t bytes) {
  crc_ = Crc32(data, bytes, crc_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, std::min(bytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    SSHSDP_CHECK(n > 0, IoError, "{}: write failed after {} bytes: {} (disk full?)", path_,
                 written_, n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
  }
}

void OutFile::SyncAndClose() {
  SSHSDP_CHECK(::fsync(fd_) == 0, IoError, "{}: fsync failed: {}", path_, std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  SSHSDP_CHECK(rc == 0, IoError, "{}: close failed: {}", path_, std::strerror(errno));
}

InFile::InFile(std::string path) : path_(std::move(path)) {
  struct stat st {};
  SSHSDP_CHECK(::stat(path_.c_str(), &st) == 0, IoError, "{}: cannot open: {}", path_,
               std::strerror(errno));
  SSHSDP_CHECK(S_ISREG(st.st_mode), IoError, "{}: not a regular file ({}); name a file", path_,
               S_ISDIR(st.st_mode)    ? "a directory"
               : S_ISFIFO(st.st_mode) ? "a FIFO"
                                      : "a device or socket");
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  SSHSDP_CHECK(fd_ >= 0, IoError, "{}: cannot open: {}", path_, std::strerror(errno));
  size_ = static_cast<uint64_t>(st.st_size);
}

InFile::~InFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InFile::ReadAt(void* dst, size_t bytes, uint64_t offset) {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, std::min(bytes, size_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    SSHSDP_CHECK(n > 0, IoError, "{}: read of {} bytes at offset {} failed: {}", path_, bytes,
                 offset, n < 0 ? std::strerror(errno) : "unexpected end of file (truncated?)");
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

void FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  SSHSDP_CHECK(fd >= 0, IoError, "{}: cannot open directory to fsync: {}", dir,
               std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  SSHSDP_CHECK(rc == 0 || err == EINVAL, IoError, "{}: fsync of directory failed: {}", dir,
               std::strerror(err));
}

void FsyncFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SSHSDP_CHECK(fd >= 0, IoError, "{}: cannot open to fsync: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  SSHSDP_CHECK(rc == 0, IoError, "{}: fsync failed: {}", path, std::strerror(err));
}

void RenameInto(const std::string& tmp, const std::string& path) {
  SSHSDP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, IoError,
               "{}: cannot rename {} over it: {}", path, tmp, std::strerror(errno));
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  FsyncDir(parent.empty() ? "." : parent.string());
}

void WriteFileAtomically(const std::string& path, const std::function<void(OutFile&)>& write) {
  const std::string tmp = path + ".tmp";
  try {
    OutFile f(tmp);
    write(f);
    f.SyncAndClose();
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  RenameInto(tmp, path);
}

}  // namespace sshsdp
