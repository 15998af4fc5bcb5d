//! `mode="conversation_pool"`: a pool of multi-turn conversations shared by
//! the stage's streams. A stream takes the least recently used
//! conversation, runs one turn of it (after its earlier turns and the
//! model's real replies) and puts it back; a finished or failed
//! conversation is replaced by a fresh one. Until the pool is full a fresh
//! conversation is the least recently used one, so the working set grows
//! to the pool's size before any conversation is taken up again. The pool
//! outlives its stage while the next stages are pool stages of the same
//! workload (the working set grows with the load instead of being thrown
//! away at each stage end).

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::lock;
use crate::runner::prepare::StageSettings;
use crate::runner::state::Shared;
use crate::runner::turn::Conversation;

/// The conversations of a pool that no stream holds, least recently used first.
#[derive(Debug)]
pub(super) struct Pool {
    /// What a stage must share with the pool's earlier stages to go on
    /// using it (its workload, target and model as written).
    pub(super) key: String,
    inner: Mutex<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    size: usize,
    /// Conversations created so far (idle or held by a stream).
    created: usize,
    idle: VecDeque<Conversation>,
}

impl Pool {
    pub(super) fn new(key: String, size: usize) -> Self {
        Pool {
            key,
            inner: Mutex::new(PoolInner {
                size,
                created: 0,
                idle: VecDeque::new(),
            }),
        }
    }

    /// A later stage of the same workload may ask for a larger pool.
    pub(super) fn grow_to(&self, size: usize) {
        let mut inner = lock(&self.inner);
        inner.size = inner.size.max(size);
    }

    /// The conversation to run a turn of: a fresh one while the pool is
    /// not full, else the least recently used one.
    pub(super) fn take(&self, fresh: impl FnOnce() -> Conversation) -> Conversation {
        let mut inner = lock(&self.inner);
        if inner.created < inner.size {
            inner.created += 1;
            drop(inner);
            return fresh();
        }
        match inner.idle.pop_front() {
            Some(conversation) => conversation,
            // Every conversation is held (more streams than conversations
            // only while a shrinking stage's surplus streams finish).
            None => fresh(),
        }
    }

    /// Puts a conversation back as the most recently used one; a finished
    /// one is replaced by `fresh()`.
    pub(super) fn put_back(
        &self,
        conversation: Conversation,
        over: bool,
        fresh: impl FnOnce() -> Conversation,
    ) {
        let conversation = if over { fresh() } else { conversation };
        lock(&self.inner).idle.push_back(conversation);
    }
}

/// A fresh conversation of the pool's stage.
pub(super) fn fresh<'a>(
    shared: &'a Shared,
    settings: &'a StageSettings,
) -> impl FnOnce() -> Conversation + 'a {
    move || Conversation::new(shared, settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::turn::Conversation;

    fn numbered() -> impl FnMut() -> Conversation {
        let mut next = 0;
        move || {
            next += 1;
            Conversation::bare(next)
        }
    }

    #[test]
    fn the_working_set_fills_before_any_conversation_comes_back() {
        let pool = Pool::new(String::new(), 3);
        let mut new = numbered();
        let ids: Vec<u64> = (0..3)
            .map(|_| {
                let c = pool.take(&mut new);
                let id = c.id;
                pool.put_back(c, false, &mut new);
                id
            })
            .collect();
        assert_eq!(ids, [1, 2, 3]);
        // Full: the least recently used comes back, in order.
        let again: Vec<u64> = (0..4)
            .map(|_| {
                let c = pool.take(&mut new);
                let id = c.id;
                pool.put_back(c, false, &mut new);
                id
            })
            .collect();
        assert_eq!(again, [1, 2, 3, 1]);
    }

    #[test]
    fn a_finished_conversation_is_replaced_at_the_back() {
        let pool = Pool::new(String::new(), 2);
        let mut new = numbered();
        let a = pool.take(&mut new);
        let b = pool.take(&mut new);
        pool.put_back(a, true, &mut new); // replaced by 3
        pool.put_back(b, false, &mut new);
        let order: Vec<u64> = (0..2).map(|_| pool.take(&mut new).id).collect();
        assert_eq!(order, [3, 2]);
    }

    #[test]
    fn a_grown_pool_adds_fresh_conversations_first() {
        let pool = Pool::new(String::new(), 1);
        let mut new = numbered();
        let a = pool.take(&mut new);
        pool.put_back(a, false, &mut new);
        pool.grow_to(2);
        assert_eq!(pool.take(&mut new).id, 2);
        assert_eq!(pool.take(&mut new).id, 1);
        pool.grow_to(1);
        assert_eq!(lock(&pool.inner).size, 2, "a pool never shrinks");
    }
}
