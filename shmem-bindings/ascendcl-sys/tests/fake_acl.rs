//! The loader, the error mapping and call sequences through the result and safe layers, against a fake
//! `libascendcl.so` (`tests/fake/fake_acl.c`) built by each test into its own temporary directory. The fake acts on
//! host memory; these tests say nothing about how a real NPU runtime behaves, only that the bindings call the
//! right C functions with the right arguments and map their results correctly.

use std::ffi::{c_char, OsString};
use std::path::Path;

use ascendcl_sys::abi::FakeLibrary;
use ascendcl_sys::loader::{Candidate, LoadError};
use ascendcl_sys::sys::{self, AclApi, ASCENDCL_LIBRARY};
use ascendcl_sys::{result, safe, AclError, Error};

/// A fake library built for one test, with handles to its control functions.
struct Fake {
    library: FakeLibrary,
}

impl Fake {
    fn build(defines: &[&str]) -> Fake {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake/fake_acl.c");
        match FakeLibrary::build(&source, "libascendcl.so", defines) {
            Ok(library) => Fake { library },
            Err(failure) => panic!("{failure}"),
        }
    }

    fn api(&self) -> AclApi {
        let path = self.library.path().as_os_str().to_owned();
        let env = move |name: &str| (name == "AIV_ASCENDCL_LIB").then(|| path.clone());
        AclApi::load(&ASCENDCL_LIBRARY, &ASCENDCL_LIBRARY.candidates(&env)).expect("the fake loads")
    }

    fn set_result(&self, function: &str, code: i32) {
        let name = std::ffi::CString::new(function).expect("no NUL");
        // SAFETY: the fake exports `int fake_set_result(const char *, int)`.
        let set = unsafe {
            self.library.control().get::<unsafe extern "C" fn(*const c_char, i32) -> i32>(b"fake_set_result\0")
        }
        .expect("control symbol");
        // SAFETY: `name` is NUL-terminated and outlives the call.
        assert_eq!(unsafe { set(name.as_ptr(), code) }, 0);
    }

    /// The calls made since the last read, one per line, each line starting with the C function name.
    fn take_log(&self) -> Vec<String> {
        self.library.take_log()
    }

    fn calls(&self) -> Vec<String> {
        self.take_log().iter().map(|line| line.split(' ').next().unwrap_or_default().to_owned()).collect()
    }
}

fn env_from(pairs: Vec<(&'static str, OsString)>) -> impl Fn(&str) -> Option<OsString> {
    move |name| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| value.clone())
}

#[test]
fn loads_through_the_override_path() {
    let fake = Fake::build(&[]);
    let api = fake.api();
    assert_eq!(api.path(), fake.library.path());
    assert!(api.is_resolved("aclrtCreateNotify"), "an optional symbol the fake exports resolves");
    assert!(!api.is_resolved("aclrtHostRegister"), "an optional symbol the fake lacks stays None");
}

#[test]
fn finds_the_library_under_ascend_home_path() {
    let fake = Fake::build(&[]);
    let root = tempfile::tempdir().expect("temporary directory");
    let dir = root.path().join("runtime/lib64");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::copy(fake.library.path(), dir.join("libascendcl.so")).expect("copy");
    let env = env_from(vec![("ASCEND_HOME_PATH", root.path().into())]);
    let candidates = ASCENDCL_LIBRARY.candidates(&env);
    assert_eq!(candidates[0].path, root.path().join("lib64/libascendcl.so"), "lib64 is tried first");
    let api = AclApi::load(&ASCENDCL_LIBRARY, &candidates).expect("found under runtime/lib64");
    assert_eq!(api.path(), dir.join("libascendcl.so"));
}

#[test]
fn a_missing_library_error_lists_every_path_tried() {
    let root = tempfile::tempdir().expect("temporary directory");
    let env = env_from(vec![("ASCEND_HOME_PATH", root.path().into())]);
    let candidates = ASCENDCL_LIBRARY.candidates(&env);
    // Four directories under the root, then the plain file name; none holds the library here (no CANN on CI).
    assert_eq!(candidates.len(), 5);
    let error = AclApi::load(&ASCENDCL_LIBRARY, &candidates).expect_err("nothing to load");
    let text = error.to_string();
    for dir in ["lib64", "runtime/lib64", "aarch64-linux/lib64", "x86_64-linux/lib64"] {
        assert!(text.contains(&root.path().join(dir).join("libascendcl.so").display().to_string()), "{text}");
    }
    assert!(text.contains("dynamic loader search path"), "{text}");
    let LoadError::NotFound { attempts, library } = error else { panic!("unexpected {error:?}") };
    assert_eq!(library, "libascendcl.so");
    assert_eq!(attempts.iter().filter(|attempt| attempt.reason == "no such file").count(), 4);
}

