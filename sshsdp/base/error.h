// Typed errors shared by every layer.
//
// Each layer throws the subclass that names what kind of input was wrong, with a message
// that says what was wrong and how to fix it. Nothing here knows about MPI: the comm layer
// turns an uncaught error on one rank into an abort of the whole job (no rank hangs).
//
//   SSHSDP_CHECK(sw > 0, LayoutError, "sw must be positive, got {}", sw);
//   try { ... } catch (const sshsdp::LayoutError& e) { fmt::print("{}\n", e.what()); }
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace sshsdp {

// Base of every error sshsdp throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Invalid configuration or command-line input.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Invalid layout: degrees, topology, data tree, tensor lists, shard chain.
class LayoutError : public Error {
 public:
  using Error::Error;
};

// Invalid collective call or a failure reported by the communication backend.
class CommError : public Error {
 public:
  using Error::Error;
};

// Invalid numeric format request (unknown dtype, unsupported conversion).
class NumericsError : public Error {
 public:
  using Error::Error;
};

// Incompatible parameter schema, plan or execution condition (paper Table 4).
class PlanError : public Error {
 public:
  using Error::Error;
};

// Unreadable, corrupt or mismatching file: checkpoint, data file, safetensors.
class IoError : public Error {
 public:
  using Error::Error;
};

}  // namespace sshsdp

// Throws `ErrorType` with a fmt-formatted message when `cond` is false.
#define SSHSDP_CHECK(cond, ErrorType, ...)                  \
  do {                                                      \
    if (!(cond)) throw ErrorType(fmt::format(__VA_ARGS__)); \
  } while (0)
