//! Unit tests of the evidence: the checks, the "submitted by" verdict and a run's tally, from hand-made acts.

use super::*;

fn by_aiv(count: u64) -> Act {
    Act { aiv_blocks: Some([0, 1]), ..Act { by_aiv: count, ..Act::unknown(Source::TwinModel) } }
}

#[test]
fn each_act_turns_exactly_its_check() {
    let good = Checks::of(&by_aiv(64), &by_aiv(2), &by_aiv(1));
    assert_eq!(good.as_array(), [Check::Yes; 4]);
    assert_eq!(good.aiv_direct(), Check::Yes);
    let host_wrote = Act { by_host: 1, ..by_aiv(63) };
    let checks = Checks::of(&host_wrote, &by_aiv(2), &by_aiv(1));
    assert_eq!(checks.as_array(), [Check::Yes, Check::No, Check::Yes, Check::Yes]);
    assert_eq!(checks.aiv_direct(), Check::No);
    let checks = Checks::of(&by_aiv(64), &Act::host(Source::TwinModel, 2), &by_aiv(1));
    assert_eq!(checks.as_array(), [Check::Yes, Check::Yes, Check::No, Check::Yes]);
    let checks = Checks::of(&by_aiv(64), &by_aiv(2), &Act::host(Source::TwinModel, 1));
    assert_eq!(checks.as_array(), [Check::Yes, Check::Yes, Check::Yes, Check::No]);
}

#[test]
fn unattributed_descriptors_fail_their_check_but_overwritten_flags_do_not() {
    let mixed = Act { unattributed: 1, ..by_aiv(63) };
    assert_eq!(Checks::of(&mixed, &by_aiv(2), &by_aiv(1)).kernel_writes_descriptors, Check::No);
    assert_eq!(Checks::of(&by_aiv(64), &by_aiv(2), &mixed).device_observes_completion, Check::Yes);
    let nobody_read = Act { source: Source::TwinModel, unattributed: 3, ..Act::unknown(Source::TwinModel) };
    assert_eq!(Checks::of(&by_aiv(64), &by_aiv(2), &nobody_read).device_observes_completion, Check::No);
}

#[test]
fn a_host_path_fails_every_check_and_missing_records_are_unknown_not_no() {
    let host = Act::host(Source::HostCalls, 1);
    let checks = Checks::of(&host, &host, &host);
    assert_eq!(checks.as_array(), [Check::No; 4]);
    let record = TransferEvidence::new("aiv", RuntimeLabel::NONE);
    assert_eq!(record.checks().as_array(), [Check::Unknown; 4]);
    assert_eq!(record.checks().aiv_direct(), Check::Unknown);
    let hidden = Act::unknown(Source::NotObservable);
    let checks = Checks::of(&by_aiv(3), &by_aiv(1), &hidden);
    assert_eq!(checks.as_array(), [Check::Yes, Check::Yes, Check::Yes, Check::Unknown]);
    assert_eq!(checks.aiv_direct(), Check::Unknown);
}

#[test]
fn a_tally_counts_a_shared_window_once_and_derives_the_run_verdict_from_the_sums() {
    let mut tally = EvidenceTally::default();
    let mut record = TransferEvidence::new("aiv", RuntimeLabel::new(RuntimeKind::Twin, "cann-twin 0.1.0"));
    record.descriptors_written = by_aiv(64);
    record.doorbells_rung = by_aiv(8);
    record.completion_seen = by_aiv(2);
    record.window = 2;
    tally.add(&record);
    tally.add(&record);
    assert_eq!(tally.descriptors_written.as_act().by_aiv, 64, "one window of two transfers, counted once");
    assert_eq!(tally.checks().aiv_direct(), Check::Yes);
    assert_eq!(tally.per_transfer[4], CheckCounts { yes: 2, no: 0, unknown: 0 });
    let lines = tally.verdict_lines();
    assert_eq!(lines[0], "submitted by: AIV-direct (twin runtime, cann-twin 0.1.0; 2 transfers: 2 AIV-direct)");
    assert!(lines[1].starts_with("  AIV-direct: yes (transfers: 2 yes, 0 no, 0 unknown)"), "{lines:?}");
    assert!(lines[3].contains("64 of 64 descriptors by AIV blocks 0-1; 0 by Host"), "{lines:?}");
    // One more transfer whose SQE the Host wrote turns the run's descriptor check, and only that one, to no.
    record.descriptors_written = Act { by_host: 1, ..by_aiv(1) };
    record.window = 1;
    tally.add(&record);
    let checks = tally.checks();
    assert_eq!(checks.as_array(), [Check::Yes, Check::No, Check::Yes, Check::Yes]);
    assert_eq!(tally.per_transfer[1], CheckCounts { yes: 2, no: 1, unknown: 0 });
    let lines = tally.verdict_lines();
    assert!(
        lines[0].starts_with("submitted by: mixed (twin runtime, cann-twin 0.1.0; 3 transfers: 2 AIV-direct, 1 mixed"),
        "{lines:?}"
    );
    assert!(lines[1].starts_with("  AIV-direct: no"), "{lines:?}");
}

