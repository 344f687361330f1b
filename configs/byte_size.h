// Byte sizes as people write them in flags and rosters: "22GiB", "512MiB", "1.5GB", "4096"
// (bytes). Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (kB, KB, MB, GB,
// TB) powers of 1000; "K", "M", "G", "T" alone mean the binary ones, as in Docker's flags.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::configs {

// nullopt for anything else: empty, negative, non-finite, an unknown unit, or more than 2^64-1.
std::optional<uint64_t> parse_byte_size(std::string_view text);
// "1.5 GiB", "512.0 MiB", "100 B": one decimal, the largest binary unit that keeps it >= 1.
std::string format_byte_size(uint64_t bytes);

}  // namespace tandem::configs