#[test]
fn a_broken_override_is_not_silently_replaced() {
    let fake = Fake::build(&[]);
    let dir = fake.library.path().parent().expect("parent").to_path_buf();
    std::fs::create_dir_all(dir.join("lib64")).expect("mkdir");
    std::fs::copy(fake.library.path(), dir.join("lib64/libascendcl.so")).expect("copy");
    let env = env_from(vec![
        ("AIV_ASCENDCL_LIB", dir.join("missing.so").into()),
        ("ASCEND_HOME_PATH", dir.clone().into()), // holds a loadable copy under lib64, never looked at
    ]);
    let candidates = ASCENDCL_LIBRARY.candidates(&env);
    assert_eq!(candidates, vec![Candidate { path: dir.join("missing.so"), origin: "AIV_ASCENDCL_LIB".into() }]);
    let error = AclApi::load(&ASCENDCL_LIBRARY, &candidates).expect_err("the override names nothing");
    assert!(error.to_string().contains("missing.so (from AIV_ASCENDCL_LIB): no such file"), "{error}");
}

#[test]
fn a_library_without_a_required_symbol_is_refused() {
    let fake = Fake::build(&["FAKE_OMIT_MALLOC"]);
    let candidates = [Candidate { path: fake.library.path().to_path_buf(), origin: "test".into() }];
    let error = AclApi::load(&ASCENDCL_LIBRARY, &candidates).expect_err("aclrtMalloc is required");
    let LoadError::MissingRequiredSymbol { symbol, path, .. } = &error else { panic!("unexpected {error:?}") };
    assert_eq!(*symbol, "aclrtMalloc");
    assert_eq!(path, fake.library.path());
}

#[test]
fn calling_an_absent_optional_symbol_names_it() {
    let fake = Fake::build(&[]);
    let api = fake.api();
    let mut page = vec![0u8; 4096];
    // SAFETY: the range is a live local buffer (and the call never reaches C: the symbol is absent).
    let error = unsafe { result::host::register(&api, page.as_mut_ptr().cast(), 4096, sys::ACL_HOST_REGISTER_MAPPED) }
        .expect_err("the fake has no aclrtHostRegister");
    let Error::MissingSymbol(missing) = &error else { panic!("unexpected {error:?}") };
    assert_eq!(missing.symbol, "aclrtHostRegister");
    assert!(error.to_string().contains("aclrtHostRegister is not exported by"), "{error}");
    assert!(fake.calls().is_empty(), "nothing was called");
}

#[test]
fn calls_into_a_loaded_library_are_counted_as_the_library_logs_them() {
    let fake = Fake::build(&[]);
    let api = fake.api();
    let before = ascendcl_sys::calls::thread();
    let names = ["aclInit", "aclrtSetDevice", "aclrtGetDeviceCount", "aclrtMalloc", "aclrtFree", "aclrtHostRegister"];
    let counters: Vec<_> = names.iter().map(|name| AclApi::counter(name).expect("AclApi declares it")).collect();
    let cheap_before: Vec<u64> = counters.iter().map(|counter| counter.thread()).collect();
    result::runtime::init(&api, None).expect("init");
    result::device::set(&api, 1).expect("set device");
    result::device::count(&api).expect("count");
    let device = result::memory::malloc(&api, 64, sys::ACL_MEM_MALLOC_HUGE_FIRST).expect("malloc");
    // SAFETY: from aclrtMalloc, unused afterwards.
    unsafe { result::memory::free(&api, device) }.expect("free");
    let mut page = vec![0u8; 4096];
    // SAFETY: a live local buffer (the call never reaches C: the fake lacks the symbol).
    unsafe { result::host::register(&api, page.as_mut_ptr().cast(), 4096, sys::ACL_HOST_REGISTER_MAPPED) }
        .expect_err("absent");
    let made = ascendcl_sys::calls::thread().since(&before);
    let logged = fake.calls();
    assert_eq!(logged, ["aclInit", "aclrtSetDevice", "aclrtGetDeviceCount", "aclrtMalloc", "aclrtFree"]);
    for function in &logged {
        assert_eq!(made.get("AclApi", function), 1, "{function}");
    }
    assert_eq!(made.total(), 5, "the absent aclrtHostRegister is not counted: {made:?}");
    // The cheap per-function reads agree with the snapshot and with the library's log.
    for ((name, counter), before) in names.iter().zip(&counters).zip(&cheap_before) {
        assert_eq!(counter.thread() - before, made.get("AclApi", name), "{name}");
        assert_eq!(counter.thread() - before, logged.iter().filter(|call| *call == name).count() as u64, "{name}");
    }
}

