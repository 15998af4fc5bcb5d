//! Incremental Server-Sent Events parsing of OpenAI streaming responses.
//!
//! [`SseParser`] turns the bytes of a response body, in whatever pieces the
//! network delivers them, into complete event payloads (the joined `data:`
//! lines of one event), following the SSE rules that matter in practice:
//! `data:` with or without the space, `\n`, `\r\n` and `\r` line ends, events
//! made of several `data:` lines, comment lines (`: keep-alive`) and other
//! fields ignored, and pieces split anywhere, even inside a UTF-8 character.
//! [`parse_chunk`] then reads one payload as an OpenAI chat or completions
//! chunk, keeping reasoning text apart from content.

use std::borrow::Cow;

use serde::Deserialize;

mod fast;

/// Splits a byte stream into SSE event payloads.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// `data:` lines of the current event, joined with `\n`.
    data: Vec<u8>,
    /// Whether the current event has at least one `data:` line.
    has_data: bool,
    /// The previous byte was `\r`: a following `\n` belongs to the same line end.
    after_cr: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next piece of the body; calls `on_event` with each payload completed by it.
    pub fn feed(&mut self, bytes: &[u8], mut on_event: impl FnMut(&[u8])) {
        let mut rest = bytes;
        // The current event's first `data:` value while it lies in `bytes`:
        // an event that arrives whole (the usual case: one per network read)
        // is handed out without being copied. When set, `has_data` is true
        // and `data` is empty.
        let mut borrowed: Option<&[u8]> = None;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match memchr_line_end(rest) {
                Some(pos) => {
                    if self.line.is_empty() {
                        self.whole_line(&rest[..pos], &mut borrowed, &mut on_event);
                    } else {
                        self.line.extend_from_slice(&rest[..pos]);
                        self.spill(&mut borrowed);
                        self.end_line(&mut on_event);
                    }
                    if rest[pos] == b'\r' {
                        self.after_cr = true;
                    }
                    rest = &rest[pos + 1..];
                }
                None => {
                    self.line.extend_from_slice(rest);
                    rest = &[];
                }
            }
        }
        self.spill(&mut borrowed);
    }

    /// A line that lies whole in the piece being fed.
    fn whole_line<'b>(
        &mut self,
        line: &'b [u8],
        borrowed: &mut Option<&'b [u8]>,
        on_event: &mut impl FnMut(&[u8]),
    ) {
        if line.is_empty() {
            match borrowed.take() {
                Some(data) => {
                    on_event(data);
                    self.has_data = false;
                }
                None => self.dispatch(on_event),
            }
        } else if line[0] != b':' {
            let (field, value) = split_field(line);
            if field == b"data" {
                if self.has_data {
                    self.spill(borrowed);
                    self.data.push(b'\n');
                    self.data.extend_from_slice(value);
                } else {
                    *borrowed = Some(value);
                    self.has_data = true;
                }
            }
        }
    }

    /// Copies a borrowed `data:` value into `data` (the piece is about to end,
    /// or the event goes on in a way only `data` can hold).
    fn spill(&mut self, borrowed: &mut Option<&[u8]>) {
        if let Some(value) = borrowed.take() {
            self.data.extend_from_slice(value);
        }
    }

    /// The body ended: a last line without its line end still counts, and a
    /// pending event is delivered (lenient: some servers omit the final blank line).
    pub fn finish(&mut self, mut on_event: impl FnMut(&[u8])) {
        if !self.line.is_empty() {
            self.end_line(&mut on_event);
        }
        self.dispatch(&mut on_event);
    }

    fn end_line(&mut self, on_event: &mut impl FnMut(&[u8])) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(on_event);
        } else if line[0] != b':' {
            let (field, value) = split_field(&line);
            if field == b"data" {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            // `event:`, `id:`, `retry:` and unknown fields carry nothing we use.
        }
        // Reuse the allocation for the next line.
        self.line = line;
        self.line.clear();
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(&[u8])) {
        if self.has_data {
            on_event(&self.data);
        }
        self.data.clear();
        self.has_data = false;
    }
}

