//! The ABI conformance check: a description of every declaration a `-sys` crate makes, derived from the same
//! macro invocations that generate the Rust types and function tables, and its rendering as a C++ translation
//! unit of `static_assert`s to compile against the vendor's real headers.
//!
//! Owns the C spelling of Rust FFI types ([`CType`]), the manifest types and the compiler invocation. It must not
//! fetch headers: the caller (the ABI test, run by `tests/run.sh`) says where they are.
//!
//! C++ rather than C because the vendor headers need it: `hccl_types.h` sizes arrays with `const uint32_t`
//! globals and `acl_base_rt.h` defines its error codes as `static const int`, neither a constant expression in C.
//! In C++ an enum parameter is its own type, so enum-typed parameters are spelled with the enum's C name and the
//! enum's underlying type is asserted separately against the Rust representation.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The C spelling of a Rust FFI type, as the vendor headers would write it.
pub trait CType {
    /// E.g. `size_t`, `void *`, `aclrtMemcpyKind`, `char const *`.
    fn c_type() -> String;
}

macro_rules! primitive_c_types {
    ($($rust:ty => $c:literal),* $(,)?) => {
        $(impl CType for $rust {
            fn c_type() -> String {
                $c.to_string()
            }
        })*
    };
}

// `core::ffi::c_char` is `i8` on x86_64 and `u8` on aarch64; the one that is `c_char` is spelled `char`.
#[cfg(not(any(target_arch = "aarch64", target_arch = "arm")))]
primitive_c_types!(i8 => "char", u8 => "uint8_t");
#[cfg(any(target_arch = "aarch64", target_arch = "arm"))]
primitive_c_types!(i8 => "int8_t", u8 => "char");

primitive_c_types!(
    () => "void",
    core::ffi::c_void => "void",
    bool => "bool",
    i16 => "int16_t",
    u16 => "uint16_t",
    i32 => "int32_t",
    u32 => "uint32_t",
    i64 => "int64_t",
    u64 => "uint64_t",
    usize => "size_t",
    isize => "ptrdiff_t",
    f32 => "float",
    f64 => "double",
);

impl<T: CType> CType for *mut T {
    fn c_type() -> String {
        format!("{} *", T::c_type())
    }
}

impl<T: CType> CType for *const T {
    // Postfix `const` stays right for pointers to pointers: `void * const *`.
    fn c_type() -> String {
        format!("{} const *", T::c_type())
    }
}

impl<T: CType, const N: usize> CType for [T; N] {
    fn c_type() -> String {
        format!("{}[{N}]", T::c_type())
    }
}

/// The C name of a Rust identifier: a raw identifier (`r#type`) loses its `r#`.
pub fn c_name(rust_identifier: &'static str) -> &'static str {
    rust_identifier.strip_prefix("r#").unwrap_or(rust_identifier)
}

/// One C function as declared on the Rust side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionDecl {
    /// The exact C name.
    pub name: &'static str,
    /// The return type's C spelling.
    pub ret: String,
    /// Each parameter's C spelling.
    pub params: Vec<String>,
    /// Whether the table treats the symbol as optional (only newer CANN versions export it).
    pub optional: bool,
}

impl FunctionDecl {
    /// The function type in C++ syntax, e.g. `int32_t(void *, size_t)`.
    pub fn c_function_type(&self) -> String {
        let params = if self.params.is_empty() { "void".to_string() } else { self.params.join(", ") };
        format!("{}({params})", self.ret)
    }
}

/// One field of a `#[repr(C)]` struct or union.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDecl {
    /// The exact C name.
    pub name: &'static str,
    /// Byte offset on the Rust side.
    pub offset: usize,
    /// The field type's C spelling.
    pub c_type: String,
}

/// One `#[repr(C)]` struct or union.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StructDecl {
    /// The exact C type name.
    pub name: &'static str,
    /// `size_of` on the Rust side.
    pub size: usize,
    /// `align_of` on the Rust side.
    pub align: usize,
    /// Every field, in declaration order.
    pub fields: Vec<FieldDecl>,
}

