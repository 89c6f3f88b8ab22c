//! Host acts (`ascendcl_sys::calls::HostActs`): a table's `acts` section classifies its functions once; a call of a
//! classified function by any thread counts process-wide by its class, a call inside `own_work` counts apart, an
//! unclassified one not at all. Its own test binary: the process-wide counts are shared by every test of a binary.

use core::ffi::c_void;
use std::path::PathBuf;

use ascendcl_sys::calls::{self, act, HostActs};

ascendcl_sys::dynamic_library! {
    /// A table with classified functions.
    pub struct ActsApi;
    required {
        fn acts_copy(a: i32) -> i32;
        fn acts_query() -> i32;
        fn acts_plain() -> i32;
    }
    optional {
        fn acts_launch() -> i32;
    }
    acts {
        acts_copy: act::WRITES_DEVICE | act::SUBMITS | act::READS_COMPLETION;
        acts_query: act::READS_COMPLETION;
        acts_launch: act::SUBMITS;
    }
}

unsafe extern "C" fn acts_copy(a: i32) -> i32 {
    a
}

unsafe extern "C" fn acts_query() -> i32 {
    0
}

unsafe extern "C" fn acts_plain() -> i32 {
    0
}

unsafe extern "C" fn acts_launch() -> i32 {
    0
}

fn api() -> ActsApi {
    let resolve = |name: &str| match name {
        "acts_copy" => Some(acts_copy as *const c_void),
        "acts_query" => Some(acts_query as *const c_void),
        "acts_plain" => Some(acts_plain as *const c_void),
        "acts_launch" => Some(acts_launch as *const c_void),
        _ => None,
    };
    // SAFETY: every address is a function above with the declared prototype.
    unsafe { ActsApi::from_resolver(PathBuf::from("acts"), &resolve) }.expect("resolves")
}

#[test]
fn classified_calls_of_any_thread_count_by_class_and_own_work_counts_apart() {
    let api = api();
    assert_eq!(ActsApi::act_class("acts_copy"), Some(act::ALL));
    assert_eq!(ActsApi::act_class("acts_plain"), Some(0));
    assert_eq!(ActsApi::act_class("nothing"), None);
    assert_eq!(
        ActsApi::classified_functions(),
        vec![("acts_copy", act::ALL), ("acts_query", act::READS_COMPLETION), ("acts_launch", act::SUBMITS)]
    );
    let (before, own_before) = (HostActs::now(), HostActs::own_work());
    // SAFETY: the functions above take and return plain integers.
    unsafe {
        api.acts_plain();
        api.acts_copy(1);
        api.acts_query();
    }
    // Another thread's calls count too.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // SAFETY: as above.
            let _ = unsafe { api.acts_launch() };
        });
    });
    // The caller's own work counts apart.
    calls::own_work(|| {
        // SAFETY: as above.
        unsafe { api.acts_copy(2) };
        calls::own_work(|| {
            // SAFETY: as above.
            let _ = unsafe { api.acts_launch() };
        });
    });
    // SAFETY: as above.
    unsafe { api.acts_query() };
    let made = HostActs::now().since(&before);
    assert_eq!(made.total(), 4, "{made:?}");
    assert_eq!(made.with_any(act::WRITES_DEVICE), 1);
    assert_eq!(made.with_any(act::SUBMITS), 2);
    assert_eq!(made.with_any(act::READS_COMPLETION), 3);
    assert_eq!(made.with_any(act::WRITES_DEVICE | act::SUBMITS), 2);
    let own = HostActs::own_work().since(&own_before);
    assert_eq!((own.total(), own.with_any(act::SUBMITS), own.with_any(act::READS_COMPLETION)), (2, 2, 1));
    assert_eq!(act::describe(act::SUBMITS | act::READS_COMPLETION), "submits device work, reads a completion");
}

#[test]
fn the_cann_tables_classify_what_can_act_on_device_work_and_nothing_else() {
    use ascendcl_sys::AclApi;
    for (function, class) in [
        ("aclrtMemcpy", act::ALL),
        ("aclrtMemcpyAsync", act::WRITES_DEVICE | act::SUBMITS),
        ("aclrtLaunchKernelWithHostArgs", act::SUBMITS),
        ("aclrtSynchronizeStreamWithTimeout", act::READS_COMPLETION),
        ("aclrtMalloc", 0),
        ("aclrtMapMem", 0),
        ("aclrtMemImportFromShareableHandle", 0),
    ] {
        assert_eq!(AclApi::act_class(function), Some(class), "{function}");
    }
    assert_eq!(ascendcl_sys::hixl::HixlApi::act_class("HixlCSClientQueryCompleteStatus"), Some(act::READS_COMPLETION));
    assert!(ascendcl_sys::prof::ProfApi::classified_functions().is_empty());
}
