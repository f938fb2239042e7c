//! Go-style duration strings (`500ms`, `2s`, `1m30s`), as used in HAProxyTemplateConfig.
//!
//! The parser never panics: it works in whole nanoseconds with checked integer arithmetic (no
//! floating point) and refuses anything above [`MAX_DURATION`], Go's own limit. Each config field
//! then has a much narrower range of its own ([`super::model::DURATION_FIELDS`]).

use std::time::Duration;

/// The longest duration the parser reads: 2^63-1 nanoseconds (2562047h47m16.854775807s, about
/// 292 years), like Go's `time.ParseDuration`.
pub const MAX_DURATION: Duration = Duration::new(9_223_372_036, 854_775_807);

const MAX_NANOS: u128 = i64::MAX as u128;

/// Fraction digits beyond this many are ignored: they are far below a nanosecond for every unit.
const MAX_FRACTION_DIGITS: u32 = 18;

/// Parses `[0-9]*(.[0-9]*)?(ns|us|µs|ms|s|m|h)` repeated, e.g. `1h2m3.5s`, or `0`. A leading
/// `+` is allowed; negative durations are refused. Unlike upstream, an unparsable value is an
/// error, never a silent fallback to the default.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let (negative, body) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    if body.is_empty() {
        return Err(format!("duration {text:?}: expected a number"));
    }
    let too_large = || {
        format!(
            "duration {text:?} is too large (the parser reads at most {})",
            format_duration(MAX_DURATION)
        )
    };
    let mut total: u128 = 0;
    let mut rest = body;
    while !rest.is_empty() {
        // The number: integer part, optional fraction; at least one digit in all.
        let mut whole: u128 = 0;
        let mut fraction: u128 = 0;
        let mut scale: u128 = 1;
        let mut digits = 0usize;
        let mut seen_dot = false;
        let mut len = 0;
        for (i, c) in rest.char_indices() {
            match c {
                '0'..='9' => {
                    let d = u128::from(c as u8 - b'0');
                    digits += 1;
                    if !seen_dot {
                        whole = whole * 10 + d;
                        if whole > MAX_NANOS {
                            // Even in nanoseconds this number exceeds the limit.
                            return Err(too_large());
                        }
                    } else if scale < 10u128.pow(MAX_FRACTION_DIGITS) {
                        fraction = fraction * 10 + d;
                        scale *= 10;
                    }
                }
                '.' if !seen_dot => seen_dot = true,
                '.' => return Err(format!("duration {text:?}: bad number (two '.')")),
                _ => break,
            }
            len = i + c.len_utf8();
        }
        if digits == 0 {
            return Err(format!("duration {text:?}: expected a number at {rest:?}"));
        }
        rest = &rest[len..];
        if rest.is_empty() {
            return Err(format!(
                "duration {text:?} lacks a unit (ns, us, ms, s, m or h)"
            ));
        }
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit: u128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            unit => {
                return Err(format!(
                    "duration {text:?}: unknown unit {unit:?} (use ns, us, ms, s, m or h)"
                ))
            }
        };
        rest = &rest[unit_len..];
        // whole <= 2^63 and the largest unit is < 2^42, so neither product overflows u128;
        // checked anyway so that the bound does not rest on this comment.
        let part = whole
            .checked_mul(nanos_per_unit)
            .and_then(|w| w.checked_add(fraction.checked_mul(nanos_per_unit)? / scale))
            .ok_or_else(too_large)?;
        total = total.checked_add(part).ok_or_else(too_large)?;
        if total > MAX_NANOS {
            return Err(too_large());
        }
    }
    if negative && total != 0 {
        return Err(format!("duration {text:?} is negative"));
    }
    // total <= 2^63-1, so it fits in u64.
    Ok(Duration::from_nanos(
        u64::try_from(total).map_err(|_| too_large())?,
    ))
}

