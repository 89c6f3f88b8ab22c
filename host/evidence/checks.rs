//! The four AIV-direct checks (docs/hardware.md section 1), derived from a record's three acts and, for
//! self-reported acts, the run's observer.

use serde::Serialize;

use super::act::{Act, Source};
use super::observer::{Corroboration, DeviceObserver};

/// The outcome of one AIV-direct check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The observations show it.
    Yes,
    /// The observations show otherwise (or show nothing that would make it hold).
    No,
    /// Not observed on this runtime or in this run: neither yes nor no.
    Unknown,
}

impl Check {
    /// `yes`, `no` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Check::Yes => "yes",
            Check::No => "no",
            Check::Unknown => "unknown",
        }
    }
}

/// The four AIV-direct checks (docs/hardware.md section 1), derived from a record's acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Checks {
    /// A kernel on the AI Vector cores took part: some act was observed done by an AIV core.
    pub kernel_on_aiv: Check,
    /// The kernel wrote the descriptors: every descriptor consumed was written by an AIV core.
    pub kernel_writes_descriptors: Check,
    /// The kernel rang the doorbell: every doorbell write was an AIV core's.
    pub kernel_rings_doorbell: Check,
    /// Completion was observed on the Device: every completion flag read first was read by an AIV core.
    pub device_observes_completion: Check,
}

impl Checks {
    /// The checks of a transfer whose three acts are these (no independent device-side observer: a
    /// [self-reported](Source::SelfReported) act makes its check `unknown` at best).
    pub fn of(descriptors: &Act, doorbells: &Act, completion: &Act) -> Checks {
        Checks::observed(descriptors, doorbells, completion, None)
    }

    /// The checks of acts whose window `observer` watched (a run's, [`EvidenceTally::observer`]).
    pub fn observed(descriptors: &Act, doorbells: &Act, completion: &Act, observer: Option<&DeviceObserver>) -> Checks {
        let acts = [descriptors, doorbells, completion];
        let corroboration = observer.map_or(Corroboration::Silent, DeviceObserver::corroboration);
        let kernel_on_aiv = if acts.iter().any(|act| act.source.is_observed() && act.by_aiv > 0) {
            Check::Yes
        } else if acts.iter().any(|act| act.source == Source::SelfReported && act.by_aiv > 0) {
            // The kernel says it ran: the observer must have seen it run.
            if observer.is_some_and(DeviceObserver::saw_aiv_kernel) {
                Check::Yes
            } else {
                Check::Unknown
            }
        } else if acts.iter().all(|act| act.source.has_counts()) {
            Check::No
        } else {
            Check::Unknown
        };
        Checks {
            kernel_on_aiv,
            kernel_writes_descriptors: descriptors.check(false, corroboration),
            kernel_rings_doorbell: doorbells.check(false, corroboration),
            // A flag overwritten by the next one before anybody read it is covered by that next flag's read (an
            // SDMA engine executes a channel's SQEs in order).
            device_observes_completion: completion.check(true, corroboration),
        }
    }

    /// The four in order: kernel on the AIV cores, descriptors, doorbell, completion.
    pub fn as_array(&self) -> [Check; 4] {
        [
            self.kernel_on_aiv,
            self.kernel_writes_descriptors,
            self.kernel_rings_doorbell,
            self.device_observes_completion,
        ]
    }

    /// All four together: yes if every one is yes, no if any is no, else unknown.
    pub fn aiv_direct(&self) -> Check {
        let all = self.as_array();
        if all.iter().all(|&check| check == Check::Yes) {
            Check::Yes
        } else if all.contains(&Check::No) {
            Check::No
        } else {
            Check::Unknown
        }
    }
}
