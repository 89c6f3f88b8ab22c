//! The layering of `host/`: which module may import which, read from the source text.
//!
//! Every `.rs` file under `host/` is a node (`host/a/b.rs` and `host/a/b/mod.rs` are module `a::b`, `host/lib.rs` is
//! the crate root, `host/bin/x.rs` is `bin::x`, the binary). There is an arrow A -> B for every path in A's non-test
//! code that names something B defines: `crate::...` paths (in `use` items, brace groups included, and anywhere in
//! code), `super::` and `self::` paths, paths through a child module (`child::X`) or through a name a `use` brought
//! in, and `aiv_transport::...` paths of the binary.
//!
//! Where a path lands: at the longest prefix that is a module (a file or an inline `mod x { ... }`); if the next name
//! is defined there (a struct, enum, union, trait, type alias, fn, const, static or module), the path names that
//! module's file. If instead a `use` item of that module brings the name in (a `pub use` / `pub(crate) use`
//! re-export, or a private `use` a child reaches through `super::`), the path is followed on to where that `use`
//! takes it from, and again there, through chains of re-exports and through glob `use`s (`pub use self::child::*`)
//! whose module the test has read, to the module that DEFINES the item. A name that cannot be followed stays with the
//! longest module prefix's file; a name a `use` takes from another crate (`std`, a dependency) makes no arrow.
//!
//! A re-export is a name alias, not code: a `pub use` / `pub(...) use` line itself is no arrow. It is an arrow (at
//! the first line that writes the name) only when the same file's code writes the name it binds (or, for a glob, one
//! of the names of the module it takes everything from). A private `use` is an arrow, as the import of code. Arrows
//! to the root and to the module itself are dropped; `mod x;` is containment, not an arrow. Test-only code is
//! skipped: an item under `#[cfg(test)]` (or a `cfg` that implies `test`), and files declared by `#[cfg(test)] mod x;`.
//!
//! The rules:
//! 1. floors ([`FLOORS`], from the bottom): a module imports only from its own floor or the floors below; the floor
//!    of a module is the floor of its top-level name, and a top-level name missing from the table fails;
//! 2. nothing under `transport` imports `engine`;
//! 3. no import cycle of more than two files (strongly connected components over files).
//! 4. no Rust source file under `host/` or `shmem-bindings/` (the twin runtime and the bindings included) over
//!    [`MAX_FILE_LINES`] lines.
//!
//! To see the whole graph, one `a::b -> c, d` line per module:
//!
//! ```text
//! AIV_PRINT_IMPORT_GRAPH=1 cargo test --test layering -- --nocapture
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The floors, from the bottom (index = floor): the top-level modules of each. A module may import from its own floor
/// and from the floors below. `bin` stands for the binary, `host/bin/*`.
const FLOORS: &[&[&str]] = &[
    &["queue", "kernel_abi"],
    &["transfer", "evidence", "cpu_time", "config", "error", "log_limit", "trace", "bounded"],
    &["metadata", "device"],
    &["transport", "occupancy"],
    &["engine"],
    &["bench", "doctor", "audit", "bin"],
];

/// The library's crate name, as the binary spells the root of the library.
const LIBRARY_CRATE: &str = "aiv_transport";

/// Words that open an item (after attributes): what follows `#[cfg(test)]` is stripped up to its end.
const ITEM_KEYWORDS: &[&str] = &[
    "pub",
    "mod",
    "fn",
    "use",
    "impl",
    "struct",
    "enum",
    "trait",
    "type",
    "const",
    "static",
    "extern",
    "union",
    "unsafe",
    "async",
    "macro_rules",
];

/// Words that define a name at item level (`mod` is handled with inline modules).
const DEFINING_KEYWORDS: &[&str] = &["struct", "enum", "union", "trait", "type", "fn", "const", "static"];

// ---------------------------------------------------------------------------------------------------------------
// Tokens: identifiers, `::`, punctuation; comments, whitespace and literals are dropped (literals become one token).

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
    /// A literal; for a string, the names it captures as a format string (`"{name}"`, `"{name:?}"`).
    Literal(Vec<String>),
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    line: usize,
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn lex(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start_line = line;
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
        } else if c == '"' {
            let begin = i;
            i = skip_string(&chars, i + 1, &mut line);
            tokens.push(Token { tok: Tok::Literal(format_captures(&chars[begin..i])), line: start_line });
        } else if c == '\'' {
            i = skip_char_or_lifetime(&chars, i);
            tokens.push(Token { tok: Tok::Literal(Vec::new()), line: start_line });
        } else if c.is_ascii_digit() {
            while i < chars.len() && is_ident_char(chars[i]) {
                i += 1;
            }
            tokens.push(Token { tok: Tok::Literal(Vec::new()), line: start_line });
        } else if is_ident_start(c) || (c == '$' && is_ident_start(at(i + 1))) {
            let begin = i;
            i += 1;
            while i < chars.len() && is_ident_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[begin..i].iter().collect();
            let raw_prefix = matches!(word.as_str(), "r" | "br" | "cr");
            if raw_prefix && (at(i) == '"' || (at(i) == '#' && (at(i + 1) == '"' || at(i + 1) == '#'))) {
                let begin = i;
                i = skip_raw_string(&chars, i, &mut line);
                tokens.push(Token { tok: Tok::Literal(format_captures(&chars[begin..i])), line: start_line });
            } else if word == "r" && at(i) == '#' && is_ident_start(at(i + 1)) {
                // A raw identifier, `r#type`: the identifier follows.
                i += 1;
            } else if matches!(word.as_str(), "b" | "c") && at(i) == '"' {
                i = skip_string(&chars, i + 1, &mut line);
                tokens.push(Token { tok: Tok::Literal(Vec::new()), line: start_line });
            } else if word == "b" && at(i) == '\'' {
                i = skip_char_or_lifetime(&chars, i);
                tokens.push(Token { tok: Tok::Literal(Vec::new()), line: start_line });
            } else {
                tokens.push(Token { tok: Tok::Ident(word), line: start_line });
            }
        } else if c == ':' && at(i + 1) == ':' {
            tokens.push(Token { tok: Tok::PathSep, line: start_line });
            i += 2;
        } else {
            tokens.push(Token { tok: Tok::Punct(c), line: start_line });
            i += 1;
        }
    }
    tokens
}

/// The names a string literal (its text, quotes included) captures if it is a format string: `{name}`, `{name:...}`;
/// `{{` is an escaped brace.
fn format_captures(text: &[char]) -> Vec<String> {
    let mut names = Vec::new();
    let mut k = 0;
    while k < text.len() {
        if text[k] == '{' && text.get(k + 1) == Some(&'{') {
            k += 2;
        } else if text[k] == '{' && text.get(k + 1).is_some_and(|&c| is_ident_start(c)) {
            let end = (k + 1..text.len()).find(|&e| !is_ident_char(text[e])).unwrap_or(text.len());
            if matches!(text.get(end), Some('}' | ':')) {
                names.push(text[k + 1..end].iter().collect());
            }
            k = end;
        } else {
            k += 1;
        }
    }
    names
}

/// From just after the opening quote of a (non-raw) string to just after its closing quote.
fn skip_string(chars: &[char], mut i: usize, line: &mut usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                *line += usize::from(chars.get(i + 1) == Some(&'\n'));
                i += 2;
            }
            '"' => return i + 1,
            c => {
                *line += usize::from(c == '\n');
                i += 1;
            }
        }
    }
    i
}