/// Formats a duration the way users write them (`15s`, `100ms`, `1m30s`, `1h0m0.5s`); the
/// result parses back to the same duration.
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    if secs == 0 {
        return match nanos {
            n if n % 1_000_000 == 0 => format!("{}ms", n / 1_000_000),
            n if n % 1_000 == 0 => format!("{}us", n / 1_000),
            n => format!("{n}ns"),
        };
    }
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let seconds = if nanos == 0 {
        format!("{s}s")
    } else {
        let fraction = format!("{nanos:09}");
        format!("{s}.{}s", fraction.trim_end_matches('0'))
    };
    match (h, m, s, nanos) {
        (0, 0, _, _) => seconds,
        (0, m, 0, 0) => format!("{m}m"),
        (0, m, _, _) => format!("{m}m{seconds}"),
        (h, 0, 0, 0) => format!("{h}h"),
        (h, m, 0, 0) => format!("{h}h{m}m"),
        (h, m, _, _) => format!("{h}h{m}m{seconds}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse_duration(text).unwrap_err()
    }

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("+0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("-0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("+3s").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration(" 2s\n").unwrap(), Duration::from_secs(2));
        assert_eq!(
            parse_duration("1h2m3s4ms5us6ns").unwrap(),
            Duration::new(3723, 4_005_006)
        );
    }

    #[test]
    fn every_unit() {
        let cases = [
            ("7ns", Duration::from_nanos(7)),
            ("7us", Duration::from_micros(7)),
            ("7µs", Duration::from_micros(7)),
            ("7μs", Duration::from_micros(7)),
            ("7ms", Duration::from_millis(7)),
            ("7s", Duration::from_secs(7)),
            ("7m", Duration::from_secs(7 * 60)),
            ("7h", Duration::from_secs(7 * 3600)),
            ("0s", Duration::ZERO),
            ("0h", Duration::ZERO),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn fractions() {
        assert_eq!(parse_duration(".5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("0.1s").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_duration("1.25m").unwrap(), Duration::from_secs(75));
        assert_eq!(parse_duration("0.5ns").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("1.000000001s").unwrap(), Duration::new(1, 1));
        // Digits far below a nanosecond are ignored, however many there are.
        let long = format!("1.{}s", "9".repeat(10_000));
        assert_eq!(
            parse_duration(&long).unwrap(),
            Duration::new(1, 999_999_999)
        );
        let zeros = format!("{}1s", "0".repeat(10_000));
        assert_eq!(parse_duration(&zeros).unwrap(), Duration::from_secs(1));
    }

    #[test]
    fn the_maximum_is_gos_and_beyond_it_is_an_error() {
        assert_eq!(
            parse_duration("9223372036854775807ns").unwrap(),
            MAX_DURATION
        );
        assert_eq!(
            parse_duration("2562047h47m16.854775807s").unwrap(),
            MAX_DURATION
        );
        for text in [
            "9223372036854775808ns",
            "9223372036854775807s",
            "99999999999999999999999h",
            "2562048h",
            "2562047h47m16.854775808s",
            "2562047h2562047h",
            "1.5e300s",
            "184467440737095516160000000000000000000000s",
        ] {
            let e = err(text);
            assert!(
                e.contains("too large") || e.contains("unknown unit"),
                "{text}: {e}"
            );
        }
        let e = err("99999999999999999999999h");
        assert!(
            e.contains("too large") && e.contains("2562047h47m16.854775807s"),
            "{e}"
        );
        let huge = format!("{}s", "9".repeat(100_000));
        assert!(err(&huge).contains("too large"));
        let many = "1h".repeat(3_000_000);
        assert!(err(&many).contains("too large"));
    }

    #[test]
    fn rejects_bad_durations_with_reason() {
        assert!(err("15").contains("unit"));
        assert!(err("1.5").contains("unit"));
        assert!(err("1s5").contains("unit"));
        assert!(err("2 days").contains("unknown unit"));
        assert!(err("2d").contains("unknown unit"));
        assert!(err("2S").contains("unknown unit"));
        assert!(err("2sec").contains("unknown unit"));
        assert!(err("").contains("empty"));
        assert!(err("   ").contains("empty"));
        assert!(err("s").contains("expected a number"));
        assert!(err(".s").contains("expected a number"));
        assert!(err("-").contains("expected a number"));
        assert!(err("+").contains("expected a number"));
        assert!(err("1..5s").contains("two '.'"));
        assert!(err("1.2.3s").contains("two '.'"));
        assert!(err("-5s").contains("negative"));
        assert!(err("-1h30m").contains("negative"));
        assert!(err("--5s").contains("expected a number"));
        assert!(err("1e3s").contains("unknown unit"));
        assert!(err("0x10s").contains("unknown unit"));
        assert!(err("NaNs").contains("expected a number"));
        assert!(err("infs").contains("expected a number"));
        assert!(err("１s").contains("expected a number"));
        assert!(err("5s\0").contains("unknown unit"));
    }

    #[test]
    fn arbitrary_input_never_panics() {
        // A deterministic sweep of short strings over the characters that matter.
        let alphabet: Vec<char> = "0159.+-smhunµμ \u{0}é".chars().collect();
        let n = alphabet.len();
        for len in 1..=4u32 {
            for mut k in 0..n.pow(len) {
                let mut s = String::new();
                for _ in 0..len {
                    s.push(alphabet[k % n]);
                    k /= n;
                }
                if let Ok(d) = parse_duration(&s) {
                    assert!(d <= MAX_DURATION, "{s:?}");
                }
            }
        }
    }

    #[test]
    fn formats_round_trip() {
        for text in [
            "15s",
            "100ms",
            "1m30s",
            "2h",
            "1m",
            "1h30m",
            "250us",
            "7ns",
            "1.5s",
            "1h0m0.5s",
            "2562047h47m16.854775807s",
        ] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
        assert_eq!(format_duration(Duration::ZERO), "0s");
        for d in [
            Duration::new(0, 1),
            Duration::new(59, 999_999_999),
            Duration::new(3601, 10),
            Duration::from_secs(86_400),
            MAX_DURATION,
        ] {
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }
}
