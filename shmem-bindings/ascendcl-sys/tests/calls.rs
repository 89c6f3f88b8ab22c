//! Call counting (`ascendcl_sys::calls`) through tables filled by an in-process resolver: exact per-function
//! counts on the calling thread, another thread's calls on that thread only and in the process totals (while it
//! runs and after it exited), an absent optional function not counted, and the cost of a counted call.

use core::ffi::c_void;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use ascendcl_sys::calls;

ascendcl_sys::dynamic_library! {
    /// The table of the per-thread tests.
    pub struct CountedApi;
    required {
        fn counted_add(a: i32, b: i32) -> i32;
        fn counted_fail() -> i32;
        fn counted_nothing();
    }
    optional {
        fn counted_twice(a: i32) -> i32;
        fn counted_absent(a: i32) -> i32;
    }
}

ascendcl_sys::dynamic_library! {
    /// The table of the process-totals test, called by that test only (the process totals of a table are shared by
    /// every test of this binary).
    pub struct ProcessApi;
    required {
        fn process_call(a: i32) -> i32;
    }
    optional {}
}

unsafe extern "C" fn counted_add(a: i32, b: i32) -> i32 {
    a + b
}

unsafe extern "C" fn counted_fail() -> i32 {
    -1
}

unsafe extern "C" fn counted_nothing() {}

unsafe extern "C" fn counted_twice(a: i32) -> i32 {
    2 * a
}

unsafe extern "C" fn process_call(a: i32) -> i32 {
    a
}

fn counted() -> CountedApi {
    let resolve = |name: &str| match name {
        "counted_add" => Some(counted_add as *const c_void),
        "counted_fail" => Some(counted_fail as *const c_void),
        "counted_nothing" => Some(counted_nothing as *const c_void),
        "counted_twice" => Some(counted_twice as *const c_void),
        _ => None,
    };
    // SAFETY: every address is a function with the declared prototype.
    unsafe { CountedApi::from_resolver(PathBuf::from("counted (in-process)"), &resolve) }.expect("resolves")
}

fn process_api() -> ProcessApi {
    let resolve = |name: &str| (name == "process_call").then_some(process_call as *const c_void);
    // SAFETY: the one address is a function with the declared prototype.
    unsafe { ProcessApi::from_resolver(PathBuf::from("process (in-process)"), &resolve) }.expect("resolves")
}

#[test]
fn a_known_sequence_is_counted_exactly_per_function_on_the_calling_thread() {
    let api = counted();
    let (before, total_before) = (calls::thread(), calls::thread_total());
    // SAFETY: every function resolved to the test's own, with the declared prototypes.
    unsafe {
        for i in 0..3 {
            assert_eq!(api.counted_add(i, 1), i + 1);
        }
        assert_eq!(api.counted_fail(), -1, "a failing call reached the library: counted");
        api.counted_nothing();
        api.counted_nothing();
        assert_eq!(api.counted_twice(21), Ok(42));
        let missing = api.counted_absent(1).expect_err("not exported");
        assert_eq!(missing.symbol, "counted_absent");
        api.counted_absent(2).expect_err("not exported");
    }
    let made = calls::thread().since(&before);
    assert_eq!(made.get("CountedApi", "counted_add"), 3);
    assert_eq!(made.get("CountedApi", "counted_fail"), 1);
    assert_eq!(made.get("CountedApi", "counted_nothing"), 2);
    assert_eq!(made.get("CountedApi", "counted_twice"), 1);
    assert_eq!(made.get("CountedApi", "counted_absent"), 0, "an absent optional function is not called: not counted");
    assert_eq!(made.total(), 7);
    assert_eq!(calls::thread_total() - total_before, 7, "the thread's total counts the same calls");
    let names: Vec<_> = made.entries().iter().map(|entry| (entry.table, entry.function, entry.count)).collect();
    assert_eq!(
        names,
        [
            ("CountedApi", "counted_add", 3),
            ("CountedApi", "counted_fail", 1),
            ("CountedApi", "counted_nothing", 2),
            ("CountedApi", "counted_twice", 1)
        ],
        "sorted by table then function, zero counts left out"
    );
}

#[test]
fn two_tables_of_one_type_share_the_threads_counters() {
    let (first, second) = (counted(), counted());
    let before = calls::thread();
    // SAFETY: as above.
    unsafe {
        first.counted_add(1, 2);
        second.counted_add(3, 4);
    }
    assert_eq!(calls::thread().since(&before).get("CountedApi", "counted_add"), 2);
}