/// One C enum mirrored as a transparent newtype with constants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnumDecl {
    /// The exact C type name.
    pub name: &'static str,
    /// The C spelling of the Rust representation, compared with the enum's underlying type.
    pub repr: String,
    /// Each enumerator with its value on the Rust side.
    pub values: Vec<(&'static str, i128)>,
}

/// One named constant (a `#define`, `static const` or enumerator the Rust side names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstDecl {
    /// The exact C name.
    pub name: &'static str,
    /// Its value on the Rust side.
    pub value: i128,
}

/// Everything one crate declares, to be checked against a set of vendor headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AbiManifest {
    /// `#include` lines, e.g. `acl/acl.h`.
    pub headers: Vec<&'static str>,
    /// Function prototypes.
    pub functions: Vec<FunctionDecl>,
    /// Struct and union layouts.
    pub structs: Vec<StructDecl>,
    /// Enums.
    pub enums: Vec<EnumDecl>,
    /// Constants.
    pub consts: Vec<ConstDecl>,
}

impl AbiManifest {
    /// Joins two manifests (e.g. ACL types that an HCCL prototype uses).
    pub fn extend(&mut self, other: AbiManifest) {
        for header in other.headers {
            if !self.headers.contains(&header) {
                self.headers.push(header);
            }
        }
        self.functions.extend(other.functions);
        self.structs.extend(other.structs);
        self.enums.extend(other.enums);
        self.consts.extend(other.consts);
    }

    /// One line saying what was checked, e.g. `ACL: 47 functions, 13 structs, 14 enums, 232 constants checked (480
    /// assertions)`.
    pub fn summary(&self, library: &str) -> String {
        format!(
            "{library}: {} functions, {} structs, {} enums, {} constants checked ({} assertions)",
            self.functions.len(),
            self.structs.len(),
            self.enums.len(),
            self.consts.len(),
            self.assertion_count()
        )
    }

    /// The number of `static_assert`s [`AbiManifest::to_cpp`] emits.
    pub fn assertion_count(&self) -> usize {
        self.functions.len()
            + self.structs.iter().map(|s| 2 + 2 * s.fields.len()).sum::<usize>()
            + self.enums.iter().map(|e| 1 + e.values.len()).sum::<usize>()
            + self.consts.len()
    }

    /// A C++17 translation unit that compiles only if every declaration matches the headers.
    pub fn to_cpp(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "// Generated from the Rust declarations of the aiv-transport -sys crates. Do not edit.");
        for header in &self.headers {
            let _ = writeln!(out, "#include \"{header}\"");
        }
        let _ = writeln!(out, "#include <cstddef>\n#include <cstdint>\n#include <type_traits>\n");
        for function in &self.functions {
            let ours = function.c_function_type();
            let _ = writeln!(
                out,
                "static_assert(std::is_same<decltype({name}), {ours}>::value, \"prototype of {name} differs from ours: {ours}\");",
                name = function.name,
            );
        }
        for decl in &self.structs {
            let name = decl.name;
            let _ = writeln!(out, "static_assert(sizeof({name}) == {}, \"sizeof({name})\");", decl.size);
            let _ = writeln!(out, "static_assert(alignof({name}) == {}, \"alignof({name})\");", decl.align);
            for field in &decl.fields {
                let _ = writeln!(
                    out,
                    "static_assert(offsetof({name}, {f}) == {off}, \"offset of {name}::{f}\");",
                    f = field.name,
                    off = field.offset,
                );
                let _ = writeln!(
                    out,
                    "static_assert(std::is_same<decltype({name}::{f}), {ty}>::value, \"type of {name}::{f} differs from ours: {ty}\");",
                    f = field.name,
                    ty = field.c_type,
                );
            }
        }
        for decl in &self.enums {
            let _ = writeln!(
                out,
                "static_assert(std::is_same<std::underlying_type<{name}>::type, {repr}>::value, \"underlying type of {name} differs from ours: {repr}\");",
                name = decl.name,
                repr = decl.repr,
            );
            for (value_name, value) in &decl.values {
                let _ = writeln!(
                    out,
                    "static_assert(static_cast<long long>({value_name}) == {value}LL, \"{value_name} differs from ours: {value}\");"
                );
            }
        }
        for constant in &self.consts {
            let _ = writeln!(
                out,
                "static_assert(static_cast<long long>({name}) == {value}LL, \"{name} differs from ours: {value}\");",
                name = constant.name,
                value = constant.value,
            );
        }
        out
    }
}

