//! Linearizability checking of recorded client histories.
//!
//! A [`History`] records, for every operation a client issued, when it was invoked, when it
//! completed (if it did) and what it returned. [`check`] decides whether some total order of
//! the operations (a *linearization*) both respects real time — an operation that completed
//! before another was invoked comes first — and explains every output through a sequential
//! [`Model`]. [`check_kv`] does this for Warden's test key-value state machine ([`KvModel`]),
//! one key at a time.
//!
//! The search is the Wing–Gong algorithm with Lowe's memoization, as in Porcupine and
//! Knossos: walk the invocation/completion events in time order, tentatively linearize any
//! operation whose completion has not been passed yet, and backtrack when a completion is
//! reached for an operation that could not be linearized before it. A cache of (set of
//! linearized operations, model state) pairs keeps the search from exploring the same
//! configuration twice. The problem is NP-complete, so every check takes a step budget and
//! answers [`CheckResult::Unknown`] rather than run unbounded.
//!
//! An operation whose outcome is unknown (a write that timed out, a client that crashed) may
//! have taken effect at any point after its invocation, or never: the checker treats its
//! completion as lying at +∞ and drops it if the rest of the history is explained without it.
//!
//! Limits:
//! - Models are deterministic (one next state and output per input and state).
//! - The cost grows exponentially with the number of mutually concurrent operations on one
//!   object, and with the number of unknown-outcome operations left pending at once: each
//!   can still take effect later, so refuting a history means ruling out every subset of
//!   them. Accepting a linearizable history is usually quick (the depth-first search goes
//!   straight down); a non-linearizable one with many timed-out writes may exhaust the
//!   budget and come back [`CheckResult::Unknown`].
//! - Memory grows with the steps taken (one memoized configuration per step at most).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;

/// A sequential specification: the states an object can be in and how each operation moves
/// it between them.
///
/// Models are deterministic: an input applied to a state has exactly one next state and one
/// output. A completed operation can take effect in a state iff the model's output there
/// equals the recorded one; an operation with an unknown outcome can take effect in any
/// state.
pub trait Model {
    /// A state of the object. States are memoized during the search, so they should be
    /// cheap to clone and hash.
    type State: Clone + Eq + Hash;
    /// What a client asks the object to do.
    type Input;
    /// What the object answers.
    type Output: PartialEq;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// Applies `input` to `state`: the next state and the output a correct object returns.
    fn step(&self, state: &Self::State, input: &Self::Input) -> (Self::State, Self::Output);
}

/// One operation of a [`History`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation<I, O> {
    client: usize,
    input: I,
    invoked_at: u64,
    /// Completion time and output; `None` while the outcome is unknown.
    outcome: Option<(u64, O)>,
}

impl<I, O> Operation<I, O> {
    /// The client that issued the operation (informational only: the checker orders
    /// operations by their times, not by client).
    pub fn client(&self) -> usize {
        self.client
    }

    /// What the client asked for.
    pub fn input(&self) -> &I {
        &self.input
    }

    /// When the client invoked the operation.
    pub fn invoked_at(&self) -> u64 {
        self.invoked_at
    }

    /// When the client saw the operation's outcome; `None` if it never did.
    pub fn completed_at(&self) -> Option<u64> {
        self.outcome.as_ref().map(|(at, _)| *at)
    }

    /// The output the client saw; `None` if the outcome is unknown.
    pub fn output(&self) -> Option<&O> {
        self.outcome.as_ref().map(|(_, output)| output)
    }
}

/// The operations a set of clients issued against one object, with their real-time
/// intervals.
///
/// Times are ticks of one monotonic clock shared by all clients, for example nanoseconds
/// since a common `Instant`. Intervals are closed: an operation that completes at `t` and
/// one invoked at `t` are concurrent. Operations are recorded with [`History::invoke`] when
/// they start and [`History::complete`] when their outcome is known; one that is never
/// completed has an unknown outcome. An operation that failed with an error that does not
/// rule out its effect (a timeout, a lost connection) must stay unknown; leaving a
/// definitely failed one unknown too is sound, only slower to check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct History<I, O> {
    operations: Vec<Operation<I, O>>,
}

impl<I, O> History<I, O> {
    /// An empty history.
    pub fn new() -> Self {
        History { operations: Vec::new() }
    }

    /// Records that `client` invoked `input` at time `at`, with an outcome not known yet.
    /// Returns the operation's index in [`History::operations`].
    pub fn invoke(&mut self, client: usize, input: I, at: u64) -> usize {
        self.operations.push(Operation { client, input, invoked_at: at, outcome: None });
        self.operations.len() - 1
    }

    /// Records that operation `index` returned `output` at time `at`.
    ///
    /// # Panics
    ///
    /// If `index` is not an operation of this history, if the operation was already
    /// completed, or if `at` precedes its invocation.
    pub fn complete(&mut self, index: usize, output: O, at: u64) {
        let operation = &mut self.operations[index];
        assert!(operation.outcome.is_none(), "operation {index} completed twice");
        assert!(at >= operation.invoked_at, "operation {index} completes at {at}, before its invocation at {}", operation.invoked_at);
        operation.outcome = Some((at, output));
    }

    /// The recorded operations, in the order they were invoked through [`History::invoke`].
    pub fn operations(&self) -> &[Operation<I, O>] {
        &self.operations
    }
}

