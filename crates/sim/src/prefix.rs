//! Automatic prefix caching, as vLLM V1 does it: the KV blocks a request
//! leaves behind stay in the pool, keyed by a hash of their tokens and of
//! every token before them, until the pool needs the block for new work.
//! A later request whose prompt starts with the same blocks takes them
//! instead of computing them: its prefill starts after them.
//!
//! Two parts: [`PrefixKey`], the chain of block hashes of a request (the API
//! computes it from the text the engine never sees), and [`BlockPool`], the
//! engine's KV blocks: free, held by running sequences, or cached and idle
//! in least-recently-used order.
//!
//! What a finished request leaves cached: the blocks of its prompt text
//! followed by a newline and its output text, which is exactly what the
//! next turn of a chat conversation sends back (the messages joined by a
//! newline, see [`crate::tokens`]), so a later turn finds its earlier turns
//! and the model's replies in the cache. Only full blocks are cached; the
//! chat template's tokens are not hashed (they are the same in every turn).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::tokens::{CHARS_PER_TOKEN, mix};

/// The hashes of a request's full token blocks, each covering the block and
/// everything before it (so equal hashes mean equal prefixes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixKey {
    /// Blocks of the prompt followed by the output: what the request leaves cached.
    blocks: Arc<[u64]>,
    /// How many of `blocks` lie within the prompt: what a lookup may match.
    in_prompt: usize,
}

impl PrefixKey {
    /// No blocks: the request neither hits nor leaves anything cached.
    pub fn none() -> PrefixKey {
        PrefixKey::default()
    }

    /// The key of a text prompt followed by `output` (its tokens are
    /// 4-character pieces), in blocks of `block_size` tokens. `salt` (the
    /// request's `cache_salt`) keeps requests with different salts apart.
    pub fn of_text(prompt: &str, output: &str, block_size: u32, salt: Option<&str>) -> PrefixKey {
        let prompt_pieces = prompt.chars().count() / CHARS_PER_TOKEN;
        let chars: Vec<char> = prompt.chars().chain(['\n']).chain(output.chars()).collect();
        let pieces = chars.chunks_exact(CHARS_PER_TOKEN).map(|piece| {
            piece
                .iter()
                .fold(0u64, |h, c| mix(h ^ u64::from(u32::from(*c))))
        });
        PrefixKey::chain(pieces, prompt_pieces, block_size, salt)
    }

    /// The key of a prompt given as token ids followed by `output` ids.
    pub fn of_ids(
        prompt: &[u32],
        output: &[u32],
        block_size: u32,
        salt: Option<&str>,
    ) -> PrefixKey {
        let pieces = prompt.iter().chain(output).map(|id| u64::from(*id));
        PrefixKey::chain(pieces, prompt.len(), block_size, salt)
    }

    fn chain(
        tokens: impl Iterator<Item = u64>,
        prompt_tokens: usize,
        block_size: u32,
        salt: Option<&str>,
    ) -> PrefixKey {
        let size = block_size.max(1) as usize;
        let root = salt.map_or(0x9e37_79b9, |s| {
            s.bytes().fold(0x5a17, |h, b| mix(h ^ u64::from(b)))
        });
        let mut blocks = Vec::new();
        let (mut parent, mut block, mut in_block) = (root, root, 0);
        for token in tokens {
            block = mix(block ^ token);
            in_block += 1;
            if in_block == size {
                parent = mix(parent ^ block);
                blocks.push(parent);
                (block, in_block) = (parent, 0);
            }
        }
        PrefixKey {
            in_prompt: (prompt_tokens / size).min(blocks.len()),
            blocks: blocks.into(),
        }
    }

    /// Hashes of the blocks a lookup may match: those of the prompt, never
    /// its last token (vLLM always computes at least one prompt token, for
    /// the logits of the first output token).
    pub fn lookup_blocks(&self, prompt_tokens: u32, block_size: u32) -> &[u64] {
        let most = (prompt_tokens.saturating_sub(1) / block_size.max(1)) as usize;
        &self.blocks[..self.in_prompt.min(most)]
    }

    /// Hashes of the first `n` blocks of prompt and output (fewer if the
    /// request has fewer full blocks).
    pub fn first_blocks(&self, n: usize) -> &[u64] {
        &self.blocks[..n.min(self.blocks.len())]
    }
}

/// A cached block: how many running sequences use it, and its place in the
/// LRU order while none does.
#[derive(Debug, Clone, Copy)]
struct Cached {
    users: u32,
    /// Key in [`BlockPool::idle`] while `users == 0`.
    idle_since: u64,
}

/// The KV blocks of one engine: free, held by sequences (their own, or
/// cached ones they share), or cached and idle, evicted least recently used
/// first when the free ones run out.
#[derive(Debug, Clone)]
pub struct BlockPool {
    total: u32,
    /// Neither held nor cached.
    free: u32,
    caching: bool,
    cached: HashMap<u64, Cached>,
    /// Idle cached blocks, least recently used first (by a counter, so the
    /// order is the same on every run).
    idle: BTreeMap<u64, u64>,
    clock: u64,
}

impl BlockPool {
    /// `total` free blocks; `caching` false keeps nothing once freed.
    pub fn new(total: u32, caching: bool) -> BlockPool {
        BlockPool {
            total,
            free: total,
            caching,
            cached: HashMap::new(),
            idle: BTreeMap::new(),
            clock: 0,
        }
    }

