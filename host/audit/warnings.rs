//! Warnings during an audit. The error-recovery rounds provoke warnings on purpose (an out-of-bounds request
//! rejected, a killed peer found lost, a refused connect): those are recorded in the round's record and kept off the
//! terminal. Every other warning or error is printed as usual and recorded too: one inside a round that does not
//! match what the round declared in the round's record, one outside the rounds in the audit's.
//!
//! The capture is process-wide, not per thread: the warnings a round provokes come from the engine's threads (the
//! aiv transport's peer probe, the tcp client's lanes) as well as from the thread that runs the round. While a round
//! runs, and for [`GRACE`] after it ended (a probe notices a loss up to one probe interval late), an event whose
//! target and message match one of the round's [`Expected`] declarations is the round's expected warning. One audit
//! at a time per process: the `aiv audit` command runs one.
//!
//! Owns: the declarations ([`Expected`]), the capture ([`AuditCapture`], [`RoundCapture`]), the layer that records
//! ([`Recorder`]), the filter that keeps expected warnings off the terminal ([`NotExpected`]), and the records
//! ([`WarningRecord`]). It must not decide what a round provokes (the rounds declare it: `faults.rs`, `peer.rs`)
//! nor print.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter, Layer};

/// How long a round's declared warnings stay expected after the round ended.
pub const GRACE: Duration = Duration::from_secs(1);

/// A warning a round provokes on purpose: an event of `target` (the module that emits it, or a module inside it: a
/// module split into files keeps its expectations) whose message starts with `message`; `what` says in plain words
/// what it is, for report.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    pub target: &'static str,
    pub message: &'static str,
    pub what: &'static str,
}

impl Expected {
    fn matches(&self, target: &str, message: &str) -> bool {
        let inside = target.strip_prefix(self.target).is_some_and(|rest| rest.is_empty() || rest.starts_with("::"));
        inside && message.starts_with(self.message)
    }
}

/// Warnings of one kind, de-duplicated by target and message, with how many there were.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WarningRecord {
    /// `WARN` or `ERROR`.
    pub level: String,
    /// The module that emitted it.
    pub target: String,
    pub message: String,
    /// The declaration it matched, in plain words (expected warnings only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub what: Option<String>,
    pub count: u64,
    /// The first occurrence's other fields, `name=value` separated by spaces.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fields: String,
}

/// `records` in one phrase for report.md: how many, of which `kind` (`expected`, `unexpected`), and each kind with
/// its count, e.g. "3 expected warnings (out-of-bounds request rejected ×2, peer found lost ×1)"; empty for none.
pub fn summary(records: &[WarningRecord], kind: &str) -> String {
    let total: u64 = records.iter().map(|r| r.count).sum();
    if total == 0 {
        return String::new();
    }
    let each: Vec<String> = records
        .iter()
        .map(|r| match &r.what {
            Some(what) => format!("{what} ×{}", r.count),
            None => format!("{} {}: {} ×{}", r.level, r.target, r.message, r.count),
        })
        .collect();
    format!("{total} {kind} warning{} ({})", if total == 1 { "" } else { "s" }, each.join(", "))
}

/// What one round captured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoundWarnings {
    pub expected: Vec<WarningRecord>,
    pub unexpected: Vec<WarningRecord>,
}

/// What an audit captured: per round (by the id [`RoundCapture::id`] gave), and outside the rounds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Captured {
    pub rounds: BTreeMap<u64, RoundWarnings>,
    pub outside: Vec<WarningRecord>,
}

struct Round {
    id: u64,
    expects: &'static [Expected],
    ended: Option<Instant>,
    warnings: RoundWarnings,
}

struct State {
    /// Whether an audit is capturing.
    active: bool,
    next_id: u64,
    rounds: Vec<Round>,
    outside: Vec<WarningRecord>,
}

