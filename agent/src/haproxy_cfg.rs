//! A comment- and whitespace-insensitive view of `haproxy.cfg`, tokenised the way HAProxy does it.
//!
//! The classifier compares two configurations through this view, so a changed comment (the
//! templates put `# Pod: <name>` after server lines) or re-indentation never causes a reload. Only
//! what the classifier needs is modelled: sections with their header and their lines as tokens,
//! and the parts of a `server` line that HAProxy can change at runtime.

use std::net::IpAddr;

/// Keywords that open a section. A line starting with one of them ends the previous section.
const SECTION_KEYWORDS: &[&str] = &[
    "global",
    "defaults",
    "frontend",
    "backend",
    "listen",
    "resolvers",
    "peers",
    "userlist",
    "mailers",
    "cache",
    "ring",
    "http-errors",
    "program",
    "log-forward",
    "fcgi-app",
    "traces",
    "crt-store",
    "acme",
    "log-profile",
];

/// One configuration line as HAProxy would see its words: quotes removed, escapes resolved,
/// comments dropped.
pub type Tokens = Vec<String>;

/// A section: its header (`backend be_x` → `["backend", "be_x"]`) and its lines. Lines before the
/// first section header land in a section with an empty header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub header: Tokens,
    pub lines: Vec<Tokens>,
}

impl Section {
    /// `backend` and `listen` sections hold servers.
    pub fn has_servers(&self) -> bool {
        matches!(
            self.header.first().map(String::as_str),
            Some("backend" | "listen")
        )
    }

    pub fn name(&self) -> &str {
        self.header.get(1).map(String::as_str).unwrap_or("")
    }
}

/// A parsed configuration: the ordered list of sections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub sections: Vec<Section>,
}

impl Config {
    pub fn parse(text: &str) -> Config {
        Config::parse_lines(text.lines())
    }

    /// [`Config::parse`] over lines already split.
    pub fn parse_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> Config {
        let mut sections = vec![Section {
            header: Vec::new(),
            lines: Vec::new(),
        }];
        for line in lines {
            let tokens = tokenize_line(line);
            let Some(first) = tokens.first() else {
                continue;
            };
            if SECTION_KEYWORDS.contains(&first.as_str()) {
                sections.push(Section {
                    header: tokens,
                    lines: Vec::new(),
                });
            } else if let Some(current) = sections.last_mut() {
                current.lines.push(tokens);
            }
        }
        if sections[0].lines.is_empty() {
            sections.remove(0);
        }
        Config { sections }
    }

    /// Every token of every line, headers included.
    pub fn tokens(&self) -> impl Iterator<Item = &str> {
        self.sections
            .iter()
            .flat_map(|s| std::iter::once(&s.header).chain(s.lines.iter()))
            .flat_map(|line| line.iter().map(String::as_str))
    }

    /// Whether any line sets `keyword` (e.g. `crt-base`) as its first word.
    pub fn has_directive(&self, keyword: &str) -> bool {
        self.sections
            .iter()
            .flat_map(|s| s.lines.iter())
            .any(|l| l.first().is_some_and(|t| t == keyword))
    }
}

/// Whether a line opens a section (as [`Config::parse`] decides).
pub fn is_section_header(line: &str) -> bool {
    tokenize_line(line)
        .first()
        .is_some_and(|first| SECTION_KEYWORDS.contains(&first.as_str()))
}

/// Where two configurations (as lines) differ, extended to whole sections: the lines
/// `old[start..old_end]` and `new[start..new_end]`. Everything outside is identical in both,
/// line for line, and begins (after the window) with a section header or ends the text.
fn differing_sections(old: &[&str], new: &[&str]) -> (usize, usize, usize) {
    let prefix = old.iter().zip(new).take_while(|(o, n)| o == n).count();
    let limit = old.len().min(new.len()) - prefix;
    let suffix = old
        .iter()
        .rev()
        .zip(new.iter().rev())
        .take(limit)
        .take_while(|(o, n)| o == n)
        .count();
    // Back to the header of the section holding the first differing line: the line at
    // `prefix` when it opens a section in both, else the last header of the common prefix.
    let opens_both = |i: usize| {
        i < old.len() && i < new.len() && is_section_header(old[i]) && is_section_header(new[i])
    };
    let start = if opens_both(prefix) {
        prefix
    } else {
        (0..prefix)
            .rev()
            .find(|&i| is_section_header(old[i]))
            .unwrap_or(0)
    };
    // Forward through the common suffix to the next section header.
    let (mut old_end, mut new_end) = (old.len() - suffix, new.len() - suffix);
    while old_end < old.len() && !is_section_header(old[old_end]) {
        old_end += 1;
        new_end += 1;
    }
    (start, old_end, new_end)
}

/// The sections of `old` and `new` that differ (see `differing_sections`), each parsed: every
/// section outside them is the same, line for line, in both configurations.
pub fn changed_sections(old: &str, new: &str) -> (Config, Config) {
    let old_lines: Vec<&str> = old.lines().collect();
    let new_lines: Vec<&str> = new.lines().collect();
    let (start, old_end, new_end) = differing_sections(&old_lines, &new_lines);
    (
        Config::parse_lines(old_lines[start..old_end].iter().copied()),
        Config::parse_lines(new_lines[start..new_end].iter().copied()),
    )
}

