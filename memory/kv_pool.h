// Paged KV cache of one model: fixed-size blocks of positions, a block table per sequence,
// reference counts (a shared prompt prefix is held once), and a queue of free blocks in
// eviction order (blocks freed longest ago are reused first, so recently freed ones stay
// intact longest for a prefix cache). A sequence's blocks can be swapped out to the host tier
// and back; its bytes return unchanged, so it continues exactly.
//
// Two kinds of pool, one interface:
// - fixed (make, or memory the caller owns): n_blocks blocks carved from one allocation,
//   reserved for the pool's whole life;
// - elastic (make_elastic): blocks taken from the arbiter's device tier one at a time as
//   sequences grow and given back as they end, beside every other model's KV and weights in
//   the same region. The model's limit (max_blocks) is a ceiling, not a reservation; a floor
//   (reserve_blocks) is taken at creation and kept, so those blocks never wait for memory.
//   Block ids are offsets into the device region in units of block_stride(), so the attention
//   kernels read block b at data() + b * block_stride() as they do for a fixed pool.
//
// What a block holds is the caller's business (the forward pass: every layer's K and V rows of
// block_tokens positions, block_bytes() bytes). Running out of blocks is a returned status,
// never an exception. Not thread-safe: the engine thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memory/arbiter.h"

namespace tandem::memory {

class kv_pool {
 public:
  // n_blocks blocks of block_bytes over memory the pool does not own (a context's own cache).
  // No swapping without an arbiter. Throws std::invalid_argument for block_tokens that is not
  // a positive multiple of 16 or a zero block size.
  kv_pool(std::byte* memory, int32_t n_blocks, int64_t block_tokens, size_t block_bytes);
  // n_blocks blocks in one device allocation of `a`, owned {kv, model}. Null, with *why =
  // no_space, when the device tier cannot hold them.
  static std::unique_ptr<kv_pool> make(arbiter& a, const std::string& model, int32_t n_blocks, int64_t block_tokens, size_t block_bytes,
                                       status* why = nullptr);
  // An elastic pool: at most max_blocks blocks, each its own device allocation of `a` owned
  // {kv, model}, taken as reserve() needs them; reserve_blocks of them taken now and never
  // given back. Null, with *why = no_space, when the floor cannot be had. Throws
  // std::invalid_argument for a bad shape or a floor above the limit.
  static std::unique_ptr<kv_pool> make_elastic(arbiter& a, const std::string& model, int32_t max_blocks, int32_t reserve_blocks, int64_t block_tokens,
                                               size_t block_bytes, status* why = nullptr);
  ~kv_pool();  // returns the device memory and any swapped-out host copies
  kv_pool(const kv_pool&) = delete;
  kv_pool& operator=(const kv_pool&) = delete;

  // Block b's bytes start at data() + b * block_stride() (block_bytes() of them).
  std::byte* data() const { return memory_; }
  size_t block_bytes() const { return block_bytes_; }
  size_t block_stride() const { return stride_; }
  int64_t block_tokens() const { return block_tokens_; }
  bool elastic() const { return elastic_; }
  // The most blocks the model may hold (fixed: all of them).
  int32_t total_blocks() const { return max_blocks_; }
  // Blocks a reserve could take now: the free ones the pool keeps, and (elastic) as many more
  // as the device tier's free bytes hold, within the limit. An estimate for planning: the
  // device tier is shared, so a reserve may still find less.
  int32_t free_blocks() const;
  // Blocks the pool holds on the device: in tables, retained, and free ones it keeps.
  int32_t device_blocks() const { return live_; }
  // Elastic: the blocks it keeps whatever happens (make_elastic's reserve_blocks); fixed: all.
  int32_t floor_blocks() const { return elastic_ ? reserve_blocks_ : max_blocks_; }
  // Blocks in tables or retained (device_blocks less the free ones it keeps).
  int32_t held_blocks() const { return live_ - static_cast<int32_t>(free_.size()); }
  // Blocks copied device -> host (swap_out, stash) and host -> device (swap_in, unstash) so far.
  int64_t moved_to_host() const { return moved_to_host_; }
  int64_t moved_to_device() const { return moved_to_device_; }
  // Bytes one block takes of the device tier (block_bytes rounded up to the arbiter's blocks).
  size_t block_footprint() const { return footprint_; }

