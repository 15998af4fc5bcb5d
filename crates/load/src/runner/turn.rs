//! One turn of a conversation: its prompt (after the conversation's earlier
//! turns and the model's real replies), the request, and its record.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nyann_model::CacheSalt;

use crate::client::{Message, Outcome, RequestSpec};
use crate::record::{RequestRecord, Status, TokenSource};
use crate::runner::prepare::StageSettings;
use crate::runner::state::{Claim, Shared};

/// How a turn ended, for the stream that sent it.
#[derive(Debug, PartialEq)]
pub(super) enum Turn {
    Ok,
    /// Failed or rejected: the stream backs off (as long as the server's
    /// `Retry-After`, if it gave one).
    Failed {
        retry_after: Option<Duration>,
    },
    /// Late or cancelled.
    Abandoned,
}

/// A conversation's state across turns.
#[derive(Debug)]
pub(super) struct Conversation {
    pub(super) id: u64,
    /// Turns sent so far.
    pub(super) turn: u32,
    /// Turns it has, as the settings of its last turn said.
    turns: u32,
    messages: Vec<Message>,
    salt: Option<String>,
}

impl Conversation {
    /// A fresh conversation (no turn sent yet), with its cache salt.
    pub(super) fn new(shared: &Shared, settings: &StageSettings) -> Self {
        let id = shared.next_conversation.fetch_add(1, Ordering::Relaxed);
        let random = || format!("{:016x}", crate::workload::mix(shared.seed ^ 0x5a17, id, 0));
        // A recorded conversation sent again (the file ran out) would find
        // its prompt in a prefix cache and flatter the TTFT: unless the
        // scenario chose a salt, a repeat gets a fresh one.
        let repeat = settings.prompts.pass(id).filter(|&pass| pass > 0);
        if repeat.is_some() {
            shared.repeats.fetch_add(1, Ordering::Relaxed);
        }
        let salt = match (&settings.cache_salt, repeat) {
            (None, None) => None,
            (None, Some(pass)) => Some(format!("repeat-{pass}-{}", random())),
            (Some(CacheSalt::Fixed(s)), _) => Some(s.clone()),
            (Some(CacheSalt::Random), _) => Some(random()),
        };
        Conversation {
            id,
            turn: 0,
            turns: settings.turns_of(id),
            messages: Vec::new(),
            salt,
        }
    }

    /// A conversation with no salt and nothing sent yet.
    #[cfg(test)]
    pub(super) fn bare(id: u64) -> Self {
        Conversation {
            id,
            turn: 0,
            turns: 1,
            messages: Vec::new(),
            salt: None,
        }
    }

    /// Whether the conversation is over after its last turn ended `how`
    /// (a failed or abandoned turn ends it: its history lacks a reply).
    pub(super) fn is_over(&self, how: &Turn) -> bool {
        !matches!(how, Turn::Ok) || self.turn >= self.turns
    }
}

/// Sends the next turn of `conv` and records it; says how it ended.
pub(super) async fn run_turn(shared: &Shared, claim: Claim, conv: &mut Conversation) -> Turn {
    let s = &claim.settings;
    conv.turn += 1;
    let chars = if conv.turn == 1 {
        s.first_chars
    } else {
        s.later_chars
    };
    let text = s.prompts.text(conv.id, conv.turn, chars);
    let prompt_chars = text.len();
    conv.messages.push(Message {
        role: "user",
        content: text,
    });
    // A ShareGPT conversation may have fewer turns than the workload's.
    conv.turns = s.turns_of(conv.id);
    let next_turn = conv.turn < conv.turns;
    // An eval question's reply is read for its answer.
    let question = s.prompts.question(conv.id);
    let keep_reply = next_turn || question.is_some();
    let spec = RequestSpec {
        target: &s.target,
        endpoint: &s.endpoint,
        model: &s.model,
        messages: &conv.messages,
        max_tokens: s.max_tokens(conv.id, conv.turn),
        cache_salt: conv.salt.as_deref(),
        keep_reply,
    };
    let before = Instant::now();
    let (mut outcome, abandoned) = tokio::select! {
        biased;
        outcome = shared.client.send(&spec) => (outcome, false),
        _ = shared.abandon_token(&claim).cancelled() => (Outcome::default(), true),
    };
    let status = status_of(
        &outcome,
        abandoned.then(|| shared.abandoned_by_interrupt.load(Ordering::SeqCst)),
    );
    let mut record = make_record(
        shared,
        &claim,
        conv,
        prompt_chars,
        status,
        &mut outcome,
        before,
    );
    crate::goodput::judge(&mut record, s.slo.as_ref());
    if let (Some(question), Some(set)) = (question, s.prompts.eval_set()) {
        record.eval_expected = Some(question.expected.clone());
        if status == Status::Ok {
            let scored = set.score(question, &outcome.reply);
            record.eval_extracted = scored.extracted;
            record.eval_correct = Some(scored.correct);
        }
    }
    let turn = match status {
        Status::Ok => Turn::Ok,
        Status::Failed | Status::Rejected => Turn::Failed {
            retry_after: outcome.retry_after,
        },
        Status::Cancelled | Status::Late | Status::Dropped => Turn::Abandoned,
    };
    if turn == Turn::Ok && next_turn {
        conv.messages.push(Message {
            role: "assistant",
            content: std::mem::take(&mut outcome.reply),
        });
    }
    shared.finish(claim, record).await;
    turn
}

