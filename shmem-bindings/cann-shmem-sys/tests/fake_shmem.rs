//! The SHMEM bindings against a fake `libshmem.so` (`tests/fake/fake_shmem.c`) built by each test: the unique-id
//! bootstrap sequence, the attributes the library receives, heap calls and error mapping. The fake models no
//! device or peer; these tests check the bindings, not SHMEM.

use std::ffi::c_char;
use std::path::Path;

use ascendcl_sys::abi::FakeLibrary;
use ascendcl_sys::loader::Candidate;
use cann_shmem_sys::sys::{self, ShmemApi, SHMEM_LIBRARY};
use cann_shmem_sys::{result, safe, Error, ShmemError};

struct Fake {
    library: FakeLibrary,
}

impl Fake {
    fn build() -> Fake {
        Fake::build_with(&[])
    }

    fn build_with(defines: &[&str]) -> Fake {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake/fake_shmem.c");
        match FakeLibrary::build(&source, "libshmem.so", defines) {
            Ok(library) => Fake { library },
            Err(failure) => panic!("{failure}"),
        }
    }

    /// A control function of fake_shmem.c, typed by the caller.
    ///
    /// # Safety
    /// `T` must be the function pointer type of the fake's `name`.
    unsafe fn control<T: Copy>(&self, name: &str) -> T {
        let symbol = format!("{name}\0");
        // SAFETY: the caller guarantees the prototype.
        *unsafe { self.library.control().get::<T>(symbol.as_bytes()) }.unwrap_or_else(|error| panic!("{name}: {error}"))
    }