/// The C++ compiler rejected a translation unit (or could not be run).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{compiler} rejected {}:\n{stderr}", .source_file.display())]
pub struct CompileFailure {
    /// The compiler command.
    pub compiler: String,
    /// The translation unit that was compiled.
    pub source_file: PathBuf,
    /// The compiler's diagnostics (or why it could not start).
    pub stderr: String,
}

/// The C++ compiler: `$CXX`, else `c++`.
pub fn cxx_compiler() -> String {
    std::env::var("CXX").ok().filter(|value| !value.is_empty()).unwrap_or_else(|| "c++".to_string())
}

/// Writes `source` to `work_dir/name` and checks it with the C++ compiler against `include_dirs`
/// (`-fsyntax-only`: nothing is linked, so no vendor library is needed).
pub fn compile_check(
    source: &str,
    name: &str,
    include_dirs: &[PathBuf],
    work_dir: &Path,
) -> Result<(), CompileFailure> {
    let compiler = cxx_compiler();
    let source_file = work_dir.join(name);
    let fail = |stderr: String| CompileFailure { compiler: compiler.clone(), source_file: source_file.clone(), stderr };
    std::fs::write(&source_file, source).map_err(|error| fail(format!("cannot write the source: {error}")))?;
    let mut command = Command::new(&compiler);
    command.args(["-std=c++17", "-fsyntax-only", "-w"]);
    for dir in include_dirs {
        command.arg("-I").arg(dir);
    }
    command.arg(&source_file);
    let output = command.output().map_err(|error| fail(format!("cannot run {compiler}: {error}")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(fail(String::from_utf8_lossy(&output.stderr).into_owned()))
    }
}

/// Builds a C source file into a shared library with the system C compiler (`$CC`, else `cc`). The binding
/// tests use it for their fake vendor libraries; `defines` become `-D` flags.
pub fn compile_shared_library(source: &Path, output: &Path, defines: &[&str]) -> Result<(), CompileFailure> {
    let compiler = std::env::var("CC").ok().filter(|value| !value.is_empty()).unwrap_or_else(|| "cc".to_string());
    let fail =
        |stderr: String| CompileFailure { compiler: compiler.clone(), source_file: source.to_path_buf(), stderr };
    let mut command = Command::new(&compiler);
    command.args(["-shared", "-fPIC", "-O0", "-Wall", "-Werror", "-fvisibility=hidden"]);
    for define in defines {
        command.arg(format!("-D{define}"));
    }
    command.arg("-o").arg(output).arg(source);
    let result = command.output().map_err(|error| fail(format!("cannot run {compiler}: {error}")))?;
    if result.status.success() {
        Ok(())
    } else {
        Err(fail(String::from_utf8_lossy(&result.stderr).into_owned()))
    }
}

/// The include directories of an unpacked `torch_npu/include` named by `AIV_CANN_INCLUDE` (ACL's `third_party/acl/inc`,
/// the root, HCCL's `third_party/hccl/inc`), or why they cannot be used. `tests/run.sh` downloads the wheel and sets
/// the variable; the vendor ABI tests call this.
pub fn vendor_include_dirs() -> Result<Vec<PathBuf>, String> {
    let root = std::env::var_os("AIV_CANN_INCLUDE").map(PathBuf::from).ok_or_else(|| {
        "AIV_CANN_INCLUDE is not set: run `bash tests/run.sh` (it downloads the torch-npu wheel and sets it)"
            .to_string()
    })?;
    let dirs = vec![root.join("third_party/acl/inc"), root.clone(), root.join("third_party/hccl/inc")];
    for header in [dirs[0].join("acl/acl.h"), dirs[2].join("hccl/hccl.h")] {
        if !header.is_file() {
            return Err(format!("{} has no {}", root.display(), header.display()));
        }
    }
    Ok(dirs)
}

/// A fake vendor library built for one test: [`compile_shared_library`] into a private temporary directory, loaded
/// once more so the test can reach the fake's control functions (`fake_take_log`, `fake_set_result`). The directory
/// is removed when the value drops. The binding tests of every `-sys` crate share it.
#[derive(Debug)]
pub struct FakeLibrary {
    control: libloading::Library,
    path: PathBuf,
    dir: PathBuf,
}

impl FakeLibrary {
    /// Compiles `source` into `<temporary directory>/<file_name>` with `defines` and loads it.
    pub fn build(source: &Path, file_name: &str, defines: &[&str]) -> Result<FakeLibrary, CompileFailure> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let fail = |stderr: String| CompileFailure { compiler: "cc".into(), source_file: source.to_path_buf(), stderr };
        let dir = std::env::temp_dir().join(format!(
            "aiv-fake-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|error| fail(format!("cannot create {}: {error}", dir.display())))?;
        let path = dir.join(file_name);
        compile_shared_library(source, &path, defines)?;
        // SAFETY: the fakes' initialisers do nothing; the library stays loaded while this value lives.
        let control = unsafe { libloading::Library::new(&path) }
            .map_err(|error| fail(format!("cannot load {}: {error}", path.display())))?;
        Ok(FakeLibrary { control, path, dir })
    }

    /// The built library's path (what the loader's override variable should name).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The loaded library, for the fake's own control symbols.
    pub fn control(&self) -> &libloading::Library {
        &self.control
    }

    /// The calls the fake recorded since the last read, one per line (`fake_take_log(char *, size_t)`).
    pub fn take_log(&self) -> Vec<String> {
        use std::ffi::{c_char, CStr};
        // SAFETY: every fake exports `size_t fake_take_log(char *, size_t)`.
        let take = match unsafe {
            self.control.get::<unsafe extern "C" fn(*mut c_char, usize) -> usize>(b"fake_take_log\0")
        } {
            Ok(take) => take,
            Err(error) => panic!("{} lacks fake_take_log: {error}", self.path.display()),
        };
        let mut buffer = vec![0 as c_char; 1 << 16];
        // SAFETY: the buffer is live and as long as the capacity passed.
        unsafe { take(buffer.as_mut_ptr(), buffer.len()) };
        // SAFETY: the fake NUL-terminates what it copies.
        let text = unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned();
        text.lines().map(str::to_owned).collect()
    }
}

impl Drop for FakeLibrary {
    fn drop(&mut self) {
        // Runs before the library is unloaded; unlinking the file of a loaded library is harmless on Linux.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::ffi::c_void;

    #[test]
    fn spells_pointers_with_postfix_const() {
        assert_eq!(<*const c_void>::c_type(), "void const *");
        assert_eq!(<*mut *mut c_void>::c_type(), "void * *");
        assert_eq!(<*const *mut c_void>::c_type(), "void * const *");
        assert_eq!(<*const core::ffi::c_char>::c_type(), "char const *");
        assert_eq!(<[u32; 4]>::c_type(), "uint32_t[4]");
    }

    #[test]
    fn renders_every_assertion() {
        let manifest = AbiManifest {
            headers: vec!["x.h"],
            functions: vec![FunctionDecl { name: "f", ret: "int".into(), params: vec![], optional: false }],
            structs: vec![StructDecl {
                name: "S",
                size: 8,
                align: 4,
                fields: vec![FieldDecl { name: "a", offset: 4, c_type: "int".into() }],
            }],
            enums: vec![EnumDecl { name: "E", repr: "uint32_t".into(), values: vec![("E_A", 3)] }],
            consts: vec![ConstDecl { name: "C", value: -7 }],
        };
        let text = manifest.to_cpp();
        assert_eq!(text.matches("static_assert(").count(), manifest.assertion_count());
        assert!(text.contains("std::is_same<decltype(f), int(void)>"), "{text}");
        assert!(text.contains("offsetof(S, a) == 4"), "{text}");
        assert!(text.contains("static_cast<long long>(C) == -7LL"), "{text}");
    }
}