#[test]
fn another_threads_calls_count_on_that_thread_and_in_the_process_totals_also_after_it_exited() {
    let api = process_api();
    let (process_before, mine_before) = (calls::process(), calls::thread());
    let (done_tx, done_rx) = mpsc::channel();
    let (exit_tx, exit_rx) = mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        let api = process_api();
        assert_eq!(calls::thread_total(), 0, "a new thread starts at zero");
        for i in 0..5 {
            // SAFETY: the test's own function, with the declared prototype.
            assert_eq!(unsafe { api.process_call(i) }, i);
        }
        assert_eq!(calls::thread().get("ProcessApi", "process_call"), 5);
        assert_eq!(calls::thread_total(), 5);
        done_tx.send(()).expect("main waits");
        exit_rx.recv().expect("main answers");
    });
    done_rx.recv().expect("the worker ran");
    let live = calls::process().since(&process_before);
    assert_eq!(live.get("ProcessApi", "process_call"), 5, "a live thread's calls are in the process totals");
    assert_eq!(calls::thread().since(&mine_before).get("ProcessApi", "process_call"), 0, "not on this thread");
    exit_tx.send(()).expect("the worker waits");
    worker.join().expect("the worker passed");
    let after = calls::process().since(&process_before);
    assert_eq!(after.get("ProcessApi", "process_call"), 5, "an exited thread's calls stay in the process totals");
    // SAFETY: as above.
    assert_eq!(unsafe { api.process_call(7) }, 7);
    assert_eq!(calls::process().since(&process_before).get("ProcessApi", "process_call"), 6);
    assert_eq!(calls::thread().since(&mine_before).get("ProcessApi", "process_call"), 1);
}

#[test]
fn presence_and_addresses_are_read_without_calling() {
    let api = counted();
    let before = calls::thread_total();
    assert!(api.is_resolved("counted_twice") && !api.is_resolved("counted_absent"));
    assert_eq!(api.address("counted_add"), Some(counted_add as *const c_void));
    assert_eq!(api.address("counted_absent"), None);
    assert_eq!(api.require("counted_absent").expect_err("absent").symbol, "counted_absent");
    assert!(api.require("counted_add").is_ok());
    assert_eq!(CountedApi::function_names().len(), 5);
    assert_eq!(calls::thread_total(), before, "nothing was called");
}

#[test]
#[should_panic(expected = "CountedApi declares no function \"counted_typo\"")]
fn an_undeclared_name_is_a_bug_in_the_caller() {
    counted().is_resolved("counted_typo");
}

ascendcl_sys::dynamic_library! {
    /// The table of the cheap-read test: no other test calls it, so a fresh thread's first read finds no counters.
    pub struct ReadApi;
    required {
        fn read_one(a: i32) -> i32;
        fn read_two(a: i32) -> i32;
    }
    optional {
        fn read_absent(a: i32) -> i32;
    }
}

unsafe extern "C" fn read_one(a: i32) -> i32 {
    a + 1
}

unsafe extern "C" fn read_two(a: i32) -> i32 {
    a + 2
}

fn read_api() -> ReadApi {
    let resolve = |name: &str| match name {
        "read_one" => Some(read_one as *const c_void),
        "read_two" => Some(read_two as *const c_void),
        _ => None,
    };
    // SAFETY: every address is a function with the declared prototype.
    unsafe { ReadApi::from_resolver(PathBuf::from("read (in-process)"), &resolve) }.expect("resolves")
}