/// A request's status: `abandoned` is `Some(by_interrupt)` when it was
/// abandoned in flight (cancelled by an interrupt, else late).
fn status_of(o: &Outcome, abandoned: Option<bool>) -> Status {
    match abandoned {
        Some(true) => Status::Cancelled,
        Some(false) => Status::Late,
        None if o.ok => Status::Ok,
        None if o.rejected() => Status::Rejected,
        None => Status::Failed,
    }
}

/// Output tokens: the server's usage when it gave one, else the chunks
/// that carried text (known for a complete answer or a partial one).
fn output_tokens(o: &Outcome) -> (Option<u64>, Option<TokenSource>) {
    match o.usage.and_then(|u| u.completion_tokens) {
        Some(n) => (Some(n), Some(TokenSource::Usage)),
        None if o.chunks_with_text > 0 || o.ok => {
            (Some(o.chunks_with_text), Some(TokenSource::Chunks))
        }
        None => (None, None),
    }
}

fn make_record(
    shared: &Shared,
    claim: &Claim,
    conv: &Conversation,
    prompt_chars: usize,
    status: Status,
    o: &mut Outcome,
    before: Instant,
) -> RequestRecord {
    let clock = &shared.clock;
    let sent = o.sent.unwrap_or(before);
    let end = o.end.unwrap_or_else(Instant::now);
    let (output_tokens, source) = output_tokens(o);
    RequestRecord {
        id: claim.id,
        conversation: conv.id,
        turn: conv.turn,
        stage: claim.stage,
        phase: claim.phase,
        status,
        scheduled_at: claim.scheduled_at,
        sent_at: Some(clock.unix(sent)),
        first_token_at: o.first_token.map(|t| clock.unix(t)),
        end_at: Some(clock.unix(end)),
        ttft_s: o.first_token.map(|t| t.duration_since(sent).as_secs_f64()),
        e2e_s: Some(end.duration_since(sent).as_secs_f64()),
        itl_s: std::mem::take(&mut o.itl),
        chunk_tokens: std::mem::take(&mut o.chunk_tokens),
        prompt_tokens: o.usage.and_then(|u| u.prompt_tokens),
        cached_tokens: o.usage.and_then(|u| u.cached_tokens()),
        output_tokens,
        output_tokens_source: source,
        prompt_chars,
        finish_reason: o.finish_reason.clone(),
        response_id: o.response_id.take(),
        http_status: o.http_status,
        error: match status {
            Status::Cancelled => {
                Some("cancelled: still in flight when the run was interrupted".into())
            }
            Status::Late => Some(
                "late: still in flight when the drain time ran out; \
                 abandoned so that the run could go on"
                    .into(),
            ),
            _ => o.error.take(),
        },
        client_lag_s: o.lag.map(|lag| lag.as_secs_f64()),
        resent: o.resent,
        client_error: o.client_side,
        eval_expected: None,
        eval_extracted: None,
        eval_correct: None,
        tpot_s: None,
        slo_met: None,
        slo_missed: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_abandoned_request_is_cancelled_on_interrupt_and_late_otherwise() {
        let ok = Outcome {
            ok: true,
            ..Outcome::default()
        };
        assert_eq!(status_of(&ok, Some(true)), Status::Cancelled);
        assert_eq!(status_of(&ok, Some(false)), Status::Late);
        assert_eq!(status_of(&ok, None), Status::Ok);
        assert_eq!(status_of(&Outcome::default(), None), Status::Failed);
    }

    #[test]
    fn output_tokens_come_from_usage_else_from_chunks() {
        let mut o = Outcome {
            ok: true,
            chunks_with_text: 3,
            ..Outcome::default()
        };
        assert_eq!(output_tokens(&o), (Some(3), Some(TokenSource::Chunks)));
        o.ok = false;
        o.chunks_with_text = 0;
        assert_eq!(output_tokens(&o), (None, None));
    }

    #[test]
    fn a_conversation_ends_after_its_last_turn_or_a_failed_one() {
        let mut conv = Conversation::bare(0);
        conv.turn = 2;
        conv.turns = 3;
        assert!(!conv.is_over(&Turn::Ok));
        assert!(conv.is_over(&Turn::Abandoned));
        assert!(conv.is_over(&Turn::Failed { retry_after: None }));
        conv.turns = 2;
        assert!(conv.is_over(&Turn::Ok));
    }
}