/// From the `#`s or the quote after `r`/`br`/`cr` to just after the closing quote and its `#`s.
fn skip_raw_string(chars: &[char], mut i: usize, line: &mut usize) -> usize {
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    i += 1; // the opening quote
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        *line += usize::from(chars[i] == '\n');
        i += 1;
    }
    i
}

/// From a `'`: past a char literal (`'x'`, `'\n'`, `'{'`) or a lifetime / label (`'a`, `'static`).
fn skip_char_or_lifetime(chars: &[char], i: usize) -> usize {
    if chars.get(i + 1) == Some(&'\\') {
        let mut k = i + 3;
        while k < chars.len() && chars[k] != '\'' {
            k += 1;
        }
        return k + 1;
    }
    if chars.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    let mut k = i + 1;
    while k < chars.len() && is_ident_char(chars[k]) {
        k += 1;
    }
    k
}

fn ident(token: Option<&Token>) -> Option<&str> {
    match token {
        Some(Token { tok: Tok::Ident(word), .. }) => Some(word),
        _ => None,
    }
}

fn is_punct(token: Option<&Token>, c: char) -> bool {
    matches!(token, Some(Token { tok: Tok::Punct(p), .. }) if *p == c)
}

fn is_sep(token: Option<&Token>) -> bool {
    matches!(token, Some(Token { tok: Tok::PathSep, .. }))
}

/// The index of the bracket closing the one at `open` (or the end).
fn matching(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, token) in tokens.iter().enumerate().skip(open) {
        match token.tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

// ---------------------------------------------------------------------------------------------------------------
// Test-only code: `#[cfg(P)]` where P implies `test`, and the item it is on.

/// Whether the attribute's tokens (between `#[` and `]`) are a `cfg` whose predicate implies `test`.
fn cfg_is_test_only(attribute: &[Token]) -> bool {
    if ident(attribute.first()) != Some("cfg") || !is_punct(attribute.get(1), '(') {
        return false;
    }
    let mut i = 2;
    predicate_implies_test(attribute, &mut i)
}

/// Parses one cfg predicate at `*i` (advancing past it): does it hold only when `test` does?
fn predicate_implies_test(tokens: &[Token], i: &mut usize) -> bool {
    let Some(word) = ident(tokens.get(*i)) else {
        *i += 1;
        return false;
    };
    let word = word.to_owned();
    *i += 1;
    if is_punct(tokens.get(*i), '=') {
        *i += 2; // `key = "value"`
        return false;
    }
    if !is_punct(tokens.get(*i), '(') {
        return word == "test";
    }
    *i += 1;
    let mut parts = Vec::new();
    while *i < tokens.len() && !is_punct(tokens.get(*i), ')') {
        let before = *i;
        parts.push(predicate_implies_test(tokens, i));
        if is_punct(tokens.get(*i), ',') {
            *i += 1;
        }
        if *i == before {
            *i += 1;
        }
    }
    *i += 1; // `)`
    match word.as_str() {
        "all" => parts.iter().any(|&p| p),
        "any" => !parts.is_empty() && parts.iter().all(|&p| p),
        _ => false, // `not(...)` and anything else
    }
}

/// The end (exclusive) of the item starting at `k` (after the test-only attribute), and the name it declares if it is
/// `mod name;` (a whole file that is test-only).
fn item_end(tokens: &[Token], mut k: usize) -> (usize, Option<String>) {
    while is_punct(tokens.get(k), '#') && is_punct(tokens.get(k + 1), '[') {
        k = matching(tokens, k + 1) + 1;
    }
    let mut head = k;
    if ident(tokens.get(head)) == Some("pub") {
        head += 1;
        if is_punct(tokens.get(head), '(') {
            head = matching(tokens, head) + 1;
        }
    }
    let keyword = ident(tokens.get(head));
    let is_item = head > k || keyword.is_some_and(|word| ITEM_KEYWORDS.contains(&word));
    let is_use = keyword == Some("use");
    let declared_file = match (keyword, ident(tokens.get(head + 1))) {
        (Some("mod"), Some(name)) if is_punct(tokens.get(head + 2), ';') => Some(name.to_owned()),
        _ => None,
    };
    let mut depth = 0usize;
    while k < tokens.len() {
        match tokens[k].tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(closer @ (')' | ']' | '}')) => {
                if depth == 0 {
                    return (k, declared_file); // the end of the enclosing block: not ours
                }
                depth -= 1;
                if depth == 0 && closer == '}' && is_item && !is_use {
                    return (k + 1, declared_file);
                }
            }
            Tok::Punct(';') if depth == 0 => return (k + 1, declared_file),
            Tok::Punct(',') if depth == 0 && !is_item => return (k + 1, declared_file),
            _ => {}
        }
        k += 1;
    }
    (k, declared_file)
}

// ---------------------------------------------------------------------------------------------------------------
// One file's references, unresolved.

#[derive(Clone, Debug)]
struct RawRef {
    /// The inline modules (`mod x { ... }`) the path is written in, inside the file's module.
    scope: Vec<String>,
    /// The path's segments as written, `{}` groups expanded, a trailing `self` or `*` dropped.
    segments: Vec<String>,
    line: usize,
    /// The path as written (groups expanded).
    text: String,
    /// For a `use` leaf: the name it brings into scope.
    binds: Option<String>,
    /// A leaf of a `pub use` / `pub(...) use` item: a re-export.
    reexport: bool,
    /// A glob leaf, `use a::b::*` (`segments` is the module, `a::b`).
    glob: bool,
}

#[derive(Debug, Default)]
struct Scan {
    refs: Vec<RawRef>,
    /// Inline modules, relative to the file's module.
    inline_modules: Vec<Vec<String>>,
    /// `#[cfg(test)] mod x;` declarations, relative to the file's module: those files are test-only.
    test_modules: Vec<Vec<String>>,
    /// `#![cfg(test)]` at the top of the file.
    test_only_file: bool,
    /// The names each module of the file (the file's own, `[]`, and its inline modules) defines: structs, enums,
    /// unions, traits, type aliases, functions, constants, statics and modules, at that module's item level.
    defines: BTreeMap<Vec<String>, BTreeSet<String>>,
    /// Every name the file's code (outside `use` items) writes, as an identifier, a path's first segment or a format
    /// string's capture (`"{name}"`), with the first line it is written on.
    written: BTreeMap<String, usize>,
}

#[derive(Debug)]
struct UseLeaf {
    segments: Vec<String>,
    glob: bool,
    alias: Option<String>,
    line: usize,
}