static STATE: Mutex<State> = Mutex::new(State { active: false, next_id: 0, rounds: Vec::new(), outside: Vec::new() });

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Where an event belongs.
#[derive(Debug, PartialEq)]
enum Class {
    /// No audit is capturing: printed, not recorded.
    Untracked,
    /// A round's expected warning (the round's index in the state, and the declaration's words): recorded, not
    /// printed.
    Expected(usize, &'static str),
    /// A warning inside a round that does not match its declarations: printed and recorded in the round.
    Unexpected(usize),
    /// A warning outside the rounds: printed and recorded in the audit's list.
    Outside,
}

fn classify(state: &State, target: &str, message: &str, now: Instant) -> Class {
    if !state.active {
        return Class::Untracked;
    }
    let live = |round: &Round| round.ended.is_none_or(|ended| now.saturating_duration_since(ended) <= GRACE);
    // The newest round first: a round that runs, then the ones still in their grace.
    let mut open = None;
    for (index, round) in state.rounds.iter().enumerate().rev().filter(|(_, round)| live(round)) {
        if let Some(expected) = round.expects.iter().find(|e| e.matches(target, message)) {
            return Class::Expected(index, expected.what);
        }
        if round.ended.is_none() && open.is_none() {
            open = Some(index);
        }
    }
    open.map_or(Class::Outside, Class::Unexpected)
}

/// Whether a warning of `target` with `message` is one a round expects now (it is then kept off the terminal).
pub fn is_expected(target: &str, message: &str) -> bool {
    matches!(classify(&state(), target, message, Instant::now()), Class::Expected(..))
}

/// Records one warning or error where it belongs.
fn record(level: &Level, target: &str, message: String, fields: String) {
    let mut state = state();
    let class = classify(&state, target, &message, Instant::now());
    let (list, what) = match class {
        Class::Untracked => return,
        Class::Expected(index, what) => (&mut state.rounds[index].warnings.expected, Some(what.to_owned())),
        Class::Unexpected(index) => (&mut state.rounds[index].warnings.unexpected, None),
        Class::Outside => (&mut state.outside, None),
    };
    match list.iter_mut().find(|r| r.target == target && r.message == message) {
        Some(known) => known.count += 1,
        None => list.push(WarningRecord {
            level: level.as_str().to_owned(),
            target: target.to_owned(),
            message,
            what,
            count: 1,
            fields,
        }),
    }
}

/// An audit's capture, from [`AuditCapture::start`] to [`AuditCapture::finish`] (or its drop).
#[derive(Debug)]
pub struct AuditCapture {
    finished: bool,
}

impl AuditCapture {
    /// Starts capturing (what an earlier audit of this process left is dropped).
    pub fn start() -> AuditCapture {
        let mut state = state();
        state.active = true;
        state.rounds.clear();
        state.outside.clear();
        AuditCapture { finished: false }
    }

    /// Waits out the grace of the rounds that ended last (at most [`GRACE`]), then stops capturing and returns
    /// everything captured.
    pub fn finish(mut self) -> Captured {
        let last_end = state().rounds.iter().filter_map(|r| r.ended).max();
        if let Some(ended) = last_end {
            std::thread::sleep(GRACE.saturating_sub(ended.elapsed()));
        }
        self.finished = true;
        let mut state = state();
        state.active = false;
        let rounds = std::mem::take(&mut state.rounds).into_iter().map(|r| (r.id, r.warnings)).collect();
        Captured { rounds, outside: std::mem::take(&mut state.outside) }
    }
}

impl Drop for AuditCapture {
    fn drop(&mut self) {
        if !self.finished {
            let mut state = state();
            state.active = false;
            state.rounds.clear();
            state.outside.clear();
        }
    }
}

/// One round's capture: its declarations are expected from [`RoundCapture::start`] until [`GRACE`] after its drop.
#[derive(Debug)]
pub struct RoundCapture {
    id: u64,
}

impl RoundCapture {
    /// Starts a round that provokes the warnings `expects` declares.
    pub fn start(expects: &'static [Expected]) -> RoundCapture {
        let mut state = state();
        let id = state.next_id;
        state.next_id += 1;
        state.rounds.push(Round { id, expects, ended: None, warnings: RoundWarnings::default() });
        RoundCapture { id }
    }

    /// The round's key in [`Captured::rounds`].
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for RoundCapture {
    fn drop(&mut self) {
        let mut state = state();
        if let Some(round) = state.rounds.iter_mut().find(|r| r.id == self.id) {
            round.ended = Some(Instant::now());
        }
    }
}

/// An event's message and its other fields.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.push(field, value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.push(field, &format!("{value:?}"));
        }
    }
}