/// `field: value` (one optional space after the colon), or the whole line as a field.
fn split_field(line: &[u8]) -> (&[u8], &[u8]) {
    match memchr::memchr(b':', line) {
        Some(colon) => {
            let value = &line[colon + 1..];
            (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
        }
        None => (line, &[]),
    }
}

fn memchr_line_end(bytes: &[u8]) -> Option<usize> {
    memchr::memchr2(b'\n', b'\r', bytes)
}

/// What one event payload says.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Event<'a> {
    /// `[DONE]`: the stream is complete.
    #[default]
    Done,
    /// A chunk of the completion.
    Chunk(Chunk<'a>),
    /// The server reported an error inside the stream.
    Error(String),
}

/// The parts of a streamed chunk the client measures (text borrowed from
/// the payload unless it had escapes: no allocation per chunk in the common case).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Chunk<'a> {
    /// The response's id (`chatcmpl-…`), as the server logs it.
    pub id: Option<Cow<'a, str>>,
    /// Answer text (`delta.content` for chat, `text` for completions).
    pub content: Cow<'a, str>,
    /// Reasoning text (`delta.reasoning_content` or `delta.reasoning`).
    pub reasoning: Cow<'a, str>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
}

impl Chunk<'_> {
    /// Whether this chunk carries generated text (content or reasoning): it
    /// counts for TTFT, inter-chunk latency and counted tokens.
    pub fn has_text(&self) -> bool {
        !self.content.is_empty() || !self.reasoning.is_empty()
    }
}

/// Token counts reported by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    /// Null unless the server reports it (vLLM: `--enable-prompt-tokens-details`).
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

impl Usage {
    /// Prompt tokens the server's prefix cache served, when it says.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.prompt_tokens_details.and_then(|d| d.cached_tokens)
    }
}

/// `usage.prompt_tokens_details`: the part the client reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub struct PromptTokensDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct RawChunk<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "first_choice")]
    choices: Option<RawChoice<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawChoice<'a> {
    #[serde(default, borrow)]
    delta: Option<RawDelta<'a>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
}

/// Keeps the first element of `choices` and skips the rest, without
/// allocating a vector for every chunk.
fn first_choice<'de, D>(deserializer: D) -> Result<Option<RawChoice<'de>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct First;
    impl<'de> serde::de::Visitor<'de> for First {
        type Value = Option<RawChoice<'de>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of choices")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let first = seq.next_element::<RawChoice<'de>>()?;
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(first)
        }
    }
    deserializer.deserialize_any(First)
}

/// Reads one event payload. A payload that is not JSON is an error (it is
/// what a truncated or corrupted stream looks like).
pub fn parse_chunk(payload: &[u8]) -> Event<'_> {
    let trimmed = payload.trim_ascii();
    if trimmed == b"[DONE]" {
        return Event::Done;
    }
    // The common shape without serde's generic machinery; anything unusual
    // (escapes, errors, odd types, malformed JSON) goes to serde_json.
    match fast::parse(trimmed) {
        Some(raw) => chunk_event(raw),
        None => parse_chunk_serde(trimmed),
    }
}

/// serde_json's reading of a trimmed payload: the reference for [`fast::parse`].
fn parse_chunk_serde(trimmed: &[u8]) -> Event<'_> {
    match serde_json::from_slice::<RawChunk>(trimmed) {
        Ok(raw) => chunk_event(raw),
        Err(err) => Event::Error(format!(
            "unreadable stream event ({err}): {}",
            excerpt(trimmed, 200)
        )),
    }
}