/// Parses a `use` tree at `*i`, appending its leaves (each with the `prefix` in front) to `out`.
fn parse_use_tree(tokens: &[Token], i: &mut usize, prefix: Vec<String>, out: &mut Vec<UseLeaf>) {
    let mut segments = prefix;
    if is_sep(tokens.get(*i)) {
        segments.push("::".to_owned()); // a global path: an external crate
        *i += 1;
    }
    let mut line = tokens.get(*i).map_or(0, |token| token.line);
    loop {
        let Some(token) = tokens.get(*i) else { return };
        match &token.tok {
            Tok::Punct('{') => {
                *i += 1;
                while *i < tokens.len() && !is_punct(tokens.get(*i), '}') {
                    let before = *i;
                    parse_use_tree(tokens, i, segments.clone(), out);
                    if is_punct(tokens.get(*i), ',') {
                        *i += 1;
                    }
                    if *i == before {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Tok::Punct('*') => {
                *i += 1;
                out.push(UseLeaf { segments, glob: true, alias: None, line: token.line });
                return;
            }
            Tok::Ident(word) => {
                segments.push(word.clone());
                line = token.line;
                *i += 1;
                if is_sep(tokens.get(*i)) {
                    *i += 1;
                    continue;
                }
                let mut alias = None;
                if ident(tokens.get(*i)) == Some("as") {
                    alias = ident(tokens.get(*i + 1)).map(str::to_owned);
                    *i += 2;
                }
                out.push(UseLeaf { segments, glob: false, alias, line });
                return;
            }
            _ => {
                if segments.len() > usize::from(segments.first().is_some_and(|s| s == "::")) {
                    out.push(UseLeaf { segments, glob: false, alias: None, line });
                }
                return;
            }
        }
    }
}

/// From `k`, past the next `;` of this level (or up to the closer of the enclosing block).
fn skip_statement(tokens: &[Token], mut k: usize) -> usize {
    let mut depth = 0usize;
    while k < tokens.len() {
        match tokens[k].tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                if depth == 0 {
                    return k;
                }
                depth -= 1;
            }
            Tok::Punct(';') if depth == 0 => return k + 1,
            _ => {}
        }
        k += 1;
    }
    k
}

/// Whether the `use` at `k` is `pub use` or `pub(...) use`: a re-export.
fn is_public(tokens: &[Token], k: usize) -> bool {
    let Some(mut before) = k.checked_sub(1) else { return false };
    if is_punct(tokens.get(before), ')') {
        // `pub(crate)`, `pub(super)`, `pub(in a::b)`: no brackets inside.
        while before > 0 && !is_punct(tokens.get(before), '(') {
            before -= 1;
        }
        let Some(pub_at) = before.checked_sub(1) else { return false };
        before = pub_at;
    }
    ident(tokens.get(before)) == Some("pub")
}

/// Whether brace depth `depth` is the item level of the innermost (inline) module: not inside a function, an `impl`,
/// a trait or a type.
fn at_item_level(inline: &[(String, usize)], depth: usize) -> bool {
    depth == inline.last().map_or(0, |(_, inner)| *inner)
}

fn scan(source: &str) -> Scan {
    let tokens = lex(source);
    let mut scan = Scan::default();
    let mut inline: Vec<(String, usize)> = Vec::new(); // inline module name, brace depth inside it
    let mut depth = 0usize;
    let scope = |inline: &[(String, usize)]| inline.iter().map(|(name, _)| name.clone()).collect::<Vec<_>>();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i].tok {
            Tok::Punct('#') => {
                let inner = is_punct(tokens.get(i + 1), '!');
                let open = if inner { i + 2 } else { i + 1 };
                if is_punct(tokens.get(open), '[') {
                    let close = matching(&tokens, open);
                    if cfg_is_test_only(tokens.get(open + 1..close).unwrap_or(&[])) {
                        if inner {
                            if inline.is_empty() && depth == 0 {
                                scan.test_only_file = true;
                                return scan;
                            }
                        } else {
                            let (end, declared_file) = item_end(&tokens, close + 1);
                            if let Some(name) = declared_file {
                                let mut module = scope(&inline);
                                module.push(name);
                                scan.test_modules.push(module);
                            }
                            i = end;
                            continue;
                        }
                    }
                }
                i += 1;
            }
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Ident(word) if word == "mod" => {
                if let Some(name) = ident(tokens.get(i + 1)).filter(|_| at_item_level(&inline, depth)) {
                    scan.defines.entry(scope(&inline)).or_default().insert(name.to_owned());
                }
                if let (Some(name), true) = (ident(tokens.get(i + 1)), is_punct(tokens.get(i + 2), '{')) {
                    inline.push((name.to_owned(), depth + 1));
                    scan.inline_modules.push(scope(&inline));
                    i += 2;
                } else {
                    i += 1;
                }
            }
            Tok::Ident(word) if DEFINING_KEYWORDS.contains(&word.as_str()) && at_item_level(&inline, depth) => {
                if let Some(name) =
                    ident(tokens.get(i + 1)).filter(|name| *name != "_" && !ITEM_KEYWORDS.contains(name))
                {
                    scan.defines.entry(scope(&inline)).or_default().insert(name.to_owned());
                }
                i += 1;
            }
            Tok::Ident(word) if word == "use" && !is_punct(tokens.get(i + 1), '<') => {
                let reexport = is_public(&tokens, i);
                let mut leaves = Vec::new();
                let mut k = i + 1;
                parse_use_tree(&tokens, &mut k, Vec::new(), &mut leaves);
                for UseLeaf { mut segments, glob, alias, line } in leaves {
                    let mut text = segments.join("::");
                    if glob {
                        text.push_str("::*");
                    }
                    if segments.last().is_some_and(|s| s == "self") {
                        segments.pop();
                    }
                    let binds = match alias {
                        Some(alias) => Some(alias).filter(|a| a != "_"),
                        None if glob => None,
                        None => segments.last().cloned(),
                    };
                    scan.refs.push(RawRef { scope: scope(&inline), segments, line, text, binds, reexport, glob });
                }
                i = skip_statement(&tokens, k);
            }
            Tok::Ident(_) if i == 0 || !is_sep(tokens.get(i - 1)) => {
                let line = tokens[i].line;
                let mut segments = Vec::new();
                let mut k = i;
                while let Some(word) = ident(tokens.get(k)) {
                    segments.push(word.to_owned());
                    if is_sep(tokens.get(k + 1)) && ident(tokens.get(k + 2)).is_some() {
                        k += 2;
                    } else {
                        break;
                    }
                }
                let name = if segments[0] == "self" && segments.len() > 1 { &segments[1] } else { &segments[0] };
                scan.written.entry(name.clone()).or_insert(line);
                if segments.len() > 1 {
                    let text = segments.join("::");
                    let (binds, reexport, glob) = (None, false, false);
                    scan.refs.push(RawRef { scope: scope(&inline), segments, line, text, binds, reexport, glob });
                }
                i = k + 1;
            }
            Tok::Literal(captured) => {
                for name in captured {
                    scan.written.entry(name.clone()).or_insert(tokens[i].line);
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    scan
}

// ---------------------------------------------------------------------------------------------------------------
// The graph.

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Arrow {
    from: String,
    to: String,
    /// The line (of the file of `from`) of the first place this path is written.
    line: usize,
    /// The path as written.
    path: String,
}

#[derive(Debug, Default)]
struct Graph {
    /// Module name (`""` is the crate root) -> its file, `host/...`.
    files: BTreeMap<String, String>,
    /// Every arrow, once per (from, to, path as written).
    arrows: Vec<Arrow>,
}

fn display(module: &str) -> &str {
    if module.is_empty() {
        "crate"
    } else {
        module
    }
}

impl Graph {
    fn edges(&self) -> BTreeMap<&str, BTreeSet<&str>> {
        let mut edges: BTreeMap<&str, BTreeSet<&str>> =
            self.files.keys().map(|m| (m.as_str(), BTreeSet::new())).collect();
        for arrow in &self.arrows {
            edges.entry(&arrow.from).or_default().insert(&arrow.to);
        }
        edges
    }

    /// The modules `from` imports.
    fn targets(&self, from: &str) -> BTreeSet<&str> {
        self.arrows.iter().filter(|a| a.from == from).map(|a| a.to.as_str()).collect()
    }

    fn file(&self, module: &str) -> &str {
        self.files.get(module).map_or("?", String::as_str)
    }

    /// One `a::b -> c, d` line per module.
    fn render(&self) -> String {
        let mut out = String::new();
        for (from, to) in self.edges() {
            let to: Vec<&str> = to.into_iter().map(display).collect();
            out.push_str(&format!("{} -> {}\n", display(from), to.join(", ")));
        }
        out
    }
}

/// The module of a file, from its path relative to `host/` (`a/b.rs`, `a/b/mod.rs`, `lib.rs`, `bin/x.rs`).
fn module_of(relative: &str) -> Option<Vec<String>> {
    let stem = relative.strip_suffix(".rs")?;
    if stem == "lib" {
        return Some(Vec::new());
    }
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if parts.len() > 1 && parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    Some(parts)
}

struct Resolver<'a> {
    /// The non-test module files.
    modules: &'a BTreeSet<Vec<String>>,
    /// Every module, absolute: the files' and the inline ones, with the names each defines and its `use` items bind.
    namespaces: BTreeMap<Vec<String>, Namespace>,
}

/// What a `use` leaf binds a name to.
#[derive(Clone, Debug)]
enum Binding {
    /// An absolute path in this crate.
    Crate(Vec<String>),
    /// Something outside the crate (`std`, a dependency): no arrow.
    External,
}

/// One module's names (a file's module or an inline one), for following a path through it.
#[derive(Debug, Default)]
struct Namespace {
    /// The names the module defines (its items).
    defines: BTreeSet<String>,
    /// The names its `use` items bring in (re-exports and private imports alike: the compiler checks visibility).
    binds: BTreeMap<String, Binding>,
    /// The modules its glob `use` items bring in everything of.
    globs: Vec<Vec<String>>,
}

/// How many `use` bindings a path may go through before the resolver gives up (a loop of re-exports).
const MAX_HOPS: usize = 16;

/// One file, for resolving its paths.
struct FileContext {
    /// What `crate` means here (the binary is its own crate, `bin`).
    crate_base: Vec<String>,
    /// Inline modules, absolute.
    inline: BTreeSet<Vec<String>>,
    /// Names the file's `use` items bring in -> absolute paths.
    names: BTreeMap<String, Vec<String>>,
}

impl Resolver<'_> {
    /// The absolute path `segments` (written in `scope`, absolute) names, and whether it went through an imported name.
    fn absolute(
        &self,
        file: &FileContext,
        scope: &[String],
        segments: &[String],
        with_names: bool,
    ) -> Option<(Vec<String>, bool)> {
        let (first, rest) = segments.split_first()?;
        let (mut base, rest, through_name) = match first.as_str() {
            "crate" | "$crate" => (file.crate_base.clone(), rest, false),
            LIBRARY_CRATE => (Vec::new(), rest, false),
            "self" => (scope.to_vec(), rest, false),
            "super" => {
                let supers = segments.iter().take_while(|s| *s == "super").count();
                let mut base = scope.to_vec();
                for _ in 0..supers {
                    base.pop()?;
                }
                (base, &segments[supers..], false)
            }
            _ => {
                let mut child = scope.to_vec();
                child.push(first.clone());
                if self.modules.contains(&child) || file.inline.contains(&child) {
                    (scope.to_vec(), segments, false)
                } else if let Some(path) = file.names.get(first).filter(|_| with_names) {
                    (path.clone(), rest, true)
                } else {
                    return None;
                }
            }
        };
        base.extend(rest.iter().cloned());
        Some((base, through_name))
    }

    /// The longest prefix of `path` that is a module file.
    fn file_module(&self, path: &[String]) -> Vec<String> {
        (0..=path.len()).rev().map(|k| path[..k].to_vec()).find(|p| self.modules.contains(p)).unwrap_or_default()
    }

    /// The module file that defines what `path` names: the longest module prefix of `path` (file or inline), then,
    /// while the next name is not defined there but brought in by a `use` (a re-export, a glob), on to where that
    /// `use` takes it from. A name that cannot be followed stays with the longest module prefix; `None` when the path
    /// leaves the crate.
    fn defining_module(&self, path: &[String]) -> Option<Vec<String>> {
        let mut path = path.to_vec();
        for _ in 0..MAX_HOPS {
            let k = (0..=path.len()).rev().find(|&k| self.namespaces.contains_key(&path[..k])).unwrap_or(0);
            let (scope, rest) = path.split_at(k);
            let here = self.file_module(scope);
            let (Some(name), Some(namespace)) = (rest.first(), self.namespaces.get(scope)) else { return Some(here) };
            if namespace.defines.contains(name) {
                return Some(here);
            }
            let next = match namespace.binds.get(name) {
                Some(Binding::External) => return None,
                Some(Binding::Crate(to)) => to.iter().chain(&rest[1..]).cloned().collect(),
                None => match namespace.globs.iter().find(|glob| self.exports(glob, name, 0)) {
                    Some(glob) => glob.iter().chain(rest).cloned().collect(),
                    None => return Some(here),
                },
            };
            path = next;
        }
        Some(self.file_module(&path))
    }

    /// Whether the module `scope` has a name `name` (defined, brought in, or a child module).
    fn exports(&self, scope: &[String], name: &str, hops: usize) -> bool {
        let Some(namespace) = self.namespaces.get(scope) else { return false };
        let child: Vec<String> = scope.iter().cloned().chain([name.to_owned()]).collect();
        namespace.defines.contains(name)
            || namespace.binds.contains_key(name)
            || self.namespaces.contains_key(&child)
            || (hops < MAX_HOPS && namespace.globs.iter().any(|glob| self.exports(glob, name, hops + 1)))
    }

    /// Every name the module `scope` has, when it is known: for telling whether a glob re-export is used.
    fn names_of(&self, scope: &[String]) -> Option<BTreeSet<String>> {
        let namespace = self.namespaces.get(scope)?;
        let mut names: BTreeSet<String> = namespace.defines.iter().chain(namespace.binds.keys()).cloned().collect();
        for glob in &namespace.globs {
            if glob.as_slice() != scope {
                names.extend(self.namespaces.get(glob).map(|g| g.defines.clone()).unwrap_or_default());
            }
        }
        Some(names)
    }

    /// The module file a path resolves to (see [`Resolver::defining_module`]); the root (no arrow) when it leaves
    /// the crate.
    fn module(&self, path: &[String]) -> Vec<String> {
        self.defining_module(path).unwrap_or_default()
    }
}

/// Builds the graph from `(path relative to host/, source)` pairs.
fn build_graph(sources: &[(String, String)]) -> Graph {
    let scans: Vec<(Vec<String>, &str, Scan)> = sources
        .iter()
        .filter_map(|(relative, source)| Some((module_of(relative)?, relative.as_str(), scan(source))))
        .collect();
    let mut test_only: Vec<Vec<String>> = Vec::new();
    for (module, _, scan) in &scans {
        if scan.test_only_file {
            test_only.push(module.clone());
        }
        for declared in &scan.test_modules {
            test_only.push(module.iter().chain(declared).cloned().collect());
        }
    }
    let is_test = |module: &[String]| test_only.iter().any(|t| module.starts_with(t));
    let scans: Vec<_> = scans.into_iter().filter(|(module, _, _)| !is_test(module)).collect();
    let modules: BTreeSet<Vec<String>> = scans.iter().map(|(module, _, _)| module.clone()).collect();
    let mut resolver = Resolver { modules: &modules, namespaces: BTreeMap::new() };

    // The names each file's `use` items bring in (those not themselves through an imported name).
    let mut contexts = Vec::new();
    for (module, _, scan) in &scans {
        let mut file = FileContext {
            crate_base: if module.first().is_some_and(|m| m == "bin") { vec!["bin".to_owned()] } else { Vec::new() },
            inline: scan.inline_modules.iter().map(|inner| module.iter().chain(inner).cloned().collect()).collect(),
            names: BTreeMap::new(),
        };
        let mut names = BTreeMap::new();
        for reference in &scan.refs {
            let Some(name) = &reference.binds else { continue };
            let scope: Vec<String> = module.iter().chain(&reference.scope).cloned().collect();
            if let Some((path, _)) = resolver.absolute(&file, &scope, &reference.segments, false) {
                names.insert(name.clone(), path);
            }
        }
        file.names = names;
        contexts.push(file);
    }

    // Each module's names: what it defines, what its `use` items bind (with the file's names known now) and glob.
    for (module, _, scan) in &scans {
        resolver.namespaces.entry(module.clone()).or_default();
        for (inner, defines) in &scan.defines {
            let scope: Vec<String> = module.iter().chain(inner).cloned().collect();
            resolver.namespaces.entry(scope).or_default().defines.extend(defines.iter().cloned());
        }
        for inner in &scan.inline_modules {
            resolver.namespaces.entry(module.iter().chain(inner).cloned().collect()).or_default();
        }
    }
    for ((module, _, scan), file) in scans.iter().zip(&contexts) {
        for reference in scan.refs.iter().filter(|r| r.glob || r.binds.is_some()) {
            let scope: Vec<String> = module.iter().chain(&reference.scope).cloned().collect();
            let path = resolver.absolute(file, &scope, &reference.segments, true).map(|(path, _)| path);
            if reference.glob {
                if let Some(path) = path.filter(|p| resolver.namespaces.contains_key(p)) {
                    resolver.namespaces.entry(scope).or_default().globs.push(path);
                }
                continue;
            }
            let binding = match path {
                Some(path) => Binding::Crate(path),
                None => {
                    // Not through `crate`, `self`, `super`, a module or an imported name: an item of this module
                    // (`use Kind::Variant`) or another crate.
                    let local = reference.segments.first().is_some_and(|first| {
                        resolver.namespaces.get(&scope).is_some_and(|n| n.defines.contains(first))
                    });
                    if local {
                        Binding::Crate(scope.iter().chain(&reference.segments).cloned().collect())
                    } else {
                        Binding::External
                    }
                }
            };
            let name = reference.binds.clone().expect("a binding use leaf");
            resolver.namespaces.entry(scope).or_default().binds.insert(name, binding);
        }
    }

    let mut arrows: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for ((module, _, scan), file) in scans.iter().zip(&contexts) {
        for reference in &scan.refs {
            let scope: Vec<String> = module.iter().chain(&reference.scope).cloned().collect();
            let Some((path, through_name)) = resolver.absolute(file, &scope, &reference.segments, true) else {
                continue;
            };
            let mut line = reference.line;
            if reference.reexport {
                // A re-export is a name alias, not code: it is an arrow only when this file's code writes the name.
                let written = if reference.glob {
                    resolver
                        .names_of(&path)
                        .map(|names| names.iter().filter_map(|n| scan.written.get(n)).min().copied())
                } else {
                    Some(reference.binds.as_ref().and_then(|name| scan.written.get(name)).copied())
                };
                match written {
                    Some(Some(first)) => line = first,
                    Some(None) => continue,
                    None => {} // a glob of a module the test cannot read: an arrow, as any `use`
                }
            }
            let target = resolver.module(&path);
            if through_name {
                // `Name::x` where `use a::b::Name`: the `use` already made the arrow to `a::b`; only a deeper module
                // reached through the name is news.
                let name_path = &file.names[&reference.segments[0]];
                if resolver.module(name_path) == target {
                    continue;
                }
            }
            if target.is_empty() || &target == module {
                continue;
            }
            let first =
                arrows.entry((module.join("::"), target.join("::"), reference.text.clone())).or_insert(usize::MAX);
            *first = (*first).min(line);
        }
    }
    Graph {
        files: scans.iter().map(|(module, relative, _)| (module.join("::"), format!("host/{relative}"))).collect(),
        arrows: arrows.into_iter().map(|((from, to, path), line)| Arrow { from, to, line, path }).collect(),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The rules. Each returns its violations, one line each.

fn floor_of(module: &str) -> Option<usize> {
    let top = module.split("::").next()?;
    FLOORS.iter().position(|floor| floor.contains(&top))
}

/// Rule 1: every module is in the floor table, and no arrow goes up a floor.
fn floor_violations(graph: &Graph) -> Vec<String> {
    let mut violations = Vec::new();
    let mut unknown = BTreeSet::new();
    for (module, file) in &graph.files {
        if !module.is_empty() && floor_of(module).is_none() {
            let top = module.split("::").next().unwrap_or(module);
            if unknown.insert(top) {
                violations
                    .push(format!("{file}: top-level module `{top}` has no floor: add it to the floor table (FLOORS)"));
            }
        }
    }
    for arrow in &graph.arrows {
        let (Some(from), Some(to)) = (floor_of(&arrow.from), floor_of(&arrow.to)) else { continue };
        if to > from {
            violations.push(format!(
                "{}:{}: `{}` (floor {from}) imports `{}` (floor {to}), upward: `{}`",
                graph.file(&arrow.from),
                arrow.line,
                arrow.from,
                arrow.to,
                arrow.path
            ));
        }
    }
    violations
}

fn top_level(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

/// Rule 2: nothing under `transport` imports `engine`.
fn transport_engine_violations(graph: &Graph) -> Vec<String> {
    graph
        .arrows
        .iter()
        .filter(|a| top_level(&a.from) == "transport" && top_level(&a.to) == "engine")
        .map(|a| {
            format!(
                "{}:{}: transport must not import engine: `{}` -> `{}` via `{}`",
                graph.file(&a.from),
                a.line,
                a.from,
                a.to,
                a.path
            )
        })
        .collect()
}

/// The strongly connected components of the graph (Tarjan), each sorted.
fn components<'a>(edges: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a, 'e> {
        edges: &'e BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(state: &mut State<'a, '_>, node: &'a str) {
        let index = state.index.len();
        state.index.insert(node, index);
        state.low.insert(node, index);
        state.stack.push(node);
        state.on_stack.insert(node);
        let next: Vec<&'a str> = state.edges.get(node).map(|to| to.iter().copied().collect()).unwrap_or_default();
        for to in next {
            if !state.index.contains_key(to) {
                visit(state, to);
                let low = state.low[node].min(state.low[to]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(to) {
                let low = state.low[node].min(state.index[to]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.push(member);
                if member == node {
                    break;
                }
            }
            component.sort_unstable();
            state.out.push(component);
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &node in edges.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.out
}

/// Rule 3: no import cycle through more than two files.
fn cycle_violations(graph: &Graph) -> Vec<String> {
    let edges = graph.edges();
    components(&edges)
        .into_iter()
        .filter(|component| component.len() > 2)
        .map(|component| {
            let files: Vec<&str> = component.iter().map(|m| graph.file(m)).collect();
            // Each arrow inside the component once, at the first place it is written.
            let mut inside: BTreeMap<(&str, &str), (&Arrow, usize)> = BTreeMap::new();
            for arrow in &graph.arrows {
                if component.contains(&arrow.from.as_str()) && component.contains(&arrow.to.as_str()) {
                    let entry = inside.entry((&arrow.from, &arrow.to)).or_insert((arrow, 0));
                    entry.1 += 1;
                    if arrow.line < entry.0.line {
                        entry.0 = arrow;
                    }
                }
            }
            let inside: Vec<String> = inside
                .into_values()
                .map(|(a, count)| {
                    let more = if count > 1 { format!(" (+{} more)", count - 1) } else { String::new() };
                    format!("    {}:{}: `{}` -> `{}` via `{}`{more}", graph.file(&a.from), a.line, a.from, a.to, a.path)
                })
                .collect();
            format!("import cycle of {} files: {}\n{}", files.len(), files.join(", "), inside.join("\n"))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------------------------
// The rules on this tree.

/// Crates of their own under `host/`, outside the library's module tree: `host/python` is the Python binding and
/// `host/capi` the C library, which reach the library only through its public API, like any other user.
const OTHER_CRATES: &[&str] = &["capi", "python"];

/// Every `.rs` file under `dir`, as (path relative to `root` with `/`, source), without [`OTHER_CRATES`].
fn read_sources(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let other_crate = dir == root && path.file_name().is_some_and(|name| OTHER_CRATES.iter().any(|c| name == *c));
        if other_crate {
            continue;
        }
        if path.is_dir() {
            read_sources(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).expect("under host/");
            let relative: Vec<String> =
                relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            out.push((relative.join("/"), source));
        }
    }
}

fn tree_graph() -> &'static Graph {
    static GRAPH: OnceLock<Graph> = OnceLock::new();
    GRAPH.get_or_init(|| {
        let host = Path::new(env!("CARGO_MANIFEST_DIR")).join("host");
        let mut sources = Vec::new();
        read_sources(&host, &host, &mut sources);
        build_graph(&sources)
    })
}

fn assert_none(what: &str, violations: &[String]) {
    assert!(violations.is_empty(), "{} {what}:\n{}", violations.len(), violations.join("\n"));
}

#[test]
fn floors_hold() {
    assert_none("floor violations (rule 1)", &floor_violations(tree_graph()));
}

#[test]
fn transport_does_not_import_engine() {
    assert_none("transport -> engine arrows (rule 2)", &transport_engine_violations(tree_graph()));
}

#[test]
fn no_import_cycle_of_more_than_two_files() {
    assert_none("import cycles (rule 3)", &cycle_violations(tree_graph()));
}

/// Prints the graph with `AIV_PRINT_IMPORT_GRAPH=1` (and `--nocapture`); checks the scan found the crate either way.
#[test]
fn import_graph() {
    let graph = tree_graph();
    assert!(graph.files.contains_key(""), "host/lib.rs was not read");
    assert!(
        graph.files.len() > 10 && graph.arrows.len() > 10,
        "the scan of host/ found almost nothing:\n{}",
        graph.render()
    );
    if std::env::var("AIV_PRINT_IMPORT_GRAPH").is_ok_and(|v| v == "1") {
        print!("{}", graph.render());
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The graph builder and the rules on small sources.

fn graph_of(files: &[(&str, &str)]) -> Graph {
    let sources: Vec<(String, String)> = files.iter().map(|(p, s)| ((*p).to_owned(), (*s).to_owned())).collect();
    build_graph(&sources)
}

fn set<'a>(modules: &[&'a str]) -> BTreeSet<&'a str> {
    modules.iter().copied().collect()
}

#[test]
fn an_upward_arrow_is_reported() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod queue;\npub mod engine;\n"),
        ("queue/mod.rs", "//! Ground floor.\n\nuse crate::engine::TransferEngine;\n"),
        ("engine/mod.rs", "use crate::queue::Ring;\n"),
    ]);
    let violations = floor_violations(&graph);
    assert_eq!(violations.len(), 1, "{violations:?}");
    let v = &violations[0];
    assert!(v.starts_with("host/queue/mod.rs:3:"), "{v}");
    assert!(
        v.contains("`queue` (floor 0) imports `engine` (floor 4)") && v.contains("crate::engine::TransferEngine"),
        "{v}"
    );
}

#[test]
fn an_unknown_top_level_module_asks_for_the_floor_table() {
    let graph = graph_of(&[("lib.rs", "pub mod queue;\npub mod gadget;\n"), ("queue.rs", ""), ("gadget/mod.rs", "")]);
    let violations = floor_violations(&graph);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].contains("`gadget`") && violations[0].contains("add it to the floor table"),
        "{violations:?}"
    );
}

#[test]
fn transport_to_engine_is_reported_also_through_a_root_reexport() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod engine;\npub mod transport;\npub use engine::TransferEngine;\n"),
        ("engine/mod.rs", "pub struct TransferEngine;\n"),
        ("transport/mod.rs", "pub mod tcp;\n"),
        ("transport/tcp.rs", "fn f(engine: &crate::TransferEngine) {}\nuse crate::engine;\n"),
    ]);
    let violations = transport_engine_violations(&graph);
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert!(violations.iter().all(|v| v.starts_with("host/transport/tcp.rs:")), "{violations:?}");
    assert!(
        violations[0].contains("crate::TransferEngine") && violations[1].contains("crate::engine"),
        "{violations:?}"
    );
    let upward = floor_violations(&graph);
    assert_eq!(upward.len(), 2, "transport is below engine too: {upward:?}");
}