impl<I, O> Default for History<I, O> {
    fn default() -> Self {
        History::new()
    }
}

/// Verdict of a linearizability check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckResult {
    /// Some linearization explains the whole history.
    Linearizable,
    /// No linearization explains the history.
    NotLinearizable(Counterexample),
    /// The step budget ran out before the search reached a verdict.
    Unknown,
}

/// Where the search for a linearization got stuck. Indices refer to
/// [`History::operations`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counterexample {
    /// The longest sequence of operations the search managed to linearize, in linearization
    /// order. No extension of it explains the history.
    pub prefix: Vec<usize>,
    /// The completed operation outside `prefix` that completed first: it had to be
    /// linearized next, or after some of `candidates`, but no such order worked.
    pub blocked: usize,
    /// The operations outside `prefix` invoked no later than `blocked` completed, in
    /// invocation order (`blocked` included): the ones that could have come next.
    pub candidates: Vec<usize>,
}

/// Checks whether `history` is linearizable with respect to `model`, exploring at most
/// `max_steps` search steps: each attempt to linearize an operation, and each backtrack,
/// is one step. Time is proportional to the steps taken (on the order of a million per
/// second), and memory to the (set of linearized operations, state) pairs memoized, at most
/// one per step.
#[must_use]
pub fn check<M: Model>(model: &M, history: &History<M::Input, M::Output>, max_steps: u64) -> CheckResult {
    search(model, history.operations(), max_steps)
}

/// An input of Warden's test key-value state machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvInput {
    /// Sets `key` to `value`; answered by [`KvOutput::Written`].
    Put {
        /// The key written.
        key: Vec<u8>,
        /// Its new value.
        value: Vec<u8>,
    },
    /// Reads `key`; answered by [`KvOutput::Value`].
    Get {
        /// The key read.
        key: Vec<u8>,
    },
    /// Sets `key` to `new` iff its value equals `expected`; answered by
    /// [`KvOutput::Swapped`].
    Cas {
        /// The key compared and written.
        key: Vec<u8>,
        /// The value `key` must hold; `None`: the key must not exist.
        expected: Option<Vec<u8>>,
        /// The value written when the comparison holds.
        new: Vec<u8>,
    },
}

impl KvInput {
    /// The key the operation reads or writes.
    pub fn key(&self) -> &[u8] {
        match self {
            KvInput::Put { key, .. } | KvInput::Get { key } | KvInput::Cas { key, .. } => key,
        }
    }
}

/// An output of Warden's test key-value state machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KvOutput {
    /// A put was applied.
    Written,
    /// A get's result: the key's value, `None` if it does not exist.
    Value(Option<Vec<u8>>),
    /// Whether a compare-and-swap's comparison held (and it wrote its value).
    Swapped(bool),
}

/// The sequential specification of Warden's test key-value state machine: a map from keys
/// to values, initially empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvModel;

impl Model for KvModel {
    type State = BTreeMap<Vec<u8>, Vec<u8>>;
    type Input = KvInput;
    type Output = KvOutput;

    fn init(&self) -> Self::State {
        BTreeMap::new()
    }

    fn step(&self, state: &Self::State, input: &KvInput) -> (Self::State, KvOutput) {
        match input {
            KvInput::Put { key, value } => {
                let mut next = state.clone();
                next.insert(key.clone(), value.clone());
                (next, KvOutput::Written)
            }
            KvInput::Get { key } => (state.clone(), KvOutput::Value(state.get(key).cloned())),
            KvInput::Cas { key, expected, new } => {
                if state.get(key) == expected.as_ref() {
                    let mut next = state.clone();
                    next.insert(key.clone(), new.clone());
                    (next, KvOutput::Swapped(true))
                } else {
                    (state.clone(), KvOutput::Swapped(false))
                }
            }
        }
    }
}

/// Checks a key-value history against [`KvModel`], one key at a time: operations on
/// different keys commute, so the history is linearizable iff each key's sub-history is
/// (linearizability is compositional). Each key gets its own budget of `max_steps`.
/// Gets with unknown outcomes constrain nothing and are left out.
///
/// Returns the first key's counterexample (keys in byte order) if any key is not
/// linearizable, else [`CheckResult::Unknown`] if any key ran out of budget, else
/// [`CheckResult::Linearizable`].
#[must_use]
pub fn check_kv(history: &History<KvInput, KvOutput>, max_steps: u64) -> CheckResult {
    let mut by_key: BTreeMap<&[u8], Vec<usize>> = BTreeMap::new();
    for (index, operation) in history.operations().iter().enumerate() {
        if matches!(operation.input, KvInput::Get { .. }) && operation.outcome.is_none() {
            continue;
        }
        by_key.entry(operation.input.key()).or_default().push(index);
    }
    let mut verdict = CheckResult::Linearizable;
    for indices in by_key.values() {
        let mut values = Interner::default();
        let operations: Vec<_> = indices.iter().map(|&index| values.register_operation(&history.operations()[index])).collect();
        match search(&Register, &operations, max_steps) {
            CheckResult::Linearizable => {}
            CheckResult::Unknown => verdict = CheckResult::Unknown,
            CheckResult::NotLinearizable(counterexample) => {
                let global = |local: usize| indices[local];
                return CheckResult::NotLinearizable(Counterexample {
                    prefix: counterexample.prefix.into_iter().map(global).collect(),
                    blocked: global(counterexample.blocked),
                    candidates: counterexample.candidates.into_iter().map(global).collect(),
                });
            }
        }
    }
    verdict
}

