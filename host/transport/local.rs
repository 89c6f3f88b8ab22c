//! The in-process path: a Host-protocol transfer whose target is this engine's own segment.
//!
//! A `tcp` transfer into one's own memory needs no socket, so it is copied in place by the submitting thread, by the
//! checked copy ([`crate::transfer::host_copy`]): a page unmapped since registration fails that transfer, it does not
//! crash the process. The evidence counts what this code does (docs/evidence.md, "Host paths"), `Source::HostCode`,
//! window 1: no descriptor is written and no doorbell rung (nothing is handed to an engine: both 0), and the copying
//! thread sees the copy end (counted when the copy returns: 1).

use super::Transport;
use crate::cpu_time::thread_cpu_time_ns;
use crate::evidence::{Act, Source, TransferEvidence};
use crate::transfer::{host_copy, FailureKind, Opcode, Transfer, TransferFailure};

/// Copies validated transfers within this process.
#[derive(Debug, Default)]
pub struct LocalTransport;

impl Transport for LocalTransport {
    fn name(&self) -> &'static str {
        "local"
    }

    fn submit(&self, transfers: Vec<Transfer>) {
        // One clock reading per submission, shared evenly: a thread-CPU clock read is a system call, as costly as a
        // small copy.
        let cpu_started = thread_cpu_time_ns();
        let count = transfers.len() as u64;
        // (transfer, copies seen ending by this thread)
        let mut done = Vec::with_capacity(transfers.len());
        for transfer in transfers {
            let (from, to) = match transfer.opcode {
                Opcode::Read => (transfer.remote_addr, transfer.local_addr),
                Opcode::Write => (transfer.local_addr, transfer.remote_addr),
            };
            // Both ranges lie inside buffers registered with this engine (checked by the engine); the checked copy
            // turns a page unmapped since registration into this transfer's failure, and copies overlapping ranges
            // as memmove does.
            match host_copy::copy(to, from, transfer.length as usize) {
                Ok(()) => done.push((transfer, 1)),
                Err(error) => {
                    transfer.slot.fail(TransferFailure::new(
                        "local",
                        FailureKind::InvalidRequest,
                        format!("registered memory is not mapped in this process: {error}"),
                    ));
                }
            }
        }
        let host_cpu_ns = thread_cpu_time_ns().saturating_sub(cpu_started) / count.max(1);
        for (transfer, copies_seen) in done {
            // A Host memcpy: nothing handed to an engine, so no descriptor and no doorbell.
            let mut evidence = TransferEvidence::new("local", crate::evidence::RuntimeLabel::NONE);
            evidence.descriptors_written = Act::host(Source::HostCode, 0);
            evidence.doorbells_rung = Act::host(Source::HostCode, 0);
            evidence.completion_seen = Act::host(Source::HostCode, copies_seen);
            evidence.host_cpu_ns = host_cpu_ns;
            transfer.slot.complete(transfer.length, evidence);
        }
    }
}
