//! The HiXL table (`ascendcl_sys::hixl`) against a fake `libcann_hixl.so` (`tests/fake/fake_hixl.c`): loading,
//! the server/client call order of the safe owners, batch put/get with the bytes checked, status mapping, and the
//! missing optional symbols. The fake acts on host memory; nothing here says how the real HiXL behaves.

use std::ffi::{c_char, CString};
use std::path::Path;

use ascendcl_sys::abi::FakeLibrary;
use ascendcl_sys::hixl::{
    self, result, safe, CommMem, EndpointDesc, HixlApi, HixlError, HixlOneSideOpDesc, HIXL_LIBRARY,
};

struct Fake {
    library: FakeLibrary,
}

impl Fake {
    fn build() -> Fake {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake/fake_hixl.c");
        match FakeLibrary::build(&source, "libcann_hixl.so", &[]) {
            Ok(library) => Fake { library },
            Err(failure) => panic!("{failure}"),
        }
    }

    fn api(&self) -> HixlApi {
        let path = self.library.path().as_os_str().to_owned();
        let env = move |name: &str| (name == "AIV_HIXL_LIB").then(|| path.clone());
        HixlApi::load(&HIXL_LIBRARY, &HIXL_LIBRARY.candidates(&env)).expect("the fake loads")
    }

    fn set_result(&self, function: &str, code: u32) {
        let name = CString::new(function).expect("no NUL");
        // SAFETY: the fake exports `int fake_set_result(const char *, unsigned)`.
        let set = unsafe {
            self.library.control().get::<unsafe extern "C" fn(*const c_char, u32) -> i32>(b"fake_set_result\0")
        }
        .expect("control symbol");
        // SAFETY: `name` is NUL-terminated and outlives the call.
        assert_eq!(unsafe { set(name.as_ptr(), code) }, 0);
    }

    fn set_completion(&self, status: u32) {
        // SAFETY: the fake exports `void fake_hixl_set_completion(uint32_t)`.
        let set = unsafe { self.library.control().get::<unsafe extern "C" fn(u32)>(b"fake_hixl_set_completion\0") }
            .expect("control symbol");
        // SAFETY: value argument.
        unsafe { set(status) };
    }

    fn calls(&self) -> Vec<String> {
        self.library.take_log().iter().map(|line| line.split(' ').next().unwrap_or_default().to_owned()).collect()
    }
}