/// Splits one line into HAProxy words. Double quotes group and allow backslash escapes, single
/// quotes group literally, a backslash outside single quotes escapes the next character, and `#`
/// starts a comment only outside quotes and at the start of a word.
pub fn tokenize_line(line: &str) -> Tokens {
    let mut tokens = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match quote {
            Some('\'') => {
                if c == '\'' {
                    quote = None;
                } else {
                    current.push(c);
                }
            }
            Some(_) => match c {
                '"' => quote = None,
                '\\' => {
                    if let Some(next) = chars.next() {
                        current.push(next);
                    }
                }
                _ => current.push(c),
            },
            None => match c {
                ' ' | '\t' | '\r' => {
                    if in_word {
                        tokens.push(std::mem::take(&mut current));
                        in_word = false;
                    }
                }
                '#' if !in_word => break,
                '"' | '\'' => {
                    quote = Some(c);
                    in_word = true;
                }
                '\\' => {
                    if let Some(next) = chars.next() {
                        current.push(next);
                    }
                    in_word = true;
                }
                _ => {
                    current.push(c);
                    in_word = true;
                }
            },
        }
    }
    if in_word {
        tokens.push(current);
    }
    tokens
}

/// The runtime-changeable parts of a `server NAME ADDR [keywords…]` line, and the rest verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLine {
    pub name: String,
    pub address: String,
    /// `None` when the `weight` keyword is absent (the default or `default-server` applies).
    pub weight: Option<String>,
    /// `disabled` in the line means administratively down (maintenance).
    pub disabled: bool,
    /// Every other keyword with its arguments, in order.
    pub rest: Vec<String>,
}

impl ServerLine {
    /// Parses a tokenised `server` line; `None` for anything else or a line too short to be one.
    pub fn parse(tokens: &[String]) -> Option<ServerLine> {
        if tokens.first().map(String::as_str) != Some("server") || tokens.len() < 3 {
            return None;
        }
        let mut line = ServerLine {
            name: tokens[1].clone(),
            address: tokens[2].clone(),
            weight: None,
            disabled: false,
            rest: Vec::new(),
        };
        let mut i = 3;
        while i < tokens.len() {
            match tokens[i].as_str() {
                "weight" if i + 1 < tokens.len() => {
                    line.weight = Some(tokens[i + 1].clone());
                    i += 1;
                }
                "disabled" => line.disabled = true,
                "enabled" => line.disabled = false,
                other => line.rest.push(other.to_string()),
            }
            i += 1;
        }
        Some(line)
    }
}

/// An `IP:PORT` server address that `set server … addr … port …` can apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAddress {
    pub ip: IpAddr,
    pub port: u16,
}

impl SocketAddress {
    /// Accepts `1.2.3.4:80`, `[::1]:80` and HAProxy's `::1:80` (the last colon separates the
    /// port). Host names, port ranges, offsets and address prefixes (`unix@`, `ipv4@`) are not
    /// runtime-changeable and return `None`.
    pub fn parse(text: &str) -> Option<SocketAddress> {
        let (host, port) = text.rsplit_once(':')?;
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let port: u16 = port.parse().ok()?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let ip: IpAddr = host.parse().ok()?;
        Some(SocketAddress { ip, port })
    }
}

/// Finds the words of `config` that name the file at `rel_path` (relative to the configuration
/// directory): either the relative path itself or an absolute path ending in `/<rel_path>`.
/// Words are searched inside expressions too (`map(/etc/haproxy/maps/host.map,be_default)`).
/// Returns each distinct name together with the text just before it (`map(`, `crt `, …).
pub fn file_references<'a>(words: impl Iterator<Item = &'a str>, rel_path: &str) -> Vec<Reference> {
    let mut found: Vec<Reference> = Vec::new();
    let mut previous = "";
    for word in words {
        for name in path_like_runs(word) {
            let matches = name.text == rel_path
                || name
                    .text
                    .strip_suffix(rel_path)
                    .is_some_and(|p| p.ends_with('/'));
            if matches {
                let context = if name.start == 0 {
                    previous.to_string()
                } else {
                    word[..name.start].to_string()
                };
                let reference = Reference {
                    name: name.text.to_string(),
                    context,
                };
                if !found.contains(&reference) {
                    found.push(reference);
                }
            }
        }
        previous = word;
    }
    found
}

/// One place where a configuration names a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The file name exactly as written: the name HAProxy's runtime API knows it by.
    pub name: String,
    /// What precedes the name: the previous word when the name is a whole word (`crt`,
    /// `crt-list`, `-f`), or the start of the word (`%[req.hdr(host),map(`).
    pub context: String,
}

