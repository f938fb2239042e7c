//! The one place where templates turn untrusted strings into HAProxy words (SECURITY.md).
//!
//! Typed filters (each also a function of the same name) check a value and print it in the one
//! form HAProxy's tokenizer reads back as the same single word: `hq`/`hq_logfmt` (a
//! double-quoted argument), `header_name`, `host`, `http_path`, `hregex` (checked and confined),
//! `duration`, `int_range`, `cidr_list`, `word` and `one_of`; `refuse()` refuses explicitly. They
//! return safe strings; a refused value is an `InvalidOperation` error whose message is
//! `<field>: <reason>` and whose source is [`RefusalMarker`].
//!
//! [`formatter`] is the secure default for every `{{ … }}`: safe strings, numbers and booleans
//! print as they are, anything else only when [`is_plain`]; otherwise the render fails with an
//! [`UnsafeOutputMarker`] error, so a forgotten filter is an error instead of a hole. Install it
//! with `env.set_formatter(safe::formatter)` together with a custom auto-escape mode (for example
//! `AutoEscape::Custom("haproxy".into())`): with `AutoEscape::None` minijinja returns macro output
//! and `{% set %}` blocks as ordinary strings, which the formatter would then refuse.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State};

/// Marks an error as the refusal of a (tenant) value by a typed filter or `refuse()`.
#[derive(Debug)]
pub(crate) struct RefusalMarker;

impl fmt::Display for RefusalMarker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("value refused by a typed filter")
    }
}

impl std::error::Error for RefusalMarker {}

/// Marks an error of [`formatter`]: a template printed an unchecked value (a template bug).
#[derive(Debug)]
pub(crate) struct UnsafeOutputMarker;

impl fmt::Display for UnsafeOutputMarker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unsafe value printed without a typed filter")
    }
}

impl std::error::Error for UnsafeOutputMarker {}

/// Longest plain string: HAProxy reads map files with `fgets` into a `tune.bufsize` buffer
/// (16 KiB by default) and would split a longer line into two entries.
const PLAIN_MAX: usize = 4096;
const QUOTE_MAX: usize = 64;
const DIGITS_MAX: usize = 18;
const CIDRS_MAX: usize = 1000;

/// `s` quoted with Rust escaping, cut to 64 characters.
fn q(s: &str) -> String {
    match s.char_indices().nth(QUOTE_MAX) {
        Some((cut, _)) => format!("{:?}... ({} characters)", &s[..cut], s.chars().count()),
        None => format!("{s:?}"),
    }
}

fn refusal(field: Option<&str>, reason: impl fmt::Display) -> Error {
    let msg = match field {
        Some(field) => format!("{field}: {reason}"),
        None => reason.to_string(),
    };
    Error::new(ErrorKind::InvalidOperation, msg).with_source(RefusalMarker)
}

fn describe(c: char) -> String {
    match c {
        '\n' | '\r' => "a line break".into(),
        '\t' => "a tab".into(),
        '\0' => "a NUL byte".into(),
        ' ' => "a space".into(),
        '"' => "a double quote".into(),
        '\'' => "a single quote".into(),
        '\\' => "a backslash".into(),
        '{' | '}' => "a brace".into(),
        '%' => "'%' not followed by two hex digits".into(),
        c if c.is_control() => format!("the control character {c:?}"),
        c if !c.is_ascii() => format!("the non-ASCII character {c:?}"),
        c => format!("'{c}'"),
    }
}

/// The first character of `s` that `allowed` refuses, described. With `pct`, `%` is allowed
/// only as the start of a `%XX` escape.
fn offence(s: &str, allowed: impl Fn(char) -> bool, pct: bool) -> Option<String> {
    let b = s.as_bytes();
    for (i, c) in s.char_indices() {
        if pct && c == '%' {
            let hex = |k: usize| b.get(i + k).is_some_and(u8::is_ascii_hexdigit);
            if hex(1) && hex(2) {
                continue;
            }
            return Some(describe(c));
        }
        if !allowed(c) {
            return Some(describe(c));
        }
    }
    None
}

fn printable(c: char) -> bool {
    (' '..='~').contains(&c)
}

fn plain_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_.:/@+=,*()[]!?&;~^|<>-".contains(c)
}

/// What makes `s` unfit to print raw, if anything.
fn plain_offence(s: &str) -> Option<String> {
    if s.len() > PLAIN_MAX {
        return Some(format!("more than {PLAIN_MAX} characters"));
    }
    offence(s, plain_char, true)
}

/// True when `s` may be printed raw into haproxy.cfg or a map without a typed filter: only
/// `[A-Za-z0-9_.:/@+=,*()[]!?&;~^|<>-]` and `%XX` escapes (no whitespace, `#`, quotes, backslash,
/// braces, `$`, control or non-ASCII characters), at most 4096 of them. Empty is plain.
pub(crate) fn is_plain(s: &str) -> bool {
    plain_offence(s).is_none()
}

/// The secure default formatter (see the module documentation).
pub(crate) fn formatter(out: &mut Output, _state: &mut State, value: &Value) -> Result<(), Error> {
    if value.is_undefined() || value.is_none() {
        return Ok(());
    }
    if let Some(unit) = value.downcast_object_ref::<super::units::UnitOutput>() {
        return out.write_str(unit.text()).map_err(Error::from);
    }
    if value.is_safe() {
        let text = value.as_str().unwrap_or_default();
        if text.contains(super::units::MARK_START) {
            // A unit's output that went through a `{% set %}` block or a macro.
            super::units::note_inspected();
        }
        return out.write_str(text).map_err(Error::from);
    }
    let text = match value.kind() {
        ValueKind::Number | ValueKind::Bool => {
            return write!(out, "{value}").map_err(Error::from);
        }
        ValueKind::String => Cow::Borrowed(value.as_str().unwrap_or_default()),
        _ => Cow::Owned(value.to_string()),
    };
    match plain_offence(&text) {
        None => out.write_str(&text).map_err(Error::from),
        Some(what) => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "unsafe value {} printed without a typed filter (contains {what}): use hq, \
                 hq_logfmt, header_name, host, http_path, hregex, duration, int_range, cidr_list, \
                 word or one_of, or | safe for trusted text",
                q(&text)
            ),
        )
        .with_source(UnsafeOutputMarker)),
    }
}

