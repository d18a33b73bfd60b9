// UTF-8 helpers and GPT-2's byte-level alphabet (utf8.h).
#include "sshsdp/text/utf8.h"

#include <array>

namespace sshsdp {
namespace {

// GPT-2's bytes_to_unicode: '!'..'~', '¡'..'¬', '®'..'ÿ' stand for themselves, the other 68
// bytes for U+0100 onwards in byte order.
struct ByteMap {
  std::array<uint32_t, 256> cp{};
  std::array<int, 324> byte{};  // code point -> byte, -1 outside the alphabet
  ByteMap() {
    byte.fill(-1);
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      cp[b] = self ? static_cast<uint32_t>(b) : extra++;
      byte[cp[b]] = b;
    }
  }
};
const ByteMap& Map() {
  static const ByteMap m;
  return m;
}

void AppendUtf8(uint32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | c >> 6));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | c >> 12));
    out->push_back(static_cast<char>(0x80 | (c >> 6 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | c >> 18));
    out->push_back(static_cast<char>(0x80 | (c >> 12 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c >> 6 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// The length of the well-formed sequence at s[i] (Unicode Table 3-7), or the length of its
// maximal invalid prefix as a negative number (at least 1 byte).
int Sequence(std::string_view s, size_t i, uint32_t* cp) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = at(i);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  int n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  uint32_t c = b0 & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -k;
    const unsigned char b = at(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return -k;
    c = c << 6 | (b & 0x3F);
  }
  *cp = c;
  return n;
}

}  // namespace

size_t FirstInvalidUtf8(std::string_view s) {
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    const int n = Sequence(s, i, &cp);
    if (n < 0) return i;
    i += static_cast<size_t>(n);
  }
  return std::string_view::npos;
}

std::string ByteLevelChar(uint8_t b) {
  std::string out;
  AppendUtf8(Map().cp[b], &out);
  return out;
}

std::string ToByteLevel(std::string_view s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) AppendUtf8(Map().cp[static_cast<uint8_t>(c)], &out);
  return out;
}

void AppendFromByteLevel(std::string_view token, std::string* out) {
  std::string bytes;
  uint32_t cp;
  for (size_t i = 0; i < token.size();) {
    const int n = Sequence(token, i, &cp);
    if (n < 0 || cp >= Map().byte.size() || Map().byte[cp] < 0) {
      out->append(token);  // not a byte-level token: its own bytes
      return;
    }
    bytes.push_back(static_cast<char>(Map().byte[cp]));
    i += static_cast<size_t>(n);
  }
  out->append(bytes);
}

std::string Utf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    const int n = Sequence(s, i, &cp);
    if (n > 0) {
      out.append(s.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

size_t Utf8CompletePrefix(std::string_view s) {
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const auto b = static_cast<unsigned char>(s[s.size() - back]);
    if (b < 0x80) return s.size();  // ASCII: nothing open
    if (b < 0xC0) continue;         // a continuation byte: look further back
    const size_t need = static_cast<size_t>(Utf8Length(b));
    return need > back ? s.size() - back : s.size();  // an unfinished sequence waits
  }
  return s.size();
}

}  // namespace sshsdp