#[test]
fn error_codes_map_to_named_errors() {
    let fake = Fake::build(&[]);
    let api = fake.api();
    result::runtime::init(&api, None).expect("init");
    result::device::set(&api, 0).expect("set device");
    fake.set_result("aclrtMalloc", 207_001);
    let error = result::memory::malloc(&api, 64, sys::ACL_MEM_MALLOC_HUGE_FIRST).expect_err("injected failure");
    assert_eq!(error, Error::Call { function: "aclrtMalloc", code: AclError(207_001) });
    assert_eq!(format!("{:?}", AclError(207_001)), "AclError(207001 ACL_ERROR_RT_MEMORY_ALLOCATION)");
    assert!(
        error.to_string().contains("aclrtMalloc failed: AclError(207001 ACL_ERROR_RT_MEMORY_ALLOCATION)"),
        "{error}"
    );

    fake.set_result("aclrtMalloc", 0);
    fake.set_result("aclrtSetDevice", 42);
    let error = result::device::set(&api, 1).expect_err("injected failure");
    assert_eq!(error.code(), Some(AclError(42)));
    assert_eq!(format!("{:?}", AclError(42)), "AclError(42 undocumented)");

    // The fake's own checks come back as the documented codes.
    fake.set_result("aclrtSetDevice", 0);
    assert_eq!(
        result::runtime::init(&api, None).expect_err("twice").code().and_then(AclError::name),
        Some("ACL_ERROR_REPEAT_INITIALIZE")
    );
    assert_eq!(
        result::device::set(&api, 9).expect_err("bad id").code().and_then(AclError::name),
        Some("ACL_ERROR_RT_INVALID_DEVICEID")
    );
}

#[test]
fn the_copy_sequence_calls_acl_in_order_and_moves_the_bytes() {
    let fake = Fake::build(&[]);
    let api = fake.api();
    let config = c"";
    result::runtime::init(&api, Some(config)).expect("init");
    result::device::set(&api, 3).expect("set device");
    assert_eq!(result::device::current(&api).expect("current"), 3);
    assert_eq!(result::version::runtime(&api).expect("version"), (1, 17, 0));
    let stream = result::stream::create_with_config(&api, 0, sys::ACL_STREAM_FAST_LAUNCH as u32).expect("stream");
    let device = result::memory::malloc(&api, 256, sys::ACL_MEM_MALLOC_HUGE_FIRST).expect("malloc");
    let source: Vec<u8> = (0..=255).collect();
    let mut back = vec![0u8; 256];
    // SAFETY: `device` is a live 256-byte allocation, `source` and `back` live 256-byte buffers, the stream live; the
    // stream is synchronised before `back` is read or anything is freed.
    unsafe {
        result::memory::memcpy(&api, device, 256, source.as_ptr().cast(), 256, sys::ACL_MEMCPY_HOST_TO_DEVICE)
            .expect("h2d");
        result::memory::memcpy_async(
            &api,
            back.as_mut_ptr().cast(),
            256,
            device,
            256,
            sys::ACL_MEMCPY_DEVICE_TO_HOST,
            stream,
        )
        .expect("d2h");
        result::stream::synchronize_with_timeout(&api, stream, 1000).expect("sync");
        result::memory::free(&api, device).expect("free");
        result::stream::destroy(&api, stream).expect("destroy");
    }
    assert_eq!(back, source);
    result::device::reset(&api, 3).expect("reset");
    result::runtime::finalize(&api).expect("finalize");

    let log = fake.take_log();
    let expected = [
        "aclInit config=",
        "aclrtSetDevice device=3",
        "aclrtGetDevice",
        "aclrtGetVersion",
        "aclrtCreateStreamWithConfig priority=0 flag=1",
        "aclrtMalloc size=256 policy=0",
        "aclrtMemcpy dest_max=256 count=256 kind=1",
        "aclrtMemcpyAsync dest_max=256 count=256 kind=2",
        "aclrtSynchronizeStreamWithTimeout timeout=1000",
        "aclrtFree",
        "aclrtDestroyStream",
        "aclrtResetDevice device=3",
        "aclFinalize",
    ];
    assert_eq!(log, expected);
}