/// The value as text: strings as they are, numbers in decimal; missing or other kinds refused.
fn text(value: &Value) -> Result<Cow<'_, str>, String> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => Err("is missing".into()),
        ValueKind::String => Ok(Cow::Borrowed(value.as_str().unwrap_or_default())),
        ValueKind::Number => Ok(Cow::Owned(value.to_string())),
        kind => Err(format!("expected a string, got {kind}")),
    }
}

/// Runs a check that returns the output text or the reason for a refusal.
fn typed(field: Option<&str>, f: impl FnOnce() -> Result<String, String>) -> Result<Value, Error> {
    f().map(Value::from_safe_string)
        .map_err(|reason| refusal(field, reason))
}

/// The common refusals: empty, too long, or the offending character `bad` found in it.
fn check(s: &str, max: usize, expected: &str, bad: Option<String>) -> Result<String, String> {
    if s.is_empty() {
        return Err(format!("is empty; expected {expected}"));
    }
    if s.chars().count() > max {
        return Err(format!(
            "{} is longer than {max} characters; expected {expected}",
            q(s)
        ));
    }
    match bad {
        Some(what) => Err(format!("{} contains {what}; expected {expected}", q(s))),
        None => Ok(s.to_string()),
    }
}

fn quoted(value: &Value, logfmt: bool) -> Result<String, String> {
    let s = text(value)?;
    if let Some(what) = offence(&s, printable, false) {
        let expected = "printable ASCII text (no line breaks, tabs or control characters)";
        return Err(format!("{} contains {what}; expected {expected}", q(&s)));
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '$' => out.push_str("\\$"),
            '%' if logfmt => out.push_str("%%"),
            c => out.push(c),
        }
    }
    out.push('"');
    Ok(out)
}

/// `hq(value, field?)`: a double-quoted HAProxy argument (`\`, `"` and `$` escaped); printable
/// ASCII only.
fn hq(value: Value, field: Option<&str>) -> Result<Value, Error> {
    typed(field, || quoted(&value, false))
}

/// `hq_logfmt(value, field?)`: like `hq`, for log-format arguments (`%` doubled), so a value can
/// never reach a sample fetch (`%[...]`).
fn hq_logfmt(value: Value, field: Option<&str>) -> Result<Value, Error> {
    typed(field, || quoted(&value, true))
}

/// `header_name(value, field?)`: an HTTP header name token, `[A-Za-z0-9][A-Za-z0-9_.-]*`.
fn header_name(value: Value, field: Option<&str>) -> Result<Value, Error> {
    typed(field, || {
        let s = text(&value)?;
        let bad = match s.chars().next() {
            Some(c) if !c.is_ascii_alphanumeric() => Some(format!("{} at the start", describe(c))),
            _ => offence(
                &s,
                |c| c.is_ascii_alphanumeric() || "_.-".contains(c),
                false,
            ),
        };
        check(
            &s,
            128,
            "an HTTP header name ([A-Za-z0-9][A-Za-z0-9_.-]*)",
            bad,
        )
    })
}

fn label_ok(l: &str) -> bool {
    let chars = l
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    chars && l.len() <= 63 && !l.starts_with('-') && !l.ends_with('-')
}

/// `host(value, field?)`: a DNS name, optionally `*.`-prefixed, lower-cased.
fn host(value: Value, field: Option<&str>) -> Result<Value, Error> {
    typed(field, || {
        let s = text(&value)?.to_ascii_lowercase();
        let rest = s.strip_prefix("*.").unwrap_or(&s);
        let allowed = |c: char| c.is_ascii_alphanumeric() || ".-*".contains(c);
        let bad = offence(&s, allowed, false).or_else(|| {
            if rest.is_empty() || rest.split('.').any(str::is_empty) {
                Some("an empty label".into())
            } else {
                let label = rest.split('.').find(|l| !label_ok(l));
                label.map(|l| format!("the invalid label {}", q(l)))
            }
        });
        let expected = "a DNS host name (dot-separated labels of letters, digits and inner '-', \
                        optionally starting with '*.')";
        check(&s, 253, expected, bad)
    })
}

/// `http_path(value, field?)`: a URL path printed bare: starts with `/`, printable ASCII without
/// space, `#`, quotes, backslash or braces, `%` only in `%XX` escapes. Not for double quotes.
fn http_path(value: Value, field: Option<&str>) -> Result<Value, Error> {
    typed(field, || {
        let s = text(&value)?;
        let allowed = |c: char| ('!'..='~').contains(&c) && !"#\"'\\{}".contains(c);
        let bad = match s.chars().next() {
            Some(c) if c != '/' => Some(format!("{} at the start instead of '/'", describe(c))),
            _ => offence(&s, allowed, true),
        };
        check(
            &s,
            2048,
            "a URL path starting with '/' (use %XX escapes)",
            bad,
        )
    })
}

/// `hregex(value, field?)`: a tenant regular expression, confined as `(?:<pattern>)`.
///
/// HAProxy compiles it with PCRE; it is checked with the `regex` crate, whose syntax is close to
/// a subset of PCRE, and then refused wherever the two could read its structure differently or
/// where HAProxy's own parsers would change it: nested or POSIX classes and set operations in
/// classes, flags other than `imsU`, `\\`, `\xHH` other than letters, digits and space,
/// `\x{..}`, `\u`, `\<`, `\>`, `\b{..}`. What remains is one word that means the same in
/// haproxy.cfg (whose parser decodes `\\` and `\xHH`) and in a map file (no decoding), and its
/// alternations stay inside the group. Print it bare, not inside quotes.
fn hregex(value: Value, field: Option<&str>) -> Result<Value, Error> {
    typed(field, || {
        let s = text(&value)?;
        let bad =
            offence(&s, |c| printable(c) && !" #\"'".contains(c), false).map(|what| {
                match what.as_str() {
                    "a space" => "a space (use \\s or \\x20 to match one)".into(),
                    _ => what,
                }
            });
        check(&s, 1024, "a regular expression", bad)?;
        if let Err(e) = regex::RegexBuilder::new(&s).size_limit(1 << 20).build() {
            let msg = e.to_string();
            let line = msg.lines().rev().find_map(|l| l.strip_prefix("error: "));
            let line = line.or(msg.lines().next()).unwrap_or_default();
            return Err(format!(
                "{} is not a valid regular expression: {line}",
                q(&s)
            ));
        }
        confinable(s.as_bytes()).map_err(|why| format!("{} {why}", q(&s)))?;
        Ok(format!("(?:{s})"))
    })
}

