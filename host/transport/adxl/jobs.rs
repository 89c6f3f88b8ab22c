//! The queue between a HiXL path's submitters and its Host thread, and how the thread cuts what it takes into
//! batches: consecutive jobs of one peer and one direction, up to a batch's limit.
//!
//! Owns: the queue and its stop flag. Knows nothing of HiXL, FabricMem or task slots.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How long the Host thread sleeps before it looks at the queue again without being woken (a missed wake-up costs
/// at most this).
const RECHECK: Duration = Duration::from_millis(20);

#[derive(Debug)]
struct State<J> {
    jobs: VecDeque<J>,
    stop: bool,
}

/// Jobs queued for one Host thread.
#[derive(Debug)]
pub(super) struct JobQueue<J> {
    state: Mutex<State<J>>,
    queued: Condvar,
}

impl<J> JobQueue<J> {
    pub(super) fn new() -> Self {
        JobQueue { state: Mutex::new(State { jobs: VecDeque::new(), stop: false }), queued: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, State<J>> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `jobs` and wakes the thread.
    pub(super) fn push(&self, jobs: impl IntoIterator<Item = J>) {
        self.lock().jobs.extend(jobs);
        self.queued.notify_one();
    }

    /// Tells the thread to stop: [`JobQueue::wait`] returns `None` from now on.
    pub(super) fn stop(&self) {
        self.lock().stop = true;
        self.queued.notify_all();
    }

    /// Every job still queued (after [`JobQueue::stop`]: those the thread will never take).
    pub(super) fn drain(&self) -> Vec<J> {
        self.lock().jobs.drain(..).collect()
    }

    /// Waits until jobs are queued and takes them all, in order; `None` once stopped.
    pub(super) fn wait(&self) -> Option<Vec<J>> {
        let mut state = self.lock();
        while state.jobs.is_empty() && !state.stop {
            state = self.queued.wait_timeout(state, RECHECK).unwrap_or_else(|poisoned| poisoned.into_inner()).0;
        }
        if state.stop {
            return None;
        }
        Some(state.jobs.drain(..).collect())
    }
}

/// Cuts `jobs` into batches of consecutive jobs that `together` says may share one (compared with the batch's first),
/// each of at most `limit` jobs.
pub(super) fn batches<J>(jobs: Vec<J>, limit: usize, together: impl Fn(&J, &J) -> bool) -> Vec<Vec<J>> {
    let mut out: Vec<Vec<J>> = Vec::new();
    for job in jobs {
        match out.last_mut() {
            Some(batch) if batch.len() < limit && together(&batch[0], &job) => batch.push(job),
            _ => out.push(vec![job]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_runs_of_one_key_up_to_the_limit() {
        let jobs = vec![(1, 'a'), (1, 'b'), (1, 'c'), (2, 'd'), (1, 'e')];
        let cut = batches(jobs, 2, |first, next| first.0 == next.0);
        let letters: Vec<String> = cut.iter().map(|batch| batch.iter().map(|job| job.1).collect()).collect();
        assert_eq!(letters, ["ab", "c", "d", "e"]);
        assert!(batches(Vec::<u8>::new(), 4, |_, _| true).is_empty());
    }

    #[test]
    fn a_stopped_queue_hands_out_nothing_and_keeps_what_was_left() {
        let queue = JobQueue::new();
        queue.push([1, 2]);
        assert_eq!(queue.wait(), Some(vec![1, 2]));
        queue.push([3]);
        queue.stop();
        assert_eq!(queue.wait(), None);
        assert_eq!(queue.drain(), [3]);
    }

    #[test]
    fn a_waiting_thread_is_woken_by_a_push() {
        let queue = std::sync::Arc::new(JobQueue::new());
        let waiter = {
            let queue = queue.clone();
            std::thread::spawn(move || queue.wait())
        };
        queue.push(["job"]);
        assert_eq!(waiter.join().expect("the waiter panicked"), Some(vec!["job"]));
    }
}
