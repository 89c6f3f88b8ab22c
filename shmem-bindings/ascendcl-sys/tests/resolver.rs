//! Tables filled by an in-process resolver (`from_resolver`) rather than from a loaded library: required symbols
//! must resolve, optional and data symbols may be absent, and the resolved pointers are the functions handed out.

use core::ffi::c_void;
use std::path::PathBuf;

use ascendcl_sys::loader::LoadError;

ascendcl_sys::dynamic_library! {
    /// A miniature table for these tests.
    pub struct MiniApi;
    required {
        fn mini_add(a: i32, b: i32) -> i32;
    }
    optional {
        fn mini_twice(a: i32) -> i32;
    }
    optional_data {
        static mini_counter;
    }
}

unsafe extern "C" fn mini_add(a: i32, b: i32) -> i32 {
    a + b
}

unsafe extern "C" fn mini_twice(a: i32) -> i32 {
    2 * a
}

static MINI_COUNTER: u32 = 41;

fn full(name: &str) -> Option<*const c_void> {
    match name {
        "mini_add" => Some(mini_add as *const c_void),
        "mini_twice" => Some(mini_twice as *const c_void),
        "mini_counter" => Some((&raw const MINI_COUNTER).cast()),
        _ => None,
    }
}

#[test]
fn every_resolved_symbol_is_the_function_handed_out() {
    // SAFETY: `full` returns functions with the declared prototypes and the address of a `u32` static.
    let api = unsafe { MiniApi::from_resolver(PathBuf::from("mini (in-process)"), &full) }.expect("resolves");
    assert_eq!(api.path(), PathBuf::from("mini (in-process)"));
    // SAFETY: the prototypes match (see above).
    assert_eq!(unsafe { api.mini_add(2, 3) }, 5);
    // SAFETY: as above.
    assert_eq!(unsafe { api.mini_twice(21) }.expect("optional resolved"), 42);
    let counter = api.mini_counter.expect("data symbol resolved");
    // SAFETY: the address of `MINI_COUNTER`, a `u32` that lives for the whole process.
    assert_eq!(unsafe { *counter.as_ptr().cast::<u32>() }, 41);
}

#[test]
fn absent_optional_and_data_symbols_are_none() {
    let only_required = |name: &str| (name == "mini_add").then_some(mini_add as *const c_void);
    // SAFETY: the one pointer handed out has the declared prototype.
    let api = unsafe { MiniApi::from_resolver(PathBuf::from("mini"), &only_required) }.expect("resolves");
    assert!(!api.is_resolved("mini_twice"));
    assert!(api.mini_counter.is_none());
    // SAFETY: an absent symbol is not called.
    let missing = unsafe { api.mini_twice(21) }.expect_err("absent");
    assert_eq!(missing.symbol, "mini_twice");
}

#[test]
fn a_missing_or_null_required_symbol_fails_naming_it() {
    for resolver in [&(|_: &str| None) as &dyn Fn(&str) -> Option<*const c_void>, &|_: &str| Some(core::ptr::null())] {
        // SAFETY: no pointer is handed out.
        let error = unsafe { MiniApi::from_resolver(PathBuf::from("mini"), resolver) }.expect_err("required missing");
        let LoadError::MissingRequiredSymbol { symbol, path, .. } = &error else { panic!("unexpected {error:?}") };
        assert_eq!(*symbol, "mini_add");
        assert_eq!(path, &PathBuf::from("mini"));
    }
}
