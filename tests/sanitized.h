#pragma once

// Whether this test was built with a sanitizer, as the programs it runs then are: a sanitizer's
// runtime slows the code about threefold and reserves terabytes of address space at start.

namespace batchpilot::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

/// What a time bound that tells a hang from due work is multiplied by.
inline constexpr int kSanitizerSlowdown = kSanitized ? 3 : 1;

}  // namespace batchpilot::test
