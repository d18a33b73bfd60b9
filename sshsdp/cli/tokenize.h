// `sshsdp tokenize`: text files to the token files `train` reads, with a Hugging Face
// tokenizer.json (text/tokenizer.h), in one process on several threads.
//
//   sshsdp tokenize --tokenizer tokenizer.json --input notes.txt more/*.txt --out train.bin
//                   --val-out val.bin --val-fraction 0.05
//   sshsdp tokenize --tokenizer tokenizer.json --input data.jsonl --text-key body --out t.bin
//
// Documents: each blank-line-separated block of a plain-text file (or each whole file with
// --document-per-file), each line of a .jsonl file (its --text-key string). They are encoded
// in parallel and written in input order, each followed by the tokenizer's end-of-text token,
// as an llm.c token file: uint16 for vocabularies up to 65,536, uint32 beyond. --val-fraction
// sends a deterministic pseudo-random share of the documents to --val-out. Bad input — invalid
// UTF-8, an unreadable file, a JSONL line that is not an object with the key — is reported
// with its file and line before anything is written; outputs are written under a temporary
// name and renamed, so nothing half-written is left. A progress line on stderr reports MB/s
// and tokens/s; the summary documents, tokens and bytes per token.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace sshsdp {

struct TokenizeOptions {
  std::string tokenizer;
  std::vector<std::string> inputs;
  std::string out, val_out;
  double val_fraction = 0.0;
  std::string text_key = "text";
  bool document_per_file = false;
  int threads = 0;  // 0: the CPUs this process may run on
};

void AddTokenizeOptions(CLI::App& app, TokenizeOptions& o);
// Returns the exit code: 0, or 1 after printing the error.
int RunTokenize(const TokenizeOptions& o);

}  // namespace sshsdp
