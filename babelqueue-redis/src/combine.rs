//! Group commit of concurrent store calls of one kind (lease `claim`, lease `complete`).
//!
//! Up to `limit` calls of a kind run at once, each on its own (the one-id command, exactly
//! as without this module). A call that arrives while `limit` are in flight waits; when an
//! in-flight call returns, the first waiter takes over its place and sends its own request
//! together with every request that waits behind it (at most [`MAX_BATCH`]) as one call,
//! then hands each caller its own answer. So a lone call, or calls below the limit, never
//! wait, and calls pile into one only when the server is already slower than they arrive.
//!
//! No task is spawned: the waiter that takes over runs the shared call itself. A caller
//! dropped (cancelled) while it waits leaves the queue, and one dropped after it took over
//! passes its place on, so the queue never stalls.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// The most requests one shared call carries.
pub(crate) const MAX_BATCH: usize = 64;

/// What a waiter is told.
enum Turn<Q, R, E> {
    /// Its answer, from a shared call another caller sent.
    Done(Result<R, E>),
    /// Its request back: it now holds an in-flight place and sends the next call.
    Lead(Q),
}

struct Waiter<Q, R, E> {
    seq: u64,
    request: Q,
    tx: oneshot::Sender<Turn<Q, R, E>>,
}

struct State<Q, R, E> {
    in_flight: usize,
    next_seq: u64,
    waiting: VecDeque<Waiter<Q, R, E>>,
}

/// Combines concurrent calls of one kind; see the module docs.
pub(crate) struct Combiner<Q, R, E> {
    limit: usize,
    state: Mutex<State<Q, R, E>>,
}

impl<Q, R, E> std::fmt::Debug for Combiner<Q, R, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Combiner")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl<Q, R, E: Clone> Combiner<Q, R, E> {
    /// Up to `limit` (at least 1) calls in flight before callers share calls.
    pub(crate) fn new(limit: usize) -> Self {
        Combiner {
            limit: limit.max(1),
            state: Mutex::new(State {
                in_flight: 0,
                next_seq: 0,
                waiting: VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<Q, R, E>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives a place that is being left to the first waiter still listening, or frees it.
    fn pass_on(state: &mut State<Q, R, E>) {
        while let Some(w) = state.waiting.pop_front() {
            if w.tx.send(Turn::Lead(w.request)).is_ok() {
                return;
            }
        }
        state.in_flight -= 1;
    }

    /// Up to [`MAX_BATCH`] − 1 waiting requests, from the front.
    fn take_waiting(&self) -> Vec<Waiter<Q, R, E>> {
        let mut state = self.lock();
        let n = state.waiting.len().min(MAX_BATCH - 1);
        state.waiting.drain(..n).collect()
    }

    /// Takes a place for `request`, or queues it.
    fn enter(&self, request: Q) -> Entry<'_, Q, R, E> {
        let mut state = self.lock();
        if state.in_flight < self.limit && state.waiting.is_empty() {
            state.in_flight += 1;
            return Entry::Alone(request);
        }
        let (tx, rx) = oneshot::channel();
        let seq = state.next_seq;
        state.next_seq += 1;
        state.waiting.push_back(Waiter { seq, request, tx });
        Entry::Queued(Waiting {
            combiner: self,
            seq,
            rx: Some(rx),
        })
    }

    /// Runs `request`: alone with `one` when fewer than `limit` calls are in flight,
    /// else with the requests waiting beside it through `many`, which answers each
    /// request in order (an error of the shared call is each caller's error). `lost` is
    /// the error of a caller whose answer went missing (`many` answered fewer requests
    /// than it was given), so no caller waits forever.
    pub(crate) async fn call<F1, F2>(
        &self,
        request: Q,
        one: impl FnOnce(Q) -> F1,
        many: impl FnOnce(Vec<Q>) -> F2,
        lost: fn() -> E,
    ) -> Result<R, E>
    where
        F1: Future<Output = Result<R, E>>,
        F2: Future<Output = Result<Vec<R>, E>>,
    {
        let mut waiting = match self.enter(request) {
            Entry::Alone(request) => {
                let _place = Place(self);
                return one(request).await;
            }
            Entry::Queued(waiting) => waiting,
        };
        let turn = match waiting.rx.as_mut() {
            Some(rx) => rx.await,
            None => return Err(lost()),
        };
        waiting.rx = None;
        let request = match turn {
            Ok(Turn::Done(answer)) => return answer,
            Ok(Turn::Lead(request)) => request,
            Err(_) => return Err(lost()),
        };
        let _place = Place(self);
        let others = self.take_waiting();
        if others.is_empty() {
            return one(request).await;
        }
        let mut requests = Vec::with_capacity(1 + others.len());
        requests.push(request);
        let mut senders = Vec::with_capacity(others.len());
        for w in others {
            requests.push(w.request);
            senders.push(w.tx);
        }
        match many(requests).await {
            Ok(answers) => {
                let mut answers = answers.into_iter();
                let own = answers.next();
                for tx in senders {
                    let answer = answers.next().ok_or_else(lost);
                    let _ = tx.send(Turn::Done(answer));
                }
                own.ok_or_else(lost)
            }
            Err(e) => {
                for tx in senders {
                    let _ = tx.send(Turn::Done(Err(e.clone())));
                }
                Err(e)
            }
        }
    }
}

/// Where [`Combiner::enter`] put a request.
enum Entry<'a, Q, R, E: Clone> {
    /// It holds an in-flight place (the caller makes a [`Place`] of it).
    Alone(Q),
    /// It waits.
    Queued(Waiting<'a, Q, R, E>),
}

/// An in-flight place: passed on (or freed) when dropped, also when the call is cancelled.
struct Place<'a, Q, R, E: Clone>(&'a Combiner<Q, R, E>);

impl<Q, R, E: Clone> Drop for Place<'_, Q, R, E> {
    fn drop(&mut self) {
        Combiner::pass_on(&mut self.0.lock());
    }
}