    fn api(&self) -> ShmemApi {
        let path = self.library.path().as_os_str().to_owned();
        let env = move |name: &str| (name == "AIV_SHMEM_LIB").then(|| path.clone());
        ShmemApi::load(&SHMEM_LIBRARY, &SHMEM_LIBRARY.candidates(&env)).expect("the fake loads")
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

    fn take_log(&self) -> Vec<String> {
        self.library.take_log()
    }
}

#[test]
fn the_unique_id_bootstrap_passes_the_header_defaults_and_reaches_the_heap() {
    let fake = Fake::build();
    let api = fake.api();

    let uid = result::bootstrap::get_uniqueid(&api).expect("uid");
    assert_eq!(uid.version, sys::ACLSHMEM_UNIQUEID_VERSION, "sent with the initializer's version");
    // The id crosses the wire as 136 bytes and comes back intact.
    let mut received = sys::aclshmemx_uniqueid_t::from_bytes(&uid.to_bytes());
    assert_eq!(received.to_bytes(), uid.to_bytes());

    let mut attr = result::bootstrap::set_attr_uniqueid_args(&api, 1, 2, 1 << 20, &mut received).expect("attr");
    assert_eq!((attr.my_pe, attr.n_pes, attr.local_mem_size), (1, 2, 1 << 20));
    assert!(!attr.comm_args.is_null(), "the library filled comm_args");
    result::bootstrap::init_attr(&api, sys::ACLSHMEMX_INIT_WITH_UNIQUEID, &mut attr).expect("init");
    assert_eq!(result::heap::my_pe(&api), 1);
    assert_eq!(result::heap::n_pes(&api), 2);

    let buffer = result::heap::malloc(&api, 4096).expect("malloc");
    // SAFETY: `buffer` is inside the heap.
    unsafe {
        let peer = result::heap::ptr(&api, buffer, 0).expect("pe 0 reachable in the fake");
        assert_ne!(peer, buffer);
        assert_eq!(result::heap::ptr(&api, buffer, 1), Some(buffer), "my own PE maps to itself");
        assert_eq!(result::heap::ptr(&api, buffer, 5), None, "no such PE");
        result::heap::free(&api, buffer);
    }
    result::bootstrap::finalize(&api).expect("finalize");

    let log = fake.take_log();
    assert_eq!(log[0], format!("aclshmemx_get_uniqueid version={}", 65_672));
    assert_eq!(
        log[1],
        "aclshmemx_set_attr_uniqueid_args pe=1 n_pes=2 size=1048576 uid=fake-uid attr_version=65560 engine=1 \
         timeouts=120,120,120 comm_args=null instance=0"
    );
    assert_eq!(log[2], "aclshmemx_init_attr flags=8 pe=1 n_pes=2 size=1048576 comm_args=uid engine=1");
    assert_eq!(
        &log[3..],
        [
            "aclshmem_malloc size=4096",
            "aclshmem_ptr offset=0 pe=0",
            "aclshmem_ptr offset=0 pe=1",
            "aclshmem_ptr offset=0 pe=5",
            "aclshmem_free offset=0",
            "aclshmem_finalize"
        ]
    );
}

#[test]
fn failures_map_to_named_errors() {
    let fake = Fake::build();
    let api = fake.api();
    assert_eq!(
        result::heap::malloc(&api, 64).expect_err("not initialised"),
        Error::AllocationFailed { function: "aclshmem_malloc", size: 64 }
    );
    let mut uid = result::bootstrap::get_uniqueid(&api).expect("uid");
    let error = result::bootstrap::set_attr_uniqueid_args(&api, 2, 2, 1 << 20, &mut uid).expect_err("pe out of range");
    assert_eq!(error, Error::Call { function: "aclshmemx_set_attr_uniqueid_args", code: ShmemError(-2) });
    assert_eq!(format!("{:?}", ShmemError(-2)), "ShmemError(-2 ACLSHMEM_INVALID_VALUE)");
    fake.set_result("aclshmemx_init_attr", -6);
    let mut attr = result::bootstrap::set_attr_uniqueid_args(&api, 0, 2, 1 << 20, &mut uid).expect("attr");
    let error = result::bootstrap::init_attr(&api, sys::ACLSHMEMX_INIT_WITH_UNIQUEID, &mut attr).expect_err("injected");
    assert!(
        error.to_string().contains("aclshmemx_init_attr failed: ShmemError(-6 ACLSHMEM_BOOTSTRAP_ERROR)"),
        "{error}"
    );
    assert_eq!(format!("{:?}", ShmemError(-55)), "ShmemError(-55 undocumented)");
    // An optional symbol the fake lacks.
    let status = result::bootstrap::init_status(&api);
    assert!(
        matches!(&status, Err(Error::MissingSymbol(missing)) if missing.symbol == "aclshmemx_init_status"),
        "{status:?}"
    );
}

#[test]
fn symmetric_allocations_free_on_drop() {
    let fake = Fake::build();
    let api = fake.api();
    let mut uid = result::bootstrap::get_uniqueid(&api).expect("uid");
    let mut attr = result::bootstrap::set_attr_uniqueid_args(&api, 0, 1, 1 << 20, &mut uid).expect("attr");
    result::bootstrap::init_attr(&api, sys::ACLSHMEMX_INIT_WITH_UNIQUEID, &mut attr).expect("init");
    fake.take_log();
    {
        let allocation = safe::SymmetricAllocation::allocate(&api, 4096, 100).expect("align");
        assert_eq!(allocation.as_ptr() as usize % 4096, 0);
        assert_eq!(allocation.peer_ptr(0), Some(allocation.as_ptr()));
    }
    assert_eq!(
        fake.take_log(),
        ["aclshmem_align alignment=4096 size=100", "aclshmem_ptr offset=0 pe=0", "aclshmem_free offset=0"]
    );
}

#[test]
fn a_missing_library_lists_the_shmem_install_locations() {
    let root = tempfile::tempdir().expect("temporary directory");
    let env = |name: &str| (name == "SHMEM_HOME_PATH").then(|| root.path().as_os_str().to_owned());
    let candidates = SHMEM_LIBRARY.candidates(&env);
    assert_eq!(
        candidates[0],
        Candidate { path: root.path().join("shmem/lib/libshmem.so"), origin: "SHMEM_HOME_PATH/shmem/lib".into() }
    );
    let error = ShmemApi::load(&SHMEM_LIBRARY, &candidates).expect_err("nothing there");
    let text = error.to_string();
    assert!(text.contains("libshmem.so could not be loaded"), "{text}");
    assert!(text.contains(&root.path().join("lib/libshmem.so").display().to_string()), "{text}");
}

#[test]
fn the_host_state_is_read_through_the_g_state_data_symbol_after_initialisation() {
    use cann_shmem_sys::device_state::{StateHeader, EXPECTED_VERSION};
    let fake = Fake::build();
    let api = fake.api();
    assert!(api.g_state.is_some(), "the fake exports g_state");
    let before = result::state::host_state(&api).expect("the initializer's version is the mirrored one");
    assert_eq!(before.header, StateHeader { version: EXPECTED_VERSION, mype: -1, npes: -1 });
    assert_eq!(before.sdma_workspace_addr, 0);

    // SAFETY: `void fake_set_sdma_workspace(uint64_t)`; a value argument only.
    unsafe { fake.control::<unsafe extern "C" fn(u64)>("fake_set_sdma_workspace")(0x1234_5000) };
    let mut uid = result::bootstrap::get_uniqueid(&api).expect("uid");
    let mut attr = result::bootstrap::set_attr_uniqueid_args(&api, 1, 2, 1 << 20, &mut uid).expect("attr");
    attr.option_attr.data_op_engine_type = sys::ACLSHMEM_DATA_OP_SDMA;
    result::bootstrap::init_attr(&api, sys::ACLSHMEMX_INIT_WITH_UNIQUEID, &mut attr).expect("init");
    let after = result::state::host_state(&api).expect("state");
    assert_eq!(after.header, StateHeader { version: EXPECTED_VERSION, mype: 1, npes: 2 });
    assert_eq!(after.sdma_workspace_addr, 0x1234_5000, "read at the mirrored offset");

    // SAFETY: `void fake_set_state_version(int)`; a value argument only.
    unsafe { fake.control::<unsafe extern "C" fn(i32)>("fake_set_state_version")((1 << 16) + 40_000) };
    let error = result::state::host_state(&api).expect_err("foreign layout");
    assert_eq!(
        error.to_string(),
        "g_state: version 0x19c40 is not layout 1/32992 (it names layout 1/40000)",
        "{error:?}"
    );
    assert!(matches!(error, Error::StateLayout { symbol: "g_state", .. }));
}

#[test]
fn a_library_without_g_state_leaves_the_data_symbol_empty() {
    let fake = Fake::build_with(&["FAKE_NO_STATE"]);
    let api = fake.api();
    assert!(api.g_state.is_none(), "hidden symbols are not found");
    let error = result::state::host_state(&api).expect_err("not exported");
    assert!(matches!(&error, Error::MissingSymbol(missing) if missing.symbol == "g_state"), "{error:?}");
    assert!(error.to_string().starts_with("g_state is not exported by "), "{error}");
}
