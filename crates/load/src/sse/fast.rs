//! A fast reader for the common shape of OpenAI stream chunks.
//!
//! Every text-bearing chunk goes through [`parse`], so its cost is paid tens
//! of times per request. serde_json spends most of its time there on fields
//! the client never reads (`id`, `object`, `created`, `model`, `logprobs`),
//! and on the generic visitor machinery. This reader walks the bytes once,
//! borrowing the few strings it keeps.
//!
//! It is a fast path, not a second parser: it returns `None` as soon as it
//! meets anything outside the plain case (an escape in any string, a number
//! that is not a plain unsigned integer, an unexpected type, a duplicate
//! field, an `error` key, deep nesting, invalid JSON or UTF-8). The caller
//! then parses with serde_json, whose answer is authoritative. When it
//! returns `Some`, serde_json would have produced the same value; the
//! differential tests in `sse.rs` check this on mutated chunks.

use std::borrow::Cow;

use super::{PromptTokensDetails, RawChoice, RawChunk, RawDelta, Usage};

/// Deeper nesting in skipped values is left to serde_json.
const MAX_DEPTH: u32 = 32;

/// Reads `payload` (already trimmed) as a chunk, or `None` for "ask serde_json".
pub(super) fn parse(payload: &[u8]) -> Option<RawChunk<'_>> {
    let mut r = Reader { b: payload, i: 0 };
    let chunk = r.chunk()?;
    r.ws();
    (r.i == r.b.len()).then_some(chunk)
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    /// Skips JSON whitespace (exactly the four bytes JSON allows).
    fn ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        if self.peek()? == c {
            self.i += 1;
            Some(())
        } else {
            None
        }
    }

    /// The bytes of a string without escapes. Control characters and
    /// invalid UTF-8 are JSON or serde errors: leave them to serde_json.
    fn raw_str(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        // One pass: the strings of a chunk are short, shorter than the
        // set-up of a vectorised search.
        let mut end = start;
        let mut high = 0u8;
        loop {
            let c = *self.b.get(end)?;
            match c {
                b'"' => break,
                b'\\' | 0..0x20 => return None,
                _ => high |= c,
            }
            end += 1;
        }
        let bytes = &self.b[start..end];
        if high >= 0x80 {
            std::str::from_utf8(bytes).ok()?;
        }
        self.i = end + 1;
        Some(bytes)
    }

    /// A string without escapes, borrowed.
    fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.raw_str()?).ok()
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Some(())
        } else {
            None
        }
    }

    /// `null` (consumed: true) or something else (untouched: false).
    fn null(&mut self) -> Option<bool> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            Some(true)
        } else {
            Some(false)
        }
    }

    /// A plain unsigned integer (`0` or no leading zero) that fits in u64.
    fn u64(&mut self) -> Option<u64> {
        self.ws();
        let start = self.i;
        let mut value: u64 = 0;
        while let Some(&c) = self.b.get(self.i)
            && c.is_ascii_digit()
        {
            value = value.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            self.i += 1;
        }
        let digits = self.i - start;
        if digits == 0 || (digits > 1 && self.b[start] == b'0') {
            return None;
        }
        // A fraction or exponent makes it a float: serde's business.
        match self.b.get(self.i) {
            Some(b'.' | b'e' | b'E') => None,
            _ => Some(value),
        }
    }

    /// Skips any value of the plain kind (see the module doc).
    fn skip(&mut self, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.raw_str().map(drop),
            b'n' => self.literal(b"null"),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'0'..=b'9' => self.u64().map(drop),
            b'{' => self.object(|r, _| r.skip(depth + 1)),
            b'[' => {
                self.i += 1;
                if self.peek()? == b']' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.skip(depth + 1)?;
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            _ => None,
        }
    }

    /// Walks an object, calling `field` with the reader positioned at each value.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let key = self.raw_str()?;
            self.eat(b':')?;
            field(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn chunk(&mut self) -> Option<RawChunk<'a>> {
        let mut choices: Option<Option<RawChoice<'a>>> = None;
        let mut usage: Option<Option<Usage>> = None;
        let mut id: Option<Option<&'a str>> = None;
        self.object(|r, key| match key {
            b"id" => once(&mut id, r.opt_str()?),
            b"choices" => once(&mut choices, r.choices()?),
            b"usage" => once(&mut usage, r.usage()?),
            // An error object, even `null`, is rare: serde_json reads it.
            b"error" => None,
            _ => r.skip(0),
        })?;
        Some(RawChunk {
            id: id.flatten().map(Cow::Borrowed),
            choices: choices.flatten(),
            usage: usage.flatten(),
            error: None,
        })
    }

    /// `null`, or a list whose first element is a choice object.
    fn choices(&mut self) -> Option<Option<RawChoice<'a>>> {
        if self.null()? {
            return Some(None);
        }
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.i += 1;
            return Some(None);
        }
        let first = self.choice()?;
        loop {
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.skip(1)?;
                }
                b']' => {
                    self.i += 1;
                    return Some(Some(first));
                }
                _ => return None,
            }
        }
    }

    fn choice(&mut self) -> Option<RawChoice<'a>> {
        let mut delta: Option<Option<RawDelta<'a>>> = None;
        let mut text: Option<Option<Cow<'a, str>>> = None;
        let mut finish_reason: Option<Option<String>> = None;
        if self.peek()? != b'{' {
            return None;
        }
        self.object(|r, key| match key {
            b"delta" => {
                let value = if r.null()? { None } else { Some(r.delta()?) };
                once(&mut delta, value)
            }
            b"text" => once(&mut text, r.opt_str()?.map(Cow::Borrowed)),
            b"finish_reason" => once(&mut finish_reason, r.opt_str()?.map(str::to_owned)),
            _ => r.skip(1),
        })?;
        Some(RawChoice {
            delta: delta.flatten(),
            text: text.flatten(),
            finish_reason: finish_reason.flatten(),
        })
    }

    fn delta(&mut self) -> Option<RawDelta<'a>> {
        let mut content = None;
        let mut reasoning_content = None;
        let mut reasoning = None;
        if self.peek()? != b'{' {
            return None;
        }
        self.object(|r, key| match key {
            b"content" => once(&mut content, r.opt_str()?.map(Cow::Borrowed)),
            b"reasoning_content" => once(&mut reasoning_content, r.opt_str()?.map(Cow::Borrowed)),
            b"reasoning" => once(&mut reasoning, r.opt_str()?.map(Cow::Borrowed)),
            _ => r.skip(2),
        })?;
        Some(RawDelta {
            content: content.flatten(),
            reasoning_content: reasoning_content.flatten(),
            reasoning: reasoning.flatten(),
        })
    }

    /// `null` or a string.
    fn opt_str(&mut self) -> Option<Option<&'a str>> {
        if self.null()? {
            Some(None)
        } else {
            self.str().map(Some)
        }
    }

    /// `null` or `{"prompt_tokens": n|null, "completion_tokens": n|null,
    /// "prompt_tokens_details": null|{"cached_tokens": n|null, ...}, ...}`.
    fn usage(&mut self) -> Option<Option<Usage>> {
        if self.null()? {
            return Some(None);
        }
        if self.peek()? != b'{' {
            return None;
        }
        let mut prompt = None;
        let mut completion = None;
        let mut details = None;
        self.object(|r, key| match key {
            b"prompt_tokens" => once(&mut prompt, r.opt_u64()?),
            b"completion_tokens" => once(&mut completion, r.opt_u64()?),
            b"prompt_tokens_details" => {
                let value = if r.null()? {
                    None
                } else {
                    Some(r.prompt_tokens_details()?)
                };
                once(&mut details, value)
            }
            _ => r.skip(2),
        })?;
        Some(Some(Usage {
            prompt_tokens: prompt.flatten(),
            completion_tokens: completion.flatten(),
            prompt_tokens_details: details.flatten(),
        }))
    }

    /// `{"cached_tokens": n|null, ...}`.
    fn prompt_tokens_details(&mut self) -> Option<PromptTokensDetails> {
        if self.peek()? != b'{' {
            return None;
        }
        let mut cached = None;
        self.object(|r, key| match key {
            b"cached_tokens" => once(&mut cached, r.opt_u64()?),
            _ => r.skip(3),
        })?;
        Some(PromptTokensDetails {
            cached_tokens: cached.flatten(),
        })
    }

    /// `null` or a plain unsigned integer.
    fn opt_u64(&mut self) -> Option<Option<u64>> {
        if self.null()? {
            Some(None)
        } else {
            self.u64().map(Some)
        }
    }
}

/// Sets a field seen for the first time; a duplicate is a serde error.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}