impl Fields {
    fn push(&mut self, field: &Field, value: &str) {
        if !self.rest.is_empty() {
            self.rest.push(' ');
        }
        let _ = write!(self.rest, "{}={value}", field.name());
    }

    fn of(event: &Event<'_>) -> Fields {
        let mut fields = Fields::default();
        event.record(&mut fields);
        fields
    }
}

fn is_warning(metadata: &Metadata<'_>) -> bool {
    *metadata.level() <= Level::WARN
}

/// The layer that records every warning and error while an audit captures (give it a `WARN` level filter, so that
/// it sees them whatever the printing layer's filter is).
#[derive(Clone, Copy, Debug, Default)]
pub struct Recorder;

impl<S: Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let metadata = event.metadata();
        if is_warning(metadata) {
            let fields = Fields::of(event);
            record(metadata.level(), metadata.target(), fields.message, fields.rest);
        }
    }
}

/// The filter of the printing layer that lets through everything but the warnings a round expects now.
#[derive(Clone, Copy, Debug, Default)]
pub struct NotExpected;

impl<S> Filter<S> for NotExpected {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        let metadata = event.metadata();
        !is_warning(metadata) || !is_expected(metadata.target(), &Fields::of(event).message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECLARED: &[Expected] = &[Expected { target: "a::b", message: "request rejected", what: "rejected" }];

    fn with(rounds: Vec<Round>) -> State {
        State { active: true, next_id: 0, rounds, outside: Vec::new() }
    }

    fn round(id: u64, ended: Option<Instant>) -> Round {
        Round { id, expects: DECLARED, ended, warnings: RoundWarnings::default() }
    }

    #[test]
    fn a_summary_counts_each_kind() {
        let record = |what: Option<&str>, count| WarningRecord {
            level: "WARN".into(),
            target: "a::b".into(),
            message: "request rejected".into(),
            what: what.map(str::to_owned),
            count,
            fields: String::new(),
        };
        assert_eq!(summary(&[], "expected"), "");
        let expected = [record(Some("rejected"), 2), record(Some("lost"), 1)];
        assert_eq!(summary(&expected, "expected"), "3 expected warnings (rejected ×2, lost ×1)");
        assert_eq!(summary(&[record(None, 1)], "unexpected"), "1 unexpected warning (WARN a::b: request rejected ×1)");
    }

    #[test]
    fn a_declared_target_covers_the_modules_inside_it_and_no_other() {
        let declared = DECLARED[0];
        assert!(declared.matches("a::b", "request rejected"));
        assert!(declared.matches("a::b::submit", "request rejected: why"));
        assert!(!declared.matches("a::bc", "request rejected"), "a sibling whose name starts the same");
        assert!(!declared.matches("a", "request rejected"), "the parent");
        assert!(!declared.matches("a::b::submit", "another message"));
    }

    #[test]
    fn a_declared_warning_is_expected_while_the_round_runs_and_for_its_grace_only() {
        let now = Instant::now();
        let idle = State { active: false, ..with(vec![round(0, None)]) };
        assert_eq!(classify(&idle, "a::b", "request rejected", now), Class::Untracked);
        let running = with(vec![round(0, None)]);
        assert_eq!(classify(&running, "a::b", "request rejected x", now), Class::Expected(0, "rejected"));
        assert_eq!(classify(&running, "a::c", "request rejected", now), Class::Unexpected(0));
        assert_eq!(classify(&running, "a::b", "other", now), Class::Unexpected(0));
        let ended = with(vec![round(0, Some(now))]);
        assert_eq!(classify(&ended, "a::b", "request rejected", now + GRACE / 2), Class::Expected(0, "rejected"));
        assert_eq!(classify(&ended, "a::b", "request rejected", now + GRACE * 2), Class::Outside);
        assert_eq!(classify(&ended, "a::b", "other", now), Class::Outside);
        // A late warning of a round in its grace belongs to it, not to the round that runs next.
        let next = Round { expects: &[], ..round(1, None) };
        let both = with(vec![round(0, Some(now)), next]);
        assert_eq!(classify(&both, "a::b", "request rejected", now), Class::Expected(0, "rejected"));
        assert_eq!(classify(&both, "a::b", "other", now), Class::Unexpected(1));
    }
}