#[test]
fn a_three_module_cycle_is_reported_and_a_two_module_one_is_not() {
    let three = graph_of(&[
        ("lib.rs", "pub mod config;\npub mod error;\npub mod evidence;\n"),
        ("config.rs", "use crate::error::EngineError;\n"),
        ("error.rs", "fn f() { crate::evidence::record(); }\n"),
        ("evidence.rs", "use crate::config::Config;\n"),
    ]);
    let violations = cycle_violations(&three);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].starts_with("import cycle of 3 files: host/config.rs, host/error.rs, host/evidence.rs"),
        "{violations:?}"
    );
    let two = graph_of(&[
        ("lib.rs", "pub mod config;\npub mod error;\n"),
        ("config.rs", "use crate::error::EngineError;\n"),
        ("error.rs", "use crate::config::Config;\n"),
    ]);
    assert!(cycle_violations(&two).is_empty(), "{:?}", cycle_violations(&two));
}

#[test]
fn test_code_comments_and_literals_are_ignored() {
    let source = r##"
//! Docs naming [`crate::engine::TransferEngine`].
// use crate::engine::A;
/* crate::engine::B /* nested */ crate::engine::C */
/// See `crate::engine::D`.
const OPEN: char = '{';
const TEXT: &str = "crate::engine::E } {";
const RAW: &str = r#"crate::engine::F " }"#;
fn lifetimes<'a>(x: &'a str) -> &'a str { x }