impl Reference {
    /// For a map reference: whether HAProxy parses the map's keys or values as more than
    /// strings (`map_reg`, `map_ip`, `map_int`, an `_int`/`_ip`/`_dbl` output, …). Only
    /// `map`, `map_str`, `map_beg`, `map_sub`, `map_dir`, `map_dom` and `map_end`, with string
    /// output, read them as they are.
    pub fn map_parses(&self) -> bool {
        let converter = self
            .context
            .strip_suffix('(')
            .and_then(|b| {
                b.rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .next()
            })
            .unwrap_or("");
        let plain = [
            "map", "map_str", "map_beg", "map_sub", "map_dir", "map_dom", "map_end",
        ];
        !plain.contains(&converter.strip_suffix("_str").unwrap_or(converter))
            && !plain.contains(&converter)
    }

    /// Whether this reference loads the file as a map (`map(…)`, `map_beg(…)`, …).
    pub fn is_map(&self) -> bool {
        let Some(before) = self.context.strip_suffix('(') else {
            return false;
        };
        let converter = before
            .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("");
        converter.starts_with("map")
    }
}

struct Run<'a> {
    start: usize,
    text: &'a str,
}

/// Maximal substrings of `word` that could be a file path (no separators used by sample
/// expressions).
fn path_like_runs(word: &str) -> Vec<Run<'_>> {
    let is_sep = |c: char| {
        matches!(
            c,
            '(' | ')' | ',' | '[' | ']' | '%' | '{' | '}' | '"' | '\'' | '='
        )
    };
    let mut runs = Vec::new();
    let mut start = None;
    for (i, c) in word.char_indices() {
        match (is_sep(c), start) {
            (true, Some(s)) => {
                runs.push(Run {
                    start: s,
                    text: &word[s..i],
                });
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push(Run {
            start: s,
            text: &word[s..],
        });
    }
    runs
}

/// The non-empty, non-comment lines of a crt-list or map file, tokenised.
pub fn data_lines(content: &str) -> Vec<Tokens> {
    content
        .lines()
        .map(tokenize_line)
        .filter(|t| !t.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        tokenize_line(line)
    }

    #[test]
    fn tokenizer_follows_haproxy_quoting_and_comment_rules() {
        assert_eq!(
            words("  server SRV_1 10.0.0.1:80 enabled # Pod: web-1"),
            ["server", "SRV_1", "10.0.0.1:80", "enabled"]
        );
        assert_eq!(
            words(r#"http-request set-header X "a # b" 'c\d'"#),
            ["http-request", "set-header", "X", "a # b", r"c\d"]
        );
        assert_eq!(
            words(r#"acl a path_beg /x#y"#),
            ["acl", "a", "path_beg", "/x#y"]
        );
        assert_eq!(
            words(r#"errorfile 503 "a\"b""#),
            ["errorfile", "503", "a\"b"]
        );
        assert_eq!(words("\t# only a comment"), Vec::<String>::new());
    }

    #[test]
    fn parse_groups_lines_into_sections() {
        let cfg = Config::parse(
            "global\n  daemon\n\ndefaults\n mode http\nbackend be1 # x\n server a 1.2.3.4:80\n",
        );
        let headers: Vec<_> = cfg.sections.iter().map(|s| s.header.join(" ")).collect();
        assert_eq!(headers, ["global", "defaults", "backend be1"]);
        assert!(cfg.sections[2].has_servers());
        assert_eq!(cfg.sections[2].lines, vec![words("server a 1.2.3.4:80")]);
    }

    #[test]
    fn server_line_separates_runtime_fields() {
        let s = ServerLine::parse(&words(
            "server SRV_1 127.0.0.1:1 disabled check weight 5 inter 2s",
        ))
        .unwrap();
        assert_eq!(s.name, "SRV_1");
        assert_eq!(s.address, "127.0.0.1:1");
        assert_eq!(s.weight.as_deref(), Some("5"));
        assert!(s.disabled);
        assert_eq!(s.rest, ["check", "inter", "2s"]);
    }

    #[test]
    fn socket_addresses() {
        assert_eq!(SocketAddress::parse("10.1.2.3:8080").unwrap().port, 8080);
        assert!(SocketAddress::parse("[::1]:80").is_some());
        assert!(SocketAddress::parse("::1:80").is_some());
        assert!(SocketAddress::parse("web.example:80").is_none());
        assert!(SocketAddress::parse("10.1.2.3").is_none());
        assert!(SocketAddress::parse("10.1.2.3:+1").is_none());
    }

    #[test]
    fn finds_file_references_inside_expressions() {
        let cfg = Config::parse(
            "frontend f\n use_backend %[req.hdr(host),lower,map(/etc/haproxy/maps/host.map,be)]\n bind :443 ssl crt /etc/haproxy/ssl/a.pem\n acl x src -f maps/host.map2\n",
        );
        let refs = file_references(cfg.tokens(), "maps/host.map");
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].name, "/etc/haproxy/maps/host.map");
        assert!(refs[0].is_map());
        let refs = file_references(cfg.tokens(), "ssl/a.pem");
        assert_eq!(refs[0].context, "crt");
        assert!(!refs[0].is_map());
    }
}
