//! A Mooncake path's error-recovery rounds, run on its session after the data check (they end the target):
//! `out_of_bounds` and `killed_peer` injected through the wheel's own calls, `stalled_engine` not injected, with why.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::driver::Driver;
use super::session::Session;
use super::{Variant, BIG_BATCH};
use crate::audit::report;

impl Session {
    /// The path's error-recovery rounds (run after the data check, as they end the target): `out_of_bounds` (4 x
    /// 64 KiB WRITEs, the second running 4 KiB past the target's buffer), `killed_peer` (the target process SIGKILLed
    /// 20 ms into a batch of [`BIG_BATCH`] WRITEs of 1 MiB, then a new transfer to it); `stalled_engine` is not injected. The
    /// wheel's batch calls return one code per batch, so each transfer's state is the batch's.
    pub fn fault_rounds(&mut self) -> Vec<report::FaultRound> {
        let path = self.variant.path();
        let not = |fault: &str, reason: String| report::FaultRound::not_injected(path, fault, reason);
        let engine = match self.variant {
            Variant::TwinHixl => "the twin's adxl::AdxlEngine",
            Variant::OverAiv => "this project's aiv engine behind its libllm_datadist.so",
        };
        let stalled = not(
            "stalled_engine",
            format!(
                "the wheel's copies run inside its own processes ({engine}), which this process cannot stall \
                 without stopping the peer, and a stopped peer holds the batch for the wheel's own transfer timeout"
            ),
        );
        let (peer, remote, size, margin) = (self.peer.clone(), self.remote, self.size, self.margin);
        let Ok((target, initiator)) = self.drivers() else {
            let reason = self.failure.clone().unwrap_or_else(|| "the Mooncake processes are not running".into());
            return vec![not("out_of_bounds", reason.clone()), stalled, not("killed_peer", reason)];
        };
        let batch = |initiator: &mut Driver, requests: &[(u64, u64, u64)], within: Duration| {
            let column = |pick: fn(&(u64, u64, u64)) -> u64| requests.iter().map(pick).collect::<Vec<u64>>();
            let request = json!({"cmd": "batch", "peer": peer, "remote": remote, "op": "write",
                "locals": column(|r| r.0), "remotes": column(|r| r.1), "lengths": column(|r| r.2)});
            initiator.call(request, within).map(|answer| {
                let rc = answer.get("rc").and_then(Value::as_i64).unwrap_or(i64::MIN);
                (rc, answer.get("ms").and_then(Value::as_f64).unwrap_or(0.0))
            })
        };
        let length = 64u64 << 10;
        let good: Vec<(u64, u64, u64)> = (0..4).map(|i| (i * length, i * length, length)).collect();
        let fate = |rc: i64, n: usize| vec![if rc == 0 { "completed" } else { "failed" }.to_owned(); n];
        let reason =
            |rc: i64| (rc != 0).then(|| format!("batch_transfer_sync_write returned {rc} (one code per batch)"));
        // out_of_bounds.
        let mut faulty = good.clone();
        faulty[1].1 = size - 4096;
        let oob = match batch(initiator, &faulty, margin) {
            Err(error) => not("out_of_bounds", error),
            Ok((rc, ms)) => {
                let next = batch(initiator, &good, margin);
                report::FaultRound {
                    ended_after_ms: Some(ms),
                    states: fate(rc, faulty.len()),
                    first_reason: reason(rc),
                    next_batch_served: Some(matches!(next, Ok((0, _)))),
                    next_batch_ms: next.ok().map(|(_, ms)| ms),
                    ..report::FaultRound::injected(path, "out_of_bounds")
                }
            }
        };
        // killed_peer: the target dies 20 ms into a batch of 2 GiB. The client-server engine's AI CPU moves 256 MiB
        // in about 20 ms on the twin (SDMA copies into the imported memory), so a smaller batch could end before the
        // kill, or before the target's teardown closes its connection: this one takes several times the delay.
        let mib = 1u64 << 20;
        // 2048 requests of 1 MiB (within HiXL's 4096 unqueried entries per client), over the buffer again and again.
        let slots = (size / mib).max(1);
        let piece = mib.min(size);
        let big: Vec<(u64, u64, u64)> =
            (0..BIG_BATCH).map(|i| ((i % slots) * piece, (i % slots) * piece, piece)).collect();
        let pid = target.child.id() as libc::pid_t;
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            let killed_at = Instant::now();
            // SAFETY: kill(2) on the target's pid, which is not reaped before the killer is joined below.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed_at
        });
        let submitted = Instant::now();
        let outcome = batch(initiator, &big, margin + Duration::from_secs(30));
        let killed_at = killer.join().unwrap_or(submitted);
        let ended = Instant::now();
        let killed = match outcome {
            Err(error) => not("killed_peer", error),
            Ok((rc, _)) => {
                let dead = batch(initiator, &good[..1], margin + Duration::from_secs(30));
                let before_kill = ended < killed_at;
                report::FaultRound {
                    ended_after_ms: Some(ended.saturating_duration_since(killed_at).as_secs_f64() * 1e3),
                    states: fate(rc, big.len()),
                    first_reason: match (before_kill, reason(rc)) {
                        (true, why) => Some(format!(
                            "the batch ended before the kill{}",
                            why.map_or(String::new(), |why| format!(": {why}"))
                        )),
                        (false, why) => why,
                    },
                    next_batch_served: None,
                    dead_peer_state: Some(match &dead {
                        Ok((0, _)) => "completed".into(),
                        Ok(_) => "failed".into(),
                        Err(_) => "no answer".into(),
                    }),
                    dead_peer_ms: dead.as_ref().ok().map(|(_, ms)| *ms),
                    dead_peer_reason: Some(match &dead {
                        Ok((rc, _)) => format!("batch_transfer_sync_write returned {rc}"),
                        Err(error) => error.clone(),
                    }),
                    ..report::FaultRound::injected(path, "killed_peer")
                }
            }
        };
        // The target is gone: later calls to it must not wait on it.
        if let Some(target) = self.target.take() {
            target.stop();
        }
        vec![oob, stalled, killed]
    }
}