#[cfg(test)]
mod tests {
    use crate::engine::G;
    fn f() { let s = "}"; let c = '}'; crate::engine::h(); }
}

#[cfg(test)]
fn helper() { crate::engine::i() }

#[cfg(test)]
use crate::engine::J;

#[cfg(test)]
impl Thing { fn k() { crate::engine::k() } }

#[cfg(all(test, not(feature = "cann")))]
mod more_tests { use crate::engine::L; }

#[cfg(test)]
mod file_tests;

#[cfg(not(test))]
use crate::error::EngineError;

#[cfg(any(test, feature = "cann"))]
fn real() { crate::evidence::record() }

pub fn after() -> crate::transfer::Opcode { todo() }
"##;
    let graph = graph_of(&[
        ("lib.rs", "pub mod queue;\npub mod engine;\npub mod error;\npub mod evidence;\npub mod transfer;\n"),
        ("queue/mod.rs", source),
        ("queue/file_tests.rs", "use crate::engine::M;\n"),
        ("engine.rs", ""),
        ("error.rs", ""),
        ("evidence.rs", ""),
        ("transfer.rs", ""),
    ]);
    assert_eq!(graph.targets("queue"), set(&["error", "evidence", "transfer"]), "{:?}", graph.arrows);
    assert!(!graph.files.contains_key("queue::file_tests"), "a #[cfg(test)] mod's file is test-only");
    let after = graph.arrows.iter().find(|a| a.to == "transfer").expect("the arrow to transfer");
    assert_eq!(after.line, source.lines().position(|l| l.contains("fn after")).expect("fn after") + 1);
}