/// Walks a pattern the way PCRE reads it: every group closes inside the pattern.
fn confinable(b: &[u8]) -> Result<(), String> {
    let (mut i, mut depth) = (0, 0usize);
    while i < b.len() {
        match b[i] {
            b'\\' => i = escape(b, i)?,
            b'[' => i = class(b, i)?,
            b'*' | b'+' | b'?' | b'{' => i = quantifier(b, i)?,
            b'(' => {
                let (next, opens) = group(b, i)?;
                depth += usize::from(opens);
                i = next;
            }
            b')' => {
                depth = depth.checked_sub(1).ok_or("has an unbalanced ')'")?;
                i += 1;
            }
            _ => i += 1,
        }
    }
    match depth {
        0 => Ok(()),
        _ => Err("has an unclosed '('".into()),
    }
}

/// Index after the quantifier starting at `b[i]` and its lazy `?`. PCRE reads a second
/// quantifier (`a++`, `a{2}{3}`) differently from the `regex` crate, if at all.
fn quantifier(b: &[u8], i: usize) -> Result<usize, String> {
    let mut end = match b[i] {
        b'{' => {
            let close = b[i..]
                .iter()
                .position(|&c| c == b'}')
                .unwrap_or(b.len() - i - 1);
            // PCRE refuses a count above 65535 (the `regex` crate takes it).
            let counts = std::str::from_utf8(&b[i + 1..i + close]).unwrap_or("");
            if counts.split(',').any(|n| {
                let digits = n.trim().trim_start_matches('0');
                digits.len() > 5 || digits.parse::<u32>().is_ok_and(|n| n > 65535)
            }) {
                return Err(
                    "has a repetition count above 65535, which HAProxy's PCRE refuses".into(),
                );
            }
            i + 1 + close
        }
        _ => i + 1,
    };
    end += usize::from(b.get(end) == Some(&b'?'));
    match b.get(end) {
        Some(b'*' | b'+' | b'?' | b'{') => Err("has a repeated quantifier".into()),
        _ => Ok(end),
    }
}

/// Index after the escape starting at `b[i] == '\\'`.
fn escape(b: &[u8], i: usize) -> Result<usize, String> {
    let at = |k: usize| b.get(i + k).copied().unwrap_or(0);
    let hex = |k: usize| at(k).is_ascii_hexdigit();
    match at(1) {
        b'\\' => Err("contains \\\\, which HAProxy's configuration parser would unescape".into()),
        b'x' if hex(2) && hex(3) => {
            let byte = u8::from_str_radix(std::str::from_utf8(&b[i + 2..i + 4]).unwrap_or(""), 16);
            match byte {
                Ok(c) if c.is_ascii_alphanumeric() || c == b' ' => Ok(i + 4),
                _ => Err(
                    "contains \\xHH for a character other than a letter, digit or space, \
                          which HAProxy would decode (escape it as \\c instead)"
                        .into(),
                ),
            }
        }
        b'p' | b'P' if at(2) == b'{' => {
            let name = b[i + 3..]
                .iter()
                .take_while(|c| c.is_ascii_alphabetic() || **c == b'_');
            let end = i + 3 + name.count();
            match at(end - i) {
                b'}' => Ok(end + 1),
                _ => Err("contains an unsupported \\p{..} class".into()),
            }
        }
        b'p' | b'P' if at(2).is_ascii_alphabetic() => Ok(i + 3),
        b'b' | b'B' if at(2) == b'{' => Err("contains \\b{..}, which PCRE does not support".into()),
        b'd' | b'D' | b's' | b'S' | b'w' | b'W' | b'b' | b'B' | b'A' | b'z' => Ok(i + 2),
        b'n' | b'r' | b't' | b'f' => Ok(i + 2),
        c if c.is_ascii_punctuation() && c != b'<' && c != b'>' => Ok(i + 2),
        c => Err(format!("contains the unsupported escape \\{}", c as char)),
    }
}

/// Index after the character class starting at `b[i] == '['`.
fn class(b: &[u8], i: usize) -> Result<usize, String> {
    let mut j = i + 1;
    j += usize::from(b.get(j) == Some(&b'^'));
    j += usize::from(b.get(j) == Some(&b']'));
    loop {
        match b.get(j) {
            None => return Err("has an unclosed '['".into()),
            Some(b']') => return Ok(j + 1),
            Some(b'\\') => j = escape(b, j)?,
            Some(b'[') => {
                return Err(
                    "contains '[' inside a character class (write \\[; nested and POSIX \
                            classes are not supported)"
                        .into(),
                )
            }
            Some(&c) if b"&-~".contains(&c) && b.get(j + 1) == Some(&c) => {
                let c = c as char;
                return Err(format!(
                    "contains {c}{c} inside a character class (escape it)"
                ));
            }
            Some(_) => j += 1,
        }
    }
}

