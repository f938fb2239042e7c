//! A small command-line parser: `--flag value`, `--flag=value`, short aliases, repeatable
//! options and boolean switches, with errors that name the flag.

use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub(super) struct Spec {
    pub long: &'static str,
    pub short: Option<char>,
    pub takes_value: bool,
    pub help: &'static str,
}

pub(super) const fn opt(long: &'static str, short: Option<char>, help: &'static str) -> Spec {
    Spec {
        long,
        short,
        takes_value: true,
        help,
    }
}

pub(super) const fn switch(long: &'static str, help: &'static str) -> Spec {
    Spec {
        long,
        short: None,
        takes_value: false,
        help,
    }
}

#[derive(Debug, Default)]
pub(super) struct Parsed {
    values: BTreeMap<&'static str, Vec<String>>,
    pub positional: Vec<String>,
    pub help: bool,
}

impl Parsed {
    pub(super) fn all(&self, long: &str) -> Vec<String> {
        self.values.get(long).cloned().unwrap_or_default()
    }

    pub(super) fn last(&self, long: &str) -> Option<String> {
        self.values.get(long).and_then(|v| v.last().cloned())
    }

    pub(super) fn flag(&self, long: &str) -> bool {
        self.values.contains_key(long)
    }
}

pub(super) fn parse(args: &[String], specs: &[Spec]) -> Result<Parsed, String> {
    let mut parsed = Parsed::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--help" || arg == "-h" {
            parsed.help = true;
            continue;
        }
        let (spec, inline) = if let Some(rest) = arg.strip_prefix("--") {
            let (name, inline) = match rest.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (rest, None),
            };
            (
                specs
                    .iter()
                    .find(|s| s.long == name)
                    .ok_or_else(|| format!("unknown option --{name} (see --help)"))?,
                inline,
            )
        } else if arg.len() == 2 && arg.starts_with('-') {
            let c = arg.chars().nth(1).unwrap_or_default();
            (
                specs
                    .iter()
                    .find(|s| s.short == Some(c))
                    .ok_or_else(|| format!("unknown option {arg} (see --help)"))?,
                None,
            )
        } else {
            parsed.positional.push(arg.clone());
            continue;
        };
        let value = if spec.takes_value {
            match inline {
                Some(v) => v,
                None => {
                    let v = args
                        .get(i)
                        .ok_or_else(|| format!("--{} needs a value", spec.long))?;
                    i += 1;
                    v.clone()
                }
            }
        } else {
            if inline.is_some() {
                return Err(format!("--{} takes no value", spec.long));
            }
            String::new()
        };
        parsed.values.entry(spec.long).or_default().push(value);
    }
    Ok(parsed)
}

pub(super) fn usage(command: &str, summary: &str, specs: &[Spec]) -> String {
    let mut out = format!("{summary}\n\nUsage: haptic {command} [options]\n\nOptions:\n");
    for s in specs {
        let short = s.short.map(|c| format!("-{c}, ")).unwrap_or_default();
        let value = if s.takes_value { " VALUE" } else { "" };
        out.push_str(&format!("  {short}--{}{value}\n      {}\n", s.long, s.help));
    }
    out.push_str("  -h, --help\n      Show this help\n");
    out
}