#[test]
fn use_groups_and_nested_groups_resolve_to_the_longest_module_prefix() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod transfer;\npub mod config;\npub mod error;\npub mod engine;\n"),
        ("transfer/mod.rs", "pub mod request;\npub mod completion;\npub mod segment;\npub mod task;\n"),
        ("transfer/request.rs", ""),
        ("transfer/completion.rs", ""),
        ("transfer/segment.rs", ""),
        ("transfer/task.rs", ""),
        ("config.rs", ""),
        ("error.rs", ""),
        (
            "engine/mod.rs",
            "use crate::transfer::{request::BatchId, completion,\n    \
             segment::{self, Segment}, task::{TaskSlot as Slot}};\n\
             // A comment in between.\n\
             use crate::{config::{self, EngineConfig}, error::{EngineError}};\n",
        ),
    ]);
    let expected =
        set(&["transfer::request", "transfer::completion", "transfer::segment", "transfer::task", "config", "error"]);
    assert_eq!(graph.targets("engine"), expected, "{:?}", graph.arrows);
    assert!(
        graph.arrows.iter().any(|a| a.path == "crate::transfer::segment::self" && a.line == 2),
        "{:?}",
        graph.arrows
    );
}

#[test]
fn crate_paths_in_expressions_and_through_imported_names_resolve() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod transfer;\npub mod evidence;\npub mod engine;\n"),
        ("transfer/mod.rs", "pub mod request;\n"),
        ("transfer/request.rs", ""),
        ("evidence.rs", ""),
        (
            "engine.rs",
            "use crate::transfer as t;\nfn f() {\n    let id = crate::transfer::request::BatchId::new();\n    \
             crate::evidence::record(&id);\n    t::request::x();\n}\n",
        ),
    ]);
    assert_eq!(graph.targets("engine"), set(&["transfer", "transfer::request", "evidence"]), "{:?}", graph.arrows);
    let through: Vec<&Arrow> = graph.arrows.iter().filter(|a| a.to == "transfer::request").collect();
    assert_eq!(through.len(), 2, "{through:?}");
}

