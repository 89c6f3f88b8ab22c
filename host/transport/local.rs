//! The in-process path: a Host-protocol transfer whose target is this engine's own segment.
//!
//! A `tcp` transfer into one's own memory needs no socket, so it is copied in place by the submitting thread. The
//! evidence counts what this code does (docs/evidence.md, "Host paths"), `Source::HostCode`, window 1: no
//! descriptor is written and no doorbell rung (nothing is handed to an engine: both 0), and the copying thread sees
//! the copy end (counted when the copy returns: 1).

use super::Transport;
use crate::cpu_time::thread_cpu_time_ns;
use crate::evidence::{Act, Source, TransferEvidence};
use crate::transfer::{Opcode, Transfer};

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
            // SAFETY: the engine checked that both ranges lie inside buffers registered with this engine (the local
            // segment is this engine's own registration), and `register_memory`'s contract keeps them valid until
            // unregistered. `copy` (memmove) tolerates overlapping ranges.
            unsafe {
                std::ptr::copy(from as *const u8, to as *mut u8, transfer.length as usize);
            }
            // The copy returned: this thread has seen it end.
            done.push((transfer, 1));
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