/// [`KvModel`] restricted to one key, with values interned as small integers so that
/// states are `Copy` and cheap to memoize: what [`check_kv`] checks each key with.
struct Register;

/// A [`KvInput`] on the register's key.
enum RegisterInput {
    Put(usize),
    Get,
    Cas { expected: Option<usize>, new: usize },
}

/// A [`KvOutput`] with values interned.
#[derive(PartialEq)]
enum RegisterOutput {
    Written,
    Value(Option<usize>),
    Swapped(bool),
}

impl Model for Register {
    type State = Option<usize>;
    type Input = RegisterInput;
    type Output = RegisterOutput;

    fn init(&self) -> Option<usize> {
        None
    }

    fn step(&self, state: &Option<usize>, input: &RegisterInput) -> (Option<usize>, RegisterOutput) {
        match *input {
            RegisterInput::Put(value) => (Some(value), RegisterOutput::Written),
            RegisterInput::Get => (*state, RegisterOutput::Value(*state)),
            RegisterInput::Cas { expected, new } if *state == expected => (Some(new), RegisterOutput::Swapped(true)),
            RegisterInput::Cas { .. } => (*state, RegisterOutput::Swapped(false)),
        }
    }
}

/// Numbers the distinct values of one key's operations.
#[derive(Default)]
struct Interner<'a> {
    ids: HashMap<&'a [u8], usize>,
}

impl<'a> Interner<'a> {
    fn id(&mut self, value: &'a [u8]) -> usize {
        let next = self.ids.len();
        *self.ids.entry(value).or_insert(next)
    }

    /// `operation` as an operation of the [`Register`] of its key.
    fn register_operation(&mut self, operation: &'a Operation<KvInput, KvOutput>) -> Operation<RegisterInput, RegisterOutput> {
        let input = match &operation.input {
            KvInput::Put { value, .. } => RegisterInput::Put(self.id(value)),
            KvInput::Get { .. } => RegisterInput::Get,
            KvInput::Cas { expected, new, .. } => RegisterInput::Cas { expected: expected.as_deref().map(|value| self.id(value)), new: self.id(new) },
        };
        let outcome = operation.outcome.as_ref().map(|(at, output)| {
            let output = match output {
                KvOutput::Written => RegisterOutput::Written,
                KvOutput::Value(value) => RegisterOutput::Value(value.as_deref().map(|value| self.id(value))),
                KvOutput::Swapped(swapped) => RegisterOutput::Swapped(*swapped),
            };
            (*at, output)
        });
        Operation { client: operation.client, input, invoked_at: operation.invoked_at, outcome }
    }
}

/// An invocation or completion of the operation with the given index.
#[derive(Clone, Copy, Debug)]
enum Event {
    Call(usize),
    Return(usize),
}

/// "No node" in [`Events`]' links.
const NIL: usize = usize::MAX;

/// The events of a history in time order, as a doubly linked list from which a linearized
/// operation's events are unlinked (lifted) and relinked in reverse order on backtrack.
///
/// Nodes `0..events.len()` are the events; node `events.len()` is the head sentinel.
struct Events {
    events: Vec<Event>,
    next: Vec<usize>,
    prev: Vec<usize>,
    call_node: Vec<usize>,
    /// `NIL` for operations with an unknown outcome: their completion lies at +∞.
    return_node: Vec<usize>,
}

impl Events {
    fn new<I, O>(operations: &[Operation<I, O>]) -> Events {
        // (time, is a return, op): at equal times calls sort before returns, so that
        // touching intervals overlap.
        let mut timed: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * operations.len());
        for (op, operation) in operations.iter().enumerate() {
            timed.push((operation.invoked_at, false, op));
            if let Some(at) = operation.completed_at() {
                timed.push((at, true, op));
            }
        }
        timed.sort_unstable();
        let head = timed.len();
        let mut call_node = vec![NIL; operations.len()];
        let mut return_node = vec![NIL; operations.len()];
        let events = timed
            .iter()
            .enumerate()
            .map(|(node, &(_, is_return, op))| {
                if is_return {
                    return_node[op] = node;
                    Event::Return(op)
                } else {
                    call_node[op] = node;
                    Event::Call(op)
                }
            })
            .collect();
        // Node k links to k + 1 and the head to node 0; then the last link is cut (the
        // last event's, or the head's when there are no events).
        let mut next: Vec<usize> = (1..=head).chain([0]).collect();
        let mut prev: Vec<usize> = std::iter::once(head).chain(0..head).collect();
        next[head.saturating_sub(1)] = NIL;
        prev[head] = NIL;
        Events { events, next, prev, call_node, return_node }
    }

    /// The first event still linked.
    fn first(&self) -> usize {
        self.next[self.events.len()]
    }

    fn event(&self, node: usize) -> Event {
        self.events[node]
    }

    fn next(&self, node: usize) -> usize {
        self.next[node]
    }

    fn unlink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = next;
        if next != NIL {
            self.prev[next] = prev;
        }
    }

    /// Undoes [`Events::unlink`]; unlinks must be undone in reverse order.
    fn relink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = node;
        if next != NIL {
            self.prev[next] = node;
        }
    }

    fn lift(&mut self, op: usize) {
        self.unlink(self.call_node[op]);
        if self.return_node[op] != NIL {
            self.unlink(self.return_node[op]);
        }
    }

    fn unlift(&mut self, op: usize) {
        if self.return_node[op] != NIL {
            self.relink(self.return_node[op]);
        }
        self.relink(self.call_node[op]);
    }

    /// The set of linearized operations, given `bound`: one past the latest call node of a
    /// linearized operation.
    fn linearized_set(&self, bound: usize) -> LinearizedSet {
        let mut holes = Vec::new();
        let mut node = self.first();
        // `NIL` is above every bound.
        while node < bound {
            holes.push(node);
            node = self.next(node);
        }
        LinearizedSet { bound, holes: holes.into_boxed_slice() }
    }

    /// Describes where the search got stuck after linearizing `prefix`, which must be
    /// lifted, and must leave a completed operation out (its completion ends the walk).
    fn counterexample(&self, prefix: Vec<usize>) -> Counterexample {
        let mut candidates = Vec::new();
        let mut node = self.first();
        loop {
            match self.event(node) {
                Event::Call(op) => candidates.push(op),
                Event::Return(blocked) => return Counterexample { prefix, blocked, candidates },
            }
            node = self.next(node);
        }
    }
}

