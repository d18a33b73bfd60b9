// UTF-8 and GPT-2's byte-level alphabet: validation, the byte <-> character map byte-level BPE
// vocabularies are written in (printable bytes stand for themselves, the others for
// U+0100..U+0143 in order), and Rust's from_utf8_lossy (each maximal invalid subsequence
// becomes one U+FFFD), which HF's ByteLevel decoder applies.
//
//   ToByteLevel(" hi")                 == "\u0120hi"   ("Ġhi")
//   AppendFromByteLevel("\u0120hi", &s);                 // s += " hi"
//   FirstInvalidUtf8("a\xff")          == 1
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sshsdp {

// Bytes of the UTF-8 sequence a lead byte starts (1 for a stray continuation byte).
inline int Utf8Length(unsigned char lead) {
  return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
// The offset of the first byte that is not part of well-formed UTF-8 (overlongs, surrogates
// and code points above U+10FFFF included), npos when all is valid.
size_t FirstInvalidUtf8(std::string_view s);
// The byte-level character of byte b, as UTF-8.
std::string ByteLevelChar(uint8_t b);
// Every byte of s as its byte-level character.
std::string ToByteLevel(std::string_view s);
// The bytes a byte-level token stands for, appended to out; a token with a character outside
// the alphabet (an added token such as "<|im start|>" with a space) as its own UTF-8 bytes.
void AppendFromByteLevel(std::string_view token, std::string* out);
// bytes with every maximal invalid subsequence replaced by U+FFFD.
std::string Utf8Lossy(std::string_view bytes);
// The length of s without a character its last bytes begin but do not finish (what a
// streamed decode prints now; the rest waits for the next token).
size_t Utf8CompletePrefix(std::string_view s);

}  // namespace sshsdp
