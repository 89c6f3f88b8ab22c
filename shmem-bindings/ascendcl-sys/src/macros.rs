//! Declaration macros shared by the CANN `-sys` crates. Each takes one declaration written once and generates
//! both the Rust item (function table, newtype enum, `#[repr(C)]` struct, constants) and its entry in the
//! [`AbiManifest`](crate::abi::AbiManifest), so the ABI check cannot drift from the code that calls the library.

/// The return type of a declaration: `()` when none is written.
#[doc(hidden)]
#[macro_export]
macro_rules! __return_type {
    () => {
        ()
    };
    ($ret:ty) => {
        $ret
    };
}

/// A table of function pointers resolved from one shared library, or from an in-process resolver (a runtime
/// linked into the process, such as the CPU twin) with no library behind it.
///
/// An `acts` section (may be left out) classifies functions once, by what a call can do to device work in flight:
/// `name: class;` with the bits of [`calls::act`](crate::calls::act) (`WRITES_DEVICE | SUBMITS`, ...); a name the
/// table does not declare does not compile, and a function not listed has class 0. A call of a classified function
/// is also counted process-wide by its class ([`calls::HostActs`](crate::calls::HostActs)).
///
/// `required` symbols must all resolve or loading fails with
/// [`LoadError::MissingRequiredSymbol`](crate::loader::LoadError); `optional` ones (only newer CANN versions export
/// them) may be absent. An `optional_data` section (may be left out) names global variables: each becomes an
/// `Option<`[`DataSymbol`](crate::loader::DataSymbol)`>` field holding the variable's address, read through
/// [`optional_symbol!`](crate::optional_symbol). Data symbols are not part of the ABI manifest (no public header
/// declares them).
///
/// The function pointers are private. Each function is called through the method of the same name,
/// `unsafe fn name(&self, params..) -> ret` for a required one and `-> Result<ret, MissingSymbol>` for an optional
/// one (`Err` without calling, or counting, when the library lacks it). Every call through a method is counted,
/// per thread and per function, by [`calls`](crate::calls): no call can bypass the count. [`is_resolved`],
/// [`require`] and [`address`] answer whether, and where, a function resolved, by its C name.
///
/// [`is_resolved`]: crate::sys::AclApi::is_resolved
/// [`require`]: crate::sys::AclApi::require
/// [`address`]: crate::sys::AclApi::address
#[macro_export]
macro_rules! dynamic_library {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident;
        required {
            $( $(#[$fmeta:meta])* fn $fname:ident( $($pname:ident : $pty:ty),* $(,)? ) $(-> $ret:ty)?; )*
        }
        optional {
            $( $(#[$ometa:meta])* fn $oname:ident( $($opname:ident : $opty:ty),* $(,)? ) $(-> $oret:ty)?; )*
        }
        $(optional_data {
            $( $(#[$dmeta:meta])* static $dname:ident; )*
        })?
        $(acts {
            $( $aname:ident : $aclass:expr; )*
        })?
    ) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        $vis struct $name {
            path: ::std::path::PathBuf,
            // Kept so that every pointer below stays valid for the table's lifetime; `None` for a table filled by an
            // in-process resolver, whose pointers live as long as the process.
            _library: ::core::option::Option<$crate::__private::libloading::Library>,
            $( $fname: $crate::calls::Resolved<unsafe extern "C" fn($($pty),*) -> $crate::__return_type!($($ret)?)>, )*
            $( $oname: ::core::option::Option<
                $crate::calls::Resolved<unsafe extern "C" fn($($opty),*) -> $crate::__return_type!($($oret)?)>
            >, )*
            $($( $(#[$dmeta])* pub $dname: ::core::option::Option<$crate::loader::DataSymbol>, )*)?
        }

        impl ::core::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.debug_struct(stringify!($name)).field("path", &self.path).finish_non_exhaustive()
            }
        }

        // The counters and the calling methods live in an unnamed scope: nothing outside can reach a counter or
        // index one, so the methods are the only way to call.
        const _: () = {
            /// The index of each function's counter.
            #[allow(non_camel_case_types, dead_code, clippy::enum_variant_names)]
            #[derive(Clone, Copy)]
            #[repr(usize)]
            enum __Function {
                $($fname,)*
                $($oname,)*
            }

            static __TABLE: $crate::calls::TableInfo = $crate::calls::TableInfo::__new(
                stringify!($name),
                &[$(stringify!($fname),)* $(stringify!($oname),)*],
            );

            const __NAMES: &[&str] = &[$(stringify!($fname),)* $(stringify!($oname),)*];

            /// Each function's class (the `acts` section; 0 for a function not listed), by counter index.
            const __ACTS: [u8; __NAMES.len()] = {
                #[allow(unused_mut)]
                let mut acts = [0u8; __NAMES.len()];
                $($( acts[__Function::$aname as usize] |= $aclass; )*)?
                acts
            };

            ::std::thread_local! {
                static __COUNTS: $crate::calls::ThreadCounts = const { $crate::calls::ThreadCounts::__new(&__TABLE) };
            }

            #[allow(non_snake_case)]
            impl $name {
                /// The counter of `function` (a C name this table declares, required or optional) for cheap reads of
                /// the calling thread's count ([`Counter::thread`](crate::calls::Counter::thread): no lock, no
                /// allocation); `None` if the table declares no such function. Compares names: look it up once.
                pub fn counter(function: &str) -> ::core::option::Option<$crate::calls::Counter> {
                    $crate::calls::Counter::__find(&__COUNTS, &__TABLE, function)
                }

                /// The class of `function` (a C name this table declares) in the table's `acts` section (the bits of
                /// [`calls::act`](crate::calls::act); 0 for a function that is not classified), or `None` if the
                /// table declares no such function.
                pub fn act_class(function: &str) -> ::core::option::Option<u8> {
                    __NAMES.iter().position(|name| *name == function).map(|index| __ACTS[index])
                }

                /// Every classified function of the table with its class, in declaration order.
                pub fn classified_functions() -> ::std::vec::Vec<(&'static str, u8)> {
                    __NAMES.iter().zip(__ACTS).filter(|(_, class)| *class != 0).map(|(name, class)| (*name, class)).collect()
                }

                $(
                    $(#[$fmeta])*
                    #[doc = concat!("Calls `", stringify!($fname), "`, counted (`ascendcl_sys::calls`).")]
                    ///
                    /// # Safety
                    ///
                    /// The C function's contract: every pointer and handle argument must be what the library
                    /// documents for it.
                    #[inline]
                    #[allow(clippy::too_many_arguments)]
                    pub unsafe fn $fname(&self, $($pname: $pty),*) -> $crate::__return_type!($($ret)?) {
                        $crate::calls::__count(
                            &__COUNTS,
                            &__TABLE,
                            __Function::$fname as usize,
                            __ACTS[__Function::$fname as usize],
                        );
                        // SAFETY: the caller upholds the C contract; the pointer has the declared prototype (the
                        // constructors' contracts) and stays valid while `self` lives.
                        unsafe { (self.$fname.__function())($($pname),*) }
                    }
                )*
                $(
                    $(#[$ometa])*
                    #[doc = concat!(
                        "Calls `", stringify!($oname), "`, counted (`ascendcl_sys::calls`), or returns ",
                        "`MissingSymbol` without calling (nor counting) when the library does not export it."
                    )]
                    ///
                    /// # Safety
                    ///
                    /// The C function's contract: every pointer and handle argument must be what the library
                    /// documents for it.
                    #[inline]
                    #[allow(clippy::too_many_arguments)]
                    pub unsafe fn $oname(
                        &self,
                        $($opname: $opty),*
                    ) -> ::core::result::Result<$crate::__return_type!($($oret)?), $crate::loader::MissingSymbol> {
                        match &self.$oname {
                            ::core::option::Option::Some(function) => {
                                $crate::calls::__count(
                                    &__COUNTS,
                                    &__TABLE,
                                    __Function::$oname as usize,
                                    __ACTS[__Function::$oname as usize],
                                );
                                // SAFETY: as for a required function.
                                ::core::result::Result::Ok(unsafe { (function.__function())($($opname),*) })
                            }
                            ::core::option::Option::None => {
                                ::core::result::Result::Err(self.__missing(stringify!($oname)))
                            }
                        }
                    }
                )*
            }
        };

        #[allow(non_snake_case)]
        impl $name {
            /// Resolves every symbol of an opened library.
            ///
            /// # Safety
            ///
            /// `library` must be the vendor library these declarations describe: the pointers are typed from the
            /// declarations (checked against the vendor headers by the ABI test), not from the library itself.
            pub unsafe fn from_library(
                library: $crate::__private::libloading::Library,
                path: ::std::path::PathBuf,
            ) -> ::core::result::Result<Self, $crate::loader::LoadError> {
                $(
                    // SAFETY: the caller guarantees the library is the one whose `$fname` has this prototype.
                    let $fname = match unsafe {
                        library.get::<unsafe extern "C" fn($($pty),*) -> $crate::__return_type!($($ret)?)>(
                            concat!(stringify!($fname), "\0").as_bytes(),
                        )
                    } {
                        Ok(symbol) => $crate::calls::Resolved::__new(*symbol),
                        Err(error) => {
                            return Err($crate::loader::LoadError::MissingRequiredSymbol {
                                path,
                                symbol: stringify!($fname),
                                reason: error.to_string(),
                            })
                        }
                    };
                )*
                $(
                    // SAFETY: as above, for the optional `$oname`.
                    let $oname = unsafe {
                        library.get::<unsafe extern "C" fn($($opty),*) -> $crate::__return_type!($($oret)?)>(
                            concat!(stringify!($oname), "\0").as_bytes(),
                        )
                    }
                    .ok()
                    .map(|symbol| $crate::calls::Resolved::__new(*symbol));
                )*
                $($(
                    // SAFETY: a data symbol is read as its address only (`dlsym` returns the variable's address);
                    // nothing is dereferenced here.
                    let $dname = unsafe {
                        library.get::<*mut ::core::ffi::c_void>(concat!(stringify!($dname), "\0").as_bytes())
                    }
                    .ok()
                    .and_then(|symbol| $crate::loader::DataSymbol::new(*symbol));
                )*)?
                Ok(Self { path, _library: Some(library), $($fname,)* $($oname,)* $($($dname,)*)? })
            }

            /// Fills the table from `resolve`, which maps a C symbol name to its address, with no library behind
            /// it: for a runtime linked into this process. A required symbol `resolve` returns `None` (or null) for
            /// fails with [`LoadError::MissingRequiredSymbol`](crate::loader::LoadError); an optional one, or a data
            /// symbol, becomes `None`. `path` is what [`path`](Self::path) reports (a description of the resolver).
            ///
            /// # Safety
            ///
            /// Every non-null pointer `resolve` returns for a function name must be the address of a function with
            /// exactly the declared prototype and the C calling convention, callable from any thread for the rest
            /// of the process's life; for a data-symbol name, the address of that variable. Nothing checks this:
            /// the pointers are typed from the declarations.
            pub unsafe fn from_resolver(
                path: ::std::path::PathBuf,
                resolve: &dyn Fn(&str) -> ::core::option::Option<*const ::core::ffi::c_void>,
            ) -> ::core::result::Result<Self, $crate::loader::LoadError> {
                $(
                    let $fname = match resolve(stringify!($fname)).filter(|address| !address.is_null()) {
                        // SAFETY: the caller guarantees a non-null address for this name is a function with the
                        // declared prototype; a data pointer and a function pointer have the same size here.
                        Some(address) => $crate::calls::Resolved::__new(unsafe {
                            ::core::mem::transmute::<
                                *const ::core::ffi::c_void,
                                unsafe extern "C" fn($($pty),*) -> $crate::__return_type!($($ret)?),
                            >(address)
                        }),
                        None => {
                            return Err($crate::loader::LoadError::MissingRequiredSymbol {
                                path,
                                symbol: stringify!($fname),
                                reason: "the in-process resolver does not provide it".into(),
                            })
                        }
                    };
                )*
                $(
                    let $oname = resolve(stringify!($oname)).filter(|address| !address.is_null()).map(|address| {
                        // SAFETY: as above, for the optional `$oname`.
                        $crate::calls::Resolved::__new(unsafe {
                            ::core::mem::transmute::<
                                *const ::core::ffi::c_void,
                                unsafe extern "C" fn($($opty),*) -> $crate::__return_type!($($oret)?),
                            >(address)
                        })
                    });
                )*
                $($(
                    let $dname = resolve(stringify!($dname))
                        .and_then(|address| $crate::loader::DataSymbol::new(address.cast_mut()));
                )*)?
                Ok(Self { path, _library: None, $($fname,)* $($oname,)* $($($dname,)*)? })
            }

            /// Opens the first candidate that loads and resolves the table from it.
            pub fn load(
                spec: &$crate::loader::LibrarySpec,
                candidates: &[$crate::loader::Candidate],
            ) -> ::core::result::Result<Self, $crate::loader::LoadError> {
                let (library, path) = spec.open(candidates)?;
                // SAFETY: the candidates name this vendor library (an explicit override, an install root or the
                // loader's resolution of its file name), whose prototypes the declarations mirror.
                unsafe { Self::from_library(library, path) }
            }

            /// The file the table was resolved from.
            pub fn path(&self) -> &::std::path::Path {
                &self.path
            }

            /// The address `function` (a C name this table declares) resolved to, or `None` for an optional one
            /// the library does not export: to compare where two tables' functions come from. Not callable as is.
            ///
            /// # Panics
            ///
            /// If the table declares no function of that name.
            pub fn address(&self, function: &str) -> ::core::option::Option<*const ::core::ffi::c_void> {
                $(
                    if function == stringify!($fname) {
                        return ::core::option::Option::Some(self.$fname.__function() as *const ::core::ffi::c_void);
                    }
                )*
                $(
                    if function == stringify!($oname) {
                        return self.$oname.map(|resolved| resolved.__function() as *const ::core::ffi::c_void);
                    }
                )*
                panic!("{} declares no function {function:?}", stringify!($name))
            }

            /// Whether `function` (a C name this table declares) resolved: always for a required one.
            ///
            /// # Panics
            ///
            /// If the table declares no function of that name.
            pub fn is_resolved(&self, function: &str) -> bool {
                self.address(function).is_some()
            }

            /// `Ok` if `function` (a C name this table declares) resolved, else the
            /// [`MissingSymbol`](crate::loader::MissingSymbol) its method would return.
            ///
            /// # Panics
            ///
            /// If the table declares no function of that name.
            pub fn require(&self, function: &str) -> ::core::result::Result<(), $crate::loader::MissingSymbol> {
                match self.address(function) {
                    ::core::option::Option::Some(_) => ::core::result::Result::Ok(()),
                    ::core::option::Option::None => {
                        let symbol = Self::function_names()
                            .iter()
                            .find(|name| **name == function)
                            .copied()
                            .unwrap_or("?");
                        ::core::result::Result::Err(self.__missing(symbol))
                    }
                }
            }

            /// The C names of every declared function, required then optional, in declaration order.
            pub fn function_names() -> &'static [&'static str] {
                &[$(stringify!($fname),)* $(stringify!($oname),)*]
            }

            #[doc(hidden)]
            #[cold]
            pub fn __missing(&self, symbol: &'static str) -> $crate::loader::MissingSymbol {
                $crate::loader::MissingSymbol { symbol, path: self.path.clone() }
            }

            /// Every declared function, for the ABI check.
            pub fn function_decls() -> ::std::vec::Vec<$crate::abi::FunctionDecl> {
                use $crate::abi::CType as _;
                ::std::vec![
                    $($crate::abi::FunctionDecl {
                        name: stringify!($fname),
                        ret: <$crate::__return_type!($($ret)?)>::c_type(),
                        params: ::std::vec![$(<$pty>::c_type()),*],
                        optional: false,
                    },)*
                    $($crate::abi::FunctionDecl {
                        name: stringify!($oname),
                        ret: <$crate::__return_type!($($oret)?)>::c_type(),
                        params: ::std::vec![$(<$opty>::c_type()),*],
                        optional: true,
                    },)*
                ]
            }
        }
    };
}

/// Reads an optional data symbol of a table (an `optional_data` entry), or returns
/// [`MissingSymbol`](crate::loader::MissingSymbol) naming it. Functions are called through the table's methods.
#[macro_export]
macro_rules! optional_symbol {
    ($table:expr, $name:ident) => {
        $table.$name.ok_or_else(|| $crate::loader::MissingSymbol {
            symbol: stringify!($name),
            path: $table.path().to_path_buf(),
        })
    };
}

/// A C enum as a `#[repr(transparent)]` newtype with one constant per enumerator (exact C names). Foreign code may
/// hand back any value, so the type is never a Rust `enum`; `name()` is a total decode.
#[macro_export]
macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $repr:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[allow(non_camel_case_types)]
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        $vis struct $name(pub $repr);

        $( $(#[$vmeta])* $vis const $variant: $name = $name($value); )*

        impl $name {
            /// The C enumerator name of this value, if it has one.
            pub fn name(self) -> ::core::option::Option<&'static str> {
                $( if self.0 == $value { return Some(stringify!($variant)); } )*
                None
            }

            /// This enum's entry in the ABI manifest.
            pub fn abi_decl() -> $crate::abi::EnumDecl {
                $crate::abi::EnumDecl {
                    name: stringify!($name),
                    repr: <$repr as $crate::abi::CType>::c_type(),
                    values: ::std::vec![$((stringify!($variant), ($value) as i128)),*],
                }
            }
        }

        impl ::core::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                match self.name() {
                    Some(name) => write!(f, "{name}"),
                    None => write!(f, "{}({})", stringify!($name), self.0),
                }
            }
        }

        impl $crate::abi::CType for $name {
            fn c_type() -> ::std::string::String {
                stringify!($name).to_string()
            }
        }
    };
}

/// A `#[repr(C)]` struct (or, with `union`, a union) whose C name, size, alignment, field offsets and field types
/// are recorded for the ABI check.
#[macro_export]
macro_rules! c_struct {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $fty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[allow(non_camel_case_types, non_snake_case)]
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $fty, )*
        }
        $crate::__c_aggregate_impls!($name; $($field : $fty),*);
    };
    (
        $(#[$meta:meta])*
        $vis:vis union $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $fty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[allow(non_camel_case_types, non_snake_case)]
        #[repr(C)]
        #[derive(Clone, Copy)]
        $vis union $name {
            $( $(#[$fmeta])* $fvis $field: $fty, )*
        }
        impl ::core::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.debug_struct(stringify!($name)).finish_non_exhaustive()
            }
        }
        $crate::__c_aggregate_impls!($name; $($field : $fty),*);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __c_aggregate_impls {
    ($name:ident; $($field:ident : $fty:ty),*) => {
        impl $name {
            /// This type's entry in the ABI manifest.
            pub fn abi_decl() -> $crate::abi::StructDecl {
                $crate::abi::StructDecl {
                    name: stringify!($name),
                    size: ::core::mem::size_of::<$name>(),
                    align: ::core::mem::align_of::<$name>(),
                    fields: ::std::vec![$($crate::abi::FieldDecl {
                        name: $crate::abi::c_name(stringify!($field)),
                        offset: ::core::mem::offset_of!($name, $field),
                        c_type: <$fty as $crate::abi::CType>::c_type(),
                    }),*],
                }
            }
        }

        impl $crate::abi::CType for $name {
            fn c_type() -> ::std::string::String {
                stringify!($name).to_string()
            }
        }
    };
}

/// Named integer constants (exact C names), with a table of them for lookups and the ABI check.
#[macro_export]
macro_rules! c_consts {
    (
        $(#[$meta:meta])*
        $vis:vis table $table:ident : $ty:ty;
        $( $(#[$cmeta:meta])* $name:ident = $value:expr; )*
    ) => {
        $( $(#[$cmeta])* $vis const $name: $ty = $value; )*

        $(#[$meta])*
        $vis const $table: &[(&str, $ty)] = &[$((stringify!($name), $name)),*];
    };
}

/// Declares a raw vendor return-code newtype (`pub struct $name(pub $repr)`) whose `Debug` and `Display` name the
/// documented codes of `$table` (a `&[(&str, $repr)]`), e.g. `AclError(207001 ACL_ERROR_RT_MEMORY_ALLOCATION)`, and
/// which is a `std::error::Error`. Shared by the `-sys` crates.
#[macro_export]
macro_rules! error_code {
    ($(#[$meta:meta])* $name:ident($repr:ty), $table:path) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name(pub $repr);

        impl $name {
            /// The C name of a documented code.
            pub fn name(self) -> Option<&'static str> {
                $table.iter().find(|(_, value)| *value == self.0).map(|(name, _)| *name)
            }
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                match self.name() {
                    Some(name) => write!(f, "{}({} {name})", stringify!($name), self.0),
                    None => write!(f, "{}({} undocumented)", stringify!($name), self.0),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                ::std::fmt::Debug::fmt(self, f)
            }
        }

        impl ::std::error::Error for $name {}
    };
}