/// A set of linearized operations, part of the memoization key, in a canonical form whose
/// size is the number of holes below `bound` (the operations concurrent with the latest
/// linearized one, and the unknown-outcome ones left out so far) rather than the length of
/// the history: the linearized operations are those whose call node is below `bound`,
/// except the holes.
#[derive(PartialEq, Eq, Hash)]
struct LinearizedSet {
    /// One past the latest call node of a linearized operation.
    bound: usize,
    /// The nodes below `bound` still linked: events of operations not linearized.
    holes: Box<[usize]>,
}

/// A linearized operation on the search stack, with what linearizing it changed.
struct Frame<S> {
    op: usize,
    /// The model state before the operation.
    state: S,
    /// [`LinearizedSet::bound`] before the operation.
    bound: usize,
}

/// The Wing–Gong search with Lowe's memoization over `operations`; indices in the result
/// refer to `operations`.
fn search<M: Model>(model: &M, operations: &[Operation<M::Input, M::Output>], max_steps: u64) -> CheckResult {
    // Completed operations not linearized yet. While there are any, the walk below always
    // meets the completion of one of them before running off the end of the list (every
    // call it passes precedes all remaining completions), so it never reads past the end.
    let mut pending = operations.iter().filter(|operation| operation.outcome.is_some()).count();
    if pending == 0 {
        // Operations with unknown outcomes can all be left out.
        return CheckResult::Linearizable;
    }
    let mut events = Events::new(operations);
    let mut state = model.init();
    let mut bound = 0;
    let mut seen: HashSet<(LinearizedSet, M::State)> = HashSet::new();
    let mut stack: Vec<Frame<M::State>> = Vec::new();
    // The deepest stack seen, as operations, and how much of it the stack still holds:
    // updating only the part that differs keeps the copying linear in the steps taken.
    let mut longest: Vec<usize> = Vec::new();
    let mut shared = 0;
    let mut node = events.first();
    let mut steps = 0u64;
    loop {
        if steps >= max_steps {
            return CheckResult::Unknown;
        }
        steps += 1;
        match events.event(node) {
            Event::Call(op) => {
                let operation = &operations[op];
                let (next_state, output) = model.step(&state, &operation.input);
                if operation.output().is_none_or(|recorded| *recorded == output) {
                    events.lift(op);
                    let next_bound = bound.max(node + 1);
                    if seen.insert((events.linearized_set(next_bound), next_state.clone())) {
                        let before = std::mem::replace(&mut state, next_state);
                        stack.push(Frame { op, state: before, bound: std::mem::replace(&mut bound, next_bound) });
                        if operation.outcome.is_some() {
                            pending -= 1;
                            if pending == 0 {
                                // Unlinearized operations left have unknown outcomes: drop them.
                                return CheckResult::Linearizable;
                            }
                        }
                        if stack.len() > longest.len() {
                            longest.truncate(shared);
                            longest.extend(stack[shared..].iter().map(|frame| frame.op));
                            shared = stack.len();
                        }
                        node = events.first();
                        continue;
                    }
                    // Explored before.
                    events.unlift(op);
                }
                node = events.next(node);
            }
            Event::Return(_) => {
                // An operation completed without being linearized: undo the last choice.
                let Some(Frame { op, state: state_before, bound: bound_before }) = stack.pop() else {
                    // Every order failed; the list is whole again. Describe the deepest point.
                    for &op in &longest {
                        events.lift(op);
                    }
                    return CheckResult::NotLinearizable(events.counterexample(longest));
                };
                shared = shared.min(stack.len());
                events.unlift(op);
                if operations[op].outcome.is_some() {
                    pending += 1;
                }
                state = state_before;
                bound = bound_before;
                node = events.next(events.call_node[op]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Generous enough that no test history here runs out.
    const BUDGET: u64 = 1_000_000;

    fn bytes(text: &str) -> Vec<u8> {
        text.as_bytes().to_vec()
    }

    fn put(key: &str, value: &str) -> KvInput {
        KvInput::Put { key: bytes(key), value: bytes(value) }
    }

    fn get(key: &str) -> KvInput {
        KvInput::Get { key: bytes(key) }
    }

    fn cas(key: &str, expected: Option<&str>, new: &str) -> KvInput {
        KvInput::Cas { key: bytes(key), expected: expected.map(bytes), new: bytes(new) }
    }

    fn value(value: Option<&str>) -> KvOutput {
        KvOutput::Value(value.map(bytes))
    }

    /// Records an operation that ran from `invoked` to `completed` and returned `output`.
    fn done(history: &mut History<KvInput, KvOutput>, client: usize, input: KvInput, output: KvOutput, invoked: u64, completed: u64) -> usize {
        let op = history.invoke(client, input, invoked);
        history.complete(op, output, completed);
        op
    }

    fn is_linearizable(history: &History<KvInput, KvOutput>) -> bool {
        match check_kv(history, BUDGET) {
            CheckResult::Linearizable => true,
            CheckResult::NotLinearizable(_) => false,
            CheckResult::Unknown => panic!("budget exhausted on {history:?}"),
        }
    }

    #[test]
    fn empty_and_sequential_histories_are_linearizable() {
        let mut history = History::new();
        assert_eq!(check_kv(&history, BUDGET), CheckResult::Linearizable);
        assert_eq!(check(&KvModel, &history, 0), CheckResult::Linearizable);
        done(&mut history, 0, get("a"), value(None), 0, 1);
        done(&mut history, 0, put("a", "1"), KvOutput::Written, 2, 3);
        done(&mut history, 1, get("a"), value(Some("1")), 4, 5);
        done(&mut history, 1, cas("a", Some("1"), "2"), KvOutput::Swapped(true), 6, 7);
        done(&mut history, 0, cas("a", Some("1"), "3"), KvOutput::Swapped(false), 8, 9);
        done(&mut history, 0, get("a"), value(Some("2")), 10, 11);
        assert_eq!(check_kv(&history, BUDGET), CheckResult::Linearizable);
        assert_eq!(check(&KvModel, &history, BUDGET), CheckResult::Linearizable);
    }

    #[test]
    fn stale_read_after_completed_write_is_not_linearizable() {
        let mut history = History::new();
        let first = done(&mut history, 0, put("a", "1"), KvOutput::Written, 0, 10);
        let second = done(&mut history, 0, put("a", "2"), KvOutput::Written, 20, 30);
        let read = done(&mut history, 1, get("a"), value(Some("1")), 40, 50);
        let expected = Counterexample { prefix: vec![first, second], blocked: read, candidates: vec![read] };
        assert_eq!(check_kv(&history, BUDGET), CheckResult::NotLinearizable(expected.clone()));
        assert_eq!(check(&KvModel, &history, BUDGET), CheckResult::NotLinearizable(expected));

        // The same read overlapping the second write may precede it.
        let mut history = History::new();
        done(&mut history, 0, put("a", "1"), KvOutput::Written, 0, 10);
        done(&mut history, 0, put("a", "2"), KvOutput::Written, 20, 30);
        done(&mut history, 1, get("a"), value(Some("1")), 25, 50);
        assert!(is_linearizable(&history));
    }

    #[test]
    fn touching_intervals_are_concurrent() {
        let mut history = History::new();
        done(&mut history, 0, put("a", "1"), KvOutput::Written, 0, 10);
        done(&mut history, 1, get("a"), value(None), 10, 20);
        assert!(is_linearizable(&history));
        let mut history = History::new();
        done(&mut history, 0, put("a", "1"), KvOutput::Written, 0, 10);
        done(&mut history, 1, get("a"), value(None), 11, 20);
        assert!(!is_linearizable(&history));
    }

    #[test]
    fn reads_observing_two_concurrent_writes_in_both_orders_are_not_linearizable() {
        let history_with = |last_read_of_client_3: &str| {
            let mut history = History::new();
            done(&mut history, 0, put("a", "1"), KvOutput::Written, 0, 100);
            done(&mut history, 1, put("a", "2"), KvOutput::Written, 0, 100);
            done(&mut history, 2, get("a"), value(Some("1")), 10, 20);
            done(&mut history, 2, get("a"), value(Some("2")), 30, 40);
            done(&mut history, 3, get("a"), value(Some("2")), 10, 20);
            done(&mut history, 3, get("a"), value(Some(last_read_of_client_3)), 30, 40);
            history
        };
        // Client 2 sees 1 then 2, client 3 sees 2 then 1: no single write order explains both.
        assert!(!is_linearizable(&history_with("1")));
        // Control: client 3 seeing 2 twice fits the order "put 1, get, put 2, gets".
        assert!(is_linearizable(&history_with("2")));

        // Once both writes completed, the value is settled: it cannot flip afterwards.
        let mut history = History::new();
        done(&mut history, 0, put("a", "1"), KvOutput::Written, 0, 100);
        done(&mut history, 1, put("a", "2"), KvOutput::Written, 0, 100);
        done(&mut history, 2, get("a"), value(Some("1")), 110, 120);
        done(&mut history, 2, get("a"), value(Some("2")), 130, 140);
        assert!(!is_linearizable(&history));
    }

    #[test]
    fn at_most_one_of_concurrent_cas_from_the_same_value_succeeds() {
        let history_with = |successes: usize, final_value: &str| {
            let mut history = History::new();
            done(&mut history, 0, put("a", "0"), KvOutput::Written, 0, 10);
            for client in 1..=3 {
                let swapped = client <= successes;
                done(&mut history, client, cas("a", Some("0"), &client.to_string()), KvOutput::Swapped(swapped), 20, 30);
            }
            done(&mut history, 4, get("a"), value(Some(final_value)), 40, 50);
            history
        };
        assert!(is_linearizable(&history_with(1, "1")));
        assert!(!is_linearizable(&history_with(1, "2")), "the final read must see the winner's value");
        assert!(!is_linearizable(&history_with(2, "1")), "two CAS from 0 cannot both succeed");
        assert!(!is_linearizable(&history_with(2, "2")));
        assert!(!is_linearizable(&history_with(0, "0")), "the first CAS to run from 0 succeeds");

        // CAS from "absent": exactly one creator wins.
        let mut history = History::new();
        done(&mut history, 0, cas("b", None, "x"), KvOutput::Swapped(true), 0, 10);
        done(&mut history, 1, cas("b", None, "y"), KvOutput::Swapped(false), 0, 10);
        done(&mut history, 2, get("b"), value(Some("x")), 20, 30);
        assert!(is_linearizable(&history));
        let mut history = History::new();
        done(&mut history, 0, cas("b", None, "x"), KvOutput::Swapped(true), 0, 10);
        done(&mut history, 1, cas("b", None, "y"), KvOutput::Swapped(true), 0, 10);
        assert!(!is_linearizable(&history));
    }

    #[test]
    fn unknown_write_may_take_effect_late_or_never() {
        let with_reads = |reads: &[&str]| {
            let mut history = History::new();
            done(&mut history, 0, put("a", "1"), KvOutput::Written, 0, 10);
            history.invoke(1, put("a", "2"), 20); // Timed out: never completed.
            for (i, read) in reads.iter().enumerate() {
                let at = 100 + 20 * i as u64;
                done(&mut history, 2, get("a"), value(Some(read)), at, at + 10);
            }
            history
        };
        // Observed long after the client gave up on it.
        assert!(is_linearizable(&with_reads(&["1", "2"])));
        assert!(is_linearizable(&with_reads(&["2"])));
        // Never observed.
        assert!(is_linearizable(&with_reads(&["1", "1"])));
        // But once observed it cannot be undone.
        assert!(!is_linearizable(&with_reads(&["2", "1"])));

        // It cannot take effect before its invocation.
        let mut history = History::new();
        done(&mut history, 0, get("a"), value(Some("2")), 0, 10);
        history.invoke(1, put("a", "2"), 20);
        assert!(!is_linearizable(&history));
    }

    #[test]
    fn read_of_a_value_no_write_wrote_is_not_linearizable() {
        let mut history = History::new();
        done(&mut history, 0, put("a", "1"), KvOutput::Written, 0, 10);
        history.invoke(1, put("a", "2"), 0);
        let read = done(&mut history, 2, get("a"), value(Some("3")), 0, 30);
        let CheckResult::NotLinearizable(counterexample) = check_kv(&history, BUDGET) else {
            panic!("a read of 3 was accepted");
        };
        assert_eq!(counterexample.blocked, read);
        assert!(!counterexample.prefix.contains(&read));
    }

    #[test]
    fn keys_are_checked_independently_and_reported_with_history_indices() {
        let mut history = History::new();
        done(&mut history, 0, put("a", "1"), KvOutput::Written, 0, 10);
        let b_write = done(&mut history, 1, put("b", "1"), KvOutput::Written, 0, 10);
        done(&mut history, 0, get("a"), value(Some("1")), 20, 30);
        let b_read = done(&mut history, 1, get("b"), value(None), 20, 30);
        let expected = Counterexample { prefix: vec![b_write], blocked: b_read, candidates: vec![b_read] };
        assert_eq!(check_kv(&history, BUDGET), CheckResult::NotLinearizable(expected));
    }

    #[test]
    fn exhausted_budget_is_unknown_not_a_verdict() {
        // Ten concurrent writes then a read of a value none of them wrote: the search must
        // try many write orders before giving up.
        let mut history = History::new();
        for client in 0..10 {
            done(&mut history, client, put("a", &client.to_string()), KvOutput::Written, 0, 100);
        }
        done(&mut history, 10, get("a"), value(Some("nope")), 200, 300);
        assert_eq!(check_kv(&history, 10), CheckResult::Unknown);
        assert_eq!(check(&KvModel, &history, 10), CheckResult::Unknown);
        assert!(matches!(check_kv(&history, BUDGET), CheckResult::NotLinearizable(_)));
    }

    #[test]
    #[should_panic(expected = "before its invocation")]
    fn completion_before_invocation_is_rejected() {
        let mut history: History<KvInput, KvOutput> = History::new();
        let op = history.invoke(0, get("a"), 10);
        history.complete(op, value(None), 9);
    }

    /// What became of a generated operation.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Fate {
        /// Completed, output seen by the client.
        Returned,
        /// Took effect at its sequential point, but the client never learned the outcome.
        AppliedUnknown,
        /// Never took effect, and the client never learned that.
        LostUnknown,
    }

    /// An operation of a generated sequential execution: it takes effect at its point in
    /// the sequence, and its recorded interval stretches `before` and `after` around it.
    #[derive(Clone, Debug)]
    struct Planned {
        input: KvInput,
        fate: Fate,
        before: u64,
        after: u64,
    }

    /// An operation as recorded, before it becomes part of a [`History`].
    #[derive(Clone, Debug)]
    struct Record {
        input: KvInput,
        invoked: u64,
        outcome: Option<(u64, KvOutput)>,
    }

    fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
        prop::sample::select(vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()])
    }

    fn value_strategy() -> impl Strategy<Value = Vec<u8>> {
        (0u8..4).prop_map(|value| vec![b'0' + value])
    }

    fn input_strategy() -> impl Strategy<Value = KvInput> {
        prop_oneof![
            (key_strategy(), value_strategy()).prop_map(|(key, value)| KvInput::Put { key, value }),
            key_strategy().prop_map(|key| KvInput::Get { key }),
            (key_strategy(), prop::option::of(value_strategy()), value_strategy()).prop_map(|(key, expected, new)| KvInput::Cas {
                key,
                expected,
                new
            }),
        ]
    }

    fn planned_strategy() -> impl Strategy<Value = Planned> {
        let fate = prop_oneof![8 => Just(Fate::Returned), 1 => Just(Fate::AppliedUnknown), 1 => Just(Fate::LostUnknown)];
        (input_strategy(), fate, 0u64..60, 0u64..60).prop_map(|(input, fate, before, after)| Planned { input, fate, before, after })
    }

    /// Runs `plan` sequentially against [`KvModel`], operation `i` taking effect at time
    /// `1000 + 10 i`, inside its recorded interval: a linearizable history by construction.
    fn execute(plan: &[Planned]) -> Vec<Record> {
        let mut state = KvModel.init();
        let mut records = Vec::with_capacity(plan.len());
        for (i, planned) in plan.iter().enumerate() {
            let point = 1000 + 10 * i as u64;
            let (next, output) = KvModel.step(&state, &planned.input);
            if planned.fate != Fate::LostUnknown {
                state = next;
            }
            let outcome = (planned.fate == Fate::Returned).then_some((point + planned.after, output));
            records.push(Record { input: planned.input.clone(), invoked: point - planned.before, outcome });
        }
        records
    }

    fn to_history(records: &[Record]) -> History<KvInput, KvOutput> {
        let mut history = History::new();
        for (client, record) in records.iter().enumerate() {
            let op = history.invoke(client, record.input.clone(), record.invoked);
            if let Some((at, output)) = &record.outcome {
                history.complete(op, output.clone(), *at);
            }
        }
        history
    }

    /// Tries every order of the operations `ops` of `records` (and every subset of the
    /// unknown-outcome ones): whether one explains them all, and the length of the longest
    /// order that respects real time and the model but leaves completed operations out.
    fn brute_force(records: &[Record], ops: Vec<usize>) -> (bool, usize) {
        fn extend(records: &[Record], remaining: &mut Vec<usize>, state: &BTreeMap<Vec<u8>, Vec<u8>>) -> (bool, usize) {
            if remaining.iter().all(|&op| records[op].outcome.is_none()) {
                return (true, 0);
            }
            let mut longest = 0;
            for slot in 0..remaining.len() {
                let op = remaining[slot];
                if !may_come_next(records, remaining, op) {
                    continue;
                }
                let (next, output) = KvModel.step(state, &records[op].input);
                if records[op].outcome.as_ref().is_some_and(|(_, recorded)| *recorded != output) {
                    continue;
                }
                remaining.remove(slot);
                let (found, reached) = extend(records, remaining, &next);
                remaining.insert(slot, op);
                if found {
                    return (true, 0);
                }
                longest = longest.max(reached + 1);
            }
            (false, longest)
        }
        extend(records, &mut ops.clone(), &KvModel.init())
    }

    /// Whether `op` may be linearized before all of `remaining`: none of them completed
    /// before it was invoked.
    fn may_come_next(records: &[Record], remaining: &[usize], op: usize) -> bool {
        !remaining.iter().any(|&other| records[other].outcome.as_ref().is_some_and(|(at, _)| *at < records[op].invoked))
    }

    /// Checks that `counterexample` describes a stuck point of the sub-history `ops` of
    /// `records`: its prefix is a longest valid partial linearization (as long as
    /// `longest`), `blocked` the first completion outside it and `candidates` the
    /// operations invoked by then.
    fn validate(records: &[Record], ops: &[usize], counterexample: &Counterexample, longest: usize) -> Result<(), String> {
        let Counterexample { prefix, blocked, candidates } = counterexample;
        if prefix.len() != longest {
            return Err(format!("prefix of {} operations, the longest has {longest}", prefix.len()));
        }
        let mut remaining = ops.to_vec();
        let mut state = KvModel.init();
        for &op in prefix {
            if !may_come_next(records, &remaining, op) {
                return Err(format!("operation {op} linearized before one that completed before its invocation"));
            }
            let (next, output) = KvModel.step(&state, &records[op].input);
            if records[op].outcome.as_ref().is_some_and(|(_, recorded)| *recorded != output) {
                return Err(format!("operation {op} linearized where its output is wrong"));
            }
            state = next;
            remaining.retain(|&other| other != op);
        }
        let completion = |op: usize| records[op].outcome.as_ref().map(|(at, _)| *at);
        let first_completion = remaining.iter().filter_map(|&op| completion(op).map(|at| (at, op))).min().map(|(_, op)| op);
        if first_completion != Some(*blocked) {
            return Err(format!("blocked {blocked}, but {first_completion:?} completes first"));
        }
        let mut expected: Vec<usize> = remaining.into_iter().filter(|&op| Some(records[op].invoked) <= completion(*blocked)).collect();
        expected.sort_by_key(|&op| (records[op].invoked, op));
        if *candidates != expected {
            return Err(format!("candidates {candidates:?}, expected {expected:?}"));
        }
        Ok(())
    }

    /// Arbitrary small histories: outputs of the right kind but random values, so that
    /// both verdicts come up.
    fn random_record_strategy() -> impl Strategy<Value = Record> {
        let key = prop::sample::select(vec![b"a".to_vec(), b"b".to_vec()]);
        let small_value = (0u8..2).prop_map(|value| vec![b'0' + value]);
        let input = prop_oneof![
            (key.clone(), small_value.clone()).prop_map(|(key, value)| KvInput::Put { key, value }),
            key.clone().prop_map(|key| KvInput::Get { key }),
            (key, prop::option::of(small_value.clone()), small_value.clone()).prop_map(|(key, expected, new)| KvInput::Cas { key, expected, new }),
        ];
        (input, prop::option::of(small_value), any::<bool>(), 0u64..20, 0u64..10, prop::bool::weighted(0.2)).prop_map(
            |(input, read, swapped, invoked, duration, unknown)| {
                let output = match input {
                    KvInput::Put { .. } => KvOutput::Written,
                    KvInput::Get { .. } => KvOutput::Value(read),
                    KvInput::Cas { .. } => KvOutput::Swapped(swapped),
                };
                Record { input, invoked, outcome: (!unknown).then_some((invoked + duration, output)) }
            },
        )
    }

    proptest! {
        #[test]
        fn histories_built_around_a_sequential_execution_are_linearizable(plan in prop::collection::vec(planned_strategy(), 0..40)) {
            let history = to_history(&execute(&plan));
            prop_assert_eq!(check_kv(&history, BUDGET), CheckResult::Linearizable);
        }

        #[test]
        fn a_read_of_a_value_never_written_is_not_linearizable(
            plan in prop::collection::vec(planned_strategy(), 0..40),
            read_at in any::<prop::sample::Index>(),
            key in key_strategy(),
            before in 0u64..60,
            after in 0u64..60,
        ) {
            let mut plan = plan;
            let read_at = read_at.index(plan.len() + 1);
            plan.insert(read_at, Planned { input: KvInput::Get { key }, fate: Fate::Returned, before, after });
            let mut records = execute(&plan);
            prop_assert_eq!(check_kv(&to_history(&records), BUDGET), CheckResult::Linearizable);
            if let Some((_, output)) = &mut records[read_at].outcome {
                *output = KvOutput::Value(Some(b"never written".to_vec()));
            }
            match check_kv(&to_history(&records), BUDGET) {
                CheckResult::NotLinearizable(counterexample) => prop_assert!(!counterexample.prefix.contains(&read_at)),
                other => prop_assert!(false, "corrupted read accepted: {:?}", other),
            }
        }

        #[test]
        fn verdicts_match_an_exhaustive_search(records in prop::collection::vec(random_record_strategy(), 0..9)) {
            let history = to_history(&records);
            let all: Vec<usize> = (0..records.len()).collect();
            let (linearizable, longest) = brute_force(&records, all.clone());
            match check(&KvModel, &history, BUDGET) {
                CheckResult::Linearizable => prop_assert!(linearizable, "check accepted a non-linearizable history"),
                CheckResult::NotLinearizable(counterexample) => {
                    prop_assert!(!linearizable, "check rejected a linearizable history: {:?}", counterexample);
                    let validated = validate(&records, &all, &counterexample, longest);
                    prop_assert!(validated.is_ok(), "check: {:?}: {:?}", validated, counterexample);
                }
                CheckResult::Unknown => prop_assert!(false, "check ran out of budget"),
            }
            match check_kv(&history, BUDGET) {
                CheckResult::Linearizable => prop_assert!(linearizable, "check_kv accepted a non-linearizable history"),
                CheckResult::NotLinearizable(counterexample) => {
                    prop_assert!(!linearizable, "check_kv rejected a linearizable history: {:?}", counterexample);
                    // The counterexample concerns the blocked operation's key, without the
                    // gets of unknown outcome (which check_kv leaves out).
                    let key = records[counterexample.blocked].input.key();
                    let ops: Vec<usize> = all
                        .into_iter()
                        .filter(|&op| records[op].input.key() == key)
                        .filter(|&op| records[op].outcome.is_some() || !matches!(records[op].input, KvInput::Get { .. }))
                        .collect();
                    let (_, longest) = brute_force(&records, ops.clone());
                    let validated = validate(&records, &ops, &counterexample, longest);
                    prop_assert!(validated.is_ok(), "check_kv: {:?}: {:?}", validated, counterexample);
                }
                CheckResult::Unknown => prop_assert!(false, "check_kv ran out of budget"),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(8))]

        #[test]
        fn long_histories_are_checked_within_budget(plan in prop::collection::vec(planned_strategy(), 500..1000)) {
            let history = to_history(&execute(&plan));
            prop_assert_eq!(check_kv(&history, BUDGET), CheckResult::Linearizable);
        }
    }
}
