//! Token counting and output text, both simple and deterministic.
//!
//! Counting: a text has `ceil(chars / 4)` tokens (Unicode scalar values), at
//! least 1 for a non-empty request. A chat request counts the contents of all
//! its messages joined by a newline. `/tokenize` uses the same rule, so a
//! client calibrating characters per token against the simulator finds 4.
//!
//! Output: every output token is a 4-character piece (a space and a
//! three-letter word), chosen from the seed, the request's arrival number
//! and the token's position, so identical seeds and arrival orders give
//! identical outputs, and the output read back as a prompt counts one token
//! per output token.

/// Characters per token of the counting rule.
pub const CHARS_PER_TOKEN: usize = 4;

const WORDS: &[&str] = &[
    " the", " and", " for", " are", " but", " not", " you", " all", " any", " can", " had", " her",
    " was", " one", " our", " out", " day", " get", " has", " him", " his", " how", " man", " new",
    " now", " old", " see", " two", " way", " who", " boy", " did", " its", " let", " put", " say",
    " she", " too", " use", " cat", " dog", " sun", " sky", " sea", " map", " key", " box", " cup",
    " pen", " red", " big", " far", " low", " top", " end", " air", " arm", " art", " bed", " car",
    " eye", " fun", " hat", " ice",
];

/// Tokens in `text`: `ceil(chars / 4)`.
pub fn count_text(text: &str) -> u32 {
    let chars = text.chars().count();
    u32::try_from(chars.div_ceil(CHARS_PER_TOKEN)).unwrap_or(u32::MAX)
}

/// Token ids of `text` (one per 4-character piece), for `/tokenize`.
pub fn token_ids(text: &str) -> Vec<u32> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(CHARS_PER_TOKEN)
        .map(|piece| {
            // FNV-1a over the piece, folded into a 32k vocabulary.
            let mut h: u32 = 0x811c_9dc5;
            for c in piece {
                h ^= *c as u32;
                h = h.wrapping_mul(0x0100_0193);
            }
            h % 32_000
        })
        .collect()
}

/// SplitMix64: a cheap, well-mixed hash of a 64-bit value.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The text of output token `index` of the request that arrived `arrival`-th.
pub fn output_token(seed: u64, arrival: u64, index: u32) -> &'static str {
    let h = mix(seed ^ mix(arrival ^ mix(u64::from(index))));
    WORDS[(h % WORDS.len() as u64) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_is_chars_over_four() {
        assert_eq!(count_text(""), 0);
        assert_eq!(count_text("abcd"), 1);
        assert_eq!(count_text("abcde"), 2);
        assert_eq!(count_text("héllo wörld!"), 3);
        assert_eq!(token_ids("abcdefgh").len(), 2);
    }

    #[test]
    fn output_is_deterministic_and_counts_back() {
        let a: String = (0..10).map(|i| output_token(1, 5, i)).collect();
        let b: String = (0..10).map(|i| output_token(1, 5, i)).collect();
        assert_eq!(a, b);
        assert_eq!(count_text(&a), 10);
        assert!(WORDS.iter().all(|w| w.chars().count() == CHARS_PER_TOKEN));
    }
}