/// Index after the group opening at `b[i] == '('`, and whether it opens a group.
fn group(b: &[u8], i: usize) -> Result<(usize, bool), String> {
    if b.get(i + 1) != Some(&b'?') {
        return Ok((i + 1, true));
    }
    let name_at = match (b.get(i + 2), b.get(i + 3)) {
        (Some(b':'), _) => return Ok((i + 3, true)),
        (Some(b'P'), Some(b'<')) => Some(i + 4),
        (Some(b'<'), _) => Some(i + 3),
        _ => None,
    };
    if let Some(start) = name_at {
        let len = b[start..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_');
        let end = start + len.count();
        if end > start && !b[start].is_ascii_digit() && b.get(end) == Some(&b'>') {
            return Ok((end + 1, true));
        }
        return Err("has an unsupported group name".into());
    }
    let end = i
        + 2
        + b[i + 2..]
            .iter()
            .take_while(|c| b"imsU-".contains(c))
            .count();
    match b.get(end) {
        Some(b':') => Ok((end + 1, true)),
        Some(b')') => Ok((end + 1, false)),
        _ => Err(
            "has an unsupported group or flag (only (?:, (?<name>, (?P<name> and the \
                  flags imsU are supported)"
                .into(),
        ),
    }
}

/// Microseconds in an HAProxy time: digits and an optional unit (none means milliseconds).
fn micros(s: &str) -> Result<u64, String> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let unit: u64 = match &s[digits..] {
        "us" => 1,
        "ms" | "" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => 0,
    };
    if unit == 0 || digits == 0 || digits > DIGITS_MAX {
        let expected = "1 to 18 digits and an optional unit us, ms, s, m, h or d";
        return Err(format!("{} is not a time; expected {expected}", q(s)));
    }
    let n: u64 = s[..digits]
        .parse()
        .map_err(|_| format!("{} is not a time", q(s)))?;
    Ok(n.saturating_mul(unit))
}

/// `duration(value, field?, max?)`: an HAProxy time no longer than `max` (default `24h`).
fn duration(value: Value, field: Option<&str>, max: Option<&str>) -> Result<Value, Error> {
    let max = max.unwrap_or("24h");
    let limit = micros(max).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("duration: invalid max: {e}"),
        )
    })?;
    typed(field, || {
        if value.kind() == ValueKind::Number && !value.is_integer() {
            return Err(format!("{value} is not a whole number of milliseconds"));
        }
        let s = text(&value)?;
        if micros(&s)? > limit {
            return Err(format!("{} is longer than the maximum of {max}", q(&s)));
        }
        Ok(s.into_owned())
    })
}

/// `gateway_duration(value, field?, max_hours?)`: a Gateway API duration (GEP-2257: one to four
/// parts of 1 to 5 digits and a unit `h`, `m`, `s` or `ms`, such as `1m30s`) in milliseconds, at
/// most `max_hours` (default 24; at most 8760, a year). `0s` is 0.
fn gateway_duration(
    value: Value,
    field: Option<&str>,
    max_hours: Option<u64>,
) -> Result<Value, Error> {
    let max_hours = max_hours.unwrap_or(24).min(8760);
    typed(field, || {
        let s = text(&value)?;
        let expected = "a duration such as 500ms, 10s or 1m30s (GEP-2257)";
        let bad = || format!("{} is not {expected}", q(&s));
        let (mut rest, mut ms, mut parts) = (&s[..], 0u64, 0);
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 || digits > 5 {
                return Err(bad());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit = if let Some(r) = rest.strip_prefix("ms") {
                rest = r;
                1
            } else if let Some(r) = rest.strip_prefix('h') {
                rest = r;
                3_600_000
            } else if let Some(r) = rest.strip_prefix('m') {
                rest = r;
                60_000
            } else if let Some(r) = rest.strip_prefix('s') {
                rest = r;
                1_000
            } else {
                return Err(bad());
            };
            ms += n * unit;
            parts += 1;
        }
        if parts == 0 || parts > 4 {
            return Err(bad());
        }
        if ms > max_hours * 3_600_000 {
            return Err(format!(
                "{} is longer than the maximum of {max_hours}h",
                q(&s)
            ));
        }
        Ok(ms.to_string())
    })
}

/// `int_range(value, min, max, field?)`: an integer within `[min, max]`, in decimal.
fn int_range(value: Value, min: i64, max: i64, field: Option<&str>) -> Result<Value, Error> {
    typed(field, || {
        let expected = format!("an integer from {min} to {max}");
        let n = match value.kind() {
            ValueKind::Number if value.is_integer() => value.as_i64(),
            ValueKind::Number => {
                return Err(format!("{value} is not an integer; expected {expected}"))
            }
            _ => {
                let s = text(&value)?;
                let digits = s.strip_prefix('-').unwrap_or(&s);
                if digits.is_empty()
                    || digits.len() > DIGITS_MAX
                    || !digits.bytes().all(|b| b.is_ascii_digit())
                {
                    let what = format!("an integer of at most {DIGITS_MAX} digits");
                    return Err(format!("{} is not {what}; expected {expected}", q(&s)));
                }
                s.parse::<i64>().ok()
            }
        };
        match n {
            Some(n) if (min..=max).contains(&n) => Ok(n.to_string()),
            _ => Err(format!(
                "{} is out of range; expected {expected}",
                q(&value.to_string())
            )),
        }
    })
}

fn cidr(entry: &str) -> Result<String, String> {
    let (addr, prefix) = match entry.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (entry, None),
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return Err(format!("{} is not an IPv4/IPv6 address or CIDR", q(entry)));
    };
    let Some(prefix) = prefix else {
        return Ok(addr.to_string());
    };
    let bits = if addr.is_ipv4() { 32 } else { 128 };
    match prefix.parse::<u8>() {
        Ok(p) if p <= bits && prefix.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(format!("{addr}/{p}"))
        }
        _ => Err(format!(
            "{} has an invalid prefix length (expected 0 to {bits})",
            q(entry)
        )),
    }
}

