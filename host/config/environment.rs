//! The environment the configuration reads ([`Environment`]): the process's, a closure, one that records what was
//! read, and a fixed set of variables that replays a recorded run.

/// Environment the configuration may read, injectable for tests.
pub trait Environment {
    /// The value of `name`, if set and valid UTF-8.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl<F: Fn(&str) -> Option<String>> Environment for F {
    fn var(&self, name: &str) -> Option<String> {
        self(name)
    }
}

/// An environment that remembers every variable read through it that was set, with its value: what a report
/// records so that a rerun sees the same configuration ([`FixedEnvironment`]).
pub struct RecordingEnvironment<'a> {
    inner: &'a dyn Environment,
    seen: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
}

impl std::fmt::Debug for RecordingEnvironment<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingEnvironment").field("seen", &self.seen()).finish_non_exhaustive()
    }
}

impl<'a> RecordingEnvironment<'a> {
    pub fn new(inner: &'a dyn Environment) -> Self {
        RecordingEnvironment { inner, seen: std::sync::Mutex::new(std::collections::BTreeMap::new()) }
    }

    /// The variables read that were set, by name.
    pub fn seen(&self) -> std::collections::BTreeMap<String, String> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Environment for RecordingEnvironment<'_> {
    fn var(&self, name: &str) -> Option<String> {
        let value = self.inner.var(name);
        if let Some(value) = &value {
            self.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_owned(), value.clone());
        }
        value
    }
}

/// An environment of exactly these variables (nothing of the process's): a recorded run's, replayed.
#[derive(Clone, Debug, Default)]
pub struct FixedEnvironment(pub std::collections::BTreeMap<String, String>);

impl Environment for FixedEnvironment {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
}
