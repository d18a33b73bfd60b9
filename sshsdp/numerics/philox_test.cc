// Philox-4x32-10 against the Random123 known-answer vectors (tests/kat_vectors,
// "philox4x32 10" lines; also repeated in Random123's own known-answer unit test), and the
// bulk generator against the scalar one.
#include "sshsdp/numerics/philox.h"

#include <gtest/gtest.h>

#include <vector>

namespace sshsdp {
namespace {

TEST(Philox, Random123KnownAnswers) {
  EXPECT_EQ(Philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(Philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(Philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (PhiloxBlock{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, BulkMatchesScalar) {
  const PhiloxKey key = {0x12345678u, 0x9abcdef0u};
  for (uint64_t first : {uint64_t{0}, uint64_t{5}, uint64_t{0xFFFFFFFDu}, ~uint64_t{0} - 20}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{19}}) {
      std::vector<uint32_t> out(4 * n);
      PhiloxBlocks(first, 77, 3, key, n, out.data());
      for (size_t i = 0; i < n; ++i) {
        const uint64_t c = first + i;
        const PhiloxBlock b =
            Philox4x32_10({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 77u, 3u}, key);
        for (int w = 0; w < 4; ++w) ASSERT_EQ(out[4 * i + w], b[w]) << first << "+" << i;
      }
    }
  }
}

}  // namespace
}  // namespace sshsdp