fn mem(buffer: &mut [u8]) -> CommMem {
    CommMem { r#type: hixl::COMM_MEM_TYPE_DEVICE, addr: buffer.as_mut_ptr().cast(), size: buffer.len() as u64 }
}

#[test]
fn a_client_puts_and_gets_through_a_listening_server() {
    let fake = Fake::build();
    let api = fake.api();
    let mut served = vec![0u8; 4096];
    let mut local: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let server_ep = EndpointDesc::device(hixl::COMM_PROTOCOL_HCCS, 1);
    let client_ep = EndpointDesc::device(hixl::COMM_PROTOCOL_HCCS, 0);
    let ip = CString::new("127.0.0.1").expect("no NUL");
    let tag = CString::new("heap").expect("no NUL");
    // SAFETY: both buffers outlive the server and the client (dropped at the end of the test, in reverse order).
    let server = unsafe { safe::Server::start(&api, &[server_ep], &ip, 26000, &[(&tag, mem(&mut served))], 16) }
        .expect("server");
    assert_eq!(fake.calls(), ["HixlCSServerCreate", "HixlCSServerRegMem", "HixlCSServerListen"]);
    // SAFETY: as above.
    let client =
        unsafe { safe::Client::connect(&api, &client_ep, &server_ep, &ip, 26000, &[(&tag, mem(&mut local))], 500) }
            .expect("client");
    assert_eq!(fake.calls(), ["HixlCSClientCreate", "HixlCSClientRegMem", "HixlCSClientConnect"], "memory first");

    let put = [HixlOneSideOpDesc {
        remote_buf: served[100..].as_mut_ptr().cast(),
        local_buf: local[8..].as_mut_ptr().cast(),
        len: 1000,
    }];
    // SAFETY: the client is connected; both ranges are registered and live.
    let batch = unsafe { result::client_batch_put_async(&api, client.as_raw(), &put) }.expect("put");
    // SAFETY: the batch is the client's and not final yet.
    let status = unsafe { result::client_query_complete_status(&api, client.as_raw(), batch) }.expect("query");
    assert_eq!(status, hixl::HIXL_COMPLETE_STATUS_COMPLETED);
    assert_eq!(served[100..1100], local[8..1008], "put copied local -> remote");

    served[2000..2100].fill(0xAB);
    let get = [HixlOneSideOpDesc {
        remote_buf: served[2000..].as_mut_ptr().cast(),
        local_buf: local[3000..].as_mut_ptr().cast(),
        len: 100,
    }];
    // SAFETY: as above.
    let batch = unsafe { result::client_batch_get_async(&api, client.as_raw(), &get) }.expect("get");
    // SAFETY: as above.
    unsafe { result::client_query_complete_status(&api, client.as_raw(), batch) }.expect("query");
    assert!(local[3000..3100].iter().all(|&b| b == 0xAB), "get copied remote -> local");

    // A range outside registered memory is the library's PARAM_INVALID, named.
    let mut elsewhere = [0u8; 16];
    let bad = [HixlOneSideOpDesc {
        remote_buf: served.as_mut_ptr().cast(),
        local_buf: elsewhere.as_mut_ptr().cast(),
        len: 16,
    }];
    fake.calls();
    // SAFETY: the ranges are live; the fake refuses the unregistered one without touching it.
    let error = unsafe { result::client_batch_put_async(&api, client.as_raw(), &bad) }.expect_err("unregistered");
    assert_eq!(error.code(), Some(HixlError(hixl::HIXL_PARAM_INVALID)));
    assert_eq!(error.to_string(), "HixlCSClientBatchPutAsync failed: HixlError(103900 HIXL_PARAM_INVALID)");

    // A batch that fails reports FAILED as its status; an injected query failure is an error.
    fake.set_completion(3);
    // SAFETY: as above.
    let batch = unsafe { result::client_batch_put_async(&api, client.as_raw(), &put) }.expect("submitted");
    // SAFETY: as above.
    let status = unsafe { result::client_query_complete_status(&api, client.as_raw(), batch) }.expect("query");
    assert_eq!(status, hixl::HIXL_COMPLETE_STATUS_FAILED);
    fake.set_completion(1);
    fake.set_result("HixlCSClientQueryCompleteStatus", hixl::HIXL_FAILED);
    // SAFETY: as above.
    let batch = unsafe { result::client_batch_put_async(&api, client.as_raw(), &put) }.expect("submitted");
    // SAFETY: as above.
    let error = unsafe { result::client_query_complete_status(&api, client.as_raw(), batch) }.expect_err("injected");
    fake.set_result("HixlCSClientQueryCompleteStatus", 0);
    assert!(error.to_string().contains("HixlCSClientQueryCompleteStatus failed: HixlError(503900 HIXL_FAILED)"));

    // The sync variants are optional and absent from the fake.
    // SAFETY: never called: the symbol is missing.
    let error = unsafe { result::client_batch_put_sync(&api, client.as_raw(), &put, 10) }.expect_err("absent");
    assert!(error.to_string().contains("HixlCSClientBatchPutSync is not exported by"), "{error}");
    // An empty batch is refused before any call.
    // SAFETY: nothing is called.
    let error = unsafe { result::client_batch_get_async(&api, client.as_raw(), &[]) }.expect_err("empty");
    assert!(error.to_string().contains("0 copies in one batch"), "{error}");

    fake.calls();
    drop(client);
    drop(server);
    assert_eq!(
        fake.calls(),
        ["HixlCSClientUnregMem", "HixlCSClientDestroy", "HixlCSServerUnregMem", "HixlCSServerDestroy"]
    );
}

#[test]
fn connecting_to_no_server_fails_and_destroys_the_client() {
    let fake = Fake::build();
    let api = fake.api();
    let mut local = vec![0u8; 64];
    let ep = EndpointDesc::device(hixl::COMM_PROTOCOL_HCCS, 0);
    let ip = CString::new("127.0.0.1").expect("no NUL");
    let tag = CString::new("heap").expect("no NUL");
    // SAFETY: the buffer outlives the call; the client is destroyed on failure.
    let error = unsafe { safe::Client::connect(&api, &ep, &ep, &ip, 1, &[(&tag, mem(&mut local))], 5) }
        .expect_err("nobody listens");
    assert_eq!(error.code(), Some(HixlError(hixl::HIXL_TIMEOUT)));
    assert_eq!(
        fake.calls(),
        [
            "HixlCSClientCreate",
            "HixlCSClientRegMem",
            "HixlCSClientConnect",
            "HixlCSClientUnregMem",
            "HixlCSClientDestroy"
        ]
    );
}

#[test]
fn a_missing_library_lists_every_path_tried() {
    let env = |name: &str| match name {
        "ASCEND_HOME_PATH" => Some("/nonexistent-cann-root".into()),
        _ => None,
    };
    let candidates = HIXL_LIBRARY.candidates(&env);
    let error = HixlApi::load(&HIXL_LIBRARY, &candidates).expect_err("no such library");
    let text = error.to_string();
    assert!(text.starts_with("libcann_hixl.so could not be loaded; tried "), "{text}");
    for candidate in &candidates {
        assert!(text.contains(&candidate.path.display().to_string()), "{text}");
    }
    assert!(text.contains("ASCEND_HOME_PATH/lib64") && text.contains("dynamic loader search path"), "{text}");
}