  // Grows `seq`'s table to cover `tokens` positions (a new sequence starts empty). no_space,
  // and nothing taken, when the free blocks do not suffice; busy while it is swapped out.
  status reserve(int64_t seq, int64_t tokens);
  // Shrinks `seq` to its first `tokens` positions, returning the blocks past them (nothing for
  // a swapped-out sequence: swap it in first).
  void truncate(int64_t seq, int64_t tokens);
  // Forgets `seq`: its blocks (device or swapped out) return to the pool.
  void drop(int64_t seq);
  // `to` (empty) starts with `from`'s first `blocks` blocks, shared: reference counted,
  // returned to the free queue when the last holder lets go. Only full blocks may be shared:
  // nobody writes a shared block again (there is no copy on write; the prefix cache shares
  // whole blocks of a finished prompt).
  void share_prefix(int64_t from, int64_t to, int32_t blocks);

  // Extra references on blocks held outside any table (a prefix cache): a retained block stays
  // out of the free queue until released. Throws std::logic_error for a block no one holds.
  void retain(int32_t block);
  void release_block(int32_t block);
  // `seq` (empty) starts with these blocks, shared (reference counted), as share_prefix does.
  void adopt(int64_t seq, const std::vector<int32_t>& blocks);

  // Block ids of `seq` (empty for an unknown or swapped-out sequence) and the positions they cover.
  const std::vector<int32_t>& table(int64_t seq) const;
  int64_t capacity(int64_t seq) const;
  int32_t refcount(int32_t block) const { return refs_.at(static_cast<size_t>(block)); }
  bool swapped_out(int64_t seq) const;
  // Blocks a swapped-out sequence needs to come back (0 when it is not swapped out).
  int32_t swapped_blocks(int64_t seq) const;

  // Copies `seq`'s blocks to one host allocation and frees them on the device (a block shared
  // with another sequence stays for that one). no_space when the host tier cannot take them;
  // not_resident without an arbiter; ok, and nothing done, for a sequence without blocks.
  // Waits for the copy.
  status swap_out(int64_t seq);
  // Brings a swapped-out sequence back into fresh device blocks (ids may differ), then frees
  // the host copy. no_space when too few blocks can be had. Waits for the copy.
  status swap_in(int64_t seq);

  // A prefix cache's spill (blocks held outside any table): a copy of `block` in a host
  // allocation of block_bytes owned {kv, model, "prefix"}, after the copy has landed; nullopt
  // without an arbiter or when the host tier has no room. The block itself is untouched.
  std::optional<allocation> stash(int32_t block);
  // A free block holding the stash's bytes, with one retained reference (release_block gives
  // it back); nullopt when no block can be had. The stash stays: drop_stash frees it.
  std::optional<int32_t> unstash(const allocation& stashed);
  void drop_stash(const allocation& stashed);

  // Throws std::logic_error unless every block's count equals the tables holding it plus its
  // retained references, the free queue holds exactly the blocks no one does, and the blocks
  // held on the device are those (within the limit, at least the floor).
  void check() const;

 private:
  kv_pool(arbiter* a, std::byte* memory, int32_t id_limit, int64_t block_tokens, size_t block_bytes, std::string model);
  // A block for a new holder (count 1): a free one, or (elastic) one more from the arbiter;
  // nullopt when neither can be had.
  std::optional<int32_t> take_block();
  // Takes n blocks or none.
  bool take_blocks(size_t n, std::vector<int32_t>& out);
  void unref(int32_t block);
  allocation device_allocation(int32_t block) const;
  std::byte* block_data(int32_t block) const { return memory_ + static_cast<size_t>(block) * stride_; }
  bool valid(int32_t block) const { return block >= 0 && static_cast<size_t>(block) < refs_.size(); }
  struct swapped {
    allocation host;
    int32_t blocks;
  };

  arbiter* arbiter_ = nullptr;
  std::optional<allocation> device_;  // fixed pools made by make(): the one allocation
  std::string model_;
  std::byte* memory_;
  int64_t block_tokens_;
  size_t block_bytes_;
  size_t stride_;
  size_t footprint_;
  bool elastic_ = false;
  int32_t max_blocks_ = 0;      // the limit
  int32_t reserve_blocks_ = 0;  // elastic: the floor kept
  int32_t live_ = 0;            // blocks held on the device (fixed: all of them)
  int64_t moved_to_host_ = 0, moved_to_device_ = 0;
  std::vector<int32_t> refs_;      // per block id
  std::vector<int32_t> retained_;  // references held outside tables, per block id
  std::deque<int32_t> free_;       // free blocks the pool keeps
  std::map<int64_t, std::vector<int32_t>> tables_;
  std::map<int64_t, swapped> swapped_;
};

}  // namespace tandem::memory