#[test]
fn a_counter_reads_exactly_this_threads_calls_of_its_function() {
    let api = read_api();
    let one = ReadApi::counter("read_one").expect("declared");
    let two = ReadApi::counter("read_two").expect("declared");
    let absent = ReadApi::counter("read_absent").expect("declared, though not exported");
    assert!(ReadApi::counter("read_typo").is_none(), "an undeclared name has no counter");
    assert_eq!((one.table(), one.function(), absent.function()), ("ReadApi", "read_one", "read_absent"));
    let (one_before, two_before) = (one.thread(), two.thread());
    // SAFETY: the test's own functions, with the declared prototypes.
    unsafe {
        for i in 0..4 {
            assert_eq!(api.read_one(i), i + 1);
        }
        assert_eq!(api.read_two(1), 3);
        api.read_absent(1).expect_err("not exported");
    }
    assert_eq!(one.thread() - one_before, 4);
    assert_eq!(two.thread() - two_before, 1);
    assert_eq!(absent.thread(), 0, "an absent optional function is not called: not counted");
    assert_eq!(one.thread(), calls::thread().get("ReadApi", "read_one"), "agrees with the snapshot");

    // Another thread's calls are on that thread's counters, not this one's; a thread that never called reads 0.
    let (one_mine, two_mine) = (one.thread(), two.thread());
    let worker = std::thread::spawn(move || {
        assert_eq!((one.thread(), two.thread()), (0, 0), "a new thread starts at zero");
        let api = read_api();
        // SAFETY: as above.
        unsafe {
            for i in 0..7 {
                api.read_two(i);
            }
        }
        (one.thread(), two.thread())
    });
    assert_eq!(worker.join().expect("the worker passed"), (0, 7));
    assert_eq!((one.thread(), two.thread()), (one_mine, two_mine), "the worker's calls are not this thread's");
}

#[test]
fn every_declared_function_of_the_crates_tables_has_a_counter() {
    use ascendcl_sys::hixl::HixlApi;
    use ascendcl_sys::sys::AclApi;
    for (table, names, find) in [
        ("AclApi", AclApi::function_names(), AclApi::counter as fn(&str) -> Option<calls::Counter>),
        ("HixlApi", HixlApi::function_names(), HixlApi::counter),
    ] {
        assert!(!names.is_empty(), "{table}");
        for name in names {
            let counter = find(name).unwrap_or_else(|| panic!("{table}::{name} has no counter"));
            assert_eq!((counter.table(), counter.function()), (table, *name));
        }
    }
}

/// The cost of a cheap read ([`calls::Counter::thread`]) against the snapshot ([`calls::thread`]), printed, not
/// asserted (shared machines); meaningful in a release build:
/// `cargo test --release -p ascendcl-sys --test calls -- --nocapture per_read`.
#[test]
fn per_read_cost_is_printed() {
    const READS: u32 = 2_000_000;
    let api = counted();
    // SAFETY: the test's own function.
    unsafe { api.counted_add(1, 1) };
    let counter = std::hint::black_box(CountedApi::counter("counted_add").expect("declared"));
    let mut sink = 0u64;
    let started = Instant::now();
    for _ in 0..READS {
        sink = sink.wrapping_add(std::hint::black_box(&counter).thread());
    }
    let read_ns = started.elapsed().as_nanos() as f64 / f64::from(READS);
    const SNAPSHOTS: u32 = 20_000;
    let started = Instant::now();
    for _ in 0..SNAPSHOTS {
        sink = sink.wrapping_add(calls::thread().get("CountedApi", "counted_add"));
    }
    let snapshot_ns = started.elapsed().as_nanos() as f64 / f64::from(SNAPSHOTS);
    std::hint::black_box(sink);
    println!("per read: Counter::thread {read_ns:.2} ns, calls::thread() snapshot {snapshot_ns:.0} ns");
    assert!(counter.thread() >= 1);
}

/// The cost of the count: a counted call through the table against a direct call of the same function pointer.
/// Printed, not asserted (shared machines); meaningful in a release build:
/// `cargo test --release -p ascendcl-sys --test calls -- --nocapture per_call`.
#[test]
fn per_call_cost_is_printed() {
    const CALLS: u32 = 2_000_000;
    let api = counted();
    let direct: unsafe extern "C" fn(i32, i32) -> i32 = std::hint::black_box(counted_add);
    let mut sink = 0i32;
    let started = Instant::now();
    for i in 0..CALLS {
        // SAFETY: the test's own function.
        sink = sink.wrapping_add(unsafe { direct(std::hint::black_box(i as i32), 1) });
    }
    let direct_ns = started.elapsed().as_nanos() as f64 / f64::from(CALLS);
    let started = Instant::now();
    for i in 0..CALLS {
        // SAFETY: as above.
        sink = sink.wrapping_add(unsafe { std::hint::black_box(&api).counted_add(std::hint::black_box(i as i32), 1) });
    }
    let counted_ns = started.elapsed().as_nanos() as f64 / f64::from(CALLS);
    std::hint::black_box(sink);
    println!(
        "per call: direct {direct_ns:.2} ns, counted {counted_ns:.2} ns, count {:.2} ns ({CALLS} calls each)",
        counted_ns - direct_ns
    );
    assert!(calls::thread().get("CountedApi", "counted_add") >= u64::from(CALLS));
}