#[test]
fn who_submitted_tells_the_three_submitters_apart_and_can_come_out_each_way() {
    let aiv = [by_aiv(64), by_aiv(2), by_aiv(1)];
    assert_eq!(Submitter::of(&aiv[0], &aiv[1], &aiv[2]), Submitter::AivDirect);
    // HiXL's AI-CPU kernel builds the SQEs and commits the tail; the Host learns completion from a flag.
    let aicpu = Act::aicpu(Source::TwinModel, 8);
    let host = Act::host(Source::TwinModel, 1);
    assert_eq!(Submitter::of(&aicpu, &Act::aicpu(Source::TwinModel, 1), &host), Submitter::AiCpuSubmitted);
    assert_eq!(Submitter::of(&host, &host, &host), Submitter::HostSubmitted);
    // A Host-side copy hands nothing to an engine: who saw it end did the work.
    let nothing = Act::host(Source::HostCode, 0);
    assert_eq!(Submitter::of(&nothing, &nothing, &Act::host(Source::HostCode, 1)), Submitter::HostSubmitted);
    // One act by another doer, or by nobody one can name, makes it mixed.
    assert_eq!(Submitter::of(&Act { by_host: 1, ..by_aiv(63) }, &aiv[1], &aiv[2]), Submitter::Mixed);
    assert_eq!(Submitter::of(&aiv[0], &aicpu, &aiv[2]), Submitter::Mixed);
    assert_eq!(Submitter::of(&Act { unattributed: 1, ..by_aiv(63) }, &aiv[1], &aiv[2]), Submitter::Mixed);
    assert_eq!(Submitter::of(&aicpu, &Act { by_host: 1, ..aicpu }, &host), Submitter::Mixed);
    // AIV submission with the Host seeing completion is not AIV-direct.
    assert_eq!(Submitter::of(&aiv[0], &aiv[1], &host), Submitter::Mixed);
    // Unobserved submission acts, or nothing that names a doer, say nothing.
    let lost = Act::unknown(Source::Lost);
    assert_eq!(Submitter::of(&lost, &aiv[1], &aiv[2]), Submitter::Unknown);
    assert_eq!(Submitter::of(&aiv[0], &aiv[1], &Act::unknown(Source::NotObservable)), Submitter::Unknown);
    let unnamed = Act { unattributed: 2, ..Act::unknown(Source::TwinModel) };
    assert_eq!(Submitter::of(&unnamed, &unnamed, &aiv[2]), Submitter::Unknown);
    for submitter in Submitter::ALL {
        assert_eq!(Submitter::parse(submitter.as_str()), Some(submitter));
        assert_eq!(serde_json::to_value(submitter).expect("serialises"), submitter.as_str());
    }
}

#[test]
fn an_act_by_the_ai_cpu_fails_its_aiv_check_and_is_described() {
    let act = Act { by_aicpu: 3, ..by_aiv(5) };
    assert_eq!(Checks::of(&act, &by_aiv(1), &by_aiv(1)).kernel_writes_descriptors, Check::No);
    assert_eq!(act.describe("SQEs"), "5 of 8 SQEs by AIV blocks 0-1; 3 by AI CPU; 0 by Host");
    let mut tally = EvidenceTally::default();
    let mut record = TransferEvidence::new("adxl", RuntimeLabel::new(RuntimeKind::Twin, "cann-twin 0.1.0"));
    record.descriptors_written = Act::aicpu(Source::TwinModel, 8);
    record.doorbells_rung = Act::aicpu(Source::TwinModel, 1);
    record.completion_seen = Act::host(Source::HostCalls, 1);
    record.window = 4;
    record.host_launches = 0.25;
    for _ in 0..4 {
        tally.add(&record);
    }
    assert_eq!(tally.submitter(), Submitter::AiCpuSubmitted);
    assert_eq!(tally.host_launches_per_transfer(), 0.25);
    assert_eq!(tally.verdict_lines()[0], "submitted by: AI-CPU-submitted (twin runtime, cann-twin 0.1.0; 4 transfers: 4 AI-CPU-submitted; 0.250 Host kernel launches per transfer)");
}

