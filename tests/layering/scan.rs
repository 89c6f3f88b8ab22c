//! The lexer and the scanner: one file's tokens, its test-only items, and its references, unresolved.

use std::collections::{BTreeMap, BTreeSet};

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
pub(crate) struct RawRef {
    /// The inline modules (`mod x { ... }`) the path is written in, inside the file's module.
    pub(crate) scope: Vec<String>,
    /// The path's segments as written, `{}` groups expanded, a trailing `self` or `*` dropped.
    pub(crate) segments: Vec<String>,
    pub(crate) line: usize,
    /// The path as written (groups expanded).
    pub(crate) text: String,
    /// For a `use` leaf: the name it brings into scope.
    pub(crate) binds: Option<String>,
    /// A leaf of a `pub use` / `pub(...) use` item: a re-export.
    pub(crate) reexport: bool,
    /// A glob leaf, `use a::b::*` (`segments` is the module, `a::b`).
    pub(crate) glob: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Scan {
    pub(crate) refs: Vec<RawRef>,
    /// Inline modules, relative to the file's module.
    pub(crate) inline_modules: Vec<Vec<String>>,
    /// `#[cfg(test)] mod x;` declarations, relative to the file's module: those files are test-only.
    pub(crate) test_modules: Vec<Vec<String>>,
    /// `#![cfg(test)]` at the top of the file.
    pub(crate) test_only_file: bool,
    /// The names each module of the file (the file's own, `[]`, and its inline modules) defines: structs, enums,
    /// unions, traits, type aliases, functions, constants, statics and modules, at that module's item level.
    pub(crate) defines: BTreeMap<Vec<String>, BTreeSet<String>>,
    /// Every name the file's code (outside `use` items) writes, as an identifier, a path's first segment or a format
    /// string's capture (`"{name}"`), with the first line it is written on.
    pub(crate) written: BTreeMap<String, usize>,
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

pub(crate) fn scan(source: &str) -> Scan {
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