    pub fn caching(&self) -> bool {
        self.caching
    }

    /// Blocks held by sequences (vLLM's usage: idle cached blocks are free to take).
    pub fn used(&self) -> u32 {
        self.total - self.available()
    }

    /// Blocks a sequence could get now: free ones and idle cached ones.
    pub fn available(&self) -> u32 {
        self.free + self.idle.len() as u32
    }

    /// Idle cached blocks (kept for a later hit, evicted when needed).
    pub fn idle_cached(&self) -> u32 {
        self.idle.len() as u32
    }

    /// How many leading blocks of `blocks` are cached (0 with caching off).
    pub fn matching(&self, blocks: &[u64]) -> usize {
        if !self.caching {
            return 0;
        }
        blocks
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Of `blocks` (all cached), how many are idle: taking them shrinks
    /// what [`BlockPool::available`] says.
    pub fn idle_among(&self, blocks: &[u64]) -> u32 {
        blocks
            .iter()
            .filter(|h| self.cached.get(h).is_some_and(|c| c.users == 0))
            .count() as u32
    }

    /// A sequence starts using cached `blocks` (found by [`BlockPool::matching`]).
    pub fn share(&mut self, blocks: &[u64]) {
        for h in blocks {
            if let Some(c) = self.cached.get_mut(h) {
                if c.users == 0 {
                    self.idle.remove(&c.idle_since);
                }
                c.users += 1;
            }
        }
    }

    /// Take `n` blocks, evicting idle cached ones (least recently used
    /// first) when the free ones are not enough. False (and nothing taken)
    /// if even that is not enough.
    pub fn take(&mut self, n: u32) -> bool {
        if n > self.available() {
            return false;
        }
        while self.free < n {
            let Some((_, hash)) = self.idle.pop_first() else {
                return false;
            };
            self.cached.remove(&hash);
            self.free += 1;
        }
        self.free -= n;
        true
    }

    /// A sequence gives back its blocks: `shared` cached ones it used, then
    /// `own` blocks of its own, of which the first `own_full` (following
    /// the shared ones in `key`) are full blocks worth keeping. The last
    /// block becomes the least recently used one (vLLM frees a request's
    /// blocks tail first: a prefix's head is the part most often shared).
    pub fn release(&mut self, key: &PrefixKey, shared: usize, own: u32, own_full: usize) {
        let full = key.first_blocks(shared + own_full);
        let kept_own = full.len().saturating_sub(shared);
        self.free += own - kept_own as u32;
        for (i, hash) in full.iter().enumerate().rev() {
            if i >= shared {
                // One of its own: cached unless an equal block already is.
                if !self.caching || self.cached.contains_key(hash) {
                    self.free += 1;
                    continue;
                }
                self.cached.insert(
                    *hash,
                    Cached {
                        users: 1,
                        idle_since: 0,
                    },
                );
            }
            self.unuse(*hash);
        }
    }

    fn unuse(&mut self, hash: u64) {
        let Some(c) = self.cached.get_mut(&hash) else {
            return;
        };
        c.users = c.users.saturating_sub(1);
        if c.users == 0 {
            self.clock += 1;
            c.idle_since = self.clock;
            self.idle.insert(self.clock, hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_turn_starts_with_the_earlier_turns_blocks() {
        // Block of 2 tokens = 8 characters.
        let first = PrefixKey::of_text("aaaabbbbcccc", " the and", 2, None);
        let next = PrefixKey::of_text("aaaabbbbcccc\n the and\nnew question", "", 2, None);
        // "aaaabbbbcccc\n the and" = 21 chars: 2 full blocks.
        assert_eq!(first.first_blocks(9).len(), 2);
        assert_eq!(next.first_blocks(2), first.first_blocks(2));
        let salted = PrefixKey::of_text("aaaabbbbcccc", "", 2, Some("x"));
        assert_ne!(salted.first_blocks(1), first.first_blocks(1));
    }

    #[test]
    fn a_lookup_never_covers_the_last_prompt_token() {
        let key = PrefixKey::of_ids(&[1, 2, 3, 4], &[5, 6], 2, None);
        assert_eq!(key.first_blocks(9).len(), 3);
        assert_eq!(key.lookup_blocks(4, 2).len(), 1, "4 tokens: 3 may hit");
        assert_eq!(key.lookup_blocks(5, 2).len(), 2);
    }

    #[test]
    fn idle_blocks_are_evicted_least_recently_used_first() {
        let key = |n: u32| {
            PrefixKey::of_ids(
                &(0..4).map(|i| i + 10 * n).collect::<Vec<_>>(),
                &[],
                2,
                None,
            )
        };
        let mut pool = BlockPool::new(4, true);
        let (a, b) = (key(1), key(2));
        assert!(pool.take(4));
        pool.release(&a, 0, 2, 2);
        pool.release(&b, 0, 2, 2);
        assert_eq!((pool.used(), pool.idle_cached()), (0, 4));
        assert!(pool.take(1), "evicts a's tail block");
        assert_eq!(pool.matching(a.first_blocks(2)), 1);
        assert_eq!(pool.matching(b.first_blocks(2)), 2);
        pool.share(b.first_blocks(2));
        assert_eq!(pool.available(), 1, "a's head is all that is left");
        assert!(!pool.take(2));
    }
}