/// A waiting caller: when dropped before its turn is read, it leaves the queue, or
/// passes on the place it was given.
struct Waiting<'a, Q, R, E: Clone> {
    combiner: &'a Combiner<Q, R, E>,
    seq: u64,
    rx: Option<oneshot::Receiver<Turn<Q, R, E>>>,
}

impl<Q, R, E: Clone> Drop for Waiting<'_, Q, R, E> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut state = self.combiner.lock();
        if let Some(at) = state.waiting.iter().position(|w| w.seq == self.seq) {
            state.waiting.remove(at);
            return;
        }
        // Taken from the queue: a place is sent under the lock, so it is here already.
        if let Ok(Turn::Lead(_)) = rx.try_recv() {
            Combiner::pass_on(&mut state);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A combiner whose calls answer `request * 10`, each "one" call held until the test
    /// releases it, and a record of the batches sent.
    struct Rig {
        combiner: Combiner<u32, u32, String>,
        gates: Mutex<VecDeque<oneshot::Sender<()>>>,
        batches: Mutex<Vec<Vec<u32>>>,
        ones: AtomicUsize,
        fail_many: bool,
    }

    impl Rig {
        fn new(limit: usize, fail_many: bool) -> Arc<Self> {
            Arc::new(Rig {
                combiner: Combiner::new(limit),
                gates: Mutex::new(VecDeque::new()),
                batches: Mutex::new(Vec::new()),
                ones: AtomicUsize::new(0),
                fail_many,
            })
        }

        async fn call(self: Arc<Self>, request: u32) -> Result<u32, String> {
            let rig: &Rig = &self;
            rig.combiner
                .call(
                    request,
                    |q| async move {
                        rig.ones.fetch_add(1, Ordering::SeqCst);
                        let (tx, rx) = oneshot::channel();
                        rig.gates.lock().unwrap().push_back(tx);
                        let _ = rx.await;
                        Ok(q * 10)
                    },
                    |qs| async move {
                        rig.batches.lock().unwrap().push(qs.clone());
                        if rig.fail_many {
                            return Err("down".to_owned());
                        }
                        Ok(qs.into_iter().map(|q| q * 10).collect())
                    },
                    || "lost".to_owned(),
                )
                .await
        }

        /// Lets the oldest call still in flight return (a cancelled call's gate is skipped).
        fn release_one(&self) {
            loop {
                let gate = self
                    .gates
                    .lock()
                    .unwrap()
                    .pop_front()
                    .expect("a call in flight");
                if gate.send(()).is_ok() {
                    return;
                }
            }
        }

        fn waiting(&self) -> usize {
            self.combiner.lock().waiting.len()
        }

        fn in_flight(&self) -> usize {
            self.combiner.lock().in_flight
        }
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn calls_below_the_limit_run_alone() {
        let rig = Rig::new(3, false);
        let calls: Vec<_> = (1..=3).map(|q| tokio::spawn(rig.clone().call(q))).collect();
        settle().await;
        assert_eq!(rig.ones.load(Ordering::SeqCst), 3);
        assert_eq!(rig.waiting(), 0);
        for _ in 0..3 {
            rig.release_one();
        }
        for (q, call) in (1..=3).zip(calls) {
            assert_eq!(call.await.unwrap(), Ok(q * 10));
        }
        assert!(rig.batches.lock().unwrap().is_empty());
        assert_eq!(rig.in_flight(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn calls_over_the_limit_share_one_call_with_their_own_answers() {
        let rig = Rig::new(1, false);
        let first = tokio::spawn(rig.clone().call(1));
        settle().await;
        let rest: Vec<_> = (2..=5).map(|q| tokio::spawn(rig.clone().call(q))).collect();
        settle().await;
        assert_eq!(rig.waiting(), 4, "the limit is reached: they wait");
        rig.release_one();
        assert_eq!(first.await.unwrap(), Ok(10));
        for (q, call) in (2..=5).zip(rest) {
            assert_eq!(call.await.unwrap(), Ok(q * 10));
        }
        assert_eq!(*rig.batches.lock().unwrap(), vec![vec![2, 3, 4, 5]]);
        assert_eq!(rig.ones.load(Ordering::SeqCst), 1);
        assert_eq!(rig.in_flight(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_shared_call_carries_at_most_max_batch() {
        let rig = Rig::new(1, false);
        let first = tokio::spawn(rig.clone().call(0));
        settle().await;
        let n = u32::try_from(MAX_BATCH).unwrap() + 3;
        let rest: Vec<_> = (1..=n).map(|q| tokio::spawn(rig.clone().call(q))).collect();
        settle().await;
        rig.release_one();
        settle().await;
        // The 3 left over went alone behind the first batch's place: release them.
        while rig.in_flight() > 0 && !rig.gates.lock().unwrap().is_empty() {
            rig.release_one();
            settle().await;
        }
        assert_eq!(first.await.unwrap(), Ok(0));
        for (q, call) in (1..=n).zip(rest) {
            assert_eq!(call.await.unwrap(), Ok(q * 10));
        }
        let batches = rig.batches.lock().unwrap();
        assert_eq!(batches[0].len(), MAX_BATCH);
        assert_eq!(
            batches.iter().map(Vec::len).sum::<usize>() + rig.ones.load(Ordering::SeqCst),
            1 + n as usize
        );
        assert_eq!(rig.in_flight(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_error_of_a_shared_call_is_each_callers_error() {
        let rig = Rig::new(1, true);
        let first = tokio::spawn(rig.clone().call(1));
        settle().await;
        let rest: Vec<_> = (2..=4).map(|q| tokio::spawn(rig.clone().call(q))).collect();
        settle().await;
        rig.release_one();
        assert_eq!(first.await.unwrap(), Ok(10));
        for call in rest {
            assert_eq!(call.await.unwrap(), Err("down".to_owned()));
        }
        assert_eq!(rig.in_flight(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn cancelled_callers_never_stall_the_queue() {
        let rig = Rig::new(1, false);
        let first = tokio::spawn(rig.clone().call(1));
        settle().await;
        let second = tokio::spawn(rig.clone().call(2));
        let third = tokio::spawn(rig.clone().call(3));
        settle().await;
        assert_eq!(rig.waiting(), 2);
        // A waiter cancelled in the queue leaves it.
        third.abort();
        settle().await;
        assert_eq!(rig.waiting(), 1);
        // The next in line is cancelled just as it is given the place: the place is
        // passed on (here: freed), and a new caller runs at once.
        {
            let mut state = rig.combiner.lock();
            Combiner::pass_on(&mut state);
            state.in_flight += 1; // the first call still holds its own place
        }
        second.abort();
        settle().await;
        rig.release_one();
        assert_eq!(first.await.unwrap(), Ok(10));
        assert_eq!(rig.in_flight(), 0);
        let fourth = tokio::spawn(rig.clone().call(4));
        settle().await;
        rig.release_one();
        assert_eq!(fourth.await.unwrap(), Ok(40));
        // A leader cancelled while its call is in flight passes its place on too.
        let lead = tokio::spawn(rig.clone().call(5));
        settle().await;
        let behind = tokio::spawn(rig.clone().call(6));
        settle().await;
        lead.abort();
        settle().await;
        rig.release_one();
        assert_eq!(behind.await.unwrap(), Ok(60));
        assert_eq!(rig.in_flight(), 0);
        assert_eq!(rig.waiting(), 0);
    }
}