/// `cidr_list(value, field?)`: addresses or CIDRs (a comma/space-separated string or a
/// sequence of strings), canonical and separated by single spaces.
fn cidr_list(value: Value, field: Option<&str>) -> Result<Value, Error> {
    let seq = matches!(value.kind(), ValueKind::Seq | ValueKind::Iterable);
    let items: Vec<Value> = match seq {
        true => value.try_iter()?.take(CIDRS_MAX + 1).collect(),
        false => Vec::new(),
    };
    typed(field, || {
        let mut entries = Vec::new();
        for item in &items {
            let s = item
                .as_str()
                .ok_or_else(|| format!("expected strings, got {}", item.kind()))?;
            entries.push(s.trim());
        }
        let s = if seq {
            Cow::Borrowed("")
        } else {
            text(&value)?
        };
        let words = s.split(|c: char| c == ',' || c.is_ascii_whitespace());
        entries.extend(words.filter(|w| !w.is_empty()).take(CIDRS_MAX + 1));
        if entries.is_empty() {
            return Err("is empty; expected IP addresses or CIDRs".into());
        }
        if entries.len() > CIDRS_MAX {
            return Err(format!("has more than {CIDRS_MAX} entries"));
        }
        let out = entries
            .into_iter()
            .map(cidr)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(out.join(" "))
    })
}

/// `word(value, field?)`: one bare word for enums and names, `[A-Za-z0-9_.:/@+=-]+`, not
/// starting with `-` (an ACL pattern starting with `-` is read as a flag).
fn word(value: Value, field: Option<&str>) -> Result<Value, Error> {
    typed(field, || {
        let s = text(&value)?;
        let bad = match s.starts_with('-') {
            true => Some("'-' at the start".into()),
            false => offence(
                &s,
                |c| c.is_ascii_alphanumeric() || "_.:/@+=-".contains(c),
                false,
            ),
        };
        check(&s, 256, "a word of letters, digits and _.:/@+=-", bad)
    })
}

/// `one_of(value, choices, field?)`: the value, when it equals one of `choices`.
fn one_of(value: Value, choices: Value, field: Option<&str>) -> Result<Value, Error> {
    let choices: Vec<String> = choices.try_iter()?.map(|c| c.to_string()).collect();
    typed(field, || {
        let s = text(&value)?;
        if choices.iter().any(|c| *c == s) {
            return Ok(s.into_owned());
        }
        let listed: Vec<String> = choices.iter().map(|c| q(c)).collect();
        Err(format!("{} is not one of {}", q(&s), listed.join(", ")))
    })
}

/// `map_key(field?)`: a key of a map file line (`KEY VALUE`): no whitespace or control
/// characters, ASCII only, not starting with `#` (a comment line), and short enough that
/// HAProxy's line reader never splits it into a second, forged entry.
fn map_key(value: Value, field: Option<&str>) -> Result<Value, Error> {
    typed(field, || {
        let s = text(&value)?;
        let bad = offence(&s, |c| c.is_ascii_graphic(), false)
            .or_else(|| s.starts_with('#').then(|| "a leading '#'".to_string()));
        check(&s, PLAIN_MAX, "a map key without spaces", bad)
    })
}

/// `pem(field?)`: PEM text from a Secret (certificates, keys, CA bundles), checked to contain
/// only PEM blocks (`-----BEGIN …-----`, base64 lines, `-----END …-----`, blank lines), so the
/// file HAProxy loads holds nothing else. Returns the blocks, each line ending in a newline.
fn pem(value: Value, field: Option<&str>) -> Result<Value, Error> {
    typed(field, || {
        let s = text(&value)?;
        if s.len() > 1 << 20 {
            return Err(format!(
                "is {} bytes; at most 1 MiB of PEM data is accepted",
                s.len()
            ));
        }
        let mut out = String::with_capacity(s.len());
        let mut inside: Option<&str> = None;
        let mut blocks = 0;
        for (n, raw) in s.lines().enumerate() {
            let line = raw.trim_end_matches('\r').trim();
            // What is wrong, never the line: it is Secret data, and the reason goes to status
            // and Events, which those allowed to see a namespace's objects but not its Secrets
            // can read (and to webhook denials, whose caller the webhook cannot tell apart).
            let bad = |why: &str| format!("line {} is not PEM: {why}", n + 1);
            if let Some(label) = line
                .strip_prefix("-----BEGIN ")
                .and_then(|l| l.strip_suffix("-----"))
            {
                if inside.is_some() {
                    return Err(bad("a BEGIN line inside an open block"));
                }
                if !label.chars().all(|c| c.is_ascii_uppercase() || c == ' ') {
                    return Err(bad("a BEGIN line whose label is not capital letters"));
                }
                inside = Some(label);
            } else if let Some(label) = line
                .strip_prefix("-----END ")
                .and_then(|l| l.strip_suffix("-----"))
            {
                if inside != Some(label) {
                    return Err(bad("an END line that closes no open block of its label"));
                }
                inside = None;
                blocks += 1;
            } else if line.is_empty() {
                continue;
            } else if inside.is_none() {
                return Err(bad("text outside a BEGIN/END block"));
            } else if !line
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '='))
            {
                return Err(bad("characters other than base64 inside a block"));
            }
            out.push_str(line);
            out.push('\n');
        }
        if inside.is_some() || blocks == 0 {
            return Err("holds no complete PEM block".into());
        }
        Ok(out)
    })
}

/// `refuse(reason, field?)`: always a refusal.
fn refuse(reason: &str, field: Option<&str>) -> Result<Value, Error> {
    Err(refusal(field, reason))
}

