//! A run's independent device-side observer (CANN's profiler, or the twin's model of it): the tasks it saw in the
//! run's window, and what that says of acts the kernel reported itself.

use serde::{Deserialize, Serialize};

/// Task counts by type that an independent device-side observer saw in a window: CANN's profiler (or the twin's
/// model of it), its task records whose execution overlapped the window, by task type (docs/evidence.md, "The
/// profiler").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedTasks {
    /// Kernels on the AI Vector cores (`KERNEL_AIVEC`, `KERNEL_MIX_AIV`).
    pub aiv_kernels: u64,
    /// AI-CPU tasks (`KERNEL_AICPU`).
    pub aicpu_tasks: u64,
    /// Copy and memset tasks (`MEMCPY_ASYNC`, `MEMSET_ASYNC`, `MEMCPY_ASYNC_WITHOUT_SDMA`, ...): the runtime's own
    /// descriptors, written on a Host call's behalf.
    pub copy_tasks: u64,
    /// Every other task type seen, by its name (other kernels, event and notify records, stream waits, ...).
    pub other_tasks: std::collections::BTreeMap<String, u64>,
}

impl ObservedTasks {
    /// `"only the AIV kernel ran (1 launch), 0 copy tasks"`, or what else ran.
    pub fn describe(&self) -> String {
        let count = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let others: u64 = self.other_tasks.values().sum();
        if self.aiv_kernels > 0 && self.copy_tasks == 0 && self.aicpu_tasks == 0 && others == 0 {
            return format!(
                "only the AIV kernel ran ({}), 0 copy tasks",
                count(self.aiv_kernels, "launch", "launches")
            );
        }
        let mut parts = vec![
            count(self.copy_tasks, "copy task", "copy tasks"),
            count(self.aicpu_tasks, "AI-CPU task", "AI-CPU tasks"),
            count(self.aiv_kernels, "AIV kernel launch", "AIV kernel launches"),
        ];
        if others > 0 {
            let names: Vec<String> = self.other_tasks.iter().map(|(name, count)| format!("{count} {name}")).collect();
            parts.push(format!("other tasks: {}", names.join(", ")));
        }
        parts.join(", ")
    }
}

/// What a run's independent device-side observer (CANN's profiler on `device_backend: "cann"`) made of the run's
/// window, or why there was none. [`EvidenceTally::observer`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum DeviceObserver {
    /// The profiler ran around the run and its task records were read back.
    Profiler {
        /// The tasks whose execution overlapped the run's window.
        tasks: ObservedTasks,
    },
    /// No observer: the profiler is missing, failed, or its records could not be read.
    Unavailable {
        /// Why.
        reason: String,
    },
}

/// What an observer says of self-reported acts by AIV cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Corroboration {
    /// It saw the AIV kernel run and nothing else: no copy, no AI-CPU task, no other task.
    Corroborates,
    /// It saw a copy task or an AI-CPU task in the window: somebody else may have written descriptors.
    Contradicts,
    /// There was none, or it saw no AIV kernel, or it saw other tasks beside it.
    Silent,
}

impl DeviceObserver {
    pub(super) fn corroboration(&self) -> Corroboration {
        match self {
            DeviceObserver::Unavailable { .. } => Corroboration::Silent,
            DeviceObserver::Profiler { tasks } if tasks.copy_tasks > 0 || tasks.aicpu_tasks > 0 => {
                Corroboration::Contradicts
            }
            DeviceObserver::Profiler { tasks } if tasks.aiv_kernels > 0 && tasks.other_tasks.is_empty() => {
                Corroboration::Corroborates
            }
            DeviceObserver::Profiler { .. } => Corroboration::Silent,
        }
    }

    pub(super) fn saw_aiv_kernel(&self) -> bool {
        matches!(self, DeviceObserver::Profiler { tasks } if tasks.aiv_kernels > 0)
    }

    /// `"profiler: only the AIV kernel ran (1 launch), 0 copy tasks"` or `"no independent device-side observer:
    /// <why>"`.
    pub fn describe(&self) -> String {
        match self {
            DeviceObserver::Profiler { tasks } => format!("profiler: {}", tasks.describe()),
            DeviceObserver::Unavailable { reason } => format!("no independent device-side observer: {reason}"),
        }
    }
}
