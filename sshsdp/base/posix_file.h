// POSIX files for checkpoints, weight and token files: every write is followed by an explicit fsync
// before the file is renamed into place, reads are positioned (pread) and checked to the last
// byte, and every failure message carries the file and the OS's reason (errno).
//
//   OutFile f(tmp);                       // IoError "tmp: cannot create: <reason>"
//   f.Write(bytes, n);                    // CRC-32 of everything written in f.crc()
//   f.SyncAndClose();                     // on stable storage when this returns
//   RenameInto(tmp, path);                // atomic replace, then the directory is fsynced
//   WriteFileAtomically(path, [&](OutFile& f) { f.Write(bytes, n); });   // all of the above
//   InFile in(path);  in.ReadAt(dst, n, offset);   // "unexpected end of file" if short
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace sshsdp {

// A file created (or truncated) for writing.
class OutFile {
 public:
  explicit OutFile(std::string path);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void Write(const void* data, size_t bytes);
  // fsync + close: the bytes are on stable storage when this returns.
  void SyncAndClose();
  uint64_t written() const { return written_; }
  uint32_t crc() const { return crc_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
  uint32_t crc_ = 0;
};

// A regular file opened for positioned reads. IoError for a missing file, a directory, a
// FIFO or another non-regular file (which could block or mislead a reader).
class InFile {
 public:
  explicit InFile(std::string path);
  ~InFile();
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  void ReadAt(void* dst, size_t bytes, uint64_t offset);

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// fsync of a directory (after a rename into it); EINVAL (file systems that cannot) is ignored.
void FsyncDir(const std::string& dir);
// fsync of a closed file written by other means (a std::ofstream): on stable storage when this
// returns, ready for RenameInto.
void FsyncFile(const std::string& path);

// rename(tmp, path) and fsync of path's directory: path holds either its old or its new
// content after a crash, never a partial one.
void RenameInto(const std::string& tmp, const std::string& path);

// Writes `path` through PATH.tmp: `write` fills it, then fsync and RenameInto. When anything
// fails the .tmp is removed (a half-written file is never left to be mistaken for one) and the
// IoError propagates; `path` keeps its old content.
void WriteFileAtomically(const std::string& path, const std::function<void(OutFile&)>& write);

}  // namespace sshsdp