/// Registers every filter above, each also as a function, and the `refuse` function.
pub(crate) fn register(env: &mut Environment<'static>) {
    macro_rules! both {
        ($($name:ident),*) => {
            $(env.add_filter(stringify!($name), $name); env.add_function(stringify!($name), $name);)*
        };
    }
    both!(
        hq,
        hq_logfmt,
        header_name,
        host,
        http_path,
        hregex,
        duration,
        gateway_duration,
        int_range
    );
    both!(cidr_list, word, one_of, map_key, pem);
    env.add_function("refuse", refuse);
    // `text is pem_text`: whether `pem` would take it, for a template that reports a bad
    // value in a status rather than leaving its object out.
    env.add_test("pem_text", |value: Value| pem(value, None).is_ok());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_keys_and_pem() {
        let f = |s: &str| map_key(Value::from(s), F);
        assert_eq!(ok(f("a.test/api")), "a.test/api");
        assert_eq!(ok(f("^a\\.test(?:/x|/y)")), "^a\\.test(?:/x|/y)");
        for bad in ["a b", "a\tb", "a\nb", "#x", "é", ""] {
            assert!(
                no(f(bad)).starts_with("annotation haproxy.org/x: "),
                "{bad:?}"
            );
        }
        assert!(no(f(&"a".repeat(5000))).contains("longer than"));
        let good = "-----BEGIN CERTIFICATE-----\r\nQUJD\nREVG==\n-----END CERTIFICATE-----\n\n-----BEGIN EC PRIVATE KEY-----\nQUJD\n-----END EC PRIVATE KEY-----\n";
        assert_eq!(
            ok(pem(Value::from(good), F)),
            "-----BEGIN CERTIFICATE-----\nQUJD\nREVG==\n-----END CERTIFICATE-----\n-----BEGIN EC PRIVATE KEY-----\nQUJD\n-----END EC PRIVATE KEY-----\n"
        );
        for bad in [
            "",
            "QUJD",
            "-----BEGIN CERTIFICATE-----\nQUJD\n",
            "-----BEGIN CERTIFICATE-----\nQU JD\n-----END CERTIFICATE-----",
            "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\nglobal\n",
            "-----BEGIN CERTIFICATE-----\nQUJD\n-----END KEY-----",
        ] {
            no(pem(Value::from(bad), F));
        }
    }
    use minijinja::{context, AutoEscape, UndefinedBehavior};

    const F: Option<&str> = Some("annotation haproxy.org/x");
    /// Structure-changing characters, for every filter that prints a bare word.
    const HOSTILE: &[&str] = &[
        "a\nb", "a\rb", "a\tb", "a\0b", "a\u{1b}", "é", "a b", "a#b", "a\"b", "a'b", "a\\b", "a{b",
        "a}b", "a$b", "%[src]", "",
    ];

    fn ok(r: Result<Value, Error>) -> String {
        let v = r.unwrap_or_else(|e| panic!("refused: {e:?}"));
        assert!(v.is_safe(), "{v:?} is not safe");
        v.as_str().unwrap().to_string()
    }

    fn no(r: Result<Value, Error>) -> String {
        let e = r.expect_err("accepted");
        assert_eq!(e.kind(), ErrorKind::InvalidOperation);
        assert!(std::error::Error::source(&e).is_some_and(|s| s.is::<RefusalMarker>()));
        e.detail().unwrap().to_string()
    }

    /// Checks accepted values and their output, then refusals (with the field prefix).
    fn table(f: impl Fn(Value) -> Result<Value, Error>, good: &[(&str, &str)], bad: &[&str]) {
        for (input, out) in good {
            assert_eq!(ok(f(Value::from(*input))), *out, "{input:?}");
        }
        for input in bad {
            let msg = f(Value::from(*input))
                .map(|v| v.to_string())
                .map_err(|e| no(Err(e)));
            let msg = msg.expect_err(&format!("{input:?} accepted"));
            assert!(msg.starts_with("annotation haproxy.org/x: "), "{msg}");
        }
        assert!(no(f(Value::UNDEFINED)).ends_with(": is missing"));
        assert!(no(f(Value::from(()))).ends_with(": is missing"));
    }

    #[test]
    fn quoting() {
        let hq = |v| hq(v, F);
        let good = [("", "\"\""), ("it's #{x} %[src]", r#""it's #{x} %[src]""#)];
        table(
            hq,
            &good,
            &["a\nb", "a\rb", "a\tb", "a\0b", "a\u{7f}", "café"],
        );
        assert_eq!(ok(hq(Value::from(r#"a"b\c$HOME"#))), r#""a\"b\\c\$HOME""#);
        assert_eq!(ok(hq(Value::from(42))), "\"42\"");
        let logfmt = |v| hq_logfmt(v, F);
        table(
            logfmt,
            &[("50% %[src] $x", r#""50%% %%[src] \$x""#)],
            &["a\nb"],
        );
        let msg = no(hq(Value::from("a\nb")));
        assert_eq!(msg, "annotation haproxy.org/x: \"a\\nb\" contains a line break; expected printable ASCII text (no line breaks, tabs or control characters)");
        assert_eq!(no(super::hq(Value::UNDEFINED, None)), "is missing");
        assert!(no(hq(Value::from(vec![1]))).contains("expected a string, got sequence"));
        let long = format!("{}\n", "x".repeat(100));
        let cut = format!("{:?}... (101 characters) contains", "x".repeat(64));
        assert!(no(super::hq(Value::from(long), None)).starts_with(&cut));
    }

    #[test]
    fn header_names_hosts_paths_words() {
        let bad = [HOSTILE, &["-x", ".x", "a:b", "a/b"]].concat();
        table(
            |v| header_name(v, F),
            &[("X-Forwarded-For", "X-Forwarded-For"), ("x_a.b9", "x_a.b9")],
            &bad,
        );
        assert!(no(header_name(Value::from("a".repeat(129)), F)).contains("longer than 128"));
        assert!(no(header_name(Value::from("a b"), F)).contains("contains a space"));

        let good = [
            ("Example.COM", "example.com"),
            ("*.a-b.x9.io", "*.a-b.x9.io"),
            ("10.0.0.1", "10.0.0.1"),
        ];
        let bad = [
            "*",
            "*.",
            "a..b",
            "a.",
            ".a",
            "-a.b",
            "a-.b",
            "a.*.b",
            "a*.b",
            "1.2.3.4:80",
            "[::1]",
            "a_b",
        ];
        table(|v| host(v, F), &good, &[HOSTILE, &bad].concat());
        assert_eq!(ok(host(Value::from("a".repeat(63)), F)), "a".repeat(63));
        no(host(Value::from("a".repeat(64)), F));
        no(host(Value::from(["abcdefgh"; 29].join(".")), F));

        let good = [
            ("/", "/"),
            ("/a/b%20c?x=1&y=[2]~$;", "/a/b%20c?x=1&y=[2]~$;"),
        ];
        let bad = [
            "a/b", "/a%2", "/a%zz", "/a%", "/%[src]", " /", "/a b", "/{x}",
        ];
        table(|v| http_path(v, F), &good, &[HOSTILE, &bad].concat());
        let msg = no(http_path(Value::from("/a%[src]"), None));
        assert_eq!(msg, "\"/a%[src]\" contains '%' not followed by two hex digits; expected a URL path starting with '/' (use %XX escapes)");
        no(http_path(Value::from(format!("/{}", "a".repeat(2048))), F));

        let good = [("round_robin:a/b@c+d=e.f-g", "round_robin:a/b@c+d=e.f-g")];
        table(
            |v| word(v, F),
            &good,
            &[HOSTILE, &["-f", "a,b", "a*"]].concat(),
        );
        no(word(Value::from("a".repeat(257)), F));
    }

    #[test]
    fn regexes() {
        let good = [
            ("/a|/b", "(?:/a|/b)"),
            (r"^/api/v[0-9]+\.json$", r"(?:^/api/v[0-9]+\.json$)"),
            ("(a+?b{2,}?c{1,3})*?[?*+{]", "(?:(a+?b{2,}?c{1,3})*?[?*+{])"),
            (
                r"(?i)^/(?P<x>a)\s\x20(?<y>[]a-z])(?:b)\p{L}\pL%$",
                r"(?:(?i)^/(?P<x>a)\s\x20(?<y>[]a-z])(?:b)\p{L}\pL%$)",
            ),
        ];
        let bad = [
            "a\nb",
            "a\rb",
            "a\tb",
            "a\0b",
            "é",
            "a b",
            "a#b",
            "a\"b",
            "a'b",
            "",
            "(",
            ")",
            "a(?=b)",
            "(?<=a)b",
            r"(a)\1",
            "a++",
            "a{2}{3}",
            "a*??",
            "a{2}+",
            r"\Q(\E",
            r"a\ b",
            "a{1000}{1000}{1000}",
            // Escapes HAProxy's parser decodes into structure; PCRE/regex-crate differences.
            r"a\\\)|.*|\\\(b",
            r"\x29|.*|\x28",
            r"\x{41}",
            r"[[a]x)|.*|(?:y]",
            "[a&&b]",
            "[a--b]",
            "[[:alpha:]]",
            "(?x)a",
            "(?R)",
            r"\<a",
            r"\b{start}a",
            r"\u0041",
            r"\v",
        ];
        table(|v| hregex(v, F), &good, &bad);
        assert!(
            no(hregex(Value::from("/a b"), F)).contains("a space (use \\s or \\x20 to match one)")
        );
        assert!(no(hregex(Value::from("(a"), F))
            .contains("not a valid regular expression: unclosed group"));
        assert!(no(hregex(Value::from("a(?=b)"), F)).contains("look-around"));
        // Counts PCRE refuses, also where the `regex` crate's own limits let them through.
        for big in ["a{65536}", "(?:){70000}", "(?:){0,65536}", "a{1,9999999}"] {
            no(hregex(Value::from(big), F));
        }
        assert!(no(hregex(Value::from("(?:){70000}"), F)).contains("above 65535"));
        assert!(hregex(Value::from("a{2,3}"), F).is_ok());
        assert!(hregex(Value::from("(?:ab|cd){3000}"), F).is_ok());
        assert!(no(hregex(Value::from(r"[[a]x)|.*|(?:y]"), F)).contains("inside a character class"));
        no(hregex(Value::from("a".repeat(1025)), F));
    }

    #[test]
    fn gateway_durations() {
        let good = [
            ("500ms", "500"),
            ("1m30s", "90000"),
            ("1h2m3s4ms", "3723004"),
            ("0s", "0"),
            ("24h", "86400000"),
        ];
        let bad = [
            "10",
            "1.5s",
            "1d",
            "100000s",
            "1h1m1s1ms1h",
            "-1s",
            "1s ",
            "5s\nx",
            "25h",
            "1S",
        ];
        table(
            |v| gateway_duration(v, F, None),
            &good,
            &[HOSTILE, &bad].concat(),
        );
        assert_eq!(
            gateway_duration(Value::from("168h"), F, Some(8760))
                .unwrap()
                .to_string(),
            "604800000"
        );
        assert!(gateway_duration(Value::from("8761h"), F, Some(8760)).is_err());
        assert!(no(gateway_duration(Value::from("25h"), F, None))
            .ends_with("is longer than the maximum of 24h"));
    }

    #[test]
    fn durations_and_integers() {
        let good = [
            ("10", "10"),
            ("0", "0"),
            ("5us", "5us"),
            ("30s", "30s"),
            ("2m", "2m"),
            ("24h", "24h"),
            ("1d", "1d"),
        ];
        let bad = [
            "s",
            "-1",
            "1.5s",
            "1 s",
            "1S",
            "1sec",
            "2d",
            "99999999999999999999999",
            "999999999999999999d",
        ];
        table(|v| duration(v, F, None), &good, &[HOSTILE, &bad].concat());
        assert_eq!(ok(duration(Value::from(1500), F, None)), "1500");
        assert_eq!(ok(duration(Value::from("2h"), F, Some("2h"))), "2h");
        assert!(no(duration(Value::from("121m"), F, Some("2h")))
            .ends_with("is longer than the maximum of 2h"));
        for v in [Value::from(-5), Value::from(1.5), Value::from(u64::MAX)] {
            no(duration(v, F, None));
        }
        assert!(duration(Value::from("1s"), F, Some("bogus")).is_err());

        let good = [("5", "5"), ("007", "7"), ("-3", "-3"), ("-0", "0")];
        let bad = [
            "-",
            "+1",
            " 1",
            "1 ",
            "1e3",
            "0x10",
            "99999999999999999999999",
            "-6",
            "11",
        ];
        table(
            |v| int_range(v, -5, 10, F),
            &good,
            &[HOSTILE, &bad].concat(),
        );
        assert_eq!(ok(int_range(Value::from(5), 1, 10, F)), "5");
        let msg = no(int_range(Value::from("11"), 1, 10, F));
        assert_eq!(
            msg,
            "annotation haproxy.org/x: \"11\" is out of range; expected an integer from 1 to 10"
        );
        for v in [
            Value::from(1.5),
            Value::from(true),
            Value::from(i128::MAX),
            Value::from(-1),
        ] {
            no(int_range(v, 0, 10, F));
        }
    }

    #[test]
    fn cidrs() {
        let good = [(
            "10.0.0.0/8, 192.168.1.1\n2001:DB8::/32,,::1",
            "10.0.0.0/8 192.168.1.1 2001:db8::/32 ::1",
        )];
        let bad = [
            " , ",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "1.0.0.0/+8",
            "010.0.0.1",
            "1.2.3",
            "fe80::1%eth0",
            "1.1.1.1/8/8",
        ];
        table(|v| cidr_list(v, F), &good, &[HOSTILE, &bad].concat());
        assert_eq!(
            ok(cidr_list(Value::from(vec!["1.2.3.4/32", " ::/0 "]), F)),
            "1.2.3.4/32 ::/0"
        );
        assert!(no(cidr_list(Value::from(Vec::<String>::new()), F)).contains("is empty"));
        no(cidr_list(Value::from(vec![Value::from(1)]), F));
        no(cidr_list(Value::from(vec!["1.1.1.1"; 1001].join(",")), F));
        assert_eq!(
            ok(cidr_list(Value::from(vec!["1.1.1.1"; 1000].join(",")), F)).len(),
            7999
        );
    }

    #[test]
    fn choices_and_refuse() {
        let choices = Value::from(vec!["http", "https"]);
        table(
            |v| one_of(v, choices.clone(), F),
            &[("https", "https")],
            &["ftp", "http\n", "HTTP", ""],
        );
        let msg = no(one_of(Value::from("ftp\n"), choices, F));
        assert_eq!(
            msg,
            "annotation haproxy.org/x: \"ftp\\n\" is not one of \"http\", \"https\""
        );
        assert_eq!(
            no(refuse("bad value", F)),
            "annotation haproxy.org/x: bad value"
        );
        assert_eq!(no(refuse("bad value", None)), "bad value");
    }

    #[test]
    fn plain() {
        assert!(is_plain(""));
        assert!(is_plain("be_ns_svc-80:a/b@c+d=e,f*(g)[h]!?&;~^|<>%2F"));
        for bad in HOSTILE
            .iter()
            .filter(|s| !s.is_empty())
            .chain(&["%", "%2", "a`b", "a\u{7f}"])
        {
            assert!(!is_plain(bad), "{bad:?}");
        }
        assert!(!is_plain(&"a".repeat(PLAIN_MAX + 1)));
    }

    fn render(tpl: &str) -> Result<String, Error> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Chainable);
        env.set_auto_escape_callback(|_| AutoEscape::Custom("haproxy".into()));
        env.set_formatter(formatter);
        register(&mut env);
        env.render_str(
            tpl,
            context! { x => "a b", y => "be_1", n => 3, l => vec!["a"], m => () },
        )
    }

    fn marked<M: std::error::Error + 'static>(e: &Error) -> bool {
        let mut chain = std::iter::successors(Some(e as &dyn std::error::Error), |e| e.source());
        chain.any(|e| e.is::<M>())
    }

    #[test]
    fn formatter_in_templates() {
        let err = render("{{ x }}").unwrap_err();
        assert!(marked::<UnsafeOutputMarker>(&err) && !marked::<RefusalMarker>(&err));
        assert!(
            err.to_string()
                .contains("unsafe value \"a b\" printed without a typed filter (contains a space)"),
            "{err}"
        );
        assert_eq!(render("{{ x|safe }}").unwrap(), "a b");
        assert_eq!(
            render("{{ x | hq }} {{ hq(x, 'f') }}").unwrap(),
            "\"a b\" \"a b\""
        );
        assert_eq!(
            render("{{ y }}{{ n }}{{ 1.5 }}{{ false }}{{ m }}{{ missing }}{{ missing.z }}|")
                .unwrap(),
            "be_131.5False|"
        );
        assert!(render("{{ l }}").is_err());
        assert!(render("{{ '#x' }}")
            .unwrap_err()
            .to_string()
            .contains("(contains '#')"));
        assert!(render("{{ 'a\nb' }}")
            .unwrap_err()
            .to_string()
            .contains("(contains a line break)"));
        // Concatenating with a safe string runs the other side through the formatter.
        assert!(render("{{ 'a b' ~ (x|hq) }}").is_err());
        assert!(render("{{ (x|hq) ~ x }}").is_err());
        assert_eq!(render("{{ 'a' ~ (x|hq) }}").unwrap(), "a\"a b\"");
        assert_eq!(render("{{ (x|hq) ~ (y|word) }}").unwrap(), "\"a b\"be_1");
        // Macro output and set blocks are safe strings under a custom auto-escape mode.
        let tpl = "{% macro m() %}a b\n{% endmacro %}{% set s %}c d{% endset %}{{ m() }}{{ s }}";
        assert_eq!(render(tpl).unwrap(), "a b\nc d");
        let err = render("{{ x|host('spec.rules[0].host') }}").unwrap_err();
        assert!(marked::<RefusalMarker>(&err));
        assert!(
            err.to_string()
                .contains("spec.rules[0].host: \"a b\" contains a space"),
            "{err}"
        );
        let tpl =
            "{{ '10s'|duration('f', '1m') }} {{ 5|int_range(1, 9) }} {{ one_of('a', ['a']) }}";
        assert_eq!(render(tpl).unwrap(), "10s 5 a");
        assert!(render("{{ refuse('no', 'f') }}")
            .unwrap_err()
            .to_string()
            .contains("f: no"));
    }
}