#[test]
fn super_self_and_child_paths_resolve() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod transport;\n"),
        ("transport/mod.rs", "pub mod aiv;\npub mod tcp;\npub mod window;\nuse self::tcp::TcpTransport;\n"),
        ("transport/aiv.rs", "pub mod ring;\nfn f() { ring::push(); }\n"),
        ("transport/aiv/ring.rs", "use super::super::window::Window;\n"),
        ("transport/window.rs", ""),
        ("transport/tcp/mod.rs", "mod wire;\nuse self::wire::Frame;\nuse super::window;\npub use wire::Header;\n"),
        ("transport/tcp/wire.rs", "use super::*;\nfn g() { super::super::aiv::h(); }\n"),
    ]);
    assert_eq!(graph.targets("transport"), set(&["transport::tcp"]));
    assert_eq!(graph.targets("transport::aiv"), set(&["transport::aiv::ring"]));
    assert_eq!(graph.targets("transport::aiv::ring"), set(&["transport::window"]));
    assert_eq!(graph.targets("transport::tcp"), set(&["transport::tcp::wire", "transport::window"]));
    assert_eq!(graph.targets("transport::tcp::wire"), set(&["transport::tcp", "transport::aiv"]));
}

#[test]
fn inline_modules_shift_super_and_the_binary_reaches_the_library_by_name() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod queue;\npub mod engine;\n"),
        ("queue/mod.rs", "pub mod chunk;\npub mod ring;\n"),
        ("queue/ring.rs", ""),
        ("queue/chunk.rs", "pub mod kernel {\n    use super::Piece;\n    fn f() { super::super::ring::x() }\n}\n"),
        ("engine.rs", ""),
        ("bin/aiv.rs", "use aiv_transport::engine::TransferEngine;\nfn main() { aiv_transport::queue::ring::x(); }\n"),
    ]);
    assert_eq!(graph.targets("queue::chunk"), set(&["queue::ring"]), "{:?}", graph.arrows);
    assert_eq!(graph.targets("bin::aiv"), set(&["engine", "queue::ring"]), "{:?}", graph.arrows);
    assert!(floor_violations(&graph).is_empty(), "{:?}", floor_violations(&graph));
}

#[test]
fn the_graph_prints_one_line_per_module() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod error;\npub mod config;\nuse error::EngineError;\n"),
        ("error.rs", ""),
        ("config.rs", "use crate::error::EngineError;\nuse crate::EngineError as E;\n"),
    ]);
    assert_eq!(graph.render(), "crate -> error\nconfig -> error\nerror -> \n");
}

#[test]
fn a_reexport_is_an_arrow_only_where_the_file_writes_the_name() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod error;\npub mod metadata;\npub use error::EngineError;\n"),
        ("error.rs", "pub struct EngineError;\n"),
        (
            "metadata/mod.rs",
            "pub mod name;\npub mod service;\npub mod store;\n\
             pub use name::SegmentName;\npub(crate) use self::service::*;\npub use store::{KeyLayout, RpcMeta};\n\
             \n\
             pub fn rpc_of(name: &str) -> RpcMeta { todo!() }\n\
             fn label() -> String { format!(\"{SegmentName}-{{MetadataService}}\") }\n",
        ),
        ("metadata/name.rs", "pub struct SegmentName;\n"),
        ("metadata/service.rs", "pub struct MetadataService;\n"),
        ("metadata/store.rs", "pub struct KeyLayout;\npub struct RpcMeta;\n"),
    ]);
    assert_eq!(graph.targets(""), set(&[]), "the root only re-exports: {:?}", graph.arrows);
    assert_eq!(
        graph.targets("metadata"),
        set(&["metadata::store", "metadata::name"]),
        "a format string's capture writes the name, an escaped brace does not: {:?}",
        graph.arrows
    );
    let arrow = graph.arrows.iter().find(|a| a.to == "metadata::store").expect("the arrow to store");
    assert_eq!((arrow.line, arrow.path.as_str()), (8, "store::RpcMeta"), "where the code writes the name: {arrow:?}");
}