#[test]
fn self_reported_acts_are_yes_only_with_an_observer_that_saw_only_the_aiv_kernel() {
    let reported = |count: u64| Act {
        source: Source::SelfReported,
        by_aiv: count,
        aiv_blocks: Some([0, 1]),
        ..Act::unknown(Source::SelfReported)
    };
    let acts = [reported(64), reported(2), reported(1)];
    let seen = |tasks: ObservedTasks| DeviceObserver::Profiler { tasks };
    let clean = seen(ObservedTasks { aiv_kernels: 1, ..ObservedTasks::default() });
    let copied = seen(ObservedTasks { aiv_kernels: 1, copy_tasks: 2, ..ObservedTasks::default() });
    let aicpu = seen(ObservedTasks { aiv_kernels: 1, aicpu_tasks: 1, ..ObservedTasks::default() });
    let other = seen(ObservedTasks {
        aiv_kernels: 1,
        other_tasks: [("EVENT_RECORD".to_string(), 1)].into_iter().collect(),
        ..ObservedTasks::default()
    });
    let none_ran = seen(ObservedTasks::default());
    let missing = DeviceObserver::Unavailable { reason: "no libmsprofiler.so".into() };
    let verdict = |observer: Option<&DeviceObserver>| {
        (
            Checks::observed(&acts[0], &acts[1], &acts[2], observer).aiv_direct(),
            Submitter::observed(&acts[0], &acts[1], &acts[2], observer),
        )
    };
    // The kernel's word alone is never yes.
    assert_eq!(verdict(None), (Check::Unknown, Submitter::Unknown));
    assert_eq!(verdict(Some(&missing)), (Check::Unknown, Submitter::Unknown));
    assert_eq!(verdict(Some(&none_ran)), (Check::Unknown, Submitter::Unknown));
    assert_eq!(verdict(Some(&other)), (Check::Unknown, Submitter::Unknown));
    assert_eq!(Checks::observed(&acts[0], &acts[1], &acts[2], Some(&none_ran)).kernel_on_aiv, Check::Unknown);
    // Corroborated: yes; contradicted by a copy or an AI-CPU task: no, mixed.
    assert_eq!(verdict(Some(&clean)), (Check::Yes, Submitter::AivDirect));
    assert_eq!(verdict(Some(&copied)), (Check::No, Submitter::Mixed));
    assert_eq!(verdict(Some(&aicpu)), (Check::No, Submitter::Mixed));
    // A Host act the loader tables counted while in flight: no, mixed, whatever the observer says.
    let host = Act { by_host: 1, ..reported(64) };
    assert_eq!(Checks::observed(&host, &acts[1], &acts[2], Some(&clean)).aiv_direct(), Check::No);
    assert_eq!(Submitter::observed(&host, &acts[1], &acts[2], None), Submitter::Mixed);
    // The run's line names every source.
    let mut tally = EvidenceTally::default();
    let mut record = TransferEvidence::new("aiv", RuntimeLabel::new(RuntimeKind::Npu, "8.0.RC1"));
    (record.descriptors_written, record.doorbells_rung, record.completion_seen) = (acts[0], acts[1], acts[2]);
    tally.add(&record);
    assert_eq!(tally.submitter(), Submitter::Unknown);
    tally.observer = Some(clean);
    assert_eq!(
        tally.verdict_lines()[0],
        "submitted by: AIV-direct (NPU, CANN 8.0.RC1; device acts self-reported by the kernel; 0 Host \
         submissions counted; profiler: only the AIV kernel ran (1 launch), 0 copy tasks; 1 transfers: 1 unknown)"
    );
    tally.observer = Some(missing);
    assert_eq!(
        tally.verdict_lines()[0],
        "submitted by: unknown (NPU, CANN 8.0.RC1; device acts self-reported by the kernel; 0 Host submissions \
         counted; no independent device-side observer: no libmsprofiler.so; 1 transfers: 1 unknown)"
    );
    assert!(tally.verdict_lines()[3].contains("(self-reported by the kernel;"), "{:?}", tally.verdict_lines());
    let json = serde_json::to_value(&tally.observer).expect("serialises");
    assert_eq!(json["outcome"], "unavailable");
    assert_eq!(serde_json::to_value(Source::SelfReported).expect("serialises"), "self_reported");
}

#[test]
fn an_act_describes_its_counts_or_why_there_are_none() {
    assert_eq!(by_aiv(64).describe("SQEs"), "64 of 64 SQEs by AIV blocks 0-1; 0 by Host");
    let one = Act { aiv_blocks: Some([3, 3]), by_host: 2, unattributed: 1, ..by_aiv(5) };
    assert_eq!(one.describe("SQEs"), "5 of 8 SQEs by AIV block 3; 2 by Host; 1 unattributed");
    assert_eq!(Act::unknown(Source::NotObservable).describe("x"), "not observable on this runtime");
}
