//! The HCCL bindings against a fake `libhccl.so` (`tests/fake/fake_hccl.c`) built by each test: the root-info
//! bootstrap sequence, the 4108-byte root info reaching C intact, and error mapping. Says nothing about real HCCL.

use std::ffi::c_char;
use std::path::Path;

use ascendcl_sys::abi::FakeLibrary;
use hccl_sys::sys::{self, HcclApi, HCCL_LIBRARY};
use hccl_sys::{result, safe, Error};

struct Fake {
    library: FakeLibrary,
}

impl Fake {
    fn build() -> Fake {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake/fake_hccl.c");
        match FakeLibrary::build(&source, "libhccl.so", &[]) {
            Ok(library) => Fake { library },
            Err(failure) => panic!("{failure}"),
        }
    }

    fn api(&self) -> HcclApi {
        let path = self.library.path().as_os_str().to_owned();
        let env = move |name: &str| (name == "AIV_HCCL_LIB").then(|| path.clone());
        HcclApi::load(&HCCL_LIBRARY, &HCCL_LIBRARY.candidates(&env)).expect("the fake loads")
    }

    fn set_result(&self, function: &str, code: u32) {
        let name = std::ffi::CString::new(function).expect("no NUL");
        // SAFETY: the fake exports `int fake_set_result(const char *, unsigned)`.
        let set = unsafe {
            self.library.control().get::<unsafe extern "C" fn(*const c_char, u32) -> i32>(b"fake_set_result\0")
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
fn the_root_info_bootstrap_calls_hccl_in_order() {
    let fake = Fake::build();
    let api = fake.api();
    let mut root = result::comm::get_root_info(&api).expect("root info");
    root.internal[4107] = 5; // the last byte reaches C: the whole 4108-byte struct is passed by pointer
    {
        let comm = safe::Communicator::init(&api, 4, &root, 2).expect("init");
        assert_eq!(comm.rank().expect("rank"), 2);
        assert_eq!(comm.size().expect("size"), 4);
    }
    assert_eq!(
        fake.take_log(),
        [
            "HcclGetRootInfo",
            "HcclCommInitRootInfo n_ranks=4 root=fake-root tail=5 rank=2",
            "HcclGetRankId",
            "HcclGetRankSize",
            "HcclCommDestroy"
        ]
    );
}

#[test]
fn failures_map_to_named_results() {
    let fake = Fake::build();
    let api = fake.api();
    let root = result::comm::get_root_info(&api).expect("root info");
    let error = result::comm::init_root_info(&api, 2, &root, 2).expect_err("rank out of range");
    assert_eq!(error, Error::Call { function: "HcclCommInitRootInfo", code: sys::HCCL_E_PARA });
    assert_eq!(error.to_string(), "HcclCommInitRootInfo failed: HCCL_E_PARA (1)");
    fake.set_result("HcclGetRootInfo", 9);
    assert_eq!(result::comm::get_root_info(&api).expect_err("injected").code(), Some(sys::HCCL_E_TIMEOUT));
    fake.set_result("HcclGetRootInfo", 77);
    assert_eq!(
        format!("{:?}", result::comm::get_root_info(&api).expect_err("injected").code()),
        "Some(HcclResult(77))"
    );
    let comm = result::comm::init_root_info(&api, 1, &root, 0).expect("init");
    // SAFETY: `comm` is live; the fake lacks the optional HcclGetCommName, so C is not called for it.
    let missing = unsafe { result::comm::name(&api, comm) }.expect_err("absent optional symbol");
    assert!(matches!(missing, Error::MissingSymbol(ref m) if m.symbol == "HcclGetCommName"), "{missing:?}");
    // SAFETY: `comm` is live and not used afterwards.
    unsafe { result::comm::destroy(&api, comm) }.expect("destroy");
}