#[test]
fn a_path_through_reexports_resolves_to_the_module_defining_the_item() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod metadata;\npub mod engine;\npub use metadata::MetadataBackend;\n"),
        (
            "metadata/mod.rs",
            "pub mod backend;\npub mod facade;\npub mod store;\npub mod looped;\n\
             pub use self::facade::*;\npub(crate) use store::KeyLayout as Layout;\npub use std::fmt::Debug;\n\
             pub use looped::Knot;\npub struct Options;\n",
        ),
        ("metadata/facade.rs", "pub use super::backend::{MetadataBackend, RpcMeta};\n"),
        ("metadata/backend.rs", "pub trait MetadataBackend {}\npub struct RpcMeta;\n"),
        ("metadata/store.rs", "pub struct KeyLayout;\n"),
        ("metadata/looped.rs", "pub use super::Knot;\n"),
        (
            "engine.rs",
            "use crate::metadata::MetadataBackend;\n\
             fn f() {\n    crate::metadata::Layout::new();\n    crate::MetadataBackend::x();\n    \
             crate::metadata::RpcMeta::y();\n    crate::metadata::Debug::z();\n    crate::metadata::Options::w();\n    \
             crate::metadata::Unknown::v();\n    crate::metadata::Knot::u();\n}\n",
        ),
    ]);
    let to = |path: &str| graph.arrows.iter().find(|a| a.path == path).map(|a| a.to.as_str());
    assert_eq!(
        to("crate::metadata::MetadataBackend"),
        Some("metadata::backend"),
        "glob, then a group: {:?}",
        graph.arrows
    );
    assert_eq!(to("crate::metadata::Layout::new"), Some("metadata::store"), "a renamed re-export");
    assert_eq!(to("crate::MetadataBackend::x"), Some("metadata::backend"), "through the root's re-export");
    assert_eq!(to("crate::metadata::RpcMeta::y"), Some("metadata::backend"));
    assert_eq!(to("crate::metadata::Debug::z"), None, "another crate's item: no arrow");
    assert_eq!(to("crate::metadata::Options::w"), Some("metadata"), "defined in the facade itself");
    assert_eq!(to("crate::metadata::Unknown::v"), Some("metadata"), "unresolved: the longest module prefix");
    assert!(to("crate::metadata::Knot::u").is_some(), "a re-export loop ends");
    assert_eq!(graph.targets("metadata"), set(&[]), "the facade only re-exports: {:?}", graph.arrows);
}

#[test]
fn a_facade_reexporting_children_that_use_a_sibling_item_is_no_cycle() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod metadata;\n"),
        (
            "metadata/mod.rs",
            "mod p2p;\nmod service;\nmod backend;\npub use p2p::P2pBackend;\npub use service::MetadataService;\n\
             pub use self::backend::*;\n",
        ),
        ("metadata/p2p.rs", "use super::MetadataBackend;\npub struct P2pBackend;\n"),
        ("metadata/service.rs", "pub struct MetadataService(Box<dyn crate::metadata::MetadataBackend>);\n"),
        ("metadata/backend.rs", "pub trait MetadataBackend {}\n"),
    ]);
    assert_eq!(graph.targets("metadata"), set(&[]), "{:?}", graph.arrows);
    assert_eq!(graph.targets("metadata::p2p"), set(&["metadata::backend"]), "{:?}", graph.arrows);
    assert_eq!(graph.targets("metadata::service"), set(&["metadata::backend"]), "{:?}", graph.arrows);
    assert!(cycle_violations(&graph).is_empty(), "{:?}", cycle_violations(&graph));
}

#[test]
fn a_parent_defining_what_its_child_uses_and_calling_the_child_is_an_allowed_two_file_cycle() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod device;\n"),
        (
            "device/mod.rs",
            "pub mod twin;\npub use twin::TwinDevice;\npub struct DeviceError;\n\
             pub fn open() -> Result<TwinDevice, DeviceError> { twin::TwinDevice::open() }\n",
        ),
        ("device/twin.rs", "use super::DeviceError;\npub struct TwinDevice;\n"),
    ]);
    assert_eq!(graph.targets("device"), set(&["device::twin"]), "{:?}", graph.arrows);
    assert_eq!(graph.targets("device::twin"), set(&["device"]), "{:?}", graph.arrows);
    let edges = graph.edges();
    assert!(components(&edges).iter().any(|c| c == &["device", "device::twin"]), "a 2-file cycle: {edges:?}");
    assert!(cycle_violations(&graph).is_empty(), "{:?}", cycle_violations(&graph));
}

#[test]
fn a_definitional_loop_of_three_files_behind_a_facade_is_reported() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod metadata;\n"),
        ("metadata/mod.rs", "mod a;\nmod b;\nmod c;\npub use a::A;\npub use b::B;\npub use c::C;\n"),
        ("metadata/a.rs", "use super::B;\npub struct A(B);\n"),
        ("metadata/b.rs", "pub struct B(crate::metadata::C);\n"),
        ("metadata/c.rs", "pub struct C(Box<super::A>);\n"),
    ]);
    let violations = cycle_violations(&graph);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0]
            .starts_with("import cycle of 3 files: host/metadata/a.rs, host/metadata/b.rs, host/metadata/c.rs\n"),
        "{violations:?}"
    );
}

// ---- 4. no Rust source file under host/ or shmem-bindings/ over MAX_FILE_LINES lines ----------------------------

/// The longest a Rust source file under `host/` or `shmem-bindings/` may be: past it, a file holds more than one
/// concern and is split by concern.
const MAX_FILE_LINES: usize = 1000;

/// Every `.rs` file below `dir` (build output and hidden directories skipped), with its line count.
fn rust_file_lengths(dir: &Path, out: &mut Vec<(PathBuf, usize)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_file_lengths(&path, out);
            }
        } else if name.ends_with(".rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            out.push((path, text.lines().count()));
        }
    }
}

fn too_long(files: &[(PathBuf, usize)], root: &Path) -> Vec<String> {
    files
        .iter()
        .filter(|(_, lines)| *lines > MAX_FILE_LINES)
        .map(|(path, lines)| {
            format!("{}: {lines} lines (split it by concern)", path.strip_prefix(root).unwrap_or(path).display())
        })
        .collect()
}

#[test]
fn no_rust_file_under_host_or_shmem_bindings_is_over_the_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["host", "shmem-bindings"] {
        rust_file_lengths(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "the walk found only {} Rust files", files.len());
    assert_none(&format!("Rust files over {MAX_FILE_LINES} lines"), &too_long(&files, root));
}

#[test]
fn a_file_over_the_limit_is_reported() {
    let root = Path::new("/r");
    let files = vec![(root.join("host/a.rs"), MAX_FILE_LINES), (root.join("host/b.rs"), MAX_FILE_LINES + 1)];
    assert_eq!(too_long(&files, root), [format!("host/b.rs: {} lines (split it by concern)", MAX_FILE_LINES + 1)]);
}