fn chunk_event(raw: RawChunk<'_>) -> Event<'_> {
    if let Some(error) = raw.error {
        return Event::Error(format!("server error in stream: {}", error_message(&error)));
    }
    let mut chunk = Chunk {
        id: raw.id,
        usage: raw.usage,
        ..Chunk::default()
    };
    if let Some(choice) = raw.choices {
        if let Some(delta) = choice.delta {
            chunk.content = delta.content.unwrap_or_default();
            chunk.reasoning = delta
                .reasoning_content
                .or(delta.reasoning)
                .unwrap_or_default();
        }
        if let Some(text) = choice.text
            && !text.is_empty()
        {
            if chunk.content.is_empty() {
                chunk.content = text;
            } else {
                chunk.content.to_mut().push_str(&text);
            }
        }
        chunk.finish_reason = choice.finish_reason;
    }
    Event::Chunk(chunk)
}

/// The differential oracle of the fast path: when [`fast::parse`] reads
/// `bytes` (trimmed as [`parse_chunk`] trims them), serde_json must read them
/// too, and to the same event; panics otherwise. Returns whether the fast
/// path read them. Run by the unit tests and the `sse_chunk` fuzz target.
pub(crate) fn check_fast_path(bytes: &[u8]) -> bool {
    let trimmed = bytes.trim_ascii();
    let Some(raw) = fast::parse(trimmed) else {
        return false;
    };
    let fast = chunk_event(raw);
    let reference = parse_chunk_serde(trimmed);
    assert!(
        !matches!(reference, Event::Error(_)),
        "fast path accepted what serde rejects: {:?} -> {reference:?}",
        String::from_utf8_lossy(bytes)
    );
    assert_eq!(fast, reference, "{:?}", String::from_utf8_lossy(bytes));
    true
}

/// The message of an OpenAI-style error object (`{"message": ...}`), else its JSON.
pub fn error_message(error: &serde_json::Value) -> String {
    match error.get("message").and_then(|m| m.as_str()) {
        Some(message) => message.to_owned(),
        None => match error.as_str() {
            Some(text) => text.to_owned(),
            None => error.to_string(),
        },
    }
}

/// At most `max` bytes of `bytes` as lossy UTF-8, marked when cut.
pub fn excerpt(bytes: &[u8], max: usize) -> String {
    if bytes.len() <= max {
        String::from_utf8_lossy(bytes).into_owned()
    } else {
        format!(
            "{}… ({} bytes)",
            String::from_utf8_lossy(&bytes[..max]),
            bytes.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(pieces: &[&[u8]]) -> Vec<String> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        for piece in pieces {
            parser.feed(piece, |e| out.push(String::from_utf8(e.to_vec()).unwrap()));
        }
        parser.finish(|e| out.push(String::from_utf8(e.to_vec()).unwrap()));
        out
    }

    #[test]
    fn data_with_and_without_space() {
        assert_eq!(events(&[b"data: a\n\ndata:b\n\n"]), vec!["a", "b"]);
    }

    #[test]
    fn multi_line_events_are_joined_with_newlines() {
        assert_eq!(
            events(&[b"data: {\"a\":\ndata: 1}\n\n"]),
            vec!["{\"a\":\n1}"]
        );
    }

    #[test]
    fn comments_keepalives_and_other_fields_are_ignored() {
        assert_eq!(
            events(&[b": keep-alive\n\nevent: message\nid: 3\nretry: 10\ndata: x\n\n:ping\n\n"]),
            vec!["x"]
        );
    }

    #[test]
    fn crlf_and_cr_line_ends() {
        assert_eq!(
            events(&[b"data: a\r\n\r\ndata: b\r\rdata: c\n\n"]),
            vec!["a", "b", "c"]
        );
    }

    #[test]
    fn pieces_split_anywhere_give_the_same_events() {
        let body = "data: {\"choices\":[{\"delta\":{\"content\":\"héllo\"}}]}\r\n\r\n: c\n\ndata: [DONE]\n\n";
        let whole = events(&[body.as_bytes()]);
        assert_eq!(whole.len(), 2);
        let bytes = body.as_bytes();
        for split in 0..bytes.len() {
            assert_eq!(
                events(&[&bytes[..split], &bytes[split..]]),
                whole,
                "split at {split}"
            );
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(events(&singles), whole);
    }

    #[test]
    fn multi_line_events_split_anywhere_give_the_same_events() {
        let body: &[u8] = b"data: a\ndata:b\r\n: c\ndata\n\nid: 1\ndata: x\rdata: y\r\rdata: z\n\n";
        let whole = events(&[body]);
        assert_eq!(whole, vec!["a\nb\n", "x\ny", "z"]);
        for split in 0..body.len() {
            for second in split..body.len() {
                assert_eq!(
                    events(&[&body[..split], &body[split..second], &body[second..]]),
                    whole,
                    "split at {split} and {second}"
                );
            }
        }
    }

    #[test]
    fn last_event_without_blank_line_is_delivered() {
        assert_eq!(events(&[b"data: a\n\ndata: [DONE]"]), vec!["a", "[DONE]"]);
    }

    #[test]
    fn chat_chunk_keeps_reasoning_apart() {
        let e = parse_chunk(br#"{"choices":[{"delta":{"reasoning_content":"think"}}]}"#);
        let Event::Chunk(c) = e else { panic!("{e:?}") };
        assert_eq!((&*c.content, &*c.reasoning), ("", "think"));
        assert!(c.has_text());
        let e = parse_chunk(br#"{"choices":[{"delta":{"reasoning":"r","content":"x"}}]}"#);
        let Event::Chunk(c) = e else { panic!("{e:?}") };
        assert_eq!((&*c.content, &*c.reasoning), ("x", "r"));
    }

    #[test]
    fn completions_chunk_finish_reason_and_usage() {
        let e = parse_chunk(
            br#"{"choices":[{"text":"hi","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":7}}"#,
        );
        let Event::Chunk(c) = e else { panic!("{e:?}") };
        assert_eq!(c.content, "hi");
        assert_eq!(c.finish_reason.as_deref(), Some("length"));
        assert_eq!(c.usage.and_then(|u| u.completion_tokens), Some(7));
    }

    #[test]
    fn usage_only_chunk_has_no_text() {
        let e = parse_chunk(br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}"#);
        let Event::Chunk(c) = e else { panic!("{e:?}") };
        assert!(!c.has_text());
    }

    /// vLLM with `--enable-prompt-tokens-details` says how many prompt
    /// tokens its prefix cache served; null, absent or an empty details
    /// object says nothing, and a value that is no count makes the event
    /// unreadable, as it does for the other usage fields.
    #[test]
    fn cached_tokens_come_from_prompt_tokens_details() {
        let cached = |details: &str| {
            let payload = format!(
                r#"{{"choices":[],"usage":{{"prompt_tokens":80,"completion_tokens":4{details}}}}}"#
            );
            match parse_chunk(payload.as_bytes()) {
                Event::Chunk(c) => Ok(c.usage.and_then(|u| u.cached_tokens())),
                other => Err(format!("{other:?}")),
            }
        };
        assert_eq!(
            cached(r#","prompt_tokens_details":{"cached_tokens":48}"#),
            Ok(Some(48))
        );
        assert_eq!(
            cached(r#","prompt_tokens_details":{"cached_tokens":0}"#),
            Ok(Some(0))
        );
        for nothing in [
            "",
            r#","prompt_tokens_details":null"#,
            r#","prompt_tokens_details":{}"#,
            r#","prompt_tokens_details":{"cached_tokens":null,"audio_tokens":null}"#,
        ] {
            assert_eq!(cached(nothing), Ok(None), "{nothing}");
        }
        // serde_json's path (an escape elsewhere) reads it the same.
        let Event::Chunk(c) =
            parse_chunk(br#"{"id":"a\"b","usage":{"prompt_tokens_details":{"cached_tokens":7}}}"#)
        else {
            panic!()
        };
        assert_eq!(c.usage.and_then(|u| u.cached_tokens()), Some(7));
        for garbage in [
            r#","prompt_tokens_details":{"cached_tokens":"many"}"#,
            r#","prompt_tokens_details":{"cached_tokens":-1}"#,
            r#","prompt_tokens_details":12"#,
        ] {
            let error = cached(garbage).unwrap_err();
            assert!(
                error.contains("unreadable stream event"),
                "{garbage}: {error}"
            );
        }
        let Event::Error(error) = parse_chunk(br#"{"usage":{"prompt_tokens":"many"}}"#) else {
            panic!()
        };
        assert!(error.contains("unreadable stream event"), "{error}");
    }

    #[test]
    fn only_the_first_choice_counts_and_null_choices_are_empty() {
        let e =
            parse_chunk(br#"{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}"#);
        let Event::Chunk(c) = e else { panic!("{e:?}") };
        assert_eq!(c.content, "a");
        let e = parse_chunk(br#"{"choices":null,"usage":null}"#);
        let Event::Chunk(c) = e else { panic!("{e:?}") };
        assert!(!c.has_text());
    }

    /// Chunks as servers send them: the simulator's and vLLM's chat shape,
    /// completions, reasoning, usage (continuous and final), escapes, non-ASCII.
    const SHAPES: &[&str] = &[
        r#"{"id":"chatcmpl-30238","object":"chat.completion.chunk","created":1796009156,"model":"nyann-sim","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"id":"chatcmpl-30238","object":"chat.completion.chunk","created":1796009156,"model":"nyann-sim","choices":[{"index":0,"delta":{"content":" key"},"logprobs":null,"finish_reason":"length"}]}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{"content":"é😀 x"},"finish_reason":null}],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3}}"#,
        r#"{"id":"c","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":30,"prompt_tokens_details":null}}"#,
        r#"{"id":"c","choices":[],"usage":{"prompt_tokens":80,"total_tokens":84,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":48,"audio_tokens":null}}}"#,
        r#"{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hi","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}"#,
        r#"{"choices":[{"delta":{"reasoning_content":"think","content":null}},{"delta":{"content":"b"}}]}"#,
        r#"{"choices":[{"delta":{"reasoning":"r","content":"x","tool_calls":[{"index":0,"function":{"arguments":"{}"}}]},"text":"t"}]}"#,
        r#" { "choices" : [ { "delta" : { "content" : "a\nb" } , "x" : [ true , false , [ ] , { } ] } ] } "#,
        r#"{"choices":[{"delta":{"content":"q\"uote\u00e9"}}],"error":null}"#,
        r#"{"error":{"message":"overloaded","code":503}}"#,
        r#"{"choices":null,"usage":{"completion_tokens":null}}"#,
    ];

    #[test]
    fn fast_path_reads_the_common_shapes() {
        for shape in &SHAPES[..8] {
            assert!(fast::parse(shape.as_bytes()).is_some(), "{shape}");
        }
    }

    /// The fast path either defers to serde_json or agrees with it, on every
    /// shape and on every truncation, deletion and one-byte change of it.
    #[test]
    fn fast_path_agrees_with_serde() {
        let accepted = std::cell::Cell::new(0usize);
        let check = |bytes: &[u8]| {
            if check_fast_path(bytes) {
                accepted.set(accepted.get() + 1);
            }
        };
        let replacements: &[u8] = b"\"\\{}[],: \t0-1.eE+nulltrfx\x01\x7f\xc3\xa9\xff";
        for shape in SHAPES {
            let bytes = shape.as_bytes();
            check(bytes);
            for cut in 0..bytes.len() {
                check(&bytes[..cut]);
                let mut deleted = bytes.to_vec();
                deleted.remove(cut);
                check(&deleted);
                for &r in replacements {
                    let mut changed = bytes.to_vec();
                    changed[cut] = r;
                    check(&changed);
                    let mut inserted = bytes.to_vec();
                    inserted.insert(cut, r);
                    check(&inserted);
                }
            }
        }
        // Duplicates, type changes and numbers at the edges.
        for text in [
            r#"{"choices":[],"choices":[]}"#,
            r#"{"usage":null,"usage":null}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":[{"finish_reason":"a","finish_reason":null}]}"#,
            r#"{"choices":[{"delta":[]}]}"#,
            r#"{"choices":[null]}"#,
            r#"{"choices":{}}"#,
            r#"{"usage":{"completion_tokens":18446744073709551615}}"#,
            r#"{"usage":{"completion_tokens":18446744073709551616}}"#,
            r#"{"usage":{"completion_tokens":-1}}"#,
            r#"{"usage":{"completion_tokens":1.0}}"#,
            r#"{"usage":{"completion_tokens":01}}"#,
            r#"{"created":1e999,"choices":[]}"#,
            r#"{"x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}"#,
            r#"[]"#,
            r#"{}"#,
            r#"{} {}"#,
        ] {
            check(text.as_bytes());
        }
        // Not vacuous: many variants (spaces, changed digits and letters) took the fast path.
        assert!(accepted.get() > 1000, "{}", accepted.get());
    }

    #[test]
    fn done_and_errors() {
        assert_eq!(parse_chunk(b"[DONE]"), Event::Done);
        assert_eq!(
            parse_chunk(br#"{"error":{"message":"overloaded","code":503}}"#),
            Event::Error("server error in stream: overloaded".into())
        );
        let Event::Error(msg) = parse_chunk(br#"{"choices":[{"delta":{"content":"tru"#) else {
            panic!()
        };
        assert!(msg.starts_with("unreadable stream event"), "{msg}");
    }
}