#[test]
fn a_copy_larger_than_its_destination_is_refused_by_the_runtime() {
    let fake = Fake::build(&[]);
    let api = fake.api();
    result::runtime::init(&api, None).expect("init");
    result::device::set(&api, 0).expect("set device");
    let device = result::memory::malloc(&api, 16, sys::ACL_MEM_MALLOC_HUGE_FIRST).expect("malloc");
    let source = [7u8; 32];
    // SAFETY: the fake checks count against dest_max before touching memory, which is what is under test; `device`
    // is freed afterwards and not used again.
    let error =
        unsafe { result::memory::memcpy(&api, device, 16, source.as_ptr().cast(), 32, sys::ACL_MEMCPY_HOST_TO_DEVICE) }
            .expect_err("32 bytes into 16");
    assert_eq!(error.code().and_then(AclError::name), Some("ACL_ERROR_INVALID_PARAM"));
    // SAFETY: `device` came from malloc above.
    unsafe { result::memory::free(&api, device) }.expect("free");
}

#[test]
fn safe_owners_release_on_drop() {
    let fake = Fake::build(&[]);
    let api = fake.api();
    result::runtime::init(&api, None).expect("init");
    result::device::set(&api, 0).expect("set device");
    fake.take_log();
    {
        let stream = safe::Stream::create(&api, 0, 0).expect("stream");
        let mut memory = safe::DeviceMemory::allocate(&api, 8, sys::ACL_MEM_MALLOC_NORMAL_ONLY).expect("memory");
        let _pinned = safe::HostMemory::allocate(&api, 8).expect("host memory");
        memory.copy_from_host(b"abcdefgh").expect("h2d");
        let mut back = [0u8; 8];
        memory.copy_to_host(&mut back).expect("d2h");
        assert_eq!(&back, b"abcdefgh");
        assert!(memory.copy_from_host(&[0; 9]).is_err(), "refused before calling C");
        stream.synchronize(100).expect("sync");
    }
    assert_eq!(
        fake.calls(),
        [
            "aclrtCreateStreamWithConfig",
            "aclrtMalloc",
            "aclrtMallocHost",
            "aclrtMemcpy",
            "aclrtMemcpy",
            "aclrtSynchronizeStreamWithTimeout",
            "aclrtFreeHost",
            "aclrtFree",
            "aclrtDestroyStream",
        ]
    );
    let stream = safe::Stream::create(&api, 0, 0).expect("stream");
    fake.set_result("aclrtDestroyStream", 107_003);
    assert_eq!(
        stream.destroy().expect_err("injected").code().and_then(AclError::name),
        Some("ACL_ERROR_RT_STREAM_CONTEXT")
    );
}

#[test]
fn optional_calls_that_exist_work() {
    let fake = Fake::build(&[]);
    let api = fake.api();
    let notify = result::notify::create(&api, sys::ACL_NOTIFY_DEFAULT).expect("notify");
    // SAFETY: `notify` was just created and is destroyed last.
    unsafe {
        let id = result::notify::id(&api, notify).expect("id");
        assert!(id > 0);
        result::notify::destroy(&api, notify).expect("destroy");
    }
    let mut buffer = [0u8; 64];
    // SAFETY: a live buffer stands in for device memory; the fake only formats the size.
    let key = unsafe { result::ipc::get_export_key(&api, buffer.as_mut_ptr().cast(), 64, 0) }.expect("key");
    assert_eq!(key, b"fake-ipc-64");
    assert_eq!(result::version::package(&api, sys::ACL_PKG_NAME_CANN).expect("version"), "8.5.0-fake");
    // SAFETY: the symbol is absent, so nothing keeps the data past the call.
    assert!(matches!(unsafe { result::kernel::load_from_data(&api, &[0; 4], None) }, Err(Error::MissingSymbol(_))));
}

#[test]
fn the_process_wide_table_loads_or_lists_what_it_tried() {
    // Without CANN (CI) this reports every candidate; on an Ascend host with CANN it loads.
    match ascendcl_sys::api() {
        Ok(api) => assert!(api.path().exists() || api.path().components().count() == 1),
        Err(Error::Load(LoadError::NotFound { attempts, .. })) => {
            let last = attempts.last().expect("at least one candidate");
            // The loader path comes last, unless an explicit override replaced every other candidate.
            let expected = match std::env::var_os("AIV_ASCENDCL_LIB").filter(|value| !value.is_empty()) {
                Some(_) => "AIV_ASCENDCL_LIB",
                None => "dynamic loader search path",
            };
            assert_eq!(last.candidate.origin, expected);
        }
        Err(other) => panic!("unexpected {other:?}"),
    }
    // The result is remembered: a second call gives the same answer.
    assert_eq!(ascendcl_sys::api().is_ok(), ascendcl_sys::api().is_ok());
}
